#!/usr/bin/env bash
# The test suite: install what is missing (including PyTorch for the parity tests), build,
# and run every test with ctest. Extra arguments go to ctest (e.g. -L kernels).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh --test
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release --parallel 2 "$@"
