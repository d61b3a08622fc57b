#!/usr/bin/env bash
# Parallel layouts on this machine, measured in one run: the same model and global batch
# trained by 1 process with 2 threads, by 2 processes with tp=2 and by 2 processes with dp=2
# (1 thread each), then the MPI backend's collective bus bandwidth on 2 ranks.
#   bash bench/run_parallel_bench.sh [STEPS=4] [CONFIG=configs/bench.toml]
# Step times are medians over the steps after the first; "collectives" is the time per step the
# compute thread waited on collectives (exposed_comm_s).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
config=${2:-configs/bench.toml}

cmake --preset release >/dev/null
cmake --build --preset release --target oases collective_bandwidth >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/release/oases prepare-data --input /usr/share/games/fortunes/* --output "$work/data" >/dev/null 2>&1 ||
  build/release/oases prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" >/dev/null
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2)
common=(--config "$config" --set train.steps="$steps" data.path="\"$work/data\"" log.peak_tflops=1.0)

build/release/oases train --quiet "${common[@]}" train.threads=2 log.metrics="\"$work/single.jsonl\""
"${mpirun_cmd[@]}" build/release/oases train --quiet "${common[@]}" train.threads=1 parallel.tp=2 \
  log.metrics="\"$work/tp2.jsonl\""
micro=$(/usr/bin/python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["train"]["micro_batch"] // 2)' "$config" 2>/dev/null || echo 4)
"${mpirun_cmd[@]}" build/release/oases train --quiet "${common[@]}" train.threads=1 parallel.dp=2 \
  train.micro_batch="$micro" log.metrics="\"$work/dp2.jsonl\""

/usr/bin/python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
def load(name):
    rows = [r for r in map(json.loads, open(f"{work}/{name}.jsonl")) if r["step"] > 0][1:]  # step 0: before training; step 1 warms up
    return (statistics.median(r["step_time_s"] for r in rows),
            statistics.median(r["exposed_comm_s"] for r in rows),
            statistics.median(r["tokens_per_s"] for r in rows))
single = load("single")
print()
print(f"{'layout':<34}{'step s':>9}{'tokens/s':>11}{'vs 1 proc':>11}{'collectives s/step':>20}")
for name, label in [("single", "1 process x 2 threads"), ("tp2", "2 processes, tp=2 (1 thread each)"),
                    ("dp2", "2 processes, dp=2 (1 thread each)")]:
    t, c, tok = load(name)
    print(f"{label:<34}{t:>9.3f}{tok:>11.0f}{single[0] / t:>10.2f}x{c:>20.3f}")
PY
echo
"${mpirun_cmd[@]}" build/release/bench/collective_bandwidth
