#!/usr/bin/env bash
# Fuzzing benchmark: each libFuzzer target of fuzz/ in turn (one at a time: it is one core's
# work), from its seed corpus, until RUNS executions or SECONDS seconds, whichever comes
# first, with a fixed seed. Builds the `fuzz` preset (clang) first.
#   bash bench/run_fuzz_bench.sh [SECONDS=600] [RUNS=10000000] [TARGET...]
# Prints one table row per target: executions, executions per second, coverage (edges
# reached by the seed corpus alone and at the end; libFuzzer's features too), the corpus it
# grew to (inputs/bytes), peak memory, and what went wrong: a crash, a reader exception other than
# UserError, a leak, a timeout (10 s per input) or out-of-memory stops a target's run, and its
# input is kept under build/fuzz/bench/<target>/ (the run's log is there too).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
runs=${2:-10000000}
shift $(($# < 2 ? $# : 2))
targets=("$@")
((${#targets[@]})) || targets=(safetensors token_shard run_config profile plan)

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz >/dev/null

echo "fuzzing each target for ${runs} executions or ${seconds} s, from fuzz/corpus/<target>"
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src fuzz || echo ' (with changes)'), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| target | executions | seconds | exec/s | edges: seeds -> end | features | corpus (inputs/size) | peak RSS MB | result |"
echo "|---|---|---|---|---|---|---|---|---|"
status=0
for target in "${targets[@]}"; do
  work=build/fuzz/bench/$target
  rm -rf "$work"
  mkdir -p "$work/corpus"
  dict=()
  [[ -f fuzz/dict/$target.dict ]] && dict=(-dict="fuzz/dict/$target.dict")
  start=$(date +%s)
  rc=0
  build/fuzz/fuzz/fuzz_$target -seed=1 -runs="$runs" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/" "${dict[@]}" \
    "$work/corpus" "fuzz/corpus/$target" >"$work/log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  stat() { sed -n "s/^stat::$1: *//p" "$work/log" | tail -1; }
  seed_cov=$(grep -m1 -o 'INITED cov: [0-9]*' "$work/log" | grep -o '[0-9]*$' || echo '?')
  last=$(grep -E '^#[0-9]+' "$work/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo '?')
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo '?')
  corpus=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' <<<"$last" | cut -d' ' -f2 || echo '?')
  artifacts=$(find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) -printf '%f ')
  if ((rc == 0)); then
    result="no crash, leak, timeout or out-of-memory"
  else
    result="exit $rc: ${artifacts:-no input saved} (see $work/log)"
    status=1
  fi
  echo "| $target | $(stat number_of_executed_units) | $elapsed | $(stat average_exec_per_sec) | $seed_cov -> $cov | $ft | $corpus | $(stat peak_rss_mb) | $result |"
done
exit $status
