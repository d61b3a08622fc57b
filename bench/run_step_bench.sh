#!/usr/bin/env bash
# Training-step benchmark: the engine against the same models in PyTorch on this machine, in
# fp32 and bf16, measured side by side (alternating runs, ROUNDS rounds) in one invocation.
#   bash bench/run_step_bench.sh [ARCH=all|gpt|llama|bert] [ROUNDS=2] [STEPS=3]
# ARCH all (the default) runs GPT, LLaMA and BERT of the step-benchmark size
# (configs/bench.toml, bench-llama.toml, bench-bert.toml). Each round, per arch, alternates:
# the engine in fp32 and bf16 (train.precision), PyTorch in fp32 and bf16 autocast
# (torch.autocast on the CPU, fp32 master weights) with OPENBLAS_CORETYPE set to the kernels
# the engine selected, PyTorch fp32 with OpenBLAS left to its own processor detection (what a
# PyTorch user gets from Debian's packages), and BASELINE in both precisions when given.
# Environment:
#   FP64=1           also time both in fp64 (the verification precision)
#   BASELINE=FILE    also time FILE, another build's step benchmark binary (model_step, or
#                    gpt_step of earlier releases), on the same configs in the same rounds
#   PRECISION=P      time only precision P (fp32 or bf16) [both]
#   TORCH=0          leave PyTorch out (the engine against BASELINE alone) [1]
#   PEAKS_JSON=FILE  take the host's peaks from FILE (the JSON of `oases peak --json`) instead
#                    of measuring them with build/release/oases peak --json
#   BREAKDOWN=0      leave out the engine's per-kernel breakdown (model_step --breakdown:
#                    one extra, separately timed step per engine run) [1]
# Prints each run's JSON, the peaks, and per arch a summary: step seconds (median of rounds),
# tokens/s, model GFLOP/s, MFU against the peak of the run's own precision (fp32 runs against
# the fp32 peak; bf16 runs, the engine's and PyTorch autocast's, against the bf16 peak),
# PyTorch/engine step-time ratios per precision (> 1: the engine is faster), peak resident
# memory, and where the engine's step time goes; then a markdown table for the README's
# "## Speed" section naming the CPU, its ISA, the OpenBLAS kernels, the threads and the date.
set -euo pipefail
cd "$(dirname "$0")/.."
arch_arg=${1:-all}
rounds=${2:-2}
steps=${3:-3}

case "$arch_arg" in
  all) archs=(gpt llama bert) ;;
  gpt | llama | bert) archs=("$arch_arg") ;;
  *) echo "ARCH must be all, gpt, llama or bert, not '$arch_arg'" >&2; exit 2 ;;
esac
case "${PRECISION:-}" in
  "") precisions=(fp32 bf16) ;;
  fp32 | bf16) precisions=("$PRECISION") ;;
  *) echo "PRECISION must be fp32 or bf16, not '$PRECISION'" >&2; exit 2 ;;
esac
with_torch=${TORCH:-1}
breakdown=()
[[ "${BREAKDOWN:-1}" == 1 ]] && breakdown=(--breakdown)

cmake --preset release >/dev/null
if [[ -n "${PEAKS_JSON:-}" ]]; then
  cmake --build --preset release --target model_step >/dev/null
else
  cmake --build --preset release --target model_step oases >/dev/null
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The host's peak FLOP/s per precision, the denominators of MFU.
if [[ -n "${PEAKS_JSON:-}" ]]; then
  cp "$PEAKS_JSON" "$out/peaks.json"
elif ! build/release/oases peak --json >"$out/peaks.json" 2>"$out/peaks.err"; then
  echo "run_step_bench: 'build/release/oases peak --json' failed; MFU is left out:" >&2
  sed 's/^/  /' "$out/peaks.err" >&2
  rm -f "$out/peaks.json"
fi

config_of() {
  case "$1" in
    gpt) echo configs/bench.toml ;;
    llama) echo configs/bench-llama.toml ;;
    bert) echo configs/bench-bert.toml ;;
  esac
}
shape_of() {
  case "$1" in
    gpt | bert) echo "--ffn-hidden 2048" ;;
    llama) echo "--ffn-hidden 1376 --kv-heads 4" ;;
  esac
}
# Quoted as TOML text: baselines from before bare words were taken as text read it too.
precision_set() { echo "train.precision=\"$1\""; }

for arch in "${archs[@]}"; do
  config=$(config_of "$arch")
  read -r -a shape <<<"$(shape_of "$arch")"
  torch_args=(--arch "$arch" --layers 6 --hidden 512 --heads 8 "${shape[@]}" --seq-len 256
              --vocab-size 50304 --micro-batch 8 --steps "$steps" --warmup 1)
  for r in $(seq 1 "$rounds"); do
    for p in "${precisions[@]}"; do
      build/release/bench/model_step --config "$config" --steps "$steps" --warmup 1 \
        --set "$(precision_set "$p")" "${breakdown[@]}" | tee "$out/$arch.engine_$p.$r.json"
    done
    core=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["openblas_core"])' \
      "$out/$arch.engine_${precisions[0]}.$r.json")
    if [[ "$with_torch" == 1 ]]; then
      for p in "${precisions[@]}"; do
        autocast=none
        [[ "$p" == bf16 ]] && autocast=bf16
        OPENBLAS_CORETYPE=$core /usr/bin/python3 bench/torch_step.py "${torch_args[@]}" \
          --autocast "$autocast" | tee "$out/$arch.torch_$p.$r.json"
      done
      if [[ " ${precisions[*]} " == *" fp32 "* ]]; then
        /usr/bin/python3 bench/torch_step.py "${torch_args[@]}" | tee "$out/$arch.torch_default_fp32.$r.json"
      fi
    fi
    if [[ -n "${BASELINE:-}" ]]; then
      for p in "${precisions[@]}"; do
        "$BASELINE" --config "$config" --steps "$steps" --warmup 1 --set "$(precision_set "$p")" |
          tee "$out/$arch.baseline_$p.$r.json" ||
          { echo "run_step_bench: the baseline failed on $arch $p" >&2; rm -f "$out/$arch.baseline_$p.$r.json"; }
      done
    fi
    if [[ "${FP64:-0}" == 1 ]]; then
      build/release/bench/model_step --config "$config" --steps "$steps" --warmup 1 \
        --set train.precision=fp64 | tee "$out/$arch.engine_fp64.$r.json"
      if [[ "$with_torch" == 1 ]]; then
        OPENBLAS_CORETYPE=$core /usr/bin/python3 bench/torch_step.py "${torch_args[@]}" \
          --dtype float64 | tee "$out/$arch.torch_fp64.$r.json"
      fi
    fi
  done
done

/usr/bin/python3 bench/step_bench_summary.py "$out" "$rounds" "${archs[@]}"
