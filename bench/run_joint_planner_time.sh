#!/usr/bin/env bash
# The joint planner's wall time (`oases plan --cluster`, cluster/joint_plan.h) at 8, 64 and 1024
# simulated GPUs of clusters/dgx-a100.toml: every global choice and per-layer policy of
#   8 GPUs     GPT 24 x 2048 (seq 2048, global batch 64)
#   64 GPUs    GPT 96 x 4096 (seq 2048, global batch 512): the 96-layer, 64-rank target
#   1024 GPUs  GPT-3 175B, 96 x 12288 (seq 2048, global batch 1536)
# each in bf16, with the search's counts (global choices, priced, simulations) and its choice.
#   bash bench/run_joint_planner_time.sh
# Environment (defaults in brackets):
#   SIZES           which of 8 64 1024 to run [8 64 1024]
#   MAX_MICRO_BATCH --max-micro-batch [0: any]
#   TIME_LIMIT      seconds after which a search is stopped and reported as such [1800]
#   SKIP_BUILD      1: use the existing build/release/oases as it is [0]
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a sizes <<<"${SIZES:-8 64 1024}"
max_micro_batch=${MAX_MICRO_BATCH:-0}
time_limit=${TIME_LIMIT:-1800}

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target oases >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

config() {  # layers hidden heads global_batch tp dp pp (any valid layout of the world)
  cat <<EOF
[model]
layers = $1
hidden = $2
heads = $3
ffn_hidden = $((4 * $2))
vocab_size = 51200
seq_len = 2048
[train]
micro_batch = 1
global_batch = $4
precision = "bf16"
[parallel]
tp = $5
dp = $6
pp = $7
EOF
}

echo "joint planner wall time on $(nproc) cores of $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)"
for size in "${sizes[@]}"; do
  case $size in
    8) config 24 2048 16 64 8 1 1 >"$work/c.toml" ;;
    64) config 96 4096 32 512 8 8 1 >"$work/c.toml" ;;
    1024) config 96 12288 96 1536 8 16 8 >"$work/c.toml" ;;
    *) echo "SIZES: $size is not one of 8 64 1024" >&2; exit 2 ;;
  esac
  start=$(date +%s.%N)
  status=0
  timeout "$time_limit" build/release/oases plan --config "$work/c.toml" \
    --cluster clusters/dgx-a100.toml --max-micro-batch "$max_micro_batch" >"$work/out.txt" 2>&1 ||
    status=$?
  end=$(date +%s.%N)
  wall=$(echo "$end - $start" | bc)
  if [[ $status == 124 ]]; then
    printf '%5s GPUs: stopped after %s s (TIME_LIMIT)\n' "$size" "$time_limit"
    continue
  fi
  printf '%5s GPUs: %8.2f s wall  %s\n' "$size" "$wall" "$(head -1 "$work/out.txt")"
  sed -n '/^chosen layout:/,/^  layer/p' "$work/out.txt" | grep -v '^  layer' | sed 's/^/        /'
  grep '^predicted step' "$work/out.txt" | sed 's/^/        /' || sed 's/^/        /' "$work/out.txt"
done
