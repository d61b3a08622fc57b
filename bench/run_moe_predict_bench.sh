#!/usr/bin/env bash
# Predicted against measured step time of a mixture-of-experts GPT, in one run: for each
# layout, `oases profile` measures the model on the ranks of that layout, `oases simulate`
# predicts the step from the profile, and the same layout trains for S steps.
#   one process      tp 1 (every expert local; no all-to-all crosses a wire)
#   ep 2             dp = ep = 2: each rank holds half the experts, all-to-alls over the link
#   tp 2 expert_tp 2 experts split over the tensor-parallel pair (the MoE layers at degree 2)
#   tp 2 expert_tp 1 experts whole, the MoE layers at degree 1 (plan 2,1,2,1)
# The two-rank layouts run over TCP on a loopback capped at RATE Mbit/s
# (bench/capped_loopback.sh), so the profile's fitted expert link is that cap.
# Model: GPT 4 layers, hidden 256, 4 heads, ffn 1024, seq 128, byte vocabulary, fp32,
# micro-batch 8 (two sub-batches of 4, oases schedule), global batch 16; layers 1 and 3 are MoE
# layers of 4 gshard experts 512 wide (capacity factor 1.25). One thread per rank.
#   bash bench/run_moe_predict_bench.sh [S=6] [RATE=1000]    (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
source bench/predict_and_measure.sh
steps=${1:-6}
rate=${2:-1000}
predict_bench_start "bash bench/run_moe_predict_bench.sh $*" "$rate"
cat >"$work/moe.toml" <<EOF
[model]
layers = 4
hidden = 256
heads = 4
ffn_hidden = 1024
vocab_size = 256
seq_len = 128
moe_every = 2
experts = 4
moe_gate = "gshard"
moe_ffn_hidden = 512
capacity_factor = 1.25
[train]
micro_batch = 8
global_batch = 16
steps = $steps
threads = 1
[parallel]
schedule = "oases"
sub_batches = 2
[data]
path = "$work/data"
tokenizer = "byte"
[log]
peak_tflops = 1.0
EOF
echo "# model: GPT 4 layers, hidden 256, seq 128, byte vocabulary, fp32, micro-batch 8, global batch 16; layers 1 and 3: 4 gshard experts of 512; oases schedule; RATE $rate Mbit/s for two ranks; $steps steps per run (medians of steps 2-$steps)"
config=(--config "$work/moe.toml")

# name | ranks | settings
layouts=(
  "one-process|1|"
  "ep2|2|parallel.dp=2 parallel.ep=2 train.micro_batch=4"
  "tp2-expert_tp2|2|parallel.tp=2"
  "tp2-expert_tp1|2|parallel.tp=2 parallel.expert_tp=1"
)
for entry in "${layouts[@]}"; do
  # expert_tp does not change what the profile measures (each degree's MoE segments).
  if [[ $entry == tp2-expert_tp1* ]]; then
    predict_and_measure "$entry" "$work/profile_tp2-expert_tp2.json"
  else
    predict_and_measure "$entry"
  fi
done
predicted_vs_measured "${layouts[@]}"
