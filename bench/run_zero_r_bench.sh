#!/usr/bin/env bash
# ZeRO-R side by side at tp = 2 on the step-benchmark model (configs/bench.toml: GPT, 6 layers,
# hidden 512, seq 256, vocab 50304), from one build in one invocation, two micro-batches of 8
# per step:
#  1. parallel.partition_activations = false / true under megatron with full recomputation and
#     under oases (fine-grained): per-rank peak activation bytes (the schedule's, which the
#     tests hold equal to the measured peak), the process's peak resident set and the mean step
#     time of steps 2..S, configurations alternating round by round (2 processes over shared
#     memory, 1 thread each);
#  2. the tensor-parallel volume per step of each: the two ranks over TCP on the loopback of a
#     private network namespace, whose byte counter is read around runs of 2 and 4 steps;
#  3. parallel.bucket_bytes = 0 / 1 MiB / 64 KiB at dp = 2 (megatron): step time, so the cost
#     of cutting every collective into bounded transport calls shows.
#   bash bench/run_zero_r_bench.sh [S=4] [ROUNDS=2]
# Needs root (ip netns) for part 2.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
bench_steps=${1:-4}
rounds=${2:-2}
configs=(megatron megatron_p oases oases_p)
settings() {
  case $1 in
    megatron) echo "parallel.schedule=\"megatron\" parallel.recompute=\"full\"" ;;
    megatron_p) echo "parallel.schedule=\"megatron\" parallel.recompute=\"full\" parallel.partition_activations=true" ;;
    oases) echo "parallel.schedule=\"oases\"" ;;
    oases_p) echo "parallel.schedule=\"oases\" parallel.partition_activations=true" ;;
  esac
}

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
out=$(mktemp -d)
ns=oases_zero_r_bench
trap 'capped_loopback_stop $ns; rm -rf "$out"' EXIT
bench_header "bash bench/run_zero_r_bench.sh $*"

data="$out/data"
$oases prepare-data --input /usr/share/games/fortunes/fortunes --output "$data" >/dev/null

common=(data.path="\"$data\"" checkpoint.dir='""' log.trace='""' log.every=1000000
        train.global_batch=16 train.micro_batch=8 train.threads=1 model.vocab_size=50304)
shm=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 -x OMP_NUM_THREADS=1)
for round in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    "${shm[@]}" "$oases" train --quiet --config configs/bench.toml --set train.steps="$bench_steps" \
      parallel.tp=2 $(settings "$c") log.metrics="\"$out/step_${c}_$round.jsonl\"" "${common[@]}" \
      >/dev/null 2>"$out/step_${c}_$round.log"
  done
  for b in 0 1048576 65536; do
    "${shm[@]}" "$oases" train --quiet --config configs/bench.toml --set train.steps="$bench_steps" \
      parallel.dp=2 parallel.schedule=\"megatron\" parallel.bucket_bytes=$b \
      log.metrics="\"$out/step_b${b}_$round.jsonl\"" "${common[@]}" >/dev/null 2>"$out/step_b${b}_$round.log"
  done
done

ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
tcp=(ip netns exec "$ns" mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1
     --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
lo_bytes() { ip netns exec "$ns" cat /sys/class/net/lo/statistics/tx_bytes; }
short=2; long=4
for c in "${configs[@]}"; do
  for steps in $short $long; do
    before=$(lo_bytes)
    "${tcp[@]}" "$oases" train --quiet --config configs/bench.toml --set train.steps="$steps" \
      parallel.tp=2 $(settings "$c") log.metrics='""' "${common[@]}" >/dev/null 2>&1
    echo $(( $(lo_bytes) - before )) > "$out/bytes_${c}_$steps"
  done
done

/usr/bin/python3 - "$out" "$rounds" "$short" "$long" "${configs[@]}" <<'PY'
import json, statistics, sys
out, rounds, short, long_, configs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
mib = 2**20
def records(path):
    return [json.loads(l) for l in open(path) if l.strip()]
def mean_time(name):
    times = []
    for r in range(1, rounds + 1):
        rs = [x for x in records(f"{out}/step_{name}_{r}.jsonl") if x["step"] >= 2]
        times.append(statistics.mean(x["step_time_s"] for x in rs))
        last = rs[-1]
    return statistics.mean(times), last
rows = {}
for c in configs:
    time, last = mean_time(c)
    volume = (int(open(f"{out}/bytes_{c}_{long_}").read()) -
              int(open(f"{out}/bytes_{c}_{short}").read())) / (long_ - short)
    rows[c] = dict(time=time, last=last, volume=volume)
print("step-benchmark model at tp = 2, 2 micro-batches of 8 per step, per rank:")
print("(_p: parallel.partition_activations = true; ratios against the same schedule unpartitioned)")
print(f"{'config':>11} {'activations MiB':>16} {'vs':>5} {'peak RSS MiB':>13} {'step s':>7} {'vs':>5} "
      f"{'MB/step':>8} {'vs':>5}")
for c, row in rows.items():
    base = rows[c.removesuffix("_p")]
    l = row["last"]
    print(f"{c:>11} {l['peak_activation_bytes'] / mib:>16.1f} "
          f"{l['peak_activation_bytes'] / base['last']['peak_activation_bytes']:>5.2f} "
          f"{l['peak_mem_bytes'] / mib:>13.1f} {row['time']:>7.3f} {row['time'] / base['time']:>5.2f} "
          f"{row['volume'] / 1e6:>8.1f} {row['volume'] / base['volume']:>5.2f}")
print("\nparallel.bucket_bytes at dp = 2 (megatron), step time:")
base = mean_time("b0")[0]
for b in ("0", "1048576", "65536"):
    t = mean_time("b" + b)[0]
    print(f"  bucket_bytes {b:>8}: {t:7.3f} s  {t / base:5.2f}x")
PY
