#!/usr/bin/env bash
# The planner against measurement, per-layer plans included, in one run: two ranks (tp=2, one
# thread each) over TCP on a loopback capped with tc (as bench/run_overlap_bench.sh). `oases
# profile` measures configs/planner.toml; planner_plans predicts every plan of degrees 1 and 2
# over its 4 layers (16 plans: uniform and mixed) and the plan the planner chooses under a
# memory limit halfway between the two uniform plans' needs; every plan is then trained
# (`oases train --set parallel.plan=...`). Prints predicted next to measured, their Spearman
# rank correlation, and the chosen plan against the fastest measured plan within the limit.
#   bash bench/run_planner_mixed.sh    (as root)
# Environment: RATE_MBIT [400], STEPS [4] (median over steps 2..), KEEP_WORK [0]
# About 6 minutes on the 2-core reference machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
rate=${RATE_MBIT:-400}
steps=${STEPS:-4}
config=configs/planner.toml
[[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns, tc)" >&2; exit 2; }
cmake --preset release >/dev/null
cmake --build --preset release --target oases planner_plans >/dev/null
oases=$PWD/build/release/oases
bench_header "RATE_MBIT=$rate STEPS=$steps bash bench/run_planner_mixed.sh"

work=$(mktemp -d)
ns=oases-planner-$$
cleanup() {
  capped_loopback_stop "$ns"
  if [[ ${KEEP_WORK:-0} == 1 ]]; then echo "# work folder kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
"$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" >/dev/null
capped_loopback_start "$ns" "$rate"
mpi=("${mpi_capped[@]}")
common=(--config "$config" --set train.threads=1 data.path="\"$work/data\"")

"${mpi[@]}" "$oases" profile "${common[@]}" --output "$work/profile.json" --steps 3 \
  >"$work/profile.log" 2>&1 || { tail -5 "$work/profile.log"; exit 1; }

plans=()
for a in 1 2; do for b in 1 2; do for c in 1 2; do for d in 1 2; do
  plans+=("$a,$b,$c,$d")
done; done; done; done
build/release/bench/planner_plans "$work/profile.json" "$config" 0 "${plans[@]}" \
  >"$work/free.csv" 2>/dev/null
limit=$(/usr/bin/python3 - "$work/free.csv" <<'PY'
import csv, sys
rows = {r["plan"]: int(r["memory_bytes"]) for r in csv.DictReader(open(sys.argv[1])) if r["plan"] != "chosen" and "," not in r["plan"]}
print((rows["1111"] + rows["2222"]) // 2)
PY
)
build/release/bench/planner_plans "$work/profile.json" "$config" "$limit" "${plans[@]}" \
  >"$work/predicted.csv" 2>"$work/plan.txt"
echo "# memory limit for the planner: $limit bytes ($((limit >> 20)) MiB)"
sed 's/^/#   /' "$work/plan.txt"

for plan in "${plans[@]}"; do
  name=${plan//,/}
  "${mpi[@]}" "$oases" train --quiet "${common[@]}" train.steps="$steps" \
    parallel.plan="\"$plan\"" log.metrics="\"$work/$name.jsonl\"" >"$work/$name.log" 2>&1 ||
    { echo "plan $plan failed:"; tail -5 "$work/$name.log"; exit 1; }
done

/usr/bin/python3 - "$work" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, "bench")
from fidelity import median_step_time, spearman
rows, chosen = [], None
with open(f"{work}/predicted.csv") as f:
    next(f)
    for line in f:
        fields = line.strip().split(",")
        if fields[0] == "chosen":
            chosen = fields[1]
            continue
        plan, step, memory, fits = fields
        rows.append((plan, float(step), median_step_time(f"{work}/{plan}.jsonl"), int(memory),
                     fits == "1"))
n = len(rows)
rho = spearman([r[1] for r in rows], [r[2] for r in rows])
print("| degrees per layer | predicted s | measured s | predicted / measured | memory MiB (pred.) | within limit |")
print("|---|---|---|---|---|---|")
for plan, p, m, mem, fits in sorted(rows, key=lambda r: r[2]):
    mark = " (chosen)" if plan == chosen else ""
    print(f"| {' '.join(plan)}{mark} | {p:.3f} | {m:.3f} | {p / m:.2f} | {mem / 2**20:.1f} | {'yes' if fits else 'no'} |")
print(f"\nSpearman rank correlation over {n} plans: {rho:.3f}")
within = [r for r in rows if r[4]]
best = min(within, key=lambda r: r[2])
picked = next(r for r in rows if r[0] == chosen)
print(f"planner's choice under the limit: {' '.join(chosen)}, measured {picked[2]:.3f} s; fastest "
      f"measured plan within the limit: {' '.join(best[0])}, {best[2]:.3f} s; "
      f"choice / fastest = {picked[2] / best[2]:.3f}")
PY
