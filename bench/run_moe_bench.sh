#!/usr/bin/env bash
# Mixture of experts against the dense GPT with the same active FLOPs per token, one process,
# side by side, on the step-benchmark model (configs/bench.toml: GPT, 6 layers, hidden 512,
# ffn 2048, seq 256, vocab 50304, micro-batch 8, fp32), every other layer an MoE layer of 8
# experts:
#   dense      the model as it is
#   gshard     top-2 of experts 1024 wide (2 x 1024 = the dense 2048 per token)
#   switch     top-1 of experts 2048 wide
#   noisy      noisy top-2 of experts 1024 wide
# capacity_factor 2 (few tokens dropped, so each token really costs its active FLOPs).
# Tokens/s is the mean of steps 2..S; configurations alternate round by round.
#
# Then expert parallelism, ep = dp = 2 (two ranks over TCP on a loopback capped at each of
# RATES Mbit/s, bench/capped_loopback.sh), a smaller GPT (4 layers, hidden 256, seq 128, vocab 4096,
# micro-batch 8; every other layer 8 gshard experts of 512, capacity factor 1.25): the
# megatron schedule (one sub-batch: each all-to-all blocks the compute lane) against
# cross-pass without recomputation (the same compute in two sub-batches: one's all-to-all
# travels while the other computes) and oases (cross-pass with fine-grained recomputation),
# side by side: step time and the compute lane's wait on the all-to-alls (exposed_a2a_s) as a
# share of their time on the wire (a2a_s), means of steps 2..S.
#   bash bench/run_moe_bench.sh [S=6] [ROUNDS=2] [RATES="1000 300"] [PARTS="1 2"]
# Needs root (ip netns) for the second part.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
bench_steps=${1:-6}
rounds=${2:-2}
rates=${3:-"1000 300"}
parts=${4:-"1 2"}
configs=(dense gshard switch noisy)
settings() {
  local moe="model.moe_every=2 model.experts=8 model.capacity_factor=2.0"
  case $1 in
    dense) echo "" ;;
    gshard) echo "$moe model.moe_gate=\"gshard\" model.moe_ffn_hidden=1024" ;;
    switch) echo "$moe model.moe_gate=\"switch\" model.moe_ffn_hidden=2048" ;;
    noisy) echo "$moe model.moe_gate=\"noisy-topk\" model.moe_top_k=2 model.moe_ffn_hidden=1024" ;;
  esac
}

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
out=$(mktemp -d)
ns=oases_moe_bench
trap 'capped_loopback_stop $ns; rm -rf "$out"' EXIT
bench_header "bash bench/run_moe_bench.sh $*"

data="$out/data"
$oases prepare-data --input /usr/share/games/fortunes/fortunes --output "$data" >/dev/null
common=(data.path="\"$data\"" checkpoint.dir='""' log.trace='""' log.every=1000000)
if [[ " $parts " == *" 1 "* ]]; then
for round in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    "$oases" train --quiet --config configs/bench.toml --set train.steps="$bench_steps" \
      $(settings "$c") log.metrics="\"$out/${c}_$round.jsonl\"" "${common[@]}" \
      >/dev/null 2>"$out/${c}_$round.log"
  done
done

/usr/bin/python3 - "$out" "$rounds" "${configs[@]}" <<'PY'
import json, statistics, sys
out, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def steps(name, r):
    return [json.loads(l) for l in open(f"{out}/{name}_{r}.jsonl") if l.strip() and json.loads(l)["step"] >= 2]
rows = {}
for c in configs:
    rates, dropped, flops = [], [], []
    for r in range(1, rounds + 1):
        rs = steps(c, r)
        rates.append(statistics.mean(x["tokens_per_s"] for x in rs))
        dropped.append(statistics.mean(x.get("moe_dropped_fraction", 0) for x in rs))
        flops.append(rs[-1]["model_tflops"] * 1e12 / rs[-1]["tokens_per_s"])
    rows[c] = dict(rate=statistics.mean(rates), dropped=statistics.mean(dropped), flops=flops[-1])
base = rows["dense"]
print("step-benchmark model, one process; MoE: every other layer, 8 experts, capacity factor 2")
print(f"{'config':>8} {'tokens/s':>10} {'vs dense':>9} {'GFLOP/token':>12} {'dropped':>8}")
for c, row in rows.items():
    print(f"{c:>8} {row['rate']:>10.0f} {row['rate'] / base['rate']:>9.2f} {row['flops'] / 1e9:>12.3f} "
          f"{100 * row['dropped']:>7.1f}%")
PY
fi
[[ " $parts " == *" 2 "* ]] || exit 0

ep_common=(model.layers=4 model.hidden=256 model.heads=4 model.ffn_hidden=1024 model.seq_len=128 model.vocab_size=4096
           model.moe_every=2 model.experts=8 model.moe_gate=\"gshard\" model.moe_ffn_hidden=512
           model.capacity_factor=1.25 train.micro_batch=8 train.global_batch=16 parallel.dp=2
           parallel.ep=2 train.threads=1)
for rate in $rates; do
  capped_loopback_start $ns "$rate"
  for round in $(seq 1 "$rounds"); do
    for schedule in megatron cross-pass oases; do
      subs=2 recompute=auto
      [[ $schedule == megatron ]] && subs=1
      [[ $schedule == cross-pass ]] && recompute=none
      "${mpi_capped[@]}" "$oases" train --quiet --config configs/bench.toml --set \
        train.steps="$bench_steps" "${ep_common[@]}" parallel.schedule=\"$schedule\" \
        parallel.recompute=\"$recompute\" parallel.sub_batches=$subs log.metrics="\"$out/ep_${schedule}_${rate}_$round.jsonl\"" \
        "${common[@]}" >/dev/null 2>"$out/ep_${schedule}_${rate}_$round.log"
    done
  done
  capped_loopback_stop $ns
done

/usr/bin/python3 - "$out" "$rounds" $rates <<'PY'
import json, statistics, sys
out, rounds, rates = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def mean(name, key):
    values = []
    for r in range(1, rounds + 1):
        rs = [json.loads(l) for l in open(f"{out}/{name}_{r}.jsonl") if l.strip()]
        values.append(statistics.mean(x[key] for x in rs if x["step"] >= 2))
    return statistics.mean(values)
print("\nexpert parallelism, ep = dp = 2 over a capped loopback (rank 0's figures):")
print(f"{'Mbit/s':>7} {'schedule':>9} {'step s':>7} {'vs':>5} {'a2a wire s':>10} {'a2a waited s':>12} {'exposed':>8}")
for rate in rates:
    base = mean(f"ep_megatron_{rate}", "step_time_s")
    for schedule in ("megatron", "cross-pass", "oases"):
        name = f"ep_{schedule}_{rate}"
        step, wire, waited = (mean(name, k) for k in ("step_time_s", "a2a_s", "exposed_a2a_s"))
        print(f"{rate:>7} {schedule:>9} {step:>7.3f} {step / base:>5.2f} {wire:>10.3f} {waited:>12.3f} "
              f"{waited / wire if wire > 0 else 0:>8.0%}")
PY
