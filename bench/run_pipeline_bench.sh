#!/usr/bin/env bash
# Pipeline schedules measured against the simulator, in one run: a small byte-level GPT (fp32,
# 1 thread per rank) trained with pp=2 under each pipeline schedule at MICRO_BATCHES
# micro-batches per step, over shared memory; its step time and measured bubble (bubble_s: what
# the first stage waited on Recvs) side by side with `oases plan --degrees-only`'s prediction
# (sim::simulate_ranks over every rank's lowered schedule, from an `oases profile` of the same
# model taken in the same run). Then, unless TP_CAPPED=0, pp=2 x tp=2 (4 ranks) over TCP on the loopback of a
# private network namespace capped with tc (as bench/run_overlap_bench.sh does), predicted from
# a tp=2 profile measured over the same capped link.
#   bash bench/run_pipeline_bench.sh        (as root for the capped part: ip netns, tc)
# Environment (defaults in brackets):
#   SCHEDULES      pipeline kinds to try; a kind the build cannot train is reported [gpipe 1f1b interleaved zero-bubble 2bw]
#   MICRO_BATCHES  micro-batches per step to sweep [4 8]
#   STEPS          steps per run; medians over the steps after the first [4]
#   CAP_MBIT       rate of the capped loopback, Mbit/s [1000]
#   TP_CAPPED      0: skip the pp=2 x tp=2 part [1]
#   SKIP_BUILD     1: use the existing build/release/oases as it is [0]
#   KEEP_WORK      1: keep the temporary folder with every run's log and metrics [0]
# About 3 minutes on the 2-core reference machine when it is otherwise idle.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a schedules <<<"${SCHEDULES:-gpipe 1f1b interleaved zero-bubble 2bw}"
read -r -a micro_batches <<<"${MICRO_BATCHES:-4 8}"
steps=${STEPS:-4}
cap_mbit=${CAP_MBIT:-1000}
py=/usr/bin/python3

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target oases >/dev/null
fi
oases=$PWD/build/release/oases

env_used=""
for v in SCHEDULES MICRO_BATCHES STEPS CAP_MBIT TP_CAPPED SKIP_BUILD; do
  if [[ -n ${!v:-} ]]; then env_used+="$v=\"${!v}\" "; fi
done
echo "# command: ${env_used}bash bench/run_pipeline_bench.sh"
echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), nproc $(nproc), $(mpirun --version | head -n1)"
echo "# load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (the runs need the cores to themselves)"

work=$(mktemp -d)
ns=oases-pipeline-$$
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  if [[ ${KEEP_WORK:-0} == 1 ]]; then echo "# logs and metrics kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" >/dev/null 2>&1

# 4 layers of hidden 256 over 2 stages: a step of 4 micro-batches of 2 sequences of 128 bytes
# takes ~0.1 s per rank, long enough to time and short enough for a shared machine.
cat >"$work/model.toml" <<EOF
[model]
arch = "gpt"
layers = 4
hidden = 256
heads = 4
ffn_hidden = 1024
vocab_size = 256
seq_len = 128
[train]
precision = "fp32"
micro_batch = 2
global_batch = 8
steps = $steps
threads = 1
[data]
path = "$work/data"
[log]
peak_tflops = 1.0
EOF
echo "# model: GPT 4 layers, hidden 256, 4 heads, ffn 1024, seq 128, byte vocabulary, fp32, micro-batch 2, 1 thread per rank; $steps steps per run (medians of steps 2-$steps)"

mpi_common=(--allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
mpi_shm=(mpirun "${mpi_common[@]}" --mca btl self,vader)
mpi_tcp=(ip netns exec "$ns" mpirun "${mpi_common[@]}" --mca btl self,tcp
         --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

manifest=$work/manifest
# run LABEL RANKS LINK SETTINGS...: trains; the metrics go to $work/LABEL.jsonl. A run that
# fails (a schedule this build does not train) is listed with the first line of its error.
run() {
  local label=$1 ranks=$2 link=$3
  shift 3
  local -a launcher
  if [[ $link == shm ]]; then launcher=("${mpi_shm[@]}"); else launcher=("${mpi_tcp[@]}"); fi
  if ! "${launcher[@]}" -np "$ranks" "$oases" train --quiet --config "$work/model.toml" --set "$@" \
      log.metrics="\"$work/$label.jsonl\"" >"$work/$label.log" 2>&1; then
    rm -f "$work/$label.jsonl"
    grep -m1 -E 'error|Error' "$work/$label.log" | cut -c1-160 >"$work/$label.error" || echo "failed" >"$work/$label.error"
  fi
}

# predict LABEL PROFILE SETTINGS...: `oases plan --degrees-only`'s pipeline table into
# $work/LABEL.plan.
predict() {
  local label=$1 profile=$2
  shift 2
  "$oases" plan --degrees-only --config "$work/model.toml" --profile "$profile" "$@" \
    >"$work/$label.plan" 2>&1 || true
}

# chunks KIND: the virtual_stages setting of a pipeline kind (two chunks per rank for
# interleaved, one for the others).
chunks() { if [[ $1 == interleaved ]]; then echo parallel.virtual_stages=2; else echo parallel.virtual_stages=1; fi; }

echo "# profiling at tp=1 (one process)" >&2
"$oases" profile --config "$work/model.toml" --set train.threads=1 --steps 3 --output "$work/profile-tp1.json" >/dev/null 2>&1
for m in "${micro_batches[@]}"; do
  # Schedules inside, micro-batches outside: the runs compared side by side run back to back.
  for s in "${schedules[@]}"; do
    label=shm-m$m-$s
    echo "# pp=2, $m micro-batches: $s" >&2
    run "$label" 2 shm parallel.pp=2 parallel.pipeline="\"$s\"" "$(chunks "$s")" train.global_batch=$((2 * m))
    predict "$label" "$work/profile-tp1.json" --set parallel.pp=2 parallel.pipeline="\"$s\"" "$(chunks "$s")" train.global_batch=$((2 * m))
    echo "pp=2 $m $s $label" >>"$manifest"
  done
done

if [[ ${TP_CAPPED:-1} != 0 ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "the capped part needs root (ip netns, tc); TP_CAPPED=0 skips it" >&2; exit 2; }
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  burst=$((cap_mbit * 1000 * 1000 / 8 / 500))
  ((burst < 131072)) && burst=131072
  ip netns exec "$ns" tc qdisc replace dev lo root tbf rate "${cap_mbit}mbit" burst "$burst" latency 100ms
  # The oases schedule splits each micro-batch in 2 sub-batches, each split over tp = 2 ranks:
  # micro-batches of 4 sequences.
  echo "# pp=2 x tp=2: 4 ranks on TCP over a loopback capped at $cap_mbit Mbit/s (both directions share it), micro-batch 4"
  echo "# profiling at tp=2 over the capped loopback" >&2
  ip netns exec "$ns" mpirun "${mpi_common[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo -np 2 "$oases" profile --config "$work/model.toml" \
    --set parallel.tp=2 train.micro_batch=4 train.global_batch=4 train.threads=1 --steps 3 \
    --output "$work/profile-tp2.json" >/dev/null 2>&1
  # Every message shares the one capped queue; the plan prices a link at the whole rate.
  gbps=$("$py" -c "print($cap_mbit / 8000)")
  m=${micro_batches[0]}
  for s in "${schedules[@]}"; do
    label=tcp-m$m-$s
    echo "# pp=2 x tp=2 capped, $m micro-batches: $s" >&2
    run "$label" 4 tcp parallel.pp=2 parallel.tp=2 parallel.pipeline="\"$s\"" "$(chunks "$s")" \
      train.micro_batch=4 train.global_batch=$((4 * m))
    predict "$label" "$work/profile-tp2.json" --set parallel.pp=2 parallel.tp=2 \
      parallel.pipeline="\"$s\"" "$(chunks "$s")" train.micro_batch=4 \
      train.global_batch=$((4 * m)) --p2p-gbps "$gbps"
    echo "pp=2xtp=2@${cap_mbit}Mbit $m $s $label" >>"$manifest"
  done
fi

cat >"$work/summary.py" <<'PY'
import json, re, statistics, sys

def measured(path):
    try:
        rows = [r for r in map(json.loads, open(path)) if r["step"] > 0]
    except FileNotFoundError:
        return None
    timed = rows[1:] or rows
    med = lambda k: statistics.median(r[k] for r in timed)
    return {"step": med("step_time_s"), "bubble": med("bubble_s"), "compute": med("compute_s"),
            "exposed": med("exposed_comm_s"), "loss": rows[-1]["loss"]}

def predicted(path, kind):
    """(step s, first stage's bubble s) of `kind` from the plan's table, or the reason for none."""
    try:
        text = open(path).read()
    except FileNotFoundError:
        return "no plan output"
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != kind:
            continue
        m = re.search(r"step ([\d.]+) ms.*\[([\d. ]+)\] ms", line)
        if not m:
            return line.split("no prediction:", 1)[-1].strip()[:90]
        return float(m.group(1)) / 1e3, float(m.group(2).split()[0]) / 1e3
    return text.strip().splitlines()[-1][:90] if text.strip() else "no plan output"

work, manifest = sys.argv[1], sys.argv[2]
print("| layout | micro-batches | schedule | step s | bubble_s | bubble / step | predicted step s "
      "| predicted bubble s | measured / predicted step | last loss |")
print("|---|---|---|---|---|---|---|---|---|---|")
for line in open(manifest):
    layout, m, kind, label = line.split()
    got, want = measured(f"{work}/{label}.jsonl"), predicted(f"{work}/{label}.plan", kind)
    if got is None:
        try:
            why = open(f"{work}/{label}.error").read().strip()
        except FileNotFoundError:
            why = "failed"
        pred = "" if isinstance(want, str) else f"{want[0]:.3f} | {want[1]:.3f}"
        print(f"| {layout} | {m} | {kind} | does not train: {why} | | | {pred or ' | '} | | |")
        continue
    if isinstance(want, str):
        pred, ratio = f"- ({want}) | -", "-"
    else:
        pred, ratio = f"{want[0]:.3f} | {want[1]:.3f}", f"{got['step'] / want[0]:.2f}"
    print(f"| {layout} | {m} | {kind} | {got['step']:.3f} | {got['bubble']:.3f} "
          f"| {got['bubble'] / got['step']:.0%} | {pred} | {ratio} | {got['loss']:.6f} |")
PY
echo
"$py" "$work/summary.py" "$work" "$manifest"
echo "# load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
