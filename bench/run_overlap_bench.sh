#!/usr/bin/env bash
# Tensor-parallel schedules under a bandwidth cap, measured in one run: two ranks (tp=2, one
# thread each) train configs/overlap.toml under every schedule, first over shared memory (no
# cap), then over TCP on the loopback of a private network namespace whose bandwidth is capped
# with tc so that communication takes about RATIOS x the compute time of a step.
#   bash bench/run_overlap_bench.sh        (as root: it creates a network namespace and a qdisc)
# Environment (defaults in brackets):
#   SCHEDULES   names from the list below, space or comma separated [all]
#   RATIOS      communication / compute ratios to sweep [0.25 0.5 1 2]
#   STEPS       steps per run; medians are over the steps after the first [5]
#   PROBE_MBIT  rate of the calibration run, Mbit/s [400]
#   CONFIG      [configs/overlap.toml]
#   MICRO_BATCHES  micro-batches per step (train.global_batch = 4 x this) [the config's]
#   SKIP_BUILD  1: use the existing build/release/oases as it is [0]
#   KEEP_WORK   1: keep the temporary folder with every run's log and metrics [0]
#   TRACE       1: capped runs also write a Chrome trace of their first 2 steps (LABEL.trace.json
#               in the kept folder; implies KEEP_WORK=1) [0]
#   BASELINE    another build's oases binary: every run is repeated with it right after, and
#               the table gains its rows (SCHEDULE@baseline) and this build's speed against it []
# All of it takes about 14 minutes on the 2-core reference machine; a quick check of the
# plumbing: SCHEDULES=megatron-none RATIOS=1 STEPS=3 bash bench/run_overlap_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The compared schedules, in table order, each with the --set overrides that select it.
# The -sb4 and -sp rows are run only when named in SCHEDULES.
schedule_names=(megatron-full megatron-none fine-grained cross-pass oases oases-interleaved oases-deferred)
extra_names=(oases-sb4 oases-interleaved-sb4 oases-deferred-sb4 megatron-full-sp megatron-none-sp oases-sp oases-sp-sb4 oases-sp-partitioned)
declare -A schedule_sets=(
  [megatron-full]='parallel.schedule="megatron" parallel.recompute="full"'
  [megatron-none]='parallel.schedule="megatron" parallel.recompute="none"'
  [fine-grained]='parallel.schedule="fine-grained"'
  [cross-pass]='parallel.schedule="cross-pass" parallel.sub_batches=2'
  [oases]='parallel.schedule="oases" parallel.sub_batches=2'
  [oases-interleaved]='parallel.schedule="oases-interleaved" parallel.sub_batches=2'
  [oases-deferred]='parallel.schedule="oases-deferred" parallel.sub_batches=2'
  # Four sub-batches of one sequence each: more compute beside every collective's neighbours.
  [oases-sb4]='parallel.schedule="oases" parallel.sub_batches=4'
  [oases-interleaved-sb4]='parallel.schedule="oases-interleaved" parallel.sub_batches=4'
  [oases-deferred-sb4]='parallel.schedule="oases-deferred" parallel.sub_batches=4'
  # Sequence parallelism (docs/distributed.md): the same schedules with the regions entered by
  # an all-gather and left by a reduce-scatter.
  [megatron-full-sp]='parallel.schedule="megatron" parallel.recompute="full" parallel.sequence_parallel=true'
  [megatron-none-sp]='parallel.schedule="megatron" parallel.recompute="none" parallel.sequence_parallel=true'
  [oases-sp]='parallel.schedule="oases" parallel.sub_batches=2 parallel.sequence_parallel=true'
  [oases-sp-sb4]='parallel.schedule="oases" parallel.sub_batches=4 parallel.sequence_parallel=true'
  # The regions' kept inputs as 1/tp slices, gathered back before their backward.
  [oases-sp-partitioned]='parallel.schedule="oases" parallel.sub_batches=2 parallel.sequence_parallel=true parallel.partition_activations=true'
)

IFS=', ' read -r -a selected <<<"${SCHEDULES:-${schedule_names[*]}}"
for s in "${selected[@]}"; do
  [[ -n ${schedule_sets[$s]+x} ]] ||
    { echo "unknown schedule '$s'; known: ${schedule_names[*]} ${extra_names[*]}" >&2; exit 2; }
done
read -r -a ratios <<<"${RATIOS:-0.25 0.5 1 2}"
steps=${STEPS:-5}
probe_mbit=${PROBE_MBIT:-400}
config=${CONFIG:-configs/overlap.toml}
py=/usr/bin/python3  # the python3 first on PATH may be another interpreter

[[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns, tc)" >&2; exit 2; }
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target oases >/dev/null
fi
oases=$PWD/build/release/oases

env_used=""
baseline=${BASELINE:-}
[[ -z $baseline || -x $baseline ]] || { echo "BASELINE=$baseline is not an executable" >&2; exit 2; }
for v in SCHEDULES RATIOS STEPS PROBE_MBIT CONFIG MICRO_BATCHES SKIP_BUILD TRACE BASELINE; do
  if [[ -n ${!v:-} ]]; then env_used+="$v=\"${!v}\" "; fi
done
echo "# command: ${env_used}bash bench/run_overlap_bench.sh"
echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), nproc $(nproc), $(mpirun --version | head -n1)"
# Other work on the machine slows compute and the TCP stack unevenly, so say how busy it was.
echo "# load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (the runs need the cores to themselves)"
echo "# config: $config, tp=2, 1 thread per rank, $steps steps per run (medians of steps 2-$steps)"

work=$(mktemp -d)
[[ ${TRACE:-0} == 1 ]] && KEEP_WORK=1
ns=oases-overlap-$$
# Runs on every exit path (success, a failed command under set -e, Ctrl-C, kill), so no
# namespace or temporary data outlives the script.
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  if [[ ${KEEP_WORK:-0} == 1 ]]; then echo "# logs and metrics kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The fortune files without their .dat indexes; fall back to the one file every install has.
mapfile -t corpus < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
"$oases" prepare-data --input "${corpus[@]}" --output "$work/data" >/dev/null 2>&1 ||
  "$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" >/dev/null

# A fresh namespace holds only its own loopback, so every byte the ranks exchange crosses the
# tbf qdisc on it and nothing leaves the namespace. Both directions share that one queue: the
# rate is the total of the two ranks' traffic.
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up

cap() {  # cap RATE_KBIT
  local kbit=$1
  # tbf needs a bucket of at least one packet (loopback MTU 64 KiB) and about one timer tick of
  # traffic at the rate; the queue may hold 100 ms so that TCP sees delay rather than drops.
  local burst=$((kbit * 1000 / 8 / 500))
  if ((burst < 131072)); then burst=131072; fi
  ip netns exec "$ns" tc qdisc replace dev lo root tbf rate "${kbit}kbit" burst "$burst" latency 100ms
}

common=(--quiet --config "$config" --set train.steps="$steps" train.threads=1 data.path="\"$work/data\"")
# More micro-batches per step give oases-interleaved forwards to run during backwards.
[[ -n ${MICRO_BATCHES:-} ]] && common+=(train.global_batch=$((4 * MICRO_BATCHES)))
# The uncapped baseline uses shared memory; capped runs must use TCP only, never vader, so the
# cap applies to all traffic (OpenMPI excludes loopback from TCP unless told to include it).
mpi_common=(--allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
mpi_shm=(mpirun "${mpi_common[@]}" --mca btl "self,vader")
mpi_tcp=(ip netns exec "$ns" mpirun "${mpi_common[@]}" --mca btl "self,tcp"
         --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

failed=()
# train LABEL SCHEDULE shm|tcp [BINARY]: writes $work/LABEL.jsonl; on failure shows the log's
# tail and returns non-zero, so one schedule the build does not support yet does not stop the
# others.
train() {
  local label=$1 sched=$2 link=$3 binary=${4:-$oases} log=$work/$1.log
  local -a sets launcher
  read -r -a sets <<<"${schedule_sets[$sched]}"
  if [[ $link == shm ]]; then launcher=("${mpi_shm[@]}"); else launcher=("${mpi_tcp[@]}"); fi
  # Traces only of capped runs (not the calibration), the second step being the first warm one.
  if [[ ${TRACE:-0} == 1 && $link == tcp && $label != calib-* ]]; then
    sets+=(log.trace="\"$work/$label.trace.json\"" log.trace_steps=2)
  fi
  if ! "${launcher[@]}" "$binary" train "${common[@]}" "${sets[@]}" log.metrics="\"$work/$label.jsonl\"" >"$log" 2>&1; then
    echo "!! $label failed; last lines of its log:" >&2
    tail -n 8 "$log" | sed 's/^/!!   /' >&2
    rm -f "$work/$label.jsonl"
    failed+=("$label")
    return 1
  fi
}

cat >"$work/summary.py" <<'PY'
import json, statistics, sys

def load(path):
    """Medians over the steps after the first (warm-up); None where a field is absent."""
    try:
        rows = [r for r in map(json.loads, open(path)) if r["step"] > 0]  # step 0: before training
    except FileNotFoundError:
        return None
    timed = rows[1:] or rows
    def med(key):
        vals = [r[key] for r in timed if key in r]
        return statistics.median(vals) if len(vals) == len(timed) else None
    out = {k: med(k) for k in ("step_time_s", "exposed_comm_s", "compute_s", "comm_s")}
    if out["compute_s"] is None:  # before the executor reported compute-lane time
        out["compute_s"] = statistics.median(r["step_time_s"] - r["exposed_comm_s"] for r in timed)
    acts = [r["peak_activation_bytes"] for r in rows if "peak_activation_bytes" in r]
    out["act"] = max(acts) if acts else None
    out["rss"] = max(r["peak_mem_bytes"] for r in rows)
    out["loss"] = rows[-1]["loss"]
    return out

def calibrate(work, probe_kbit, ratios, plan):
    base, probe = load(f"{work}/calib-shm.jsonl"), load(f"{work}/calib-probe.jsonl")
    # megatron with recompute none is blocking, so its exposed time is its communication time;
    # comm_s says the same directly once reported.
    comm = probe["comm_s"] if probe["comm_s"] is not None else probe["exposed_comm_s"]
    compute = base["compute_s"]
    print(f"# calibration (megatron-none): compute {compute:.3f} s/step over shared memory; "
          f"communication {comm:.3f} s/step at {probe_kbit / 1000:g} Mbit/s "
          f"(step {probe['step_time_s']:.3f} s)")
    chosen = []
    with open(plan, "w") as out:
        for r in ratios:
            kbit = max(1000, round(probe_kbit * comm / (float(r) * compute)))  # comm time ~ 1/rate
            out.write(f"{r} {kbit} {kbit / 1000:.0f}Mbit({r}x)\n")
            chosen.append(f"{r}x compute -> {kbit / 1000:.1f} Mbit/s")
    print("# rates chosen: " + "; ".join(chosen))

def fmt(v, spec, scale=1.0, suffix=""):
    return "-" if v is None else format(v * scale, spec) + suffix

def table(work, manifest):
    groups = {}  # cap label -> [(schedule, run label)], in manifest order
    for line in open(manifest):
        cap, sched, label = line.split()
        groups.setdefault(cap, []).append((sched, label))
    ref_loss, bad, versus = None, [], []
    print("| cap | schedule | step s | exposed comm s | exposed / comm | exposed / step "
          "| peak act MiB | peak RSS MiB | last loss | vs megatron-full | vs megatron-none |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for cap, runs in groups.items():
        res = {s: load(f"{work}/{label}.jsonl") for s, label in runs}
        def speedup(s, base):
            a, b = res.get(s), res.get(base)
            return None if not a or not b else b["step_time_s"] / a["step_time_s"]
        for s, _ in runs:
            m = res[s]
            if m is None:
                print(f"| {cap} | {s} | failed | | | | | | | | |")
                continue
            frac = (m["exposed_comm_s"] / m["comm_s"]) if m["comm_s"] else None
            print(f"| {cap} | {s} | {m['step_time_s']:.3f} | {m['exposed_comm_s']:.3f} "
                  f"| {fmt(frac, '.0%')} | {m['exposed_comm_s'] / m['step_time_s']:.0%} "
                  f"| {fmt(m['act'], '.0f', 1 / 2**20)} | {m['rss'] / 2**20:.0f} | {m['loss']:.6f} "
                  f"| {fmt(speedup(s, 'megatron-full'), '.2f', suffix='x')} "
                  f"| {fmt(speedup(s, 'megatron-none'), '.2f', suffix='x')} |")
            if ref_loss is None:
                ref_loss = (cap, s, m["loss"])
            elif abs(m["loss"] - ref_loss[2]) > 1e-4 * abs(ref_loss[2]):
                bad.append(f"{cap}/{s}: {m['loss']:.6f}")
        # How far the cap got from its target: communication over compute of the blocking run.
        base = res.get("megatron-none")
        ratio = None if not base else (base["comm_s"] or base["exposed_comm_s"]) / base["compute_s"]
        summary.append((cap, ratio, speedup("oases", "megatron-full"), speedup("oases", "megatron-none")))
        for s, _ in runs:
            if s.endswith("@baseline") and speedup(s[: -len("@baseline")], s) is not None:
                versus.append(f"{cap}/{s[: -len('@baseline')]}: "
                              f"{speedup(s[: -len('@baseline')], s):.3f}x the baseline's speed")
    print()
    for cap, ratio, full, none in summary:
        print(f"- {cap}: megatron-none communication / compute {fmt(ratio, '.2f')}; oases is "
              f"{fmt(full, '.2f', suffix='x')} megatron-full, {fmt(none, '.2f', suffix='x')} megatron-none")
    if versus:
        print("\nthis build against the baseline (> 1: faster), run right after each other:")
        for line in versus:
            print(f"- {line}")
    if bad:
        print(f"\nWARNING: last-step losses differ by more than 1e-4 relative from "
              f"{ref_loss[0]}/{ref_loss[1]} ({ref_loss[2]:.6f}): " + ", ".join(bad))

if __name__ == "__main__":
    if sys.argv[1] == "calibrate":
        calibrate(sys.argv[2], int(sys.argv[3]), sys.argv[5:], sys.argv[4])
    else:
        table(sys.argv[2], sys.argv[3])
PY

# Calibration: compute time per step without a cap, communication time per step at the probe
# rate, both from the blocking megatron-none schedule; the uncapped run doubles as its row.
probe_kbit=$((probe_mbit * 1000))
echo "# calibrating: megatron-none over shared memory, then over TCP at $probe_mbit Mbit/s" >&2
train calib-shm megatron-none shm
cap "$probe_kbit"
train calib-probe megatron-none tcp
# The cap means something only if the ranks' traffic crossed the qdisc (not shared memory).
sent=$(ip netns exec "$ns" tc -s qdisc show dev lo | awk '/Sent/ {print $2; exit}')
echo "# probe run: $((sent / 1048576)) MiB crossed the capped loopback in $steps steps"
if ((sent < 1048576 * steps)); then
  echo "the probe run's traffic bypassed the capped loopback" >&2
  exit 1
fi
"$py" "$work/summary.py" calibrate "$work" "$probe_kbit" "$work/plan" "${ratios[@]}"
mapfile -t plan <"$work/plan"

manifest=$work/manifest
for s in "${selected[@]}"; do
  if [[ $s == megatron-none ]]; then
    echo "no-cap megatron-none calib-shm" >>"$manifest"
  else
    echo "# no cap: $s" >&2
    train "shm-$s" "$s" shm || true
    echo "no-cap $s shm-$s" >>"$manifest"
    if [[ -n $baseline ]]; then
      train "shm-$s-baseline" "$s" shm "$baseline" || true
      echo "no-cap $s@baseline shm-$s-baseline" >>"$manifest"
    fi
  fi
done
# Rates outside, schedules inside: the schedules compared at one rate run back to back, so
# slow drifts of the shared machine hit them alike.
for p in "${plan[@]}"; do
  read -r _ kbit label <<<"$p"
  cap "$kbit"
  for s in "${selected[@]}"; do
    echo "# $label: $s" >&2
    train "tcp-$kbit-$s" "$s" tcp || true
    echo "$label $s tcp-$kbit-$s" >>"$manifest"
    if [[ -n $baseline ]]; then
      train "tcp-$kbit-$s-baseline" "$s" tcp "$baseline" || true
      echo "$label $s@baseline tcp-$kbit-$s-baseline" >>"$manifest"
    fi
  done
done

echo
"$py" "$work/summary.py" table "$work" "$manifest"
echo "# load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg) (2 ranks of this benchmark count about 2)"
if ((${#failed[@]})); then
  echo "failed runs: ${failed[*]}" >&2
  exit 1
fi
