#!/usr/bin/env bash
# One job over two hosts against the cluster simulator: tp 2 x dp 2, each tensor-parallel pair
# on a host of its own and the data-parallel reduction between the hosts, over a link capped
# with tc. The hosts are network and UTS namespaces of this machine (as tests/support/hosts.h
# makes them): each has one interface on a bridge, address 10.77.0.k, host name a or b, and a
# token bucket of RATE Mbit/s on what it sends; mpirun runs on host a with a hostfile
# (2 slots each) and starts host b's daemon through an rsh agent that enters b's namespaces.
# The ranks of a host talk over shared memory, the hosts over TCP.
#
# Model: configs/overlap.toml cut to 4 layers of hidden 512 (8 heads, ffn 2048), sequences of
# 128 bytes, micro-batch 4 and global batch 8 (one micro-batch per replica), fp32, one thread
# per rank: 25 MiB of gradients per rank cross the link each step.
# Per round: `oases profile` of that config on the two hosts (two copies of the
# tensor-parallel pair, one per host, sharing the cores as the run's ranks do), `oases
# simulate` with clusters/this-machine-two-hosts.toml (a rank's link and its host's uplink set
# to the cap) and that profile, and `oases train` for STEPS steps after a first, whose median
# step time is the measurement. Prints both with their compute and exposed communication, the
# ratio, and what host b sent per step with its time at the cap.
#   bash bench/run_multihost_bench.sh [RATE=500] [STEPS=5] [ROUNDS=3]   (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/capped_loopback.sh  # bench_header
rate=${1:-500}
steps=${2:-5}
rounds=${3:-3}
[[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns, tc)" >&2; exit 2; }
cmake --preset release >/dev/null
cmake --build --preset release --target oases >/dev/null
oases=$PWD/build/release/oases
bench_header "bash bench/run_multihost_bench.sh $*"

work=$(mktemp -d)
prefix=oases-bench-hosts-$$-
hosts=(a b)
remove_hosts() {
  for h in "${hosts[@]}"; do ip netns del "$prefix$h" 2>/dev/null || true; done
  ip netns del "${prefix}net" 2>/dev/null || true
  rm -rf "$work"
}
trap remove_hosts EXIT

# The hosts: a bridge in a namespace of its own, one veth pair per host, a cap on each host's
# interface (a bucket of 2 ms at the rate, at least 128 KiB, so that bursts cannot beat it).
burst=$((rate * 1000 * 1000 / 8 / 500))
((burst < 131072)) && burst=131072
ip netns add "${prefix}net"
ip -n "${prefix}net" link add br0 type bridge
ip -n "${prefix}net" link set br0 up
: >"$work/hostfile"
for k in "${!hosts[@]}"; do
  h=${hosts[$k]} ns=$prefix${hosts[$k]}
  ip netns add "$ns"
  ip -n "${prefix}net" link add "p$k" type veth peer name eth0 netns "$ns"
  ip -n "${prefix}net" link set "p$k" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.77.0.$((k + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  tc -n "$ns" qdisc replace dev eth0 root tbf rate "${rate}mbit" burst "$burst" latency 100ms
  echo "$h slots=2" >>"$work/hostfile"
done
cat >"$work/rsh-agent" <<EOF
#!/bin/sh
# Open MPI's rsh agent: \`rsh-agent HOST COMMAND...\` runs COMMAND in HOST's namespaces.
host=\$1; shift
exec nsenter --net=/run/netns/$prefix\$host -- unshare --uts -- sh -c 'hostname "\$1" && shift && exec sh -c "\$*"' sh "\$host" "\$@"
EOF
chmod +x "$work/rsh-agent"
on_two_hosts=(nsenter "--net=/run/netns/${prefix}a" -- unshare --uts -- sh -c 'hostname a && exec "$@"' a
              mpirun --allow-run-as-root --hostfile "$work/hostfile" --mca plm_rsh_agent "$work/rsh-agent"
              --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24
              --mca btl self,vader,tcp --bind-to none -x OMP_NUM_THREADS=1 -np 4)

"$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" \
  --tokenizer byte >/dev/null
model=(model.layers=4 model.hidden=512 model.heads=8 model.ffn_hidden=2048 model.seq_len=128
       train.micro_batch=4 train.threads=1 parallel.tp=2 data.path="\"$work/data\""
       checkpoint.dir='""')
settings=("${model[@]}" train.global_batch=8 parallel.dp=2)
# The profile measures one tensor-parallel group; on four ranks it runs two copies of it at
# once, one per host, so that compute shares the cores as in the run, and times the degree-1
# replicas' gradient all-reduce within a host (which calibrates the shared-memory tier).
profile_settings=("${model[@]}" train.global_batch=4 parallel.dp=1)
link=$(printf "%.6f" "$(echo "$rate / 8000" | bc -l)")  # GB/s each way
echo "# two hosts of 2 ranks, link capped at $rate Mbit/s each way ($link GB/s); tp 2 x dp 2"
"${on_two_hosts[@]}" "$oases" train --config configs/overlap.toml --set "${settings[@]}" \
  train.steps=1 2>&1 </dev/null | grep '^hosts:'

for round in $(seq 1 "$rounds"); do
  "${on_two_hosts[@]}" "$oases" profile --config configs/overlap.toml --set "${profile_settings[@]}" \
    --output "$work/profile-$round.json" --steps 5 </dev/null >"$work/profile-$round.log" 2>&1 ||
    { echo "profile failed:"; tail -5 "$work/profile-$round.log"; exit 1; }
  "$oases" simulate --config configs/overlap.toml --set "${settings[@]}" \
    --cluster clusters/this-machine-two-hosts.toml --cluster-set tier.bridge.link_gbs="$link" tier.bridge.uplink_gbs="$link" \
    --profile "$work/profile-$round.json" >"$work/simulate-$round.log"
  sent_before=$(ip netns exec "${prefix}b" cat /sys/class/net/eth0/statistics/tx_bytes)
  "${on_two_hosts[@]}" "$oases" train --quiet --config configs/overlap.toml --set "${settings[@]}" \
    train.steps=$((steps + 1)) log.metrics="\"$work/metrics-$round.jsonl\"" </dev/null \
    >"$work/train-$round.log" 2>&1 || { echo "run failed:"; tail -5 "$work/train-$round.log"; exit 1; }
  sent_after=$(ip netns exec "${prefix}b" cat /sys/class/net/eth0/statistics/tx_bytes)
  echo "$round $work/simulate-$round.log $work/metrics-$round.jsonl $((sent_after - sent_before))" >>"$work/rows.txt"
done
echo "# simulator's report, round 1:"
sed 's/^/#   /' "$work/simulate-1.log"

python3 - "$work/rows.txt" "$rate" "$steps" <<'PY'
import json
import re
import statistics
import sys
sys.path.insert(0, "bench")
from fidelity import median_step_time


def simulated(log):
    """Step, compute and exposed communication of rank 0 in `oases simulate`'s report."""
    text = open(log).read()
    step = float(re.search(r"^simulated step ([0-9.]+) s", text, re.M).group(1))
    row = re.search(r"^\s+0\s+0\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", text, re.M)
    return step, float(row.group(2)), float(row.group(3))


def measured(metrics, key):
    """Median of `key` over the steps after the first (rank 0's figures)."""
    records = [r for r in map(json.loads, open(metrics)) if r["step"] > 1]
    return statistics.median(r[key] for r in records)


rows = [line.split() for line in open(sys.argv[1])]
rate, steps = float(sys.argv[2]), int(sys.argv[3])
print("| round | predicted step s (compute, exposed comm) | measured step s (compute, exposed comm) | predicted / measured | host b sent per step | its time at the cap |")
print("|---|---|---|---|---|---|")
pairs = []
for rnd, log, metrics, sent in rows:
    p, pc, pe = simulated(log)
    m = median_step_time(metrics)
    mc, me = measured(metrics, "compute_s"), measured(metrics, "exposed_comm_s")
    per_step = int(sent) / (steps + 1)
    pairs.append((p, m))
    print(f"| {rnd} | {p:.3f} ({pc:.3f}, {pe:.3f}) | {m:.3f} ({mc:.3f}, {me:.3f}) | {p / m:.3f} | "
          f"{per_step / 1e6:.1f} MB | {per_step * 8 / (rate * 1e6):.3f} s |")
p = statistics.median(x for x, _ in pairs)
m = statistics.median(y for _, y in pairs)
print(f"\nmedian over {len(pairs)} rounds: predicted {p:.3f} s, measured {m:.3f} s, "
      f"ratio {p / m:.3f} ({100 * (p - m) / m:+.1f}%)")
PY
