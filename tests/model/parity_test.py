#!/usr/bin/python3
"""PyTorch parity test for the oases GPT model (DESIGN.md, "How we know it works").

Builds a random GPT-2 in PyTorch, hands its weights and one batch to the engine's
`parity_engine` binary through safetensors, and checks that the engine reproduces, within fp32
tolerance: the logits and loss at the initial weights, the gradient of every parameter, the
loss trajectory of `--steps` AdamW steps (with gradient clipping) on that batch, and the final
parameters. The reference runs in float32 (what the engine computes in) and in float64, and
errors are measured against the float64 norm so that the printed fp32-vs-fp64 "floor" says how
much of an error is mere rounding.

Files in --workdir:
  w.safetensors  every parameter, F32, HF GPT-2 names and Conv1D layout ([in, out])
  b.safetensors  inputs, targets: I32 [micro_batch, seq_len]
  cfg.json       model sizes and optimizer settings
  o.safetensors  written by the engine:
                   logits F32 [B, T, V], loss F32 [1]          (initial weights)
                   grad.<name> F32, shape of <name>           (mean loss, before clipping)
                   losses F32 [steps]                         (loss before each update)
                   final.<name> F32, shape of <name>          (after all updates)
The trajectory is PyTorch's: every step runs on the same batch, clips the gradients with
clip_grad_norm_ (scale grad_clip / (norm + 1e-6) when below 1) and applies AdamW (decoupled
decay p *= 1 - lr*wd on tensors with >= 2 dims only; denominator sqrt(v)/sqrt(1-beta2^t) + eps).

Every tensor is compared by ||engine - torch32|| / ||torch64||. c_attn's q, k and v blocks are
compared separately, and the key bias, whose true gradient is identically zero, is checked
against the bias gradient's scale and, after training, only against AdamW's largest possible
move (see checks_for).

Must run under /usr/bin/python3: Debian's python3-torch is only visible there.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time


def fail(message, code=1):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


try:  # a missing numpy or torch must fail the test, never skip it
    import numpy as np
    import torch
except ImportError as e:
    fail(f"cannot import {e.name or 'a module'} in {sys.executable} ({e}). The parity test "
         "needs Debian's python3-torch and python3-numpy (apt-get install -y python3-torch) "
         "and must run with /usr/bin/python3, the interpreter that sees Debian's packages.",
         code=2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402
import torch_gpt  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True, help="path to the parity_engine binary")
    p.add_argument("--workdir", required=True, help="directory for the exchanged files")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn-hidden", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tol", type=float, default=1e-4,
                   help="relative tolerance for logits, loss, gradients and losses")
    p.add_argument("--final-tol", type=float, default=1e-4,
                   help="relative tolerance for the parameters after all steps")
    p.add_argument("--timeout", type=float, default=600, help="seconds the engine may run")
    p.add_argument("--verbose", action="store_true", help="print every tensor's errors")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def run_reference(cfg, init_params, inputs, targets, args, dtype):
    """Everything o.safetensors must hold, computed by PyTorch in `dtype`, as float64 numpy.

    Also returns the pre-clipping gradient norm of every step, to show whether clipping was
    exercised (a test that never clips cannot catch a clipping bug).
    """
    params = {n: t.detach().to(dtype).clone().requires_grad_(True)
              for n, t in init_params.items()}
    optimizer = torch.optim.AdamW(
        torch_gpt.optimizer_param_groups(params, args.weight_decay),
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    out = {}
    losses = []
    grad_norms = []
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        logits = torch_gpt.forward(params, cfg, inputs)
        loss = torch_gpt.loss_fn(logits, targets)
        loss.backward()
        if step == 0:
            # Step 0 runs at the initial weights: its logits, loss and (unclipped) gradients
            # are the single-step part of the contract.
            out["logits"] = logits.detach().clone()
            out["loss"] = loss.detach().reshape(1).clone()
            for n, t in params.items():
                out["grad." + n] = t.grad.detach().clone()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), args.grad_clip)
        grad_norms.append(float(norm))
        optimizer.step()
        losses.append(loss.detach().reshape(()))
    out["losses"] = torch.stack(losses)
    for n, t in params.items():
        out["final." + n] = t.detach().clone()
    return {k: v.to(torch.float64).numpy() for k, v in out.items()}, grad_norms


def run_engine(args, paths):
    engine = os.path.abspath(args.engine)
    if not os.path.isfile(engine) or not os.access(engine, os.X_OK):
        fail(f"engine binary {engine} does not exist or is not executable "
             "(build the parity_engine target first)")
    cmd = [engine, "--config", paths["cfg"], "--weights", paths["weights"],
           "--batch", paths["batch"], "--out", paths["out"]]
    print("running:", " ".join(cmd), flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              cwd=args.workdir)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-4000:]
        fail(f"engine did not finish within {args.timeout:.0f} s; stderr tail:\n"
             f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}")
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        fail(f"engine {how} after {elapsed:.1f} s\n"
             f"--- engine stdout ---\n{proc.stdout[-4000:]}\n"
             f"--- engine stderr ---\n{proc.stderr[-8000:]}")
    print(f"engine finished in {elapsed:.1f} s", flush=True)
    if not os.path.isfile(paths["out"]):
        fail(f"engine exited 0 but did not write {paths['out']}\n"
             f"--- engine stderr ---\n{proc.stderr[-8000:]}")


def relative_l2(a, b, ref):
    """||a - b|| / ||ref||, falling back to the absolute norm when ref is all zeros."""
    denom = float(np.linalg.norm(ref))
    diff = float(np.linalg.norm(a - b))
    return diff / denom if denom > 0 else diff


def adam_drift_bound(lr, beta1, beta2, steps):
    """Largest distance AdamW (no weight decay) can move one element in `steps` steps.

    By Cauchy-Schwarz, |m_t| <= sqrt(v_t) * (1-b1)/sqrt(1-b2) * sqrt(sum_i (b1^2/b2)^i), and
    the bias corrections scale that by sqrt(1-b2^t)/(1-b1^t); eps only shrinks the step. The
    bound holds whatever the gradients are, which is what an element whose gradient is pure
    rounding noise needs.
    """
    total = 0.0
    for t in range(1, steps + 1):
        series = sum((beta1 * beta1 / beta2) ** i for i in range(t))
        ratio = ((1 - beta1) / math.sqrt(1 - beta2) * math.sqrt(series)
                 * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t))
        total += lr * ratio
    return total


def checks_for(name, hidden):
    """Splits a tensor into the blocks compared separately: (label, index, kind).

    c_attn packs q | k | v along its last dimension, and their gradients differ by orders of
    magnitude (the v block dominates), so a whole-tensor norm would hide an error confined to
    q or k. The key bias is special: softmax is invariant to adding q.b_k to every score of a
    row, so its true gradient is identically zero and what any fp32 code computes is rounding
    noise. Its gradient is checked against the whole bias gradient's scale ("inert_grad") and
    its final value only against the largest move AdamW could make ("inert_final"), because
    Adam normalises that noise into steps of up to lr that no two implementations share.
    """
    base = name.split(".", 1)[1] if name.startswith(("grad.", "final.")) else name
    every = (Ellipsis,)
    if base.endswith("attn.c_attn.weight"):
        return [(f"{name}[{part}]", (Ellipsis, slice(k * hidden, (k + 1) * hidden)), "rel")
                for k, part in enumerate("qkv")]
    if base.endswith("attn.c_attn.bias"):
        key_kind = "inert_final" if name.startswith("final.") else (
            "inert_grad" if name.startswith("grad.") else "rel")
        return [(f"{name}[q]", (slice(0, hidden),), "rel"),
                (f"{name}[k]", (slice(hidden, 2 * hidden),), key_kind),
                (f"{name}[v]", (slice(2 * hidden, 3 * hidden),), "rel")]
    return [(name, every, "rel")]


def compare(engine_out, ref32, ref64, groups, ctx):
    """Checks every expected tensor; returns a list of failure messages (empty on success).

    ctx: hidden, init (name -> float64 initial values), drift_bound, verbose.
    """
    failures = []
    expected_names = {name for _, names, _ in groups for name in names}
    unexpected = sorted(set(engine_out) - expected_names)
    missing = sorted(expected_names - set(engine_out))
    if missing:
        failures.append(f"o.safetensors lacks {len(missing)} expected tensor(s): "
                        + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else ""))
        if unexpected:
            # A renamed tensor shows up as one missing and one unexpected name; list both.
            failures.append("o.safetensors holds tensors nobody asked for: "
                            + ", ".join(unexpected[:20])
                            + (" ..." if len(unexpected) > 20 else ""))
    elif unexpected:
        print("note: o.safetensors also holds " + ", ".join(unexpected[:20]), flush=True)

    worst_inert_drift = None  # (drift, label)
    for label, names, tol in groups:
        worst = None  # (rel, name, max_abs)
        worst_floor = (0.0, "")
        group_failures = []
        for name in names:
            if name not in engine_out:
                continue
            got = engine_out[name]
            want = ref32[name]
            if got.dtype != np.float32:
                group_failures.append(f"{name}: dtype {got.dtype}, expected float32 (F32)")
                continue
            if got.shape != want.shape:
                group_failures.append(
                    f"{name}: shape {list(got.shape)}, expected {list(want.shape)}")
                continue
            got = got.astype(np.float64)
            if not np.all(np.isfinite(got)):
                bad = int(np.count_nonzero(~np.isfinite(got)))
                group_failures.append(f"{name}: {bad} non-finite value(s) (NaN or inf)")
                continue
            for check, index, kind in checks_for(name, ctx["hidden"]):
                g, w, w64 = got[index], want[index], ref64[name][index]
                max_abs = float(np.max(np.abs(g - w))) if g.size else 0.0
                if kind == "inert_final":
                    param = name.split(".", 1)[1]
                    drift = float(np.max(np.abs(g - ctx["init"][param][index])))
                    if ctx["verbose"]:
                        print(f"    {check:44s} inert: max drift from init {drift:.3e} "
                              f"(bound {ctx['drift_bound']:.3e}), max abs diff {max_abs:.3e}",
                              flush=True)
                    if worst_inert_drift is None or drift > worst_inert_drift[0]:
                        worst_inert_drift = (drift, check)
                    if drift > ctx["drift_bound"]:
                        group_failures.append(
                            f"{check}: moved {drift:.3e} from its initial value, more than "
                            f"AdamW can move any element in these steps "
                            f"({ctx['drift_bound']:.3e})")
                    continue
                if kind == "inert_grad":
                    # True value 0: measure against the scale of the whole bias gradient.
                    rel = relative_l2(g, w, ref64[name])
                    floor = relative_l2(w, w64, ref64[name])
                else:
                    rel = relative_l2(g, w, w64)
                    floor = relative_l2(w, w64, w64)
                if ctx["verbose"]:
                    note = "  (inert: vs whole-tensor norm)" if kind == "inert_grad" else ""
                    print(f"    {check:44s} rel {rel:.3e}  max abs {max_abs:.3e}  "
                          f"fp32 floor {floor:.3e}{note}", flush=True)
                if worst is None or rel > worst[0]:
                    worst = (rel, check, max_abs)
                if floor >= worst_floor[0]:
                    worst_floor = (floor, check)
                if not rel <= tol:
                    group_failures.append(
                        f"{check}: relative error {rel:.3e} > tolerance {tol:.0e} "
                        f"(max abs diff {max_abs:.3e}, fp32-vs-fp64 floor {floor:.3e})")
        status = "FAIL" if group_failures else "ok"
        if worst is None:
            print(f"{label:7s} {len(names):3d} tensor(s): nothing comparable  [{status}]",
                  flush=True)
        else:
            print(f"{label:7s} {len(names):3d} tensor(s): worst {worst[1]} rel {worst[0]:.3e} "
                  f"(max abs {worst[2]:.3e}) | fp32 floor worst {worst_floor[1]} "
                  f"{worst_floor[0]:.3e} | tol {tol:.0e}  [{status}]", flush=True)
        failures.extend(group_failures)
    if worst_inert_drift is not None:
        print(f"note: key biases (zero true gradient) checked only for drift: worst "
              f"{worst_inert_drift[1]} moved {worst_inert_drift[0]:.3e}, bound "
              f"{ctx['drift_bound']:.3e}", flush=True)
    return failures


def main():
    args = parse_args()
    cfg = torch_gpt.GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                              ffn_hidden=args.ffn_hidden, vocab_size=args.vocab_size,
                              seq_len=args.seq_len)
    os.makedirs(args.workdir, exist_ok=True)
    args.workdir = os.path.abspath(args.workdir)
    paths = {k: os.path.join(args.workdir, f) for k, f in
             [("weights", "w.safetensors"), ("batch", "b.safetensors"),
              ("cfg", "cfg.json"), ("out", "o.safetensors")]}
    # A stale output from an earlier run must never be mistaken for this run's.
    if os.path.exists(paths["out"]):
        os.remove(paths["out"])

    init = torch_gpt.init_params(cfg, args.seed, torch.float32)
    gen = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.micro_batch, args.seq_len)
    inputs = torch.randint(0, cfg.vocab_size, shape, generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg.vocab_size, shape, generator=gen, dtype=torch.int64)

    safetensors_io.save(paths["weights"], {n: t.detach().numpy() for n, t in init.items()})
    safetensors_io.save(paths["batch"], {"inputs": inputs.numpy().astype(np.int32),
                                         "targets": targets.numpy().astype(np.int32)})
    config = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
              "ffn_hidden": args.ffn_hidden, "vocab_size": args.vocab_size,
              "seq_len": args.seq_len, "micro_batch": args.micro_batch, "steps": args.steps,
              "lr": args.lr, "beta1": args.beta1, "beta2": args.beta2, "eps": args.eps,
              "weight_decay": args.weight_decay, "grad_clip": args.grad_clip}
    with open(paths["cfg"], "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"torch {torch.__version__}; config {json.dumps(config)}", flush=True)

    run_engine(args, paths)
    try:
        engine_out = safetensors_io.load(paths["out"])
    except (safetensors_io.SafetensorsError, OSError) as e:
        fail(f"cannot read the engine's output: {e}")

    ref32, norms = run_reference(cfg, init, inputs, targets, args, torch.float32)
    ref64, _ = run_reference(cfg, init, inputs, targets, args, torch.float64)
    clipped = [k for k, n in enumerate(norms) if n > args.grad_clip]
    print(f"torch fp32 losses: {' '.join(f'{x:.6f}' for x in ref32['losses'])}", flush=True)
    if "losses" in engine_out and engine_out["losses"].size:
        print(f"engine losses:     "
              f"{' '.join(f'{x:.6f}' for x in np.ravel(engine_out['losses']))}", flush=True)
    print(f"gradient norms before clipping: {' '.join(f'{n:.4f}' for n in norms)} "
          f"(clipping active in {len(clipped)} of {len(norms)} steps)", flush=True)

    names = list(init)
    groups = [("logits", ["logits"], args.tol),
              ("loss", ["loss"], args.tol),
              ("grad", ["grad." + n for n in names], args.tol),
              ("losses", ["losses"], args.tol),
              ("final", ["final." + n for n in names], args.final_tol)]
    ctx = {"hidden": args.hidden, "verbose": args.verbose,
           "init": {n: t.detach().to(torch.float64).numpy() for n, t in init.items()},
           "drift_bound": adam_drift_bound(args.lr, args.beta1, args.beta2, args.steps)}
    failures = compare(engine_out, ref32, ref64, groups, ctx)
    if failures:
        print(f"FAIL: {len(failures)} problem(s) comparing the engine with PyTorch:",
              file=sys.stderr)
        for message in failures:
            print("  " + message, file=sys.stderr)
        sys.exit(1)
    print("PASS: engine matches PyTorch", flush=True)


if __name__ == "__main__":
    main()
