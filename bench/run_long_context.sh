#!/usr/bin/env bash
# Long sequences on this machine: configs/long-context.toml (a 4-layer GPT, one sequence per
# step) at seq_len 4096 and 16384, trained by one process and by two context-parallel ranks
# (parallel.cp = 2, each kind available), side by side in interleaved rounds; then the memory
# limit one process cannot meet at 16384 while each cp rank can.
#   bash bench/run_long_context.sh
# Environment (defaults in brackets):
#   SEQS        sequence lengths [4096 16384]
#   KINDS       parallel.cp_kind values to run at cp 2 [all-to-all ring]
#   ROUNDS      interleaved rounds; the table shows the best round [2]
#   STEPS       steps per run; medians are over the steps after the first [3]
#   LIMIT       parallel.memory_limit of the limit check, bytes [900000000]
#   SKIP_BUILD  1: use the existing build/release/oases as it is [0]
# Prints per run: median step time, exposed communication per step (and of it, the wait on the
# cp transfers, with their time on the wire), the predicted and measured activation peak and
# the peak resident memory of rank 0. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

SEQS=${SEQS:-"4096 16384"}
KINDS=${KINDS:-"all-to-all ring"}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-3}
LIMIT=${LIMIT:-900000000}
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target oases >/dev/null
fi
oases=build/release/oases
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Byte-level text of the fortunes and licences (about 2.7 M training tokens).
texts=()
for f in /usr/share/common-licenses/* /usr/share/games/fortunes/*; do
  [[ -f "$f" && ! -L "$f" && "$f" != *.dat ]] && texts+=("$f")
done
"$oases" prepare-data --input "${texts[@]}" --output "$work/text" --val-fraction 0.02 >/dev/null

mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
# run LABEL CP KIND SEQ [extra settings...]: trains and prints the summary line of LABEL.
run() {
  local label=$1 cp=$2 kind=$3 seq=$4
  shift 4
  local out="$work/$label"
  rm -rf "$out"
  local launch=()
  [[ $cp -gt 1 ]] && launch=("${mpi[@]}" -np "$cp")
  "${launch[@]}" "$oases" train --quiet --config configs/long-context.toml --set \
    data.path="\"$work/text\"" model.seq_len="$seq" parallel.cp="$cp" \
    parallel.cp_kind="\"$kind\"" train.steps="$STEPS" log.metrics="\"$out/metrics.jsonl\"" "$@" \
    >"$work/$label.log" 2>&1 || { echo "$label failed:"; tail -5 "$work/$label.log"; return 1; }
  python3 - "$out" "$label" <<'EOF'
import json, statistics, sys
out, label = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(out + "/metrics.jsonl") if '"step_time_s"' in l]
later = rows[1:] or rows
step = statistics.median(r["step_time_s"] for r in later)
exposed = statistics.median(r.get("exposed_comm_s", 0.0) for r in later)
exposed_cp = statistics.median(r.get("exposed_cp_s", 0.0) for r in later)
wire_cp = statistics.median(r.get("cp_s", 0.0) for r in later)
run = json.load(open(out + "/run.json"))
predicted = run["memory_bytes"]["activations"]
measured = max(r["peak_activation_bytes"] for r in rows)
rss = max(r["peak_mem_bytes"] for r in rows)
mib = 1 << 20
print(f"{label:24s} step {step:8.2f} s  exposed comm {exposed:6.2f} s (cp transfers {exposed_cp:5.2f} "
      f"s of {wire_cp:5.2f} s on the wire)  activations predicted {predicted / mib:7.1f} MiB "
      f"measured {measured / mib:7.1f} MiB  peak RSS {rss / mib:7.1f} MiB")
EOF
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; $(date -u +%F)"
for seq in $SEQS; do
  for round in $(seq 1 "$ROUNDS"); do
    echo "seq_len $seq, round $round"
    run "one-process-$seq" 1 all-to-all "$seq"
    for kind in $KINDS; do run "cp2-$kind-$seq" 2 "$kind" "$seq"; done
  done
done

echo
echo "parallel.memory_limit = $LIMIT bytes at seq_len 16384:"
if "$oases" train --quiet --config configs/long-context.toml --set data.path="\"$work/text\"" \
  model.seq_len=16384 train.steps=1 parallel.memory_limit="$LIMIT" >"$work/limit1.log" 2>&1; then
  echo "  one process: ran (the limit is not below what one process needs)"
else
  echo "  one process: $(grep -m1 'error' "$work/limit1.log")"
fi
for kind in $KINDS; do
  run "cp2-$kind-limited" 2 "$kind" 16384 parallel.memory_limit="$LIMIT"
done
