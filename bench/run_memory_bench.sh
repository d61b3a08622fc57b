#!/usr/bin/env bash
# Activation memory of every recomputation policy, measured side by side in one run: one
# process (one thread) trains configs/memory-bench.toml, a 16-layer GPT, under each policy and
# prints the peak activation bytes the executor's activation store measured beside the ones the
# schedule predicts (schedule::peak_activation_bytes plus the static buffers: run.json), and the
# step time.
#   bash bench/run_memory_bench.sh
# Environment (defaults in brackets):
#   POLICIES    names from the list below, space or comma separated [all]
#   STEPS       steps per run; the step time is the median over the steps after the first [4]
#   CONFIG      [configs/memory-bench.toml]
#   SKIP_BUILD  1: use the existing build/release/oases as it is [0]
#   KEEP_WORK   1: keep the temporary folder with every run's log, metrics and run.json [0]
# A quick check of the plumbing: STEPS=2 bash bench/run_memory_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The compared policies, in table order, each with the --set overrides that select it. sqrt:
# groups of round(sqrt(16)) = 4 layers; sqrt-k2 and sqrt-k8 show the trade-off either side.
policy_names=(none full selective fine-grained sqrt sqrt-k2 sqrt-k8)
declare -A policy_sets=(
  [none]='parallel.schedule="megatron" parallel.recompute="none"'
  [full]='parallel.schedule="megatron" parallel.recompute="full"'
  [selective]='parallel.schedule="megatron" parallel.recompute="selective"'
  [fine-grained]='parallel.schedule="fine-grained" parallel.recompute="fine-grained"'
  [sqrt]='parallel.schedule="megatron" parallel.recompute="sqrt"'
  [sqrt-k2]='parallel.schedule="megatron" parallel.recompute="sqrt" parallel.recompute_every=2'
  [sqrt-k8]='parallel.schedule="megatron" parallel.recompute="sqrt" parallel.recompute_every=8'
)

# The policies that keep the most run again with their kept tensors held in bf16 and fp8
# between the passes (parallel.activation_compression), as rows "<policy>+<format>".
for format in bf16 fp8; do
  for p in none fine-grained sqrt; do
    policy_names+=("$p+$format")
    policy_sets[$p+$format]="${policy_sets[$p]} parallel.activation_compression=\"$format\""
  done
done

IFS=', ' read -r -a selected <<<"${POLICIES:-${policy_names[*]}}"
for p in "${selected[@]}"; do
  [[ -n ${policy_sets[$p]+x} ]] || { echo "unknown policy '$p'; known: ${policy_names[*]}" >&2; exit 2; }
done
steps=${STEPS:-4}
config=${CONFIG:-configs/memory-bench.toml}
py=/usr/bin/python3  # the python3 first on PATH may be another interpreter

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target oases >/dev/null
fi
oases=$PWD/build/release/oases


env_used=""
for v in POLICIES STEPS CONFIG SKIP_BUILD; do
  if [[ -n ${!v:-} ]]; then env_used+="$v=\"${!v}\" "; fi
done
echo "# command: ${env_used}bash bench/run_memory_bench.sh"
echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), nproc $(nproc)"
echo "# load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg) (step times need an idle machine)"
echo "# config: $config, 1 process, 1 thread, $steps steps per run (step time: median of steps 2-$steps)"

work=$(mktemp -d)
cleanup() {
  if [[ ${KEEP_WORK:-0} == 1 ]]; then echo "# logs and metrics kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The fortune files without their .dat indexes; fall back to the one file every install has.
mapfile -t corpus < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
"$oases" prepare-data --input "${corpus[@]}" --output "$work/data" >/dev/null 2>&1 ||
  "$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" >/dev/null

common=(--quiet --config "$config" --set train.steps="$steps" train.threads=1 data.path="\"$work/data\"")
failed=()
for p in "${selected[@]}"; do
  read -r -a sets <<<"${policy_sets[$p]}"
  mkdir -p "$work/$p"
  # Each run in a folder of its own: run.json (the predicted peak) is written beside the metrics.
  if ! OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$oases" train "${common[@]}" "${sets[@]}" \
       log.metrics="\"$work/$p/metrics.jsonl\"" >"$work/$p/log" 2>&1; then
    echo "!! $p failed; last lines of its log:" >&2
    tail -n 8 "$work/$p/log" | sed 's/^/!!   /' >&2
    failed+=("$p")
  fi
done

"$py" - "$work" "${selected[@]}" <<'PY'
import json, statistics, sys

work, policies = sys.argv[1], sys.argv[2:]
mib = 1 << 20

def load(policy):
    try:
        rows = [r for r in map(json.loads, open(f"{work}/{policy}/metrics.jsonl")) if r["step"] > 0]
        run = json.load(open(f"{work}/{policy}/run.json"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    timed = rows[1:] or rows
    schedule = run.get("schedule", {})
    k = schedule.get("recompute_every")
    return {
        "measured": max(r["peak_activation_bytes"] for r in rows),
        "predicted": run["memory_bytes"]["activations"],
        "step": statistics.median(r["step_time_s"] for r in timed),
        "loss": rows[-1]["loss"],
        "what": f'{schedule.get("kind", "?")}, {schedule.get("recompute", "?")}' + (f", k={k}" if k else ""),
    }

results = {p: load(p) for p in policies}
base = results.get("none")
print()
print(f'{"policy":<18}{"schedule, recompute":<30}{"measured MiB":>13}{"predicted MiB":>14}'
      f'{"meas/pred":>10}{"vs none":>9}{"step s":>9}{"vs none":>9}{"last loss":>11}')
for p in policies:
    r = results[p]
    if r is None:
        print(f"{p:<18}(failed or not run)")
        continue
    mem_ratio = f'{r["measured"] / base["measured"]:.2f}' if base else "-"
    time_ratio = f'{r["step"] / base["step"]:.2f}' if base else "-"
    print(f'{p:<18}{r["what"]:<30}{r["measured"] / mib:>13.1f}{r["predicted"] / mib:>14.1f}'
          f'{r["measured"] / r["predicted"]:>10.3f}{mem_ratio:>9}{r["step"]:>9.3f}{time_ratio:>9}'
          f'{r["loss"]:>11.4f}')
mismatched = [p for p, r in results.items() if r and r["measured"] != r["predicted"]]
print()
print("measured == predicted for every policy" if not mismatched
      else f"measured != predicted: {', '.join(mismatched)}")
PY
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
