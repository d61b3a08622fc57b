#!/usr/bin/env bash
# The kernels' front door, checked on the source tree: no file of the engine (src/) or of the
# fuzz targets (fuzz/) outside src/kernels/ includes a device's kernel header (kernels/cpu/...,
# kernels/cuda/...); they reach the kernels through kernels/kernels.h. Inside src/kernels/ the
# device folders and the dispatchers (src/kernels/*.cc) may include them, but the front door and
# its device-neutral headers (src/kernels/*.h) may not, so that a second device implements the
# same declarations. Tests of the CPU kernels (tests/kernels/) and microbenchmarks of them
# (bench/) include them on purpose and are not scanned.
#
#   kernel_includes_test.sh ROOT        checks the tree at ROOT (the repository): prints every
#                                       offending include as FILE:LINE and exits 1, or exits 0
#   kernel_includes_test.sh --self-test checks the check: on a scratch tree with includes
#                                       planted where they are forbidden and where they are
#                                       allowed, it must report exactly the forbidden ones
set -uo pipefail

# An #include whose path names a device folder: "kernels/cpu/x.h", <kernels/cuda/x.cuh>, or
# "cpu/x.h" written relative to src/kernels/.
readonly kPattern='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](([^">]*/)?kernels/|(\./)?)(cpu|cuda)/'
# Where device headers may be included: the device folders and the dispatchers.
readonly kAllowed='^src/kernels/(cpu|cuda)/|^src/kernels/[^/]+\.(cc|cpp|cu):'

# Prints FILE:LINE:TEXT for each forbidden include under $1, sorted; status 1 when there is any.
find_violations() {
  local root=$1 dirs=() found
  for d in src fuzz; do [[ -d $root/$d ]] && dirs+=("$d"); done
  [[ ${#dirs[@]} -gt 0 ]] || { echo "no src/ or fuzz/ under $root" >&2; return 2; }
  found=$(cd "$root" && grep -rnE "$kPattern" "${dirs[@]}" --include='*.h' --include='*.hpp' \
            --include='*.cc' --include='*.cpp' --include='*.cu' --include='*.cuh' |
          grep -vE "$kAllowed" | sort)
  [[ -z $found ]] && return 0
  printf '%s\n' "$found"
  return 1
}

check_tree() {
  local out status
  out=$(find_violations "$1"); status=$?
  [[ $status -eq 0 ]] && { echo "kernel front door: no file outside src/kernels/ includes a device's kernel header"; return 0; }
  [[ $status -ne 1 ]] && return "$status"
  while IFS= read -r hit; do
    local file=${hit%%:*} rest=${hit#*:}
    local line=${rest%%:*} text=${rest#*:}
    echo "error: $file:$line: ${text#"${text%%[![:space:]]*}"}"
  done <<< "$out"
  cat <<'MSG'
These files include a device's kernel header (kernels/cpu/ or kernels/cuda/). Outside the device
folders the kernels are reached through kernels/kernels.h only: call the Tensor-level function
it declares (add it there, dispatching to the device in src/kernels/*.cc, if it is missing), and
put argument types in a device-neutral header under src/kernels/ (types.h, dropout_rule.h,
gemm16_paths.h).
MSG
  return 1
}

self_test() {
  local tree out status
  tree=$(mktemp -d) || return 2
  trap 'rm -rf "$tree"' RETURN
  mkdir -p "$tree"/src/ops "$tree"/src/kernels/cpu "$tree"/src/kernels/cuda "$tree"/fuzz
  printf '// planted\n#include "kernels/cpu/gemm.h"\n' > "$tree"/src/ops/planted.cc
  printf '#include <kernels/cuda/gemm.cuh>\n' > "$tree"/fuzz/planted_fuzzer.cc
  printf '#pragma once\n  #  include "cpu/dropout.h"\n' > "$tree"/src/kernels/planted.h
  printf '#include "kernels/kernels.h"\n// kernels/cpu/gemm.h in a comment\n' > "$tree"/src/ops/fine.cc
  printf '#include "kernels/cpu/gemm.h"\n' > "$tree"/src/kernels/kernels.cc
  printf '#include "kernels/cpu/gemm.h"\n' > "$tree"/src/kernels/cpu/gemm16.h
  printf '#include "kernels/cuda/gemm.cuh"\n' > "$tree"/src/kernels/cuda/gemm.cu
  out=$(find_violations "$tree"); status=$?
  local want
  want=$(printf '%s\n' 'fuzz/planted_fuzzer.cc:1:#include <kernels/cuda/gemm.cuh>' \
                       'src/kernels/planted.h:2:  #  include "cpu/dropout.h"' \
                       'src/ops/planted.cc:2:#include "kernels/cpu/gemm.h"')
  if [[ $status -ne 1 || $out != "$want" ]]; then
    printf 'self-test failed (status %s); reported:\n%s\nwanted:\n%s\n' "$status" "$out" "$want"
    return 1
  fi
  echo "self-test: the three planted includes are reported, the allowed ones are not"
}

case ${1:-} in
  --self-test) self_test ;;
  "") echo "usage: $0 ROOT | --self-test" >&2; exit 2 ;;
  *) check_tree "$1" ;;
esac
