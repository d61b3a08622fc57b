#!/usr/bin/env bash
# Periodic synchronisation (parallel.dp_sync_every, local SGD) against synchronous data
# parallelism: the demo (configs/demo.toml) trained by 2 processes at dp = 2 with
# dp_sync_every = 1 (gradients summed every step), 4 and 8, from one build in one invocation.
# Prints the validation-loss curve of each (every E steps), the mean step time and the mean
# replica divergence measured before each average.
#   bash bench/run_local_sgd_bench.sh [N=300] [E=50]
# Environment: DATA=PREFIX  demo shards (default data/demo, made by scripts/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
every=${2:-50}
intervals=(1 4 8)

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=build/release/oases
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
data=${DATA:-data/demo}
[[ -f "${data}_train.bin" ]] || { echo "no demo shards at $data: run scripts/demo.sh first" >&2; exit 2; }

mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2)
for x in "${intervals[@]}"; do
  "${mpirun_cmd[@]}" $oases train --quiet --config configs/demo.toml --set train.steps="$steps" \
    train.eval_every="$every" train.threads=1 parallel.dp=2 parallel.dp_sync_every="$x" \
    data.path="\"$data\"" checkpoint.dir='""' log.trace='""' log.every=1 \
    log.metrics="\"$out/x$x.jsonl\"" >/dev/null 2>"$out/x$x.log"
done

/usr/bin/python3 - "$out" "$every" "${intervals[@]}" <<'PY'
import json, statistics, sys
out, every, xs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = {x: [json.loads(l) for l in open(f"{out}/x{x}.jsonl") if l.strip()] for x in xs}
val = {x: {r["step"]: r["val_loss"] for r in rs if "val_loss" in r} for x, rs in runs.items()}
steps = sorted(val[xs[0]])
print("validation loss at dp = 2 (demo), by dp_sync_every:")
print(f"{'step':>6} " + " ".join(f"{'x=' + x:>9}" for x in xs) +
      " " + " ".join(f"{'x=' + x + ' vs 1':>11}" for x in xs[1:]))
for s in steps:
    row = [val[x][s] for x in xs]
    print(f"{s:>6} " + " ".join(f"{v:>9.4f}" for v in row) + " " +
          " ".join(f"{100 * (v / row[0] - 1):>+10.2f}%" for v in row[1:]))
print(f"\n{'x':>3} {'step s':>8} {'train loss (last 50)':>21} {'divergence (mean)':>18}")
for x, rs in runs.items():
    train = [r for r in rs if "loss" in r]
    times = [r["step_time_s"] for r in train if r["step"] >= 2]
    last = statistics.mean(r["loss"] for r in train[-50:])
    div = [r["replica_divergence"] for r in rs if "replica_divergence" in r]
    d = f"{statistics.mean(div):.3g}" if div else "-"
    print(f"{x:>3} {statistics.mean(times):>8.4f} {last:>21.4f} {d:>18}")
PY
