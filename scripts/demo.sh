#!/usr/bin/env bash
# The demo: install what is missing, build, prepare a corpus of English text from Debian's
# `fortunes` package, train a small GPT on it for a few minutes, and print a sample.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target oases

corpus=(/usr/share/games/fortunes/*)
texts=()
for f in "${corpus[@]}"; do
  [[ -f "$f" && ! -L "$f" && "$f" != *.dat ]] && texts+=("$f")
done
mkdir -p data runs
build/release/oases prepare-data --input "${texts[@]}" --output data/fortunes --val-fraction 0.05
build/release/oases train --config configs/demo.toml "$@"
echo
echo "---- sample from runs/demo/checkpoints ----"
build/release/oases generate --checkpoint runs/demo/checkpoints --prompt "The " \
  --max-new-tokens 300 --temperature 0.8 --top-k 40
