#!/usr/bin/env bash
# The cluster simulator against real runs on this machine: two CPU ranks over TCP on a loopback
# capped with tc (bench/capped_loopback.sh), described by clusters/this-machine-loopback.toml
# with half the cap's rate as each direction's link (--cluster-set tier.loopback.link_gbs; tc
# shapes both directions of the loopback together, see the cluster file) and compute from
# `oases profile` (each family of configs profiled under the cap of each rate it runs at, on both
# ranks at once, as the runs compute; the overlapped family's profile measures how compute and
# communication slow each other from steps of its oases schedule, which also stand for the
# cross-pass schedule and the mixed plan).
# Model: configs/overlap.toml (GPT 6 layers, hidden 1024, 16 heads, seq 256, byte vocabulary,
# fp32, micro-batch 4); one thread per rank. Configurations:
#   tp 2 under megatron (full recomputation), fine-grained, cross-pass and oases, at RATE1 and
#     RATE2 Mbit/s (8)
#   dp 2 (tp 1, micro-batch 2), pp 2 with 1f1b and with gpipe (tp 1, 4 micro-batches of 2),
#     a mixed plan (tp 2, layers at degrees 1,2,1,2,1,2, oases), ep 2 (layers 1, 3, 5 mixture
#     of experts, 4 gshard experts, dp = ep = 2), at RATE1 (5)
# For each: `oases simulate --cluster` predicts the step, `oases train` measures it (median of
# STEPS steps after the first). The host is shared and its speed drifts by 10-30% over minutes,
# so the whole sequence (profiles, predictions, runs) is repeated ROUNDS times, one round after
# the other, and each configuration's prediction and measurement are the medians over the
# rounds. Prints both with the spread of the rounds, the error of each, the mean absolute
# percentage error and Spearman's rank correlation (of the medians, and of each round alone).
#   bash bench/run_cluster_validation.sh [RATE1=800] [RATE2=300] [STEPS=5] [ROUNDS=3]  (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
rate1=${1:-800}
rate2=${2:-300}
steps=${3:-5}
rounds=${4:-3}
[[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns, tc)" >&2; exit 2; }
cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
bench_header "bash bench/run_cluster_validation.sh $*"
work=$(mktemp -d)
ns=oases-cluster-validation-$$
trap 'capped_loopback_stop "$ns"; rm -rf "$work"' EXIT
"$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" \
  --tokenizer byte >/dev/null
common=(--config configs/overlap.toml --set train.threads=1 data.path="\"$work/data\"")
moe='model.moe_every=2 model.experts=4 model.moe_gate="gshard"'

# name | profile family | rate | settings
cases=$(cat <<EOF
tp2-megatron|tp2-sb1|$rate1|parallel.schedule="megatron" parallel.recompute="full"
tp2-fine-grained|tp2-sb1|$rate1|parallel.schedule="fine-grained"
tp2-cross-pass|tp2-sb2|$rate1|parallel.schedule="cross-pass" parallel.sub_batches=2
tp2-oases|tp2-sb2|$rate1|parallel.schedule="oases" parallel.sub_batches=2
tp2-megatron|tp2-sb1|$rate2|parallel.schedule="megatron" parallel.recompute="full"
tp2-fine-grained|tp2-sb1|$rate2|parallel.schedule="fine-grained"
tp2-cross-pass|tp2-sb2|$rate2|parallel.schedule="cross-pass" parallel.sub_batches=2
tp2-oases|tp2-sb2|$rate2|parallel.schedule="oases" parallel.sub_batches=2
dp2|tp1-mb2|$rate1|parallel.tp=1 parallel.dp=2 train.micro_batch=2 train.global_batch=4 parallel.schedule="megatron" parallel.recompute="none"
pp2-1f1b|tp1-mb2|$rate1|parallel.tp=1 parallel.pp=2 train.micro_batch=2 train.global_batch=8 parallel.pipeline="1f1b" parallel.schedule="megatron" parallel.recompute="none"
pp2-gpipe|tp1-mb2|$rate1|parallel.tp=1 parallel.pp=2 train.micro_batch=2 train.global_batch=8 parallel.pipeline="gpipe" parallel.schedule="megatron" parallel.recompute="none"
mixed-plan|tp2-sb2|$rate1|parallel.schedule="oases" parallel.sub_batches=2 parallel.plan="1,2,1,2,1,2"
ep2|ep2|$rate1|$moe parallel.tp=1 parallel.dp=2 parallel.ep=2 train.micro_batch=4 train.global_batch=8 parallel.schedule="megatron" parallel.recompute="none"
EOF
)
declare -A family=(
  [tp2-sb1]='parallel.schedule="megatron" parallel.recompute="full"'
  [tp2-sb2]='parallel.schedule="oases" parallel.sub_batches=2'
  [tp1-mb2]='parallel.tp=1 train.micro_batch=2 train.global_batch=2 parallel.schedule="megatron" parallel.recompute="none"'
  [ep2]="$moe"' parallel.tp=1 parallel.dp=2 parallel.ep=2 train.global_batch=8 parallel.schedule="megatron" parallel.recompute="none"'
)

current_rate=""
run_capped() {  # rate, command...
  local rate=$1; shift
  if [[ $rate != "$current_rate" ]]; then
    capped_loopback_stop "$ns"
    capped_loopback_start "$ns" "$rate"
    current_rate=$rate
  fi
  "${mpi_capped[@]}" "$@" </dev/null  # mpirun would read the loop's input
}
# Each family is profiled under the cap of each rate it runs at (the compute slowdown under
# communication follows the TCP stack's load, which follows the rate), on both ranks at once:
# the tensor-parallel pair, or for tp 1 two copies of the one-rank group, since two ranks
# computing side by side on the two cores are slower than one alone (10-15% here), as in the
# runs they predict.
: >"$work/rows.txt"
for round in $(seq 1 "$rounds"); do
  while IFS='|' read -r name fam rate settings; do
    [[ -f "$work/$fam-$rate-$round.json" ]] && continue
    read -r -a fsettings <<<"${family[$fam]}"
    run_capped "$rate" "$oases" profile "${common[@]}" "${fsettings[@]}" \
      --output "$work/$fam-$rate-$round.json" --steps 5 >"$work/$fam-$rate-$round.profile.log" 2>&1
  done <<<"$cases"

  while IFS='|' read -r name fam rate settings; do
    read -r -a extra <<<"$settings"
    link=$(printf "%.6f" "$(echo "$rate / 16000" | bc -l)")  # half the cap each way
    predicted=$("$oases" simulate "${common[@]}" "${extra[@]}" --cluster clusters/this-machine-loopback.toml \
      --cluster-set tier.loopback.link_gbs="$link" --profile "$work/$fam-$rate-$round.json" |
      sed -n 's/^simulated step \([0-9.]*\) s.*/\1/p')
    metrics="$work/$name-$rate-$round.jsonl"
    run_capped "$rate" "$oases" train --quiet "${common[@]}" "${extra[@]}" train.steps=$((steps + 1)) \
      log.metrics="\"$metrics\"" >"$work/$name-$rate-$round.log" 2>&1 ||
      { echo "run $name at $rate failed:"; tail -5 "$work/$name-$rate-$round.log"; exit 1; }
    echo "$name $rate $round $predicted $metrics" >>"$work/rows.txt"
  done <<<"$cases"
done

python3 - "$work/rows.txt" <<'PY'
import statistics
import sys
sys.path.insert(0, "bench")
from fidelity import median_step_time, spearman
runs = {}  # (name, rate) -> [(round, predicted, measured)], in the cases' order
for line in open(sys.argv[1]):
    name, rate, rnd, predicted, metrics = line.split()
    runs.setdefault((name, int(rate)), []).append(
        (int(rnd), float(predicted), median_step_time(metrics)))

def summary(rows):
    mape = sum(abs(p - m) / m for _, _, p, m in rows) / len(rows)
    rho = spearman([r[2] for r in rows], [r[3] for r in rows])
    return mape, rho

rows = [(name, rate, statistics.median(p for _, p, _ in r), statistics.median(m for _, _, m in r))
        for (name, rate), r in runs.items()]
print("| configuration | cap Mbit/s | predicted s (rounds' range) | measured s (rounds' range) | error |")
print("|---|---|---|---|---|")
for (name, rate, p, m), r in zip(rows, runs.values()):
    ps, ms = [x[1] for x in r], [x[2] for x in r]
    print(f"| {name} | {rate} | {p:.3f} ({min(ps):.3f}-{max(ps):.3f}) | "
          f"{m:.3f} ({min(ms):.3f}-{max(ms):.3f}) | {100 * (p - m) / m:+.1f}% |")
mape, rho = summary(rows)
print(f"\n{len(rows)} configurations, medians of {len(next(iter(runs.values())))} rounds: "
      f"mean absolute percentage error {100 * mape:.1f}%, Spearman {rho:.3f}")
for rnd in sorted({x[0] for r in runs.values() for x in r}):
    alone = [(n, rt, p, m) for (n, rt), r in runs.items() for k, p, m in r if k == rnd]
    mape, rho = summary(alone)
    print(f"round {rnd} alone: mean absolute percentage error {100 * mape:.1f}%, Spearman {rho:.3f}")
PY
