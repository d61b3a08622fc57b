#!/usr/bin/env bash
# The joint planner proved by measurement on this machine: for each model, link rate and memory
# limit, `oases plan` chooses a layout for two ranks from profiles measured here, then its
# choice, the ten best alternatives it lists and each schedule family's best are all trained
# in the same session, and the measured steps are ranked against the predicted ones.
#
#   models   GPT, LLaMA (grouped-query attention, SwiGLU, RMSNorm) and BERT, each 4 layers,
#            hidden 512, 8 heads, seq 256, byte vocabulary, global batch 8, fp32, one thread
#            per rank
#   rates    the two ranks talk over TCP on a loopback capped with tc (bench/capped_loopback.sh)
#            at each RATES Mbit/s; the planner is given clusters/this-machine-loopback.toml with
#            the link at RATE/16000 GB/s each way
#   profiles `oases profile` at tp 2 for every micro-batch (2, 4, 8), sub-batch count (1, 2)
#            and sequence-parallel setting that can run; the tensor-, data- and pipeline-
#            parallel layouts, schedules, recomputation and ZeRO stages they price are searched
#            (context parallelism is not: its profile would be another layout); activation
#            compression stays off (--fix parallel.activation_compression) unless COMPRESSION
#            is "search" (the profiles time its encode and decode passes)
#   limits   the cluster's device memory (no binding limit), then 60% of the predicted memory
#            of that choice (75% or 90% where nothing fits in 60%), given to the planner and
#            to every measured run as parallel.memory_limit (a run stops at start-up when its
#            plan does not fit)
#
# Each run trains STEPS steps; its step time is the median of the steps after the first. With
# ROUNDS 2 every candidate runs twice (the second round in reverse order) and the lesser
# median counts. Prints, per setting, the candidates by predicted step with their measured step
# and rank, the rank of the planner's choice among the measured (and how far it is from the
# best measured), and Spearman's rank correlation of predicted and measured; then a summary.
#   bash bench/run_joint_plan_measured.sh    (as root)
# Environment: RATES ["500 4000"], MODELS ["gpt llama bert"], LIMITS ["free tight"], STEPS [4],
# ROUNDS [1], COMPRESSION ["none": kept off; "search": chosen per layer like the rest]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
read -r -a rates <<<"${RATES:-500 4000}"
read -r -a models <<<"${MODELS:-gpt llama bert}"
read -r -a limits <<<"${LIMITS:-free tight}"
compression=${COMPRESSION:-none}
[[ $compression == none || $compression == search ]] ||
  { echo "COMPRESSION=$compression: valid: none, search" >&2; exit 2; }
steps=${STEPS:-4}
rounds=${ROUNDS:-1}
[[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns, tc)" >&2; exit 2; }
cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
bench_header "RATES=\"${rates[*]}\" MODELS=\"${models[*]}\" LIMITS=\"${limits[*]}\" STEPS=$steps ROUNDS=$rounds COMPRESSION=$compression bash bench/run_joint_plan_measured.sh"

work=$(mktemp -d)
ns=oases-joint-$$
trap 'capped_loopback_stop "$ns"; rm -rf "$work"' EXIT
"$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" \
  --tokenizer byte >/dev/null

write_model() {  # NAME: the model's config in $work/NAME.toml
  local arch=gpt vocab=256 kv=""
  case $1 in
    llama) arch=llama kv="kv_heads = 4" ;;
    bert) arch=bert vocab=260 ;;
  esac
  local ffn=2048
  [[ $1 == llama ]] && ffn=1376
  cat >"$work/$1.toml" <<EOF
[model]
arch = "$arch"
layers = 4
hidden = 512
heads = 8
$kv
ffn_hidden = $ffn
vocab_size = $vocab
seq_len = 256
dropout = 0.0

[train]
micro_batch = 4
global_batch = 8
steps = $steps
lr = 3e-4
threads = 1

[parallel]
tp = 2

[data]
tokenizer = "byte"
path = "$work/data"
EOF
}

# Profiles of MODEL at every micro-batch, sub-batch count and sequence-parallel setting that
# runs at tp 2 (a sub-batch must split over the two ranks); their paths in `profiles`.
profile_model() {
  local model=$1 rate=$2 mb sb sp
  profiles=()
  for mb in 2 4 8; do
    for sb in 1 2; do
      (((mb / sb) % 2 == 0)) || continue
      for sp in false true; do
        local out="$work/profile_${model}_${rate}_mb${mb}_sb${sb}_sp$sp.json"
        "${mpi[@]}" "$oases" profile --config "$work/$model.toml" --set train.micro_batch="$mb" \
          parallel.sub_batches="$sb" parallel.sequence_parallel="$sp" --output "$out" \
          --steps 3 >"$work/profile.log" 2>&1 ||
          { echo "profile $model mb $mb sb $sb sp $sp failed:"; tail -5 "$work/profile.log"; exit 1; }
        profiles+=(--profile "$out")
      done
    done
  done
}

# The candidates of a plan file, one per line: name|predicted step|summary|settings.
candidates_of() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))["report"]
listed = [report["chosen"]] + report["alternatives"] + list(report["best_of_family"].values())
seen = set()
for c in listed:
    key = tuple(sorted(c["settings"].items()))
    if key in seen:
        continue
    seen.add(key)
    settings = " ".join(f"{k}={v}" for k, v in c["settings"].items())
    print(f"c{len(seen) - 1}|{c['predicted_step_s']:.6f}|{c['summary']}|{settings}")
PY
}

# Trains every candidate of $work/$1.candidates (ROUNDS times) under the memory limit $2.
measure_candidates() {
  local setting=$1 limit=$2 round name predicted summary settings
  local -a order extra
  mapfile -t order <"$work/$setting.candidates"
  for ((round = 0; round < rounds; ++round)); do
    if ((round % 2 == 1)); then
      local -a reversed=()
      for ((i = ${#order[@]} - 1; i >= 0; --i)); do reversed+=("${order[i]}"); done
      order=("${reversed[@]}")
    fi
    for line in "${order[@]}"; do
      IFS='|' read -r name predicted summary settings <<<"$line"
      read -r -a extra <<<"$settings"
      "${mpi[@]}" "$oases" train --quiet --config "$work/${setting%%_*}.toml" --set "${extra[@]}" \
        parallel.memory_limit="$limit" train.steps="$steps" \
        log.metrics="\"$work/${setting}_${name}_r$round.jsonl\"" \
        >"$work/${setting}_${name}_r$round.log" 2>&1 ||
        { echo "train $setting $name ($summary) failed:"; tail -5 "$work/${setting}_${name}_r$round.log"; exit 1; }
    done
  done
}

# The table of one setting, and its line of the summary appended to $work/summary.
rank_setting() {
  /usr/bin/python3 - "$work" "$1" "$rounds" <<'PY'
import glob, json, statistics, sys
work, setting, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])

def median_step(path):
    steps = [r["step_time_s"] for r in map(json.loads, open(path)) if r["step"] > 0][1:]
    return statistics.median(steps)

def ranks(values):  # 1-based, ties share their mean rank
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out

def spearman(xs, ys):
    a, b = ranks(xs), ranks(ys)
    ma, mb = statistics.mean(a), statistics.mean(b)
    num = sum((p - ma) * (q - mb) for p, q in zip(a, b))
    den = (sum((p - ma) ** 2 for p in a) * sum((q - mb) ** 2 for q in b)) ** 0.5
    return num / den if den > 0 else float("nan")

rows = []
for line in open(f"{work}/{setting}.candidates"):
    name, predicted, summary, _ = line.rstrip("\n").split("|", 3)
    measured = min(median_step(f"{work}/{setting}_{name}_r{r}.jsonl") for r in range(rounds))
    rows.append((name, float(predicted), measured, summary))
measured_rank = ranks([r[2] for r in rows])
best = min(r[2] for r in rows)
print(f"## {setting}")
print("| candidate | predicted step s | measured step s | measured / predicted | measured rank |")
print("|---|---|---|---|---|")
for (name, predicted, measured, summary), rank in sorted(zip(rows, measured_rank), key=lambda x: x[0][1]):
    chosen = " (chosen)" if name == "c0" else ""
    print(f"| {summary}{chosen} | {predicted:.3f} | {measured:.3f} | {measured / predicted:.2f} | {rank:g} |")
rho = spearman([r[1] for r in rows], [r[2] for r in rows])
# Near-ties in the prediction are ordered by noise; pairs predicted more than 5% apart are not.
apart = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:] if max(a[1], b[1]) / min(a[1], b[1]) > 1.05]
ordered = sum((a[1] < b[1]) == (a[2] < b[2]) for a, b in apart)
choice_rank, choice_gap = measured_rank[0], rows[0][2] / best - 1
print(f"chosen: measured rank {choice_rank:g} of {len(rows)}, {100 * choice_gap:.1f}% above the best "
      f"measured; Spearman (predicted, measured) = {rho:.3f}; pairs predicted more than 5% apart "
      f"measured in the same order: {ordered} of {len(apart)}\n")
with open(f"{work}/summary", "a") as f:
    f.write(f"| {setting} | {rows[0][3]} | {len(rows)} | {choice_rank:g} | {100 * choice_gap:.1f}% | {rho:.3f} | {ordered} of {len(apart)} |\n")
PY
}

for rate in "${rates[@]}"; do
  capped_loopback_start "$ns" "$rate"
  mpi=("${mpi_capped[@]}")
  link=$(/usr/bin/python3 -c "print($rate / 16000)")
  for model in "${models[@]}"; do
    write_model "$model"
    profile_model "$model" "$rate"
    plan=("$oases" plan --config "$work/$model.toml" --cluster clusters/this-machine-loopback.toml
          --cluster-set tier.loopback.link_gbs="$link" "${profiles[@]}")
    [[ $compression == none ]] && plan+=(--fix parallel.activation_compression)
    "${plan[@]}" --output "$work/${model}_${rate}_free.plan.json" >"$work/${model}_${rate}_free.plan.txt"
    free_memory=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['report']['memory_limit_bytes'])" \
      "$work/${model}_${rate}_free.plan.json")
    chosen_memory=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['report']['chosen']['memory_bytes'])" \
      "$work/${model}_${rate}_free.plan.json")
    for fraction in 0.6 0.75 0.9; do
      tight=$(/usr/bin/python3 -c "print(int($chosen_memory * $fraction))")
      "${plan[@]}" --set parallel.memory_limit="$tight" --output "$work/${model}_${rate}_tight.plan.json" \
        >"$work/${model}_${rate}_tight.plan.txt" 2>&1 && break
      tight=""
    done
    for limit in "${limits[@]}"; do
      setting="${model}_${rate}_$limit"
      value=$free_memory
      [[ $limit == tight ]] && value=$tight
      [[ -n $value ]] || { echo "## $setting: nothing fits in 90% of the free choice's memory"; continue; }
      echo "# $setting: memory limit $value bytes; the plan:"
      sed 's/^/#   /' "$work/$setting.plan.txt"
      candidates_of "$work/$setting.plan.json" >"$work/$setting.candidates"
      measure_candidates "$setting" "$value"
      rank_setting "$setting"
    done
  done
  capped_loopback_stop "$ns"
done

echo "## summary"
echo "| model_rate_limit | chosen | candidates measured | chosen's measured rank | chosen above best | Spearman | pairs > 5% apart in order |"
echo "|---|---|---|---|---|---|---|"
cat "$work/summary"
