#!/usr/bin/env bash
# Cost-model fidelity on this machine, in one run: `oases profile` measures configs/overlap.toml
# at tp=2 over TCP on a loopback capped with tc (as bench/run_overlap_bench.sh), the cost model
# predicts the step time of every uniform plan (degree 2: tp=2; degree 1: two replicas, i.e.
# tp=1 x dp=2) under every schedule, and the same ten runs are measured. Prints predicted next
# to measured and their Spearman rank correlation.
#   bash bench/run_planner_fidelity.sh    (as root)
# Environment: RATE_MBIT [800], STEPS [4], SLOWDOWN (compute slowdown under overlap) [-1: as
# the profile measured it]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
rate=${RATE_MBIT:-800}
steps=${STEPS:-4}
slowdown=${SLOWDOWN:--1}
config=configs/overlap.toml
[[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns, tc)" >&2; exit 2; }
cmake --preset release >/dev/null
cmake --build --preset release --target oases planner_predict >/dev/null
oases=$PWD/build/release/oases
bench_header "RATE_MBIT=$rate STEPS=$steps SLOWDOWN=$slowdown bash bench/run_planner_fidelity.sh"

work=$(mktemp -d)
ns=oases-fidelity-$$
trap 'capped_loopback_stop "$ns"; rm -rf "$work"' EXIT
"$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" >/dev/null
capped_loopback_start "$ns" "$rate"
mpi=("${mpi_capped[@]}")
common=(--config "$config" --set train.threads=1 data.path="\"$work/data\"")

"${mpi[@]}" "$oases" profile "${common[@]}" --output "$work/profile.json" --steps 3 >/dev/null 2>&1
build/release/bench/planner_predict "$work/profile.json" "$config" "$slowdown" > "$work/predicted.csv"

declare -A sets=(
  [megatron-full]='parallel.schedule="megatron" parallel.recompute="full"'
  [megatron-none]='parallel.schedule="megatron" parallel.recompute="none"'
  [fine-grained]='parallel.schedule="fine-grained"'
  [cross-pass]='parallel.schedule="cross-pass" parallel.sub_batches=2'
  [oases]='parallel.schedule="oases" parallel.sub_batches=2'
)
for degree in 2 1; do
  for s in megatron-full megatron-none fine-grained cross-pass oases; do
    read -r -a extra <<<"${sets[$s]}"
    layout=(parallel.tp=2 parallel.dp=1)
    [[ $degree == 1 ]] && layout=(parallel.tp=1 parallel.dp=2 train.micro_batch=2)
    "${mpi[@]}" "$oases" train --quiet "${common[@]}" train.steps="$steps" "${layout[@]}" "${extra[@]}" \
      log.metrics="\"$work/d${degree}_$s.jsonl\"" >"$work/d${degree}_$s.log" 2>&1 ||
      { echo "run degree $degree $s failed:"; tail -5 "$work/d${degree}_$s.log"; exit 1; }
  done
done

/usr/bin/python3 - "$work" <<'PY'
import csv, sys
work = sys.argv[1]
sys.path.insert(0, "bench")
from fidelity import median_step_time, spearman
rows = []
for r in csv.DictReader(open(f"{work}/predicted.csv")):
    measured = median_step_time(f"{work}/d{r['degree']}_{r['schedule']}.jsonl")
    rows.append((int(r["degree"]), r["schedule"], float(r["step_s"]), measured))
n = len(rows)
rho = spearman([r[2] for r in rows], [r[3] for r in rows])
print("| degree | schedule | predicted s | measured s | predicted / measured |")
print("|---|---|---|---|---|")
for d, s, p, m in rows:
    print(f"| {d} | {s} | {p:.3f} | {m:.3f} | {p / m:.2f} |")
best_pred = min(rows, key=lambda r: r[2]); best_meas = min(rows, key=lambda r: r[3])
print(f"\nSpearman rank correlation over {n} (degree, schedule) plans: {rho:.3f}")
print(f"predicted fastest: degree {best_pred[0]} {best_pred[1]} (measured {best_pred[3]:.3f} s); "
      f"measured fastest: degree {best_meas[0]} {best_meas[1]} ({best_meas[3]:.3f} s): "
      f"{best_pred[3] / best_meas[3]:.3f}x")
PY
