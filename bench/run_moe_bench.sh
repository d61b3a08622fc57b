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
#   bash bench/run_moe_bench.sh [S=6] [ROUNDS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
bench_steps=${1:-6}
rounds=${2:-2}
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
trap 'rm -rf "$out"' EXIT
bench_header "bash bench/run_moe_bench.sh $*"

data="$out/data"
$oases prepare-data --input /usr/share/games/fortunes/fortunes --output "$data" >/dev/null
common=(data.path="\"$data\"" checkpoint.dir='""' log.trace='""' log.every=1000000)
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
