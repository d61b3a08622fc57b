#!/usr/bin/env bash
# Mixed precision side by side: for train.precision = fp32, bf16 and fp16, from one build in
# one invocation,
#  - the step time of the step-benchmark model (configs/bench.toml: GPT, 6 layers, hidden 512,
#    seq 256, micro-batch 8, vocab 50304; the mean of steps 2..S, the precisions alternating
#    round by round so that all see the same machine load), its activation bytes and the
#    memory line the engine logs at start-up (fp32 master, gradients, the 16-bit copy), and the
#    16-bit product path chosen at start-up with its reason;
#  - the validation loss of the demo (configs/demo.toml) after N steps in each precision, and
#    fp16's final loss scale and skipped steps.
#   bash bench/run_precision_bench.sh [N=300] [S=4] [ROUNDS=2]
# Environment: DATA=PREFIX  demo shards (default data/demo, made by scripts/demo.sh)
#              DEMO=0       step times only (the demo's losses do not depend on the load)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
bench_steps=${2:-4}
rounds=${3:-2}
precisions=(fp32 bf16 fp16)

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=build/release/oases
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
data=${DATA:-data/demo}
[[ -f "${data}_train.bin" ]] || { echo "no demo shards at $data: run scripts/demo.sh first" >&2; exit 2; }

common=(checkpoint.dir='""' log.trace='""' log.every=1000000)
for round in $(seq 1 "$rounds"); do
  for p in "${precisions[@]}"; do
    $oases train --config configs/bench.toml --set train.steps="$bench_steps" \
      train.precision="\"$p\"" data.path="\"$data\"" data.tokenizer='"sentencepiece"' \
      log.metrics="\"$out/bench_${p}_$round.jsonl\"" "${common[@]}" \
      2>"$out/bench_${p}_$round.log" >/dev/null
  done
done
demo=${DEMO:-1}
for p in "${precisions[@]}"; do
  [[ "$demo" == 1 ]] || break
  $oases train --config configs/demo.toml --set train.steps="$steps" train.eval_every="$steps" \
    train.precision="\"$p\"" data.path="\"$data\"" log.metrics="\"$out/demo_$p.jsonl\"" \
    "${common[@]}" 2>"$out/demo_$p.log" >/dev/null
done

/usr/bin/python3 - "$out" "$steps" "$rounds" "$demo" "${precisions[@]}" <<'PY'
import json, re, statistics, sys
out, steps, rounds, demo, labels = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:]
def records(path):
    return [json.loads(l) for l in open(path) if l.strip()]
times, activations = {}, {}
for p in labels:
    per_round = []
    for r in range(1, rounds + 1):
        steps_ = [x for x in records(f"{out}/bench_{p}_{r}.jsonl") if x["step"] >= 2]
        per_round.append(statistics.mean(x["step_time_s"] for x in steps_))
        activations[p] = steps_[-1]["peak_activation_bytes"]
    times[p] = statistics.mean(per_round)
print(f"step-benchmark model, mean step time over {rounds} rounds (steps 2..):")
print(f"{'precision':<10} {'step s':>8} {'vs fp32':>8} {'activations MiB':>16}")
for p in labels:
    print(f"{p:<10} {times[p]:>8.3f} {times[p] / times['fp32']:>8.2f} {activations[p] / 2**20:>16.1f}")
for p in labels:
    log = open(f"{out}/bench_{p}_1.log").read()
    for key in ("memory per rank", "precision:"):
        m = re.search(rf"^.*{re.escape(key)}.*$", log, re.M)
        if m: print(f"  {p}: {m.group(0).split('] ')[-1]}")
if not demo: sys.exit(0)
print(f"\ndemo ({steps} steps):")
print(f"{'precision':<10} {'val_loss':>9} {'vs fp32':>8} {'loss scale':>11} {'skipped':>8}")
val = {}
for p in labels:
    rs = records(f"{out}/demo_{p}.jsonl")
    val[p] = [r["val_loss"] for r in rs if r["step"] == steps and "val_loss" in r][-1]
    last = [r for r in rs if r["step"] == steps][-1]
    print(f"{p:<10} {val[p]:>9.4f} {100 * (val[p] / val['fp32'] - 1):>+7.2f}% "
          f"{last.get('loss_scale', '-'):>11} {last.get('skipped_steps', '-'):>8}")
PY
