#!/usr/bin/env bash
# Periodic synchronisation (parallel.dp_sync_every, local SGD) against synchronous data
# parallelism: the demo (configs/demo.toml) trained by 2 processes at dp = 2 with
# dp_sync_every = 1 (gradients summed every step), 4 and 8, from one build in one invocation.
# Prints the validation-loss curve of each (every E steps) and the mean replica divergence
# measured before each average; then the mean step time of each from separate runs of T steps,
# the intervals alternating round by round (ROUNDS) so that all see the same machine load.
#   bash bench/run_local_sgd_bench.sh [N=300] [E=50] [T=40] [ROUNDS=2]
# N = 0: the step times alone.
# Environment: RATE=MBIT  time the runs over TCP on a loopback capped at MBIT Mbit/s in a private
#                         network namespace (bench/capped_loopback.sh; needs root), where the
#                         gradient all-reduce, not the compute, bounds a step
# Environment: DATA=PREFIX  demo shards (default data/demo, made by scripts/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
every=${2:-50}
timing_steps=${3:-40}
rounds=${4:-2}
intervals=(1 4 8)

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=build/release/oases
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
data=${DATA:-data/demo}
[[ -f "${data}_train.bin" ]] || { echo "no demo shards at $data: run scripts/demo.sh first" >&2; exit 2; }

mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2)
timing_cmd=("${mpirun_cmd[@]}")
if [[ -n "${RATE:-}" ]]; then
  source bench/capped_loopback.sh
  trap 'capped_loopback_stop oases_local_sgd; rm -rf "$out"' EXIT
  capped_loopback_start oases_local_sgd "$RATE"
  timing_cmd=("${mpi_capped[@]}")
  echo "step times over TCP on a loopback capped at $RATE Mbit/s"
fi
for x in "${intervals[@]}"; do
  ((steps > 0)) || break
  "${mpirun_cmd[@]}" $oases train --quiet --config configs/demo.toml --set train.steps="$steps" \
    train.eval_every="$every" train.threads=1 parallel.dp=2 parallel.dp_sync_every="$x" \
    data.path="\"$data\"" checkpoint.dir='""' log.trace='""' log.every=1 \
    log.metrics="\"$out/x$x.jsonl\"" >/dev/null 2>"$out/x$x.log"
done
for round in $(seq 1 "$rounds"); do
  for x in "${intervals[@]}"; do
    "${timing_cmd[@]}" $oases train --quiet --config configs/demo.toml --set \
      train.steps="$timing_steps" train.eval_every=1000000 train.threads=1 parallel.dp=2 \
      parallel.dp_sync_every="$x" data.path="\"$data\"" checkpoint.dir='""' log.trace='""' \
      log.every=1 log.metrics="\"$out/time_x${x}_$round.jsonl\"" >/dev/null 2>&1
  done
done

/usr/bin/python3 - "$out" "$every" "$rounds" "$steps" "${intervals[@]}" <<'PY'
import json, os, statistics, sys
out, every, rounds, curves, xs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) > 0, sys.argv[5:]
runs = {x: [json.loads(l) for l in open(f"{out}/x{x}.jsonl") if l.strip()] if curves else [] for x in xs}
val = {x: {r["step"]: r["val_loss"] for r in rs if "val_loss" in r} for x, rs in runs.items()}
steps = sorted(val[xs[0]])
if curves: print("validation loss at dp = 2 (demo), by dp_sync_every:")
if curves:
    print(f"{'step':>6} " + " ".join(f"{'x=' + x:>9}" for x in xs) +
          " " + " ".join(f"{'x=' + x + ' vs 1':>11}" for x in xs[1:]))
for s in steps:
    row = [val[x][s] for x in xs]
    print(f"{s:>6} " + " ".join(f"{v:>9.4f}" for v in row) + " " +
          " ".join(f"{100 * (v / row[0] - 1):>+10.2f}%" for v in row[1:]))
def step_time(x):
    per_round = []
    for r in range(1, rounds + 1):
        rs = [json.loads(l) for l in open(f"{out}/time_x{x}_{r}.jsonl") if l.strip()]
        per_round.append(statistics.mean(t["step_time_s"] for t in rs if t["step"] >= 2 and "loss" in t))
    return statistics.mean(per_round)
times = {x: step_time(x) for x in xs}
print(f"\n{'x':>3} {'step s':>8} {'vs 1':>6} {'train loss (last 50)':>21} {'divergence (mean)':>18}")
for x, rs in runs.items():
    train = [r for r in rs if "loss" in r]
    last = statistics.mean(r["loss"] for r in train[-50:]) if train else float("nan")
    div = [r["replica_divergence"] for r in rs if "replica_divergence" in r]
    d = f"{statistics.mean(div):.3g}" if div else "-"
    print(f"{x:>3} {times[x]:>8.4f} {times[x] / times[xs[0]]:>6.2f} {last:>21.4f} {d:>18}")
PY
