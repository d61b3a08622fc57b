#!/usr/bin/env bash
# The Oases paper's setting on its two 3090 clusters, simulated: 32 RTX 3090s, 4 per server,
# with NVLink bridges between pairs (clusters/rtx3090-nvlink.toml) and with PCIe only
# (clusters/rtx3090-pcie.toml). GPT models of seq 1024, vocabulary 50257, heads = hidden / 64,
# from hidden 1024 x 24 layers to hidden 12288 x 4 layers, fp16, micro-batch 8, one micro-batch
# per data-parallel rank per step. Tensor-parallel degree: 4 (one server, the fastest links) up to
# hidden 4096; 8 (two servers) for hidden 8192 and 12288, which the paper too spreads over two
# servers for its largest models (a quarter of their weights and optimizer state per GPU would
# not fit 24 GiB beside the activations). Data parallelism takes the rest of the 32 GPUs.
# Hidden and attention dropout 0.1 (Megatron-LM's defaults). Megatron: the megatron schedule
# with full recomputation; Oases: the oases schedule (two
# sub-batches offset, fine-grained recomputation). The paper reports Oases up to 1.63x
# (NVLink bridges) and 1.95x (PCIe only) faster than Megatron-LM.
#   bash bench/run_oases_3090_prediction.sh
set -euo pipefail
ACCUMULATE=${1:-8}
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
bench_header "bash bench/run_oases_3090_prediction.sh $*"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/gpt.toml" <<EOF
[model]
vocab_size = 50257
seq_len = 1024
dropout = 0.1
attention_dropout = 0.1
[train]
micro_batch = 8
precision = "fp16"
EOF
step() {  # cluster hidden layers tp schedule recompute -> step seconds, or "does-not-fit"
  local out
  out=$(OMP_NUM_THREADS=1 "$oases" simulate --config "$work/gpt.toml" --cluster "clusters/$1.toml" --set \
    model.hidden="$2" model.heads=$(($2 / 64)) model.ffn_hidden=$((4 * $2)) model.layers="$3" \
    parallel.tp="$4" parallel.dp=$((32 / $4)) train.global_batch=$((8 * ACCUMULATE * 32 / $4)) \
    parallel.schedule="\"$5\"" parallel.recompute="\"$6\"")
  local seconds
  seconds=$(echo "$out" | sed -n 's/^simulated step \([0-9.]*\) s.*/\1/p')
  if echo "$out" | grep -q "does not fit"; then echo "${seconds}*"; else echo "$seconds"; fi
}
for cluster in rtx3090-nvlink rtx3090-pcie; do
  echo
  echo "$cluster (step seconds; * = a rank does not fit 24 GiB)"
  printf '%-14s %4s %12s %12s %10s\n' model tp megatron oases speedup
  while read -r hidden layers tp; do
    m=$(step "$cluster" "$hidden" "$layers" "$tp" megatron full)
    o=$(step "$cluster" "$hidden" "$layers" "$tp" oases fine-grained)
    printf '%-14s %4s %12s %12s %9.2fx\n' "h$hidden x $layers" "$tp" "$m" "$o" \
      "$(echo "${m%\*} / ${o%\*}" | bc -l)"
  done <<'ROWS'
1024 24 4
2048 24 4
4096 16 4
8192 8 8
12288 4 8
ROWS
done
