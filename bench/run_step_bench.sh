#!/usr/bin/env bash
# Training-step benchmark: the engine against the same model in PyTorch on this machine,
# measured side by side (alternating runs, ROUNDS rounds) in one invocation.
#   bash bench/run_step_bench.sh [ARCH=gpt|llama|bert] [ROUNDS=2] [STEPS=3]
# Environment:
#   FP64=1           also time both in fp64 (the verification precision)
#   BASELINE=FILE    also time FILE, another build's step benchmark binary (model_step, or
#                    gpt_step of earlier releases), on the same config in the same rounds
#   PRECISION=P      train.precision of the engine's (and the baseline's) runs [fp32]
#   TORCH=0          leave PyTorch out (the engine against BASELINE alone) [1]
# Prints each run's JSON and a summary: the PyTorch/engine step-time ratio (> 1: the engine is
# faster), the engine's model FLOP/s as a fraction of the peak sgemm FLOP/s measured in the
# same process, and both peak resident memories.
#
# PyTorch runs twice per round: with OpenBLAS left to its own processor detection (what a
# PyTorch user gets from Debian's packages) and with OPENBLAS_CORETYPE set to the kernels the
# engine selected, so the main ratio compares like with like.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-gpt}
rounds=${2:-2}
steps=${3:-3}

case "$arch" in
  gpt) config=configs/bench.toml; shape=(--ffn-hidden 2048) ;;
  llama) config=configs/bench-llama.toml; shape=(--ffn-hidden 1376 --kv-heads 4) ;;
  bert) config=configs/bench-bert.toml; shape=(--ffn-hidden 2048) ;;
  *) echo "ARCH must be gpt, llama or bert, not '$arch'" >&2; exit 2 ;;
esac

cmake --preset release >/dev/null
cmake --build --preset release --target model_step >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Quoted as TOML text: baselines from before bare words were taken as text read it too.
precision=(--set "train.precision=\"${PRECISION:-fp32}\"")
with_torch=${TORCH:-1}
torch_args=(--arch "$arch" --layers 6 --hidden 512 --heads 8 "${shape[@]}" --seq-len 256
            --vocab-size 50304 --micro-batch 8 --steps "$steps" --warmup 1)
for r in $(seq 1 "$rounds"); do
  build/release/bench/model_step --config "$config" --steps "$steps" --warmup 1 "${precision[@]}" |
    tee "$out/engine.$r.json"
  if [[ "$with_torch" == 1 ]]; then
    core=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["openblas_core"])' "$out/engine.$r.json")
    OPENBLAS_CORETYPE=$core /usr/bin/python3 bench/torch_step.py "${torch_args[@]}" | tee "$out/torch_same.$r.json"
    /usr/bin/python3 bench/torch_step.py "${torch_args[@]}" | tee "$out/torch_default.$r.json"
  fi
  if [[ -n "${BASELINE:-}" ]]; then
    "$BASELINE" --config "$config" --steps "$steps" --warmup 1 "${precision[@]}" | tee "$out/baseline.$r.json"
  fi
  if [[ "${FP64:-0}" == 1 ]]; then
    build/release/bench/model_step --config "$config" --steps "$steps" --warmup 1 \
      --set train.precision=fp64 | tee "$out/engine64.$r.json"
    if [[ "$with_torch" == 1 ]]; then
      OPENBLAS_CORETYPE=$core /usr/bin/python3 bench/torch_step.py "${torch_args[@]}" \
        --dtype float64 | tee "$out/torch64.$r.json"
    fi
  fi
done

/usr/bin/python3 - "$out" "$rounds" "$arch" <<'PY'
import json, os, sys, statistics
out, rounds, arch = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda kind: [json.load(open(f"{out}/{kind}.{r}.json")) for r in range(1, rounds + 1)]
have = lambda kind: os.path.exists(f"{out}/{kind}.1.json")
engine = load("engine")
med = lambda runs, key: statistics.median(r[key] for r in runs)
e = med(engine, "step_seconds_median")
print()
print(f"{arch}: engine step (median of rounds)     {e:8.3f} s   [{engine[0].get('precision', 'fp32')}, OpenBLAS {engine[0]['openblas_core']}, {engine[0]['threads']} threads]")
ts = None
if have("torch_same"):
    same, default = load("torch_same"), load("torch_default")
    ts, td = med(same, "step_seconds_median"), med(default, "step_seconds_median")
    print(f"PyTorch step, same OpenBLAS kernels     {ts:8.3f} s   ratio PyTorch/engine = {ts / e:.2f}x")
    print(f"PyTorch step, default OpenBLAS          {td:8.3f} s   ratio PyTorch/engine = {td / e:.2f}x")
print(f"engine model FLOP/s                     {med(engine, 'model_flops_per_s') / 1e9:8.1f} GFLOP/s")
print(f"peak sgemm FLOP/s (same process)        {med(engine, 'peak_sgemm_flops_per_s') / 1e9:8.1f} GFLOP/s")
print(f"engine MFU vs measured sgemm peak       {med(engine, 'mfu_vs_sgemm_peak') * 100:8.1f} %")
if ts is not None:
    er, tr = med(engine, "peak_rss_bytes"), med(same, "peak_rss_bytes")
    print(f"peak RSS engine / PyTorch               {er / 2**20:8.0f} MiB / {tr / 2**20:.0f} MiB = {er / tr:.2f}")
if have("baseline"):
    base = load("baseline")
    b = med(base, "step_seconds_median")
    rounds_of = lambda runs: " / ".join(f"{r['step_seconds_median']:.3f}" for r in runs)
    print(f"baseline engine step                    {b:8.3f} s   baseline/engine = {b / e:.2f}x")
    print(f"  rounds: engine {rounds_of(engine)}; baseline {rounds_of(base)}")
    print(f"  final loss: engine {engine[0]['final_loss']!r}, baseline {base[0]['final_loss']!r}")
if have("engine64"):
    e64 = med(load("engine64"), "step_seconds_median")
    print(f"fp64: engine step                       {e64:8.3f} s   ({e64 / e:.2f}x the step above)")
    if have("torch64"):
        t64 = med(load("torch64"), "step_seconds_median")
        print(f"fp64: PyTorch step, same kernels        {t64:8.3f} s   ratio PyTorch/engine = {t64 / e64:.2f}x")
PY
