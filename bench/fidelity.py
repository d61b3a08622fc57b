"""Shared by the planner benchmarks: measured step times and rank correlation."""
import json
import statistics


def median_step_time(metrics_path):
    """Median step_time_s of a metrics JSONL file, leaving out the first (warm-up) step."""
    lines = [r for r in map(json.loads, open(metrics_path)) if r["step"] > 0][1:]  # step 0: before training
    return statistics.median(line["step_time_s"] for line in lines)


def spearman(xs, ys):
    """Spearman's rank correlation of two equally long lists (no ties expected)."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        for rank, i in enumerate(order):
            out[i] = rank + 1.0
        return out
    a, b = ranks(xs), ranks(ys)
    n = len(xs)
    return 1 - 6 * sum((p - q) ** 2 for p, q in zip(a, b)) / (n * (n * n - 1))
