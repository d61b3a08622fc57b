#!/usr/bin/env bash
# ZeRO stages side by side at dp = 2 on the step-benchmark model (configs/bench.toml: GPT, 6
# layers, hidden 512, seq 256, vocab 50304, micro-batch 8, one micro-batch per rank), from one
# build in one invocation, for parallel.zero = 0, 1, 2, 3 and zero 2 and 3 with the optimizer
# state offloaded to a scratch file (parallel.offload = "optimizer", offload_dir = a temporary
# folder on the local disk):
#  1. per-rank bytes (parameters, gradients, optimizer state, what of them is offloaded, peak
#     activations, the process's peak resident set) and the mean step time of steps 2..S, the
#     configurations alternating round by round so that all see the same machine load (2
#     processes over shared memory, 1 thread each);
#  2. the communication volume per step of each stage: the two ranks over TCP on the loopback
#     of a private network namespace, whose byte counter is read around runs of S1 and S2
#     steps (volume per step = the difference / (S2 - S1), start-up traffic cancelled);
#  3. the largest model (layers at hidden 512) each configuration trains under
#     parallel.memory_limit = LIMIT bytes per rank, found by bisection on the start-up memory
#     check (which counts offloaded bytes out).
#   bash bench/run_zero_bench.sh [S=4] [ROUNDS=2] [LIMIT=1200000000]
# Needs root (ip netns) for part 2.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
bench_steps=${1:-4}
rounds=${2:-2}
limit=${3:-1200000000}
stages=(0 1 2 2o 3 3o)
# The settings of each configuration.
settings() {
  case $1 in
    2o|3o) echo "parallel.zero=${1%o} parallel.offload=\"optimizer\" parallel.offload_dir=\"$out\"" ;;
    *) echo "parallel.zero=$1" ;;
  esac
}

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
out=$(mktemp -d)
ns=oases_zero_bench
trap 'capped_loopback_stop $ns; rm -rf "$out"' EXIT
bench_header "bash bench/run_zero_bench.sh $*"

# Random tokens are enough for time, bytes and traffic: a shard of the fortunes.
data="$out/data"
$oases prepare-data --input /usr/share/games/fortunes/fortunes --output "$data" >/dev/null

common=(data.path="\"$data\"" checkpoint.dir='""' log.trace='""' log.every=1000000
        train.global_batch=16 train.threads=1 parallel.dp=2 model.vocab_size=50304)
shm=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 -x OMP_NUM_THREADS=1)
for round in $(seq 1 "$rounds"); do
  for z in "${stages[@]}"; do
    "${shm[@]}" "$oases" train --quiet --config configs/bench.toml --set train.steps="$bench_steps" \
      $(settings "$z") log.metrics="\"$out/step_z${z}_$round.jsonl\"" "${common[@]}" \
      >/dev/null 2>"$out/step_z${z}_$round.log"
    cp "$out/run.json" "$out/run_z$z.json"
  done
done

# Part 2: the same runs over TCP in a namespace of their own; its loopback counts every byte.
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
tcp=(ip netns exec "$ns" mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1
     --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
lo_bytes() { ip netns exec "$ns" cat /sys/class/net/lo/statistics/tx_bytes; }
short=2; long=5
for z in "${stages[@]}"; do
  for steps in $short $long; do
    before=$(lo_bytes)
    "${tcp[@]}" "$oases" train --quiet --config configs/bench.toml --set train.steps="$steps" \
      $(settings "$z") log.metrics='""' "${common[@]}" >/dev/null 2>&1
    echo $(( $(lo_bytes) - before )) > "$out/bytes_z${z}_$steps"
  done
done

# Part 3: bisection on model.layers; a run that passes the start-up check trains one step.
fits() {
  "${shm[@]}" "$oases" train --quiet --config configs/bench.toml --set train.steps=1 \
    model.layers="$2" $(settings "$1") parallel.memory_limit="$limit" log.metrics='""' \
    "${common[@]}" >/dev/null 2>&1
}
for z in "${stages[@]}"; do
  lo=0; hi=64
  while (( hi - lo > 1 )); do
    mid=$(( (lo + hi) / 2 ))
    if fits "$z" "$mid"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo" > "$out/largest_z$z"
done

/usr/bin/python3 - "$out" "$rounds" "$short" "$long" "$limit" "${stages[@]}" <<'PY'
import json, statistics, sys
out, rounds, short, long_, limit, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]
mib = 2**20
def records(path):
    return [json.loads(l) for l in open(path) if l.strip()]
rows = {}
for z in stages:
    times = []
    for r in range(1, rounds + 1):
        rs = [x for x in records(f"{out}/step_z{z}_{r}.jsonl") if x["step"] >= 2]
        times.append(statistics.mean(x["step_time_s"] for x in rs))
        last = rs[-1]
    per_step = (int(open(f"{out}/bytes_z{z}_{long_}").read()) -
                int(open(f"{out}/bytes_z{z}_{short}").read())) / (long_ - short)
    rows[z] = dict(time=statistics.mean(times), last=last, volume=per_step,
                   largest=int(open(f"{out}/largest_z{z}").read()))
print("step-benchmark model at dp = 2, per rank (MiB):")
print("(2o, 3o: zero 2, 3 with the optimizer state offloaded; 'offloaded' is not in memory;")
print(" zero 3's params include what a step holds gathered at once)")
print(f"{'zero':>4} {'params':>8} {'grads':>8} {'optimizer':>10} {'offloaded':>10} {'activations':>12} "
      f"{'peak RSS':>9} {'step s':>7} {'vs 0':>5} {'MB/step':>8} {'vs 0':>5}")
for z, row in rows.items():
    l = row["last"]
    run = json.load(open(f"{out}/run_z{z}.json"))
    offloaded = run["memory_bytes"].get("offloaded", 0)
    print(f"{z:>4} {l['param_bytes'] / mib:>8.1f} {l['grad_bytes'] / mib:>8.1f} "
          f"{l['optimizer_bytes'] / mib:>10.1f} {offloaded / mib:>10.1f} {l['peak_activation_bytes'] / mib:>12.1f} "
          f"{l['peak_mem_bytes'] / mib:>9.1f} {row['time']:>7.3f} "
          f"{row['time'] / rows['0']['time']:>5.2f} {row['volume'] / 1e6:>8.1f} "
          f"{row['volume'] / rows['0']['volume']:>5.2f}")
print(f"\nlargest model under parallel.memory_limit = {limit} bytes per rank (hidden 512, "
      "layers bisected):")
for z, row in rows.items():
    print(f"  zero {z}: {row['largest']} layers")
PY
