#!/usr/bin/env bash
# One ctest smoke run of a fuzz target: every input of its seed corpus, then RUNS fuzzing
# executions from them with a fixed seed (stopped after SECONDS at most). Inputs libFuzzer
# finds go to a scratch corpus under SCRATCH (emptied first), so the committed corpus is
# never written. A crash, a reader exception other than UserError, a leak, a timeout (10 s
# per input) or running out of memory fails the test and leaves the input in SCRATCH.
# Usage: smoke_test.sh FUZZER SEED_CORPUS SCRATCH RUNS SECONDS [libFuzzer flags...]
set -euo pipefail
fuzzer=$1 corpus=$2 scratch=$3 runs=$4 seconds=$5
shift 5
rm -rf "$scratch"
mkdir -p "$scratch/corpus"
exec "$fuzzer" -seed=1 -runs="$runs" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix="$scratch/" -print_final_stats=1 "$@" \
  "$scratch/corpus" "$corpus"
