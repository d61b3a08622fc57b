#!/usr/bin/env bash
# Checkpoint stall benchmark: how long a save holds the training loop up, synchronous
# (checkpoint.async = false) against asynchronous (true), on the step-benchmark model
# (configs/bench.toml: GPT, 6 layers, hidden 512, vocab 50304, about 45M parameters; each
# checkpoint holds the weights and AdamW's two moments, about 0.5 GB), alternating the two in
# each of ROUNDS rounds.
#   bash bench/run_checkpoint_bench.sh [ROUNDS=2] [STEPS=8] [EVERY=2]
# Environment: CKPT_DIR=DIR puts the checkpoints on another file system [a temporary folder].
# Prints, per mode, the mean of "checkpoint_s" (the stall the metrics record on the step after
# each save) of each run's first save and of its later ones (an asynchronous run's first save
# also faults in the staging memory that its later saves reuse), the mean step time of the steps right after a save and of the other steps (the
# writer thread shares the cores), and the run's wall time from its first step to its exit
# (async: the last save included).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
steps=${2:-8}
every=${3:-2}

cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
out=$(mktemp -d)
ckpt_root=${CKPT_DIR:-$out}
trap 'rm -rf "$out"' EXIT
build/release/oases prepare-data --input /usr/share/games/fortunes/fortunes --output "$out/data" \
  >/dev/null 2>&1

for r in $(seq 1 "$rounds"); do
  for mode in sync async; do
    async=false
    [[ "$mode" == async ]] && async=true
    rm -rf "$ckpt_root/ck_$mode"
    start=$(date +%s.%N)
    build/release/oases train --quiet --config configs/bench.toml --set \
      "train.steps=$steps" "checkpoint.dir=$ckpt_root/ck_$mode" "checkpoint.every=$every" \
      checkpoint.keep=1 "checkpoint.async=$async" "log.metrics=$out/$mode.$r.jsonl" \
      "data.path=$out/data" log.peak_tflops=1
    end=$(date +%s.%N)
    echo "$start $end" > "$out/$mode.$r.wall"
  done
done

/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
summary = {}
for mode in ("sync", "async"):
    firsts, stalls, waits, after, other, walls = [], [], [], [], [], []
    for r in range(1, rounds + 1):
        records = [json.loads(l) for l in open(f"{out}/{mode}.{r}.jsonl")]
        for rec in records:
            if "loss" not in rec:
                continue
            if "checkpoint_s" in rec:
                (stalls if any("checkpoint_s" in earlier for earlier in records[:records.index(rec)])
                 else firsts).append(rec["checkpoint_s"])
                waits.append(rec.get("checkpoint_wait_s", 0.0))
                after.append(rec["step_time_s"])
            else:
                other.append(rec["step_time_s"])
        start, end = map(float, open(f"{out}/{mode}.{r}.wall").read().split())
        first = next(rec["time"] for rec in records if rec["step"] == 0)
        walls.append(end - first)
    summary[mode] = {
        "saves_measured": len(firsts) + len(stalls),
        "first_stall_s_mean": statistics.mean(firsts),
        "stall_s_mean": statistics.mean(stalls),
        "wait_s_mean": statistics.mean(waits),
        "step_after_save_s_mean": statistics.mean(after),
        "step_other_s_mean": statistics.mean(other),
        "run_wall_s_mean": statistics.mean(walls),
    }
    print(json.dumps({"mode": mode, **summary[mode]}))
s, a = summary["sync"], summary["async"]
print(f"stall per save after the first: sync {s['stall_s_mean']:.3f} s, async "
      f"{a['stall_s_mean']:.3f} s ({s['stall_s_mean'] / a['stall_s_mean']:.1f}x less)")
print(f"stall of the first save: sync {s['first_stall_s_mean']:.3f} s, async "
      f"{a['first_stall_s_mean']:.3f} s")
print(f"step after a save: sync {s['step_after_save_s_mean']:.3f} s, async "
      f"{a['step_after_save_s_mean']:.3f} s (other steps {s['step_other_s_mean']:.3f} / "
      f"{a['step_other_s_mean']:.3f} s)")
print(f"run wall time from step 0 to exit: sync {s['run_wall_s_mean']:.2f} s, async "
      f"{a['run_wall_s_mean']:.2f} s")
PY
