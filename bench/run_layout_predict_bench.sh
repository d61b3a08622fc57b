#!/usr/bin/env bash
# Predicted against measured step time of sequence- and context-parallel layouts, in one run:
# for each layout `oases profile` measures the model on that layout's ranks (its own segments
# and transfers: planner::ProfiledLayout), `oases simulate` predicts the step from the profile
# (the run's own program, cluster/plan_prediction.h), and the same layout trains for S steps.
#   one process    tp 1
#   tp2            tp 2 (oases schedule, all-reduces)
#   tp2-sp         tp 2 with sequence parallelism (all-gathers and reduce-scatters)
#   cp2-a2a        cp 2, all-to-all kind
#   cp2-ring       cp 2, ring kind
# The two-rank layouts run over TCP on a loopback capped at RATE Mbit/s
# (bench/capped_loopback.sh).
# Model: GPT 4 layers, hidden 256, 4 heads, ffn 1024, seq 512, byte vocabulary, fp32,
# micro-batch 4 (two sub-batches of 2, oases schedule, fine-grained recomputation), global
# batch 8. One thread per rank.
#   bash bench/run_layout_predict_bench.sh [S=6] [RATE=1000]    (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh
source bench/predict_and_measure.sh
steps=${1:-6}
rate=${2:-1000}
predict_bench_start "bash bench/run_layout_predict_bench.sh $*" "$rate"
cat >"$work/gpt.toml" <<EOF2
[model]
layers = 4
hidden = 256
heads = 4
ffn_hidden = 1024
vocab_size = 256
seq_len = 512
[train]
micro_batch = 4
global_batch = 8
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
EOF2
echo "# model: GPT 4 layers, hidden 256, seq 512, byte vocabulary, fp32, micro-batch 4, global batch 8; oases schedule, fine-grained recomputation; RATE $rate Mbit/s for two ranks; $steps steps per run (medians of steps 2-$steps)"
config=(--config "$work/gpt.toml")

# name | ranks | settings
layouts=(
  "one-process|1|"
  "tp2|2|parallel.tp=2"
  "tp2-sp|2|parallel.tp=2 parallel.sequence_parallel=true"
  "cp2-a2a|2|parallel.cp=2 parallel.cp_kind=all-to-all"
  "cp2-ring|2|parallel.cp=2 parallel.cp_kind=ring"
)
for entry in "${layouts[@]}"; do
  predict_and_measure "$entry"
done
predicted_vs_measured "${layouts[@]}"
