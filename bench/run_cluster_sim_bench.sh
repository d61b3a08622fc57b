#!/usr/bin/env bash
# Wall time of `oases simulate --cluster` for a GPT-175B-class model (96 layers, hidden 12288,
# 96 heads, seq 2048, vocab 51200, bf16, micro-batch 1, full recomputation, megatron schedule,
# 1F1B) on DGX A100 clusters of 8, 64, 1024 and 4096 GPUs (clusters/dgx-a100.toml, resized with
# --cluster-set where 384 nodes are too few):
#     8 GPUs   tp 8               global batch 16
#    64 GPUs   tp 8 x pp 8        global batch 512
#  1024 GPUs   tp 8 x pp 16 x dp 8  global batch 1536 (192 micro-batches per pipeline)
#  4096 GPUs   tp 8 x pp 16 x dp 32 global batch 6144 (192 micro-batches per pipeline)
# and 64 GPUs with --every-rank (no folding) beside the folded run. Each case runs R times; the
# best wall time is printed with the predicted step. One process, one thread.
#   bash bench/run_cluster_sim_bench.sh [R=3]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
repeats=${1:-3}
cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
bench_header "bash bench/run_cluster_sim_bench.sh $*"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/gpt175b.toml" <<EOF
[model]
layers = 96
hidden = 12288
heads = 96
ffn_hidden = 49152
vocab_size = 51200
seq_len = 2048
dropout = 0.0
[train]
micro_batch = 1
global_batch = 1536
precision = "bf16"
[parallel]
tp = 8
schedule = "megatron"
recompute = "full"
pipeline = "1f1b"
EOF

# case: label, extra arguments
run_case() {
  local label=$1; shift
  local best=999 out step
  for ((i = 0; i < repeats; ++i)); do
    local start end
    start=$(date +%s.%N)
    out=$(OMP_NUM_THREADS=1 "$oases" simulate --config "$work/gpt175b.toml" "$@")
    end=$(date +%s.%N)
    best=$(echo "$end - $start" | bc -l | awk -v b="$best" '{print ($1 < b) ? $1 : b}')
  done
  step=$(echo "$out" | sed -n 's/^simulated step \([0-9.]*\) s.*/\1/p')
  mfu=$(echo "$out" | sed -n 's/.*MFU \([0-9.]*%\).*/\1/p')
  printf '%-34s %10.3f %12s %8s\n' "$label" "$best" "$step" "$mfu"
}
printf '%-34s %10s %12s %8s\n' "case" "wall s" "step s" "MFU"
a100=clusters/dgx-a100.toml
run_case "8 GPUs (tp 8)" --cluster "$a100" --set parallel.pp=1 parallel.dp=1 train.global_batch=16
run_case "64 GPUs (tp 8 pp 8)" --cluster "$a100" --set parallel.pp=8 parallel.dp=1 train.global_batch=512
run_case "64 GPUs, every rank" --cluster "$a100" --every-rank --set parallel.pp=8 parallel.dp=1 train.global_batch=512
run_case "1024 GPUs (tp 8 pp 16 dp 8)" --cluster "$a100" --set parallel.pp=16 parallel.dp=8 train.global_batch=1536
run_case "4096 GPUs (tp 8 pp 16 dp 32)" --cluster "$a100" \
  --cluster-set topology.nodes=512 tier.infiniband.span=4096 \
  --set parallel.pp=16 parallel.dp=32 train.global_batch=6144
