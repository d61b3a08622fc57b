#!/usr/bin/env bash
# Memory-saving optimizers side by side: for each of AdamW, Adafactor (relative step, and the
# demo's schedule), SM3 (without and with momentum) and SGD with momentum, the optimizer state in bytes per parameter on the
# step-benchmark model (configs/bench.toml: GPT, 6 layers, hidden 512, vocab 50304) and the
# validation loss after N steps of the demo (configs/demo.toml), all from one build in one
# invocation.
#   bash bench/run_optimizer_bench.sh [N=300]
# Environment:
#   OPTIMIZERS="adamw sm3"  a subset of the labels below
#   DATA=PREFIX             demo shards to train on (default data/demo, prepared as
#                           scripts/demo.sh prepares them when missing)
# The state bytes are those the engine reports at start-up (optimizer state / parameters);
# the demo losses are val_loss at step N (evaluated at step N only, train.eval_steps batches).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}

# label -> settings. SM3 and SGD take larger rates than AdamW (no second-moment scale).
declare -A settings=(
  [adamw]='train.optimizer="adamw"'
  [adafactor]='train.optimizer="adafactor" train.lr=0 train.warmup_steps=0'
  [adafactor_lr]='train.optimizer="adafactor"'
  [sm3]='train.optimizer="sm3" train.lr=0.05 train.min_lr=0.005'
  [sm3_momentum]='train.optimizer="sm3" train.lr=0.05 train.min_lr=0.005 train.momentum=0.9'
  [sgd]='train.optimizer="sgd" train.lr=0.1 train.min_lr=0.01 train.momentum=0.9'
)
order=(${OPTIMIZERS:-adamw adafactor adafactor_lr sm3 sm3_momentum sgd})

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=build/release/oases
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

data=${DATA:-data/demo}
if [[ ! -f "${data}_train.bin" ]]; then
  texts=()
  for f in /usr/share/common-licenses/* /usr/share/games/fortunes/*; do
    [[ -f "$f" && ! -L "$f" && "$f" != *.dat && "$f" != */wisdom ]] && texts+=("$f")
  done
  texts+=(/usr/share/games/fortunes/wisdom)
  mkdir -p "$(dirname "$data")"
  $oases train-tokenizer --input "${texts[@]}" --model-prefix "${data}_tokenizer" \
    --vocab-size 4096 --type bpe >/dev/null
  $oases prepare-data --tokenizer sentencepiece --tokenizer-model "${data}_tokenizer.model" \
    --input "${texts[@]}" --output "$data" --val-fraction 0.02 >/dev/null
fi

common=(checkpoint.dir='""' log.trace='""' log.every=1000000)
for label in "${order[@]}"; do
  [[ -n "${settings[$label]:-}" ]] || { echo "unknown optimizer label '$label'" >&2; exit 2; }
  read -r -a extra <<<"${settings[$label]}"
  # State bytes on the step-benchmark model: one step (the log line comes at start-up).
  $oases train --config configs/bench.toml --set train.steps=1 data.path="\"$data\"" \
    data.tokenizer='"sentencepiece"' log.metrics="\"$out/bench_$label.jsonl\"" "${common[@]}" \
    "${extra[@]}" 2>"$out/bench_$label.log" >/dev/null
  # The demo for N steps, evaluated at the end.
  $oases train --config configs/demo.toml --set train.steps="$steps" train.eval_every="$steps" \
    data.path="\"$data\"" log.metrics="\"$out/demo_$label.jsonl\"" "${common[@]}" "${extra[@]}" \
    2>"$out/demo_$label.log" >/dev/null
done

/usr/bin/python3 - "$out" "$steps" "${order[@]}" <<'PY'
import json, re, sys
out, steps, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
line = re.compile(r"optimizer state ([0-9.]+) MiB \((\w+), (\d+) bytes, ([0-9.e+-]+) bytes per parameter\)")
print(f"{'optimizer':<14} {'state MiB':>10} {'bytes/param':>12} {'val_loss@' + str(steps):>14} {'train loss':>11}")
for label in labels:
    found = line.search(open(f"{out}/bench_{label}.log").read())
    mib, per = (float(found.group(1)), float(found.group(4))) if found else (float("nan"),) * 2
    records = [json.loads(l) for l in open(f"{out}/demo_{label}.jsonl") if l.strip()]
    val = [r["val_loss"] for r in records if "val_loss" in r and r["step"] == steps]
    loss = [r["loss"] for r in records if r["step"] == steps]
    print(f"{label:<14} {mib:>10.2f} {per:>12.4g} {val[-1] if val else float('nan'):>14.4f} "
          f"{loss[-1] if loss else float('nan'):>11.4f}")
PY
