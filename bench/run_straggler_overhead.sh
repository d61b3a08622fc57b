#!/usr/bin/env bash
# What the per-step stop agreement (train.save_on_signal: one 8-byte all-reduce per step), the
# straggler exchange (one all-gather of 3 numbers per rank every log.every steps) and the
# flight recorder (log.flight_records: a ring entry per collective and message) cost a step,
# measured side by side: 2 ranks (mpirun, shared memory; dp = 2 unless LAYOUT says otherwise,
# e.g. "parallel.dp=1 parallel.tp=2 parallel.schedule=oases", whose many activation
# all-reduces are the flight recorder's worst case) on a small GPT whose step takes tens of
# milliseconds, so that a fixed cost shows. Five settings alternate in each of ROUNDS rounds:
# all off (save_on_signal = false, log.every = STEPS: one exchange per run, no recorder), the
# agreement alone, the exchange every step (log.every = 1, its worst case) alone, the recorder
# alone, and all three.
#   bash bench/run_straggler_overhead.sh [ROUNDS=3] [STEPS=200] [LAYOUT="parallel.dp=2"]
# Prints each setting's median wall time from one step's record to the next (the step and
# what runs between steps) and its ratio to "both off".
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-200}
layout=${3:-parallel.dp=2}

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
build/release/oases prepare-data --input /usr/share/games/fortunes/fortunes --output "$out/data" \
  >/dev/null 2>&1
cat > "$out/small.toml" <<TOML
[model]
layers = 4
hidden = 128
heads = 4
ffn_hidden = 512
vocab_size = 256
seq_len = 64
[train]
micro_batch = 4
global_batch = 8
steps = $steps
threads = 1
[data]
path = "$out/data"
[parallel]
dp = 2
[log]
peak_tflops = 1.0
TOML

declare -A settings=(
  [off]="train.save_on_signal=false log.every=$steps log.flight_records=0"
  [agreement]="train.save_on_signal=true log.every=$steps log.flight_records=0"
  [exchange]="train.save_on_signal=false log.every=1 log.flight_records=0"
  [recorder]="train.save_on_signal=false log.every=$steps log.flight_records=2000"
  [all]="train.save_on_signal=true log.every=1 log.flight_records=2000")
for r in $(seq 1 "$rounds"); do
  for name in off agreement exchange recorder all; do
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 \
      build/release/oases train --quiet --config "$out/small.toml" --set $layout \
      ${settings[$name]} "log.metrics=$out/$name.$r.jsonl" "log.flight_dir=$out/flight"
  done
done

/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
medians = {}
for name in ("off", "agreement", "exchange", "recorder", "all"):
    times = []
    for r in range(1, rounds + 1):
        # Wall time between consecutive records: the step and everything between steps (the
        # agreement and the exchange are outside step_time_s).
        stamps = [json.loads(l)["time"] for l in open(f"{out}/{name}.{r}.jsonl")]
        times += [b - a for a, b in zip(stamps[1:], stamps[2:])]
    medians[name] = statistics.median(times)
for name, m in medians.items():
    print(f"{name:10s} median step {m * 1e3:8.3f} ms  ratio to off {m / medians['off']:.4f}"
          f"  ({len(times)} steps per setting and round)")
PY
