#!/usr/bin/env bash
# Calibration of device.step_efficiency of clusters/dgx-a100.toml on a published layer time:
# Korthikanti et al. 2022 (arXiv 2205.05198), Table 4: one transformer layer of their 22B GPT
# (hidden 6144, 64 heads, seq 2048, micro-batch 4, tensor parallel 8 on one DGX A100, no
# recomputation, no sequence parallelism) takes 7.7 ms forward and 11.9 ms backward (with
# Megatron-LM's default hidden and attention dropout 0.1, simulated the same).
# The simulated layer is read from the Chrome trace of `oases simulate --cluster` (a middle
# layer: its attention and MLP segments' compute and their blocking all-reduces), at the file's
# step_efficiency and at 1; the step_efficiency that matches the published forward + backward is
# (compute at 1) / (published - collectives). The end-to-end rows of
# bench/run_published_validation.sh are not used here.
#   bash bench/run_layer_calibration.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
bench_header "bash bench/run_layer_calibration.sh $*"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/22b.toml" <<EOF
[model]
layers = 48
hidden = 6144
heads = 64
ffn_hidden = 24576
vocab_size = 51200
seq_len = 2048
dropout = 0.1
attention_dropout = 0.1
[train]
micro_batch = 4
global_batch = 4
precision = "bf16"
[parallel]
tp = 8
schedule = "megatron"
recompute = "none"
EOF
layer_times() {  # extra cluster overrides -> "forward_compute forward_comm backward_compute backward_comm" in ms
  OMP_NUM_THREADS=1 "$oases" simulate --config "$work/22b.toml" --cluster clusters/dgx-a100.toml \
    --trace "$work/trace.json" "$@" >/dev/null
  python3 - "$work/trace.json" <<'PY'
import json, re, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
# Segments 1 + 2l and 2 + 2l are layer l's attention and MLP (segment 0: the embedding).
layer = 20
ms = {"Forward": 0.0, "Backward": 0.0, "fwd": 0.0, "bwd": 0.0}
for e in events:
    m = re.match(r"(\w+)\((?:(fwd|bwd), )?seg=(\d+)", e["name"])
    if not m or int(m.group(3)) not in (1 + 2 * layer, 2 + 2 * layer):
        continue
    key = m.group(2) if m.group(1) == "Start" else m.group(1)
    if key in ms:
        ms[key] += e["dur"] / 1000
print(f'{ms["Forward"]:.3f} {ms["fwd"]:.3f} {ms["Backward"]:.3f} {ms["bwd"]:.3f}')
PY
}
read -r f fc b bc < <(layer_times)
read -r f1 fc1 b1 bc1 < <(layer_times --cluster-set device.step_efficiency=1)
printf '%-34s %10s %10s %10s\n' "" "forward" "backward" "combined"
printf '%-34s %10.2f %10.2f %10.2f\n' "published (Table 4), ms" 7.7 11.9 19.6
printf '%-34s %10.2f %10.2f %10.2f\n' "simulated at the file's setting" "$(echo "$f + $fc" | bc -l)" \
  "$(echo "$b + $bc" | bc -l)" "$(echo "$f + $fc + $b + $bc" | bc -l)"
printf '%-34s %10.2f %10.2f %10.2f\n' "simulated at step_efficiency 1" "$(echo "$f1 + $fc1" | bc -l)" \
  "$(echo "$b1 + $bc1" | bc -l)" "$(echo "$f1 + $fc1 + $b1 + $bc1" | bc -l)"
printf 'collectives (blocking all-reduces) %.2f ms; matching step_efficiency = %.3f\n' \
  "$(echo "$fc1 + $bc1" | bc -l)" "$(echo "($f1 + $b1) / (19.6 - $fc1 - $bc1)" | bc -l)"
