#!/usr/bin/python3
"""Summary of bench/run_step_bench.sh's runs: per arch, step times, tokens/s, model FLOP/s,
MFU against the peak of each run's own precision, PyTorch/engine ratios, peak memory and the
engine's per-kernel breakdown; then a markdown table for the README's "## Speed" section.

  step_bench_summary.py OUT ROUNDS ARCH...

OUT holds the runs' JSON, named ARCH.KIND.ROUND.json (KIND: engine_fp32, engine_bf16,
engine_fp64, torch_fp32, torch_bf16, torch_fp64, torch_default_fp32, baseline_fp32,
baseline_bf16) and, when the peaks were measured, peaks.json (`oases peak --json`).
"""

import datetime
import json
import os
import statistics
import sys

CONFIGS = {"gpt": "configs/bench.toml", "llama": "configs/bench-llama.toml",
           "bert": "configs/bench-bert.toml"}
TITLES = {"gpt": "GPT", "llama": "LLaMA", "bert": "BERT"}
CATEGORIES = ["products", "attention", "norms", "head", "optimizer", "conversions",
              "elementwise", "allocation", "unaccounted"]


def cpuinfo():
    """(model name, flags) of the first processor in /proc/cpuinfo."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name, flags


def isa_of(flags):
    if "avx512f" in flags:
        isa = "AVX-512"
        extras = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
        return isa + (" with " + ", ".join(extras) if extras else " without avx512_bf16")
    if "avx2" in flags:
        return "AVX2"
    return "no AVX2"


class Runs:
    def __init__(self, out, rounds):
        self.out, self.rounds = out, rounds

    def load(self, arch, kind):
        runs = []
        for r in range(1, self.rounds + 1):
            path = f"{self.out}/{arch}.{kind}.{r}.json"
            if os.path.exists(path):
                with open(path) as f:
                    runs.append(json.load(f))
        return runs


def median(runs, key):
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def load_peaks(out):
    path = f"{out}/peaks.json"
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"peaks: {path} is not readable JSON ({e}); MFU is left out")
        return None


def peak_of(peaks, precision):
    if peaks is None:
        return None
    entry = peaks.get("peaks", {}).get(precision)
    if not entry or not entry.get("flops_per_s"):
        return None
    return float(entry["flops_per_s"])


def print_peaks(peaks):
    if peaks is None:
        print("host peaks: not measured (`oases peak --json` failed or was not run): no MFU below")
        return
    host = peaks.get("host", {})
    print(f"host peaks (oases peak): {host.get('cpu', '?')}, {host.get('threads', '?')} threads, "
          f"BLAS {host.get('blas', '?')}, oneDNN {host.get('onednn', '?')}"
          + (f"; cache {peaks['cache']}" if peaks.get("cache") else ""))
    print(f"  {'precision':<10}{'GFLOP/s':>10}  {'path':<28}measured")
    for precision, entry in peaks.get("peaks", {}).items():
        if not isinstance(entry, dict):
            continue
        print(f"  {precision:<10}{fmt(entry.get('flops_per_s') and entry['flops_per_s'] / 1e9, '10.1f', '         -')}"
              f"  {str(entry.get('path', '-')):<28} {entry.get('measured', '-')}")


def summarise_arch(runs, arch, precisions, peaks):
    """Prints the arch's summary; returns its rows for the markdown table."""
    engine_any = next((runs.load(arch, f"engine_{p}") for p in precisions
                       if runs.load(arch, f"engine_{p}")), [])
    if not engine_any:
        print(f"\n{arch}: no engine runs")
        return []
    flops_per_step = engine_any[0]["model_flops_per_step"]
    tokens = engine_any[0]["tokens_per_step"]
    print(f"\n== {TITLES[arch]} ({CONFIGS[arch]}): {tokens} tokens a step, "
          f"{flops_per_step / 1e9:.1f} GFLOP a step; medians of {runs.rounds} round(s) ==")
    print(f"  {'run':<33}{'precision':<10}{'step s':>8}{'tokens/s':>10}{'GFLOP/s':>9}"
          f"{'MFU':>8}{'RSS MiB':>9}")

    def line(label, precision, kind):
        rs = runs.load(arch, kind)
        if not rs:
            return None
        step = median(rs, "step_seconds_median")
        peak = peak_of(peaks, precision)
        flops = flops_per_step / step
        mfu = flops / peak if peak else None
        rss = median(rs, "peak_rss_bytes")
        print(f"  {label:<33}{precision:<10}{step:8.3f}{tokens / step:10.0f}{flops / 1e9:9.1f}"
              f"{fmt(mfu and mfu * 100, '7.1f', '      -')}{'%' if mfu else ' '}"
              f"{fmt(rss and rss / 2**20, '9.0f', '        -')}")
        return {"step": step, "tokens_per_s": tokens / step, "flops": flops, "mfu": mfu,
                "rss": rss, "runs": rs}

    results = {}
    for p in precisions:
        results[("engine", p)] = line("engine", p, f"engine_{p}")
        results[("torch", p)] = line("PyTorch, same OpenBLAS kernels" if p == "fp32"
                                     else "PyTorch autocast, same kernels", p, f"torch_{p}")
        if p == "fp32":
            results[("torch_default", p)] = line("PyTorch, default OpenBLAS", p,
                                                 "torch_default_fp32")
        results[("baseline", p)] = line("baseline engine", p, f"baseline_{p}")
    results[("engine", "fp64")] = line("engine", "fp64", "engine_fp64")
    results[("torch", "fp64")] = line("PyTorch, same OpenBLAS kernels", "fp64", "torch_fp64")

    for p in precisions + ["fp64"]:
        e = results.get(("engine", p))
        if not e:
            continue
        ratios = []
        for key, label in (("torch", "PyTorch/engine"), ("torch_default", "PyTorch default OpenBLAS/engine"),
                           ("baseline", "baseline/engine")):
            other = results.get((key, p))
            if other:
                ratios.append(f"{label} = {other['step'] / e['step']:.2f}x")
        if ratios:
            print(f"  {p}: " + ", ".join(ratios))
        t = results.get(("torch", p))
        if t and e["rss"] and t["rss"]:
            print(f"  {p}: peak RSS engine / PyTorch = {e['rss'] / 2**20:.0f} MiB / "
                  f"{t['rss'] / 2**20:.0f} MiB = {e['rss'] / t['rss']:.2f}")
        b = results.get(("baseline", p))
        if b:
            rounds_of = lambda rs: " / ".join(f"{r['step_seconds_median']:.3f}" for r in rs)
            print(f"  {p}: rounds: engine {rounds_of(e['runs'])}; baseline {rounds_of(b['runs'])}; "
                  f"final loss: engine {e['runs'][0]['final_loss']!r}, "
                  f"baseline {b['runs'][0]['final_loss']!r}")

    print_breakdown(arch, precisions, runs)
    rows = []
    for p in precisions:
        e, t = results.get(("engine", p)), results.get(("torch", p))
        if e:
            rows.append((arch, p, e, t))
    return rows


def print_breakdown(arch, precisions, runs):
    """Median over rounds of each category's seconds in the engine's breakdown step."""
    columns = []
    for p in precisions:
        steps = [r["breakdown"] for r in runs.load(arch, f"engine_{p}") if r.get("breakdown")]
        if steps:
            columns.append((p, steps))
    if not columns:
        return
    print(f"  where the engine's step goes (one extra step with the timing sink installed):")
    header = f"  {'category':<14}"
    for p, _ in columns:
        header += f"{p + ' s':>10}{'share':>8}{'calls':>7}"
    print(header)
    for c in CATEGORIES:
        row = f"  {c:<14}"
        for _, steps in columns:
            seconds = statistics.median(s["categories"][c]["seconds"] for s in steps)
            step = statistics.median(s["step_seconds"] for s in steps)
            calls = statistics.median(s["categories"][c]["calls"] for s in steps)
            row += f"{seconds:10.3f}{seconds / step * 100:7.1f}%{calls:7.0f}"
        print(row)
    row = f"  {'step':<14}"
    for _, steps in columns:
        row += f"{statistics.median(s['step_seconds'] for s in steps):10.3f}{100:7.1f}%{'':7}"
    print(row)


def markdown(rows, peaks, precisions):
    cpu, flags = cpuinfo()
    if peaks and peaks.get("host", {}).get("cpu"):
        cpu = peaks["host"]["cpu"]
    engine0 = rows[0][2]["runs"][0]
    date = datetime.date.today().isoformat()
    print("\nMarkdown for the README's \"## Speed\" section:\n")
    print(f"#### {cpu} ({isa_of(flags)}), OpenBLAS {engine0['openblas_core']} kernels, "
          f"{engine0['threads']} threads, {date}")
    print()
    if peaks:
        parts = []
        for p in precisions:
            peak = peak_of(peaks, p)
            if peak:
                path = peaks["peaks"][p].get("path", "?")
                parts.append(f"{p} {peak / 1e9:.1f} GFLOP/s ({path})")
        print("Peaks measured by `oases peak`: " + ", ".join(parts) + ". MFU is against the "
              "peak of the run's own precision (PyTorch's bf16 autocast against the bf16 peak).")
    else:
        print("Peaks not measured (`oases peak` failed): no MFU.")
    print()
    print("| Model | Precision | Engine step | Engine tokens/s | Engine MFU | PyTorch step | "
          "PyTorch MFU | PyTorch / engine |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    pct = lambda v: "-" if v is None else f"{v * 100:.1f}%"
    for arch, p, e, t in rows:
        torch_label = "fp32" if p == "fp32" else "bf16 autocast"
        print(f"| {TITLES[arch]} | {p} (PyTorch {torch_label}) | {e['step']:.3f} s | "
              f"{e['tokens_per_s']:.0f} | {pct(e['mfu'])} | "
              f"{'-' if not t else format(t['step'], '.3f') + ' s'} | {pct(t and t['mfu'])} | "
              f"{'-' if not t else format(t['step'] / e['step'], '.2f') + 'x'} |")


def main():
    out, rounds, archs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    runs = Runs(out, rounds)
    peaks = load_peaks(out)
    precisions = [p for p in ("fp32", "bf16")
                  if any(runs.load(a, f"engine_{p}") for a in archs)]
    print()
    print_peaks(peaks)
    rows = []
    for arch in archs:
        rows += summarise_arch(runs, arch, precisions, peaks)
    if rows:
        markdown(rows, peaks, precisions)


if __name__ == "__main__":
    main()
