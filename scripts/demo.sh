#!/usr/bin/env bash
# The demo: install what is missing, build, gather a few MB of English text from Debian packages
# (the fortune cookie collections and the licence texts every Debian system has), train a
# SentencePiece tokenizer on it, train a small GPT for about ten minutes on 2 cores, print
# samples, and write the run's report (runs/demo/report.html). Arguments go to `oases train`
# (e.g. `bash scripts/demo.sh --set train.steps=100` for a short run).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target oases

# Each text once (.dat files are indexes; .u8 and licence names such as GPL are links). The
# validation shard is the last 2% of the tokens: the `wisdom` collection, put last.
texts=()
for f in /usr/share/common-licenses/* /usr/share/games/fortunes/*; do
  [[ -f "$f" && ! -L "$f" && "$f" != *.dat && "$f" != */wisdom ]] && texts+=("$f")
done
texts+=(/usr/share/games/fortunes/wisdom)
mkdir -p data runs
build/release/oases train-tokenizer --input "${texts[@]}" --model-prefix data/demo_tokenizer \
  --vocab-size 4096 --type bpe
build/release/oases prepare-data --tokenizer sentencepiece \
  --tokenizer-model data/demo_tokenizer.model --input "${texts[@]}" --output data/demo \
  --val-fraction 0.02
# Byte-level shards of the fortunes for the other example configs (configs/llama-demo.toml,
# bert-demo.toml, planner.toml), which train on data/fortunes.
fortunes=()
for f in /usr/share/games/fortunes/*; do
  [[ -f "$f" && ! -L "$f" && "$f" != *.dat ]] && fortunes+=("$f")
done
build/release/oases prepare-data --input "${fortunes[@]}" --output data/fortunes --val-fraction 0.05
build/release/oases train --config configs/demo.toml "$@"
echo
echo "---- samples from runs/demo/checkpoints ----"
build/release/oases generate --checkpoint runs/demo/checkpoints --prompt "The " \
  --max-new-tokens 120 --temperature 0.8 --top-p 0.95 --num-samples 2 --seed 1
build/release/oases generate --checkpoint runs/demo/checkpoints --prompt "" \
  --max-new-tokens 120 --temperature 0.8 --top-p 0.95 --seed 2
echo
build/release/oases eval --checkpoint runs/demo/checkpoints --data data/demo
build/release/oases report runs/demo --output runs/demo/report.html >/dev/null
echo "report of the run: $(pwd)/runs/demo/report.html (open it in a browser)"
