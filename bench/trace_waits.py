#!/usr/bin/env python3
"""Where a traced step's compute lane waited, from a Chrome trace written by `oases train`
with log.trace (bench/run_overlap_bench.sh writes them with TRACE=1).

  /usr/bin/python3 bench/trace_waits.py RUN.trace.json [--rank R] [--step N] [--top K]

A step runs from the end of one OptimizerStep to the end of the next (the first traced step
is the one after the first OptimizerStep, so the cold first step is left out). Every gap on
the compute lane is charged to the instruction that ran after it: that instruction's Wait
held the lane. Gaps are grouped by instruction kind, segment kind (layers merged) and
micro-batch, and shown as shares of the communication lane's busy time in the step, which is
how the metrics' exposed / comm reads. The communication lane's own idle time is shown too: a
step whose link idles while compute waits is waiting on the other rank, not on the wire.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

GAP_US = 200  # shorter gaps are the executor's own bookkeeping


def events_of(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X"]


def group_of(name):
    """'B1 attention.3 mb2 sb0' -> 'B1 attention mb2'; other names stay as they are."""
    m = re.match(r"(\S+(?: \S+)?) (\w+?)(?:\.\d+)? mb(\d+)", name)
    if not m:
        return name
    return f"{m.group(1)} {m.group(2)} mb{m.group(3)}"


def lane_gaps(events, start, end):
    """Gaps (microseconds, next event) between events of one lane within [start, end), and the
    time from the lane's last event to `end`."""
    gaps, busy_until = [], start
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] - busy_until > GAP_US:
            gaps.append((e["ts"] - busy_until, e))
        busy_until = max(busy_until, e["ts"] + e["dur"])
    return gaps, end - busy_until


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--step", type=int, default=1,
                        help="which traced step after the first OptimizerStep [1]")
    parser.add_argument("--top", type=int, default=15, help="groups to list [15]")
    args = parser.parse_args()

    events = [e for e in events_of(args.trace) if e.get("pid") == args.rank]
    steps = sorted(e["ts"] + e["dur"] for e in events if e["name"] == "OptimizerStep")
    if len(steps) < args.step + 1:
        sys.exit(f"{args.trace}: rank {args.rank} has {len(steps)} OptimizerStep events; "
                 f"--step {args.step} needs {args.step + 1}")
    start, end = steps[args.step - 1], steps[args.step]
    lanes = defaultdict(list)
    for e in events:
        if start <= e["ts"] < end:
            lanes[e["tid"]].append(e)
    compute, comm = lanes[0], lanes[1]
    comm_busy = sum(e["dur"] for e in comm)
    if comm_busy <= 0:
        sys.exit("no communication in the step")
    waits, tail = lane_gaps(compute, start, end)
    idle, comm_tail = lane_gaps(comm, start, end)
    total = sum(g for g, _ in waits)
    print(f"rank {args.rank}, step {args.step}: {(end - start) / 1e6:.3f} s; compute busy "
          f"{sum(e['dur'] for e in compute) / 1e6:.3f} s, communication busy {comm_busy / 1e6:.3f} s")
    print(f"compute waited {total / 1e6:.3f} s = {total / comm_busy:.1%} of the communication "
          f"(and {tail / 1e6:.3f} s after its last instruction: the optimizer step)")
    print(f"communication idle {sum(g for g, _ in idle) / 1e6:.3f} s "
          f"(+ {comm_tail / 1e6:.3f} s after its last collective)")
    by_group = defaultdict(float)
    for gap, e in waits:
        by_group[group_of(e["name"])] += gap
    print(f"\n{'waited s':>9} {'of comm':>8}  before")
    for name, gap in sorted(by_group.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{gap / 1e6:9.3f} {gap / comm_busy:8.1%}  {name}")


if __name__ == "__main__":
    main()
