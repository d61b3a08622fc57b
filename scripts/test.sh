#!/usr/bin/env bash
# The test suite: install what is missing (including PyTorch for the parity tests and clang
# for the fuzz targets), build, and run every test with ctest, the fuzz targets' smoke runs
# included. Extra arguments go to ctest (e.g. -L kernels, -L fuzz).
#   scripts/test.sh --sanitize [asan|tsan] [ctest args]   the suite under the sanitizers
#                                                         instead (scripts/test-sanitize.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--sanitize" ]]; then
  shift
  exec bash scripts/test-sanitize.sh "$@"
fi

scripts/install-deps.sh --test
# The fuzz targets first (clang, sanitizers; fuzz/): configuring the release tree afterwards
# registers their smoke tests (ctest label `fuzz`) beside the others.
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release --parallel 2 "$@"
