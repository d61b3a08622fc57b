#!/usr/bin/env bash
# The joint planner (`oases plan --cluster`) on the published settings, against the layouts
# the papers ran, all simulated on the same cluster descriptions:
#   1. The Oases paper's GPT models on 32 RTX 3090s (clusters/rtx3090-nvlink.toml and
#      rtx3090-pcie.toml): the five tensor-parallel models of bench/run_oases_3090_prediction.sh
#      (seq 1024, vocabulary 50257, heads = hidden / 64, dropout 0.1, fp16, micro-batch 8, 8
#      micro-batches per data-parallel rank) and its two pipeline models, GPT-18.4B (hidden 6144,
#      40 layers, 48 heads) and GPT-39.1B (hidden 8192, 48 layers, 64 heads), in Megatron-LM's
#      shapes, at tp 8 with pp 2 and 4. Megatron-LM's layout: the megatron schedule, full
#      recomputation, the paper's tensor-parallel degree (and pipeline degree, 1F1B), data
#      parallelism for the rest.
#   2. Korthikanti et al. 2022, Table 5 (clusters/dgx-a100.toml): the 22B and 175B models in
#      their published layouts (t8 p1 and t8 p8; full recomputation, and selective with
#      sequence parallelism, their "present work"), against the joint plan for the same world,
#      batch and memory; 530B and 1T keep tp and pp as published (their worlds of 280 and 512
#      GPUs are past what the search covers in time) and search the rest.
# The joint plan keeps activation compression off (--fix parallel.activation_compression):
# the papers' runs compute in full precision. Prints, per model, the baseline's simulated step,
# the joint plan's predicted step, the speedup and the chosen layout.
#   bash bench/run_joint_plan_papers.sh
# Environment: SKIP_BUILD=1 uses build/release/oases as it is; PARTS="1 2" which parts to run;
# TIME_LIMIT seconds per search (default 600).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
read -r -a parts <<<"${PARTS:-1 2}"
time_limit=${TIME_LIMIT:-600}
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target oases >/dev/null
fi
oases=$PWD/build/release/oases
bench_header "bash bench/run_joint_plan_papers.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# config FILE layers hidden heads seq vocab micro global tp pp dp precision dropout
config() {
  cat >"$1" <<EOF
[model]
layers = $2
hidden = $3
heads = $4
ffn_hidden = $((4 * $3))
seq_len = $5
vocab_size = $6
dropout = ${13}
attention_dropout = ${13}
[train]
micro_batch = $7
global_batch = $8
precision = "${12}"
[parallel]
tp = $9
pp = ${10}
dp = ${11}
EOF
}

# baseline FILE CLUSTER schedule recompute [sp] -> seconds ("*" when a rank does not fit)
baseline() {
  local out seconds
  out=$(OMP_NUM_THREADS=1 "$oases" simulate --config "$1" --cluster "clusters/$2.toml" --set \
    parallel.schedule="\"$3\"" parallel.recompute="\"$4\"" parallel.pipeline='"1f1b"' \
    parallel.sequence_parallel="${5:-false}" 2>&1) || { echo "error"; return; }
  seconds=$(echo "$out" | sed -n 's/^simulated step \([0-9.]*\) s.*/\1/p')
  if echo "$out" | grep -q "does not fit"; then echo "${seconds}*"; else echo "$seconds"; fi
}

# joint FILE CLUSTER [--fix KEY ...] -> "seconds|summary|search seconds", or "-|reason|"
joint() {
  local file=$1 cluster=$2
  shift 2
  local status=0
  timeout "$time_limit" "$oases" plan --config "$file" --cluster "clusters/$cluster.toml" \
    --fix parallel.activation_compression "$@" --output "$work/plan.json" >"$work/plan.txt" 2>&1 ||
    status=$?
  if [[ $status == 124 ]]; then
    echo "-|search stopped after ${time_limit} s|"
  elif [[ $status != 0 ]]; then
    echo "-|$(head -c 200 "$work/plan.txt" | tr '\n' ' ')|"
  else
    /usr/bin/python3 - "$work/plan.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))["report"]
chosen = report["chosen"]
print(f'{chosen["predicted_step_s"]:.3f}|{chosen["summary"]}|{report["search_s"]:.1f}')
EOF
  fi
}

row() {  # name baseline joint-line
  local name=$1 base=$2 line=$3
  local seconds=${line%%|*} rest=${line#*|}
  local summary=${rest%|*} took=${rest##*|}
  local speedup="-"
  if [[ $seconds != "-" && $base != "error" ]]; then
    speedup=$(printf '%.2fx' "$(echo "${base%\*} / $seconds" | bc -l)")
  fi
  printf '%-12s %10s %10s %8s %7s  %s\n' "$name" "$base" "$seconds" "$speedup" "${took:+$took s}" "$summary"
}

if [[ " ${parts[*]} " == *" 1 "* ]]; then
  for cluster in rtx3090-nvlink rtx3090-pcie; do
    echo
    echo "$cluster: Megatron-LM's layout (megatron, full recomputation) against the joint plan"
    echo "(step seconds; * = a rank of the baseline does not fit 24 GiB)"
    printf '%-12s %10s %10s %8s %7s  %s\n' model megatron joint speedup search chosen
    while read -r name hidden layers tp pp; do
      dp=$((32 / tp / pp))
      config "$work/c.toml" "$layers" "$hidden" $((hidden / 64)) 1024 50257 8 $((64 * dp)) \
        "$tp" "$pp" "$dp" fp16 0.1
      [[ $name == GPT-18.4B ]] && sed -i 's/^heads = .*/heads = 48/' "$work/c.toml"
      row "$name" "$(baseline "$work/c.toml" "$cluster" megatron full)" \
        "$(joint "$work/c.toml" "$cluster")"
    done <<'ROWS'
h1024x24 1024 24 4 1
h2048x24 2048 24 4 1
h4096x16 4096 16 4 1
h8192x8 8192 8 8 1
h12288x4 12288 4 8 1
GPT-18.4B 6144 40 8 2
GPT-39.1B 8192 48 8 4
ROWS
  done
fi

if [[ " ${parts[*]} " == *" 2 "* ]]; then
  echo
  echo "dgx-a100: Korthikanti et al. 2022, Table 5 layouts against the joint plan (bf16, seq 2048,"
  echo "vocabulary 51200; published seconds: full recomputation / selective + sequence parallelism)"
  printf '%-12s %10s %10s %8s %7s  %s\n' model "pub.layout" joint speedup search chosen
  while read -r name heads hidden layers tp pp gpus batch micro published present; do
    dp=$((gpus / tp / pp))
    config "$work/c.toml" "$layers" "$hidden" "$heads" 2048 51200 "$micro" "$batch" "$tp" "$pp" \
      "$dp" bf16 0.1
    full=$(baseline "$work/c.toml" dgx-a100 megatron full)
    sp=$(baseline "$work/c.toml" dgx-a100 megatron selective true)
    echo "$name: published layout t$tp p$pp, simulated $full s full (published $published), $sp s selective + sp (published $present)"
    fixes=()
    if ((gpus > 64)); then fixes=(--fix parallel.tp --fix parallel.pp); fi
    row "$name" "$sp" "$(joint "$work/c.toml" dgx-a100 "${fixes[@]}")"
  done < <(grep -v '^#' bench/korthikanti_table5.txt)
  echo "(speedup against the published layout's best, selective recomputation with sequence parallelism)"
fi
