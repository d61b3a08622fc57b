#!/usr/bin/env bash
# The cluster simulator against published Megatron-LM measurements on DGX A100 clusters
# (clusters/dgx-a100.toml: Selene-like, 80 GB A100s, 8 HDR NICs per node).
#
# 1. Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
#    Using Megatron-LM" (arXiv 2104.04473), Table 1: GPT models of 1.7B to 1T parameters,
#    seq 2048, vocabulary 51200, full activation recomputation, mixed precision; the achieved
#    teraFLOP/s per GPU counts 96 B s l h^2 (1 + s / 6h + V / 16 l h) FLOPs per step (the
#    paper's formula, recomputation included). The table states no micro-batch size: 1 is
#    assumed (Megatron's choice for its pipelined runs). Each row is simulated with the 1F1B
#    schedule and, where the layers split evenly into two chunks per stage, the interleaved one.
#    Hidden and attention dropout 0.1, Megatron-LM's defaults (the attention probabilities'
#    dropout is a kernel of its own there, priced by its memory traffic).
# 2. Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
#    (arXiv 2205.05198), Table 5: iteration time with full recomputation (its baseline column)
#    and with selective recomputation and sequence parallelism (its "present work" column),
#    configurations of its Table 3. Selective recomputation without sequence parallelism is
#    printed beside them for reference, not compared.
#
# Calibration: the cluster file's device and link figures come from microbenchmarks (cuBLAS
# GEMM sweeps and nccl-tests bus bandwidth, see its description), never from these rows, so
# every row below is held out.
#   bash bench/run_published_validation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
bench_header "bash bench/run_published_validation.sh $*"
cluster=clusters/dgx-a100.toml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/gpt.toml" <<EOF
[model]
vocab_size = 51200
seq_len = 2048
dropout = 0.1
attention_dropout = 0.1
[train]
micro_batch = 1
precision = "bf16"
[parallel]
schedule = "megatron"
recompute = "full"
EOF

# simulate LAYERS HIDDEN HEADS TP PP GPUS BATCH MICRO PIPELINE V RECOMPUTE [SP] -> step seconds
simulate() {
  local layers=$1 hidden=$2 heads=$3 tp=$4 pp=$5 gpus=$6 batch=$7 micro=$8 pipeline=$9 v=${10} recompute=${11}
  local sp=${12:-false}
  local dp=$((gpus / (tp * pp)))
  OMP_NUM_THREADS=1 "$oases" simulate --config "$work/gpt.toml" --cluster "$cluster" --set \
    model.layers="$layers" model.hidden="$hidden" model.heads="$heads" \
    model.ffn_hidden=$((4 * hidden)) train.micro_batch="$micro" train.global_batch="$batch" \
    parallel.tp="$tp" parallel.pp="$pp" parallel.dp="$dp" parallel.pipeline="\"$pipeline\"" \
    parallel.virtual_stages="$v" parallel.recompute="\"$recompute\"" \
    parallel.sequence_parallel="$sp" |
    sed -n 's/^simulated step \([0-9.]*\) s.*/\1/p'
}

echo
echo "Narayanan et al. 2021, Table 1 (teraFLOP/s per GPU; every row held out)"
printf '%-8s %-10s %6s %6s %8s %10s %10s %8s %12s %8s\n' params "layout" GPUs batch \
  published "1F1B" "error" "interl." "error" held-out
errors=()
while read -r params heads hidden layers tp pp gpus batch published; do
  flops=$(echo "96 * $batch * 2048 * $layers * $hidden^2 * (1 + 2048 / (6 * $hidden) + 51200 / (16 * $layers * $hidden))" | bc -l)
  pipeline=1f1b
  [[ $pp -gt 1 ]] || pipeline=1f1b
  step=$(simulate "$layers" "$hidden" "$heads" "$tp" "$pp" "$gpus" "$batch" 1 1f1b 1 full)
  tf=$(echo "$flops / ($step * $gpus) / 10^12" | bc -l)
  err=$(echo "100 * ($tf - $published) / $published" | bc -l)
  errors+=("$err")
  itf="-"; ierr="-"
  if [[ $pp -gt 1 && $((layers % (2 * pp))) -eq 0 ]]; then
    istep=$(simulate "$layers" "$hidden" "$heads" "$tp" "$pp" "$gpus" "$batch" 1 interleaved 2 full)
    itf=$(printf '%.1f' "$(echo "$flops / ($istep * $gpus) / 10^12" | bc -l)")
    ierr=$(printf '%+.1f%%' "$(echo "100 * ($itf - $published) / $published" | bc -l)")
  fi
  printf '%-8s %-10s %6s %6s %8s %10.1f %9.1f%% %8s %12s %8s\n' "$params" "t$tp p$pp" "$gpus" \
    "$batch" "$published" "$tf" "$err" "$itf" "$ierr" yes
done <<'ROWS'
1.7B 24 2304 24 1 1 32 512 137
3.6B 32 3072 30 2 1 64 512 138
7.5B 32 4096 36 4 1 128 512 142
18.4B 48 6144 40 8 1 256 1024 135
39.1B 64 8192 48 8 2 512 1536 138
76.1B 80 10240 60 8 4 1024 1792 140
145.6B 96 12288 80 8 8 1536 2304 148
310.1B 128 16384 96 8 16 1920 2160 155
529.6B 128 20480 105 8 35 2520 2520 163
1008.0B 160 25600 128 8 64 3072 3072 163
ROWS
printf '%s\n' "${errors[@]}" | awk '{s += ($1 < 0 ? -$1 : $1); n++} END {printf "1F1B mean absolute error %.1f%% over %d rows\n", s / n, n}'

echo
echo "Korthikanti et al. 2022, Table 5 (seconds per iteration; every row held out): full"
echo "recomputation, and selective recomputation with sequence parallelism (\"present work\")"
printf '%-6s %-10s %6s %6s %6s %9s %9s %7s %9s %9s %7s %14s\n' model layout GPUs batch micro \
  "full pub." simulated error "sp pub." simulated error "selective (ref)"
sp_errors=()
while read -r name heads hidden layers tp pp gpus batch micro published present; do
  step=$(simulate "$layers" "$hidden" "$heads" "$tp" "$pp" "$gpus" "$batch" "$micro" 1f1b 1 full)
  sp=$(simulate "$layers" "$hidden" "$heads" "$tp" "$pp" "$gpus" "$batch" "$micro" 1f1b 1 selective true)
  selective=$(simulate "$layers" "$hidden" "$heads" "$tp" "$pp" "$gpus" "$batch" "$micro" 1f1b 1 selective)
  err=$(echo "100 * ($step - $published) / $published" | bc -l)
  sperr=$(echo "100 * ($sp - $present) / $present" | bc -l)
  sp_errors+=("$sperr")
  printf '%-6s %-10s %6s %6s %6s %9s %9.2f %6.1f%% %9s %9.2f %6.1f%% %14.2f\n' "$name" "t$tp p$pp" \
    "$gpus" "$batch" "$micro" "$published" "$step" "$err" "$present" "$sp" "$sperr" "$selective"
done < <(grep -v '^#' bench/korthikanti_table5.txt)
printf '%s\n' "${sp_errors[@]}" | awk '{a = ($1 < 0 ? -$1 : $1); s += a; if (a > m) m = a; n++} END {printf "selective + sequence parallelism: mean absolute error %.1f%%, largest %.1f%%, over %d rows\n", s / n, m, n}'
