#!/usr/bin/python3
"""PyTorch parity test for the oases models (docs/testing.md, "PyTorch parity").

Builds a random GPT-2, LLaMA or BERT (--arch) in PyTorch (torch_gpt.py, torch_llama.py,
torch_bert.py), hands its weights and one batch to the engine's `parity_engine` binary through
safetensors, and checks what the engine computes: the logits and loss at the initial weights,
the gradient of every parameter, the loss trajectory of `--steps` AdamW steps (with gradient
clipping) on that batch, and the final parameters. The engine runs once per precision
(--precision fp64, fp32 or both):

  fp64 run: every compared tensor must be within relative --fp64-tol (1e-10) of PyTorch fp64:
            ||engine64 - torch64|| / ||torch64||. No summation order or kernel choice comes
            near that; a difference is a bug, not rounding.
  fp32 run: the engine must be no further from fp64 than PyTorch's own fp32 run is, measured
            here on the same weights and batch: per tensor
              err_engine32 = ||engine32 - torch64|| / ||torch64||
              err_torch32  = max over --fp32-variants (3) PyTorch fp32 runs with the batch rows
                             in different orders of ||torch32 - torch64|| / ||torch64||
            and the check is err_engine32 <= slack * err_torch32 + --fp32-floor, with slack
            --fp32-slack (2) for logits, loss, gradients and losses and --fp32-final-slack (8)
            for the parameters after training. The floor (default 4 * 2^-24, two fp32 ulps at
            the worst) covers tensors whose torch32 error is ~0 by luck, such as a scalar loss
            that PyTorch's fp32 run happens to round to the same float as fp64: the engine may
            then still be an ulp away without being wrong.
            The final parameters get more slack because their fp32 error is heavy-tailed: where
            an element's gradient is near zero at some step, Adam turns the gradient's rounding
            error into a step of up to lr, and one such element (or the row of activations it
            feeds) dominates the tensor's error. Two equally valid fp32 runs (PyTorch with the
            micro-batch permuted) differ by ratios of 1-1.7 on logits, loss, gradients and
            losses but up to 5 (rarely 15) on final parameters, over 40 configurations; hence
            also the largest error over several row orders as PyTorch fp32's measured noise.

Weights are drawn once in float32, so both runs (and both PyTorch references) start from
identical values; the fp64 file holds them upcast.

Files in --workdir/<precision>/ (the protocol between this driver and parity_engine):
  cfg.json       {"arch": "gpt"|"llama"|"bert", "precision": "fp64"|"fp32", "layers", "hidden",
                  "heads", "kv_heads", "ffn_hidden", "vocab_size", "seq_len", "micro_batch",
                  "steps", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip",
                  "norm_eps", "rope_theta", "tp", "seed",
                  "moe_every", "experts", "moe_gate", "moe_top_k", "capacity_factor",
                  "eval_capacity_factor", "moe_group_size", "moe_aux_loss_coef",
                  "moe_z_loss_coef", "moe_router_noise", "expert_dropout", "moe_ffn_hidden"}
                 (the mixture-of-experts keys, below, are written for every run; moe_every 0
                 is a dense model and the others then mean nothing)
  w.safetensors  every parameter under its Hugging Face name and layout (GPT-2: Conv1D
                 [in, out]; LLaMA, BERT: nn.Linear [out, in]), F64 in an fp64 run, F32 in an
                 fp32 run
  hf/            instead of w.safetensors with --hf-folder: a Hugging Face model folder
                 (config.json as transformers writes it, the same tensors in three shards with
                 model.safetensors.index.json; GPT-2's under "transformer."), which the engine
                 reads through `--init-from`'s folder path and checks against cfg.json
  b.safetensors  inputs, targets: I32 [micro_batch, seq_len]; a negative target is ignored
                 (BERT's unpredicted positions; both -1 and -100 occur) and the loss is the
                 mean over the others
  o.safetensors  written by the engine, in the run's dtype:
                   logits [B, T, V], loss [1]          (initial weights; no logits when
                                                        tp > 1: each rank holds a vocab block)
                   grad.<name>, shape of <name>        (mean loss, before clipping)
                   losses [steps]                      (loss before each update)
                   final.<name>, shape of <name>       (after all updates)
The engine runs as `parity_engine --config cfg.json --weights w.safetensors --batch
b.safetensors --out o.safetensors`, under `mpirun --allow-run-as-root --oversubscribe --mca
btl self,vader -np <tp>` when --tp > 1. The trajectory is PyTorch's: every step runs on the
same batch, clips the gradients with clip_grad_norm_ (scale grad_clip / (norm + 1e-6) when
below 1) and applies torch.optim.AdamW with a constant lr (decoupled decay p *= 1 - lr*wd on
tensors with >= 2 dims only).

Mixture of experts (GPT and LLaMA; torch_moe.py, src/ops/moe.h): with --moe-every k > 0 layer
l (0-based) is an MoE layer iff (l + 1) % k == 0; its MLP becomes a router and --experts expert
FFNs (names and layouts in torch_gpt.py / torch_llama.py). The cfg.json keys:
  moe_every             (--moe-every) 0: dense
  experts               (--experts) E
  moe_gate              (--moe-gate) "noisy-topk" | "gshard" | "switch" | "expert-choice"
  moe_top_k             (--moe-top-k) 0: the gate's (noisy-topk 2, gshard 2, switch 1;
                        expert-choice takes 0 only)
  capacity_factor       (--capacity-factor) training
  eval_capacity_factor  (--eval-capacity-factor) evaluation; 0: capacity_factor
  moe_group_size        (--moe-group-size) tokens per routing group, consecutive in global
                        order (sample * seq_len + position; the micro-batch's row r is global
                        sample r); 0: seq_len. Must divide seq_len or be a multiple of it, and
                        divide micro_batch * seq_len
  moe_aux_loss_coef     (--moe-aux-loss-coef)
  moe_z_loss_coef       (--moe-z-loss-coef)
  moe_router_noise      (--moe-router-noise) noisy-topk's noise scale
  expert_dropout        (--expert-dropout) on each expert's hidden activation, site 5
  moe_ffn_hidden        (--moe-ffn-hidden) each expert's hidden width; 0: ffn_hidden
  seed                  (--seed) train.seed: keys router noise, random routing and expert
                        dropout (and seeds this driver's weights and batch)
For an MoE model "loss", "losses" and the gradients are those of the training objective:
mean cross-entropy + sum over MoE layers of (moe_aux_loss_coef * mean over groups of aux +
moe_z_loss_coef * mean over groups of z), in training mode (noise, random routing, expert
dropout, capacity_factor) with the Philox step of the forward's optimizer step (0 for loss and
grad; s for losses[s]). "logits" alone is computed in evaluation mode (no noise, every gshard
second choice routed, no expert dropout, eval_capacity_factor) at the initial weights.
Routing is piecewise constant, so the driver also checks that the test is meaningful:
--expect-routing names what must happen in the fp64 reference's step-0 training forward
(overflow: a choice dropped for capacity, or for expert-choice a token no expert took;
random-skip: a gshard second choice skipped at random; unserved: a token reaching no expert;
shared: a token taken by several experts), and PyTorch's fp32 runs must route exactly as its
fp64 run in every forward (else the configuration sits on a routing tie and fp32 noise is not
measurable); the smallest decision margin is printed.

Special cases, where a true value is zero and only rounding noise is computed: the key bias
(GPT: the k block of c_attn.bias; BERT: attention.self.key.bias) adds q.b_k to every score of
a row, which softmax ignores, so its true gradient is identically zero. Its gradient is
measured against the norm of the whole q|k|v bias gradient of its layer, and its final value
only against the largest move AdamW can make, because Adam normalises the noise into steps of
up to lr that no two implementations share (see blocks_for). GPT's c_attn weight and bias are
also compared as separate q, k and v blocks, whose gradients differ by orders of magnitude.

torch_engine.py speaks the same protocol with the reference models, so the driver can be
run (and is tested) on a correct engine of every architecture and on planted bugs.

Must run under /usr/bin/python3: Debian's python3-torch is only visible there.
"""

import argparse
import json
import math
import os
import shutil
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
import torch_bert  # noqa: E402
import torch_gpt  # noqa: E402
import torch_llama  # noqa: E402
import torch_moe  # noqa: E402

MODELS = {"gpt": torch_gpt, "llama": torch_llama, "bert": torch_bert}
DEFAULT_NORM_EPS = {"gpt": torch_gpt.LAYER_NORM_EPS, "llama": torch_llama.DEFAULT_NORM_EPS,
                    "bert": torch_bert.DEFAULT_NORM_EPS}
NUMPY_DTYPE = {"fp64": np.float64, "fp32": np.float32}
SAFETENSORS_DTYPE = {"fp64": "F64", "fp32": "F32"}
UNIT_ROUNDOFF_FP32 = 2.0 ** -24
MPIRUN_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]
MAX_FAILURE_LINES = 40  # per run; an engine that gets everything wrong need not list it all
ROUTING_EXPECTATIONS = ("overflow", "random-skip", "unserved", "shared")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True, help="path to the parity_engine binary")
    p.add_argument("--workdir", required=True, help="directory for the exchanged files")
    p.add_argument("--arch", choices=sorted(MODELS), default="gpt")
    p.add_argument("--precision", choices=["fp64", "fp32", "both"], default="both",
                   help="which engine runs to check (both: fp64, then fp32)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None,
                   help="key/value heads (LLaMA's grouped-query attention); default --heads")
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
    p.add_argument("--norm-eps", type=float, default=None,
                   help="LayerNorm/RMSNorm eps; default per arch (gpt 1e-5, llama 1e-5, "
                        "bert 1e-12)")
    p.add_argument("--rope-theta", type=float, default=torch_llama.DEFAULT_ROPE_THETA,
                   help="rotary base (LLaMA)")
    p.add_argument("--rope-scaling-factor", type=float, default=0.0,
                   help="llama: LLaMA 3's rotary frequency scaling factor (0: none)")
    p.add_argument("--rope-low-freq-factor", type=float, default=1.0)
    p.add_argument("--rope-high-freq-factor", type=float, default=4.0)
    p.add_argument("--rope-original-max-positions", type=int, default=8192)
    p.add_argument("--hf-folder", action="store_true",
                   help="hand the weights to the engine as a Hugging Face model folder: "
                        "config.json as transformers writes it for the architecture's class, "
                        "the weights in three shards with model.safetensors.index.json")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks; > 1 runs the engine under mpirun -np TP")
    p.add_argument("--mpirun", default="mpirun", help="mpirun executable for --tp > 1")
    p.add_argument("--mask-fraction", type=float, default=0.3,
                   help="BERT: fraction of positions with a target; the rest are ignored")
    p.add_argument("--seed", type=int, default=1234,
                   help="seeds the weights and the batch; also cfg.json's seed (the engine's "
                        "Philox draws: router noise, random routing, expert dropout)")
    moe = p.add_argument_group("mixture of experts (GPT, LLaMA; ops/moe.h, torch_moe.py)")
    moe.add_argument("--moe-every", type=int, default=0,
                     help="layer l is an MoE layer iff (l + 1) %% k == 0; 0: dense")
    moe.add_argument("--experts", type=int, default=4)
    moe.add_argument("--moe-gate", choices=torch_moe.GATES, default="switch")
    moe.add_argument("--moe-top-k", type=int, default=0, help="0: the gate's default")
    moe.add_argument("--capacity-factor", type=float, default=1.0)
    moe.add_argument("--eval-capacity-factor", type=float, default=0.0,
                     help="0: --capacity-factor")
    moe.add_argument("--moe-group-size", type=int, default=0, help="0: --seq-len")
    moe.add_argument("--moe-aux-loss-coef", type=float, default=0.01)
    moe.add_argument("--moe-z-loss-coef", type=float, default=0.0)
    moe.add_argument("--moe-router-noise", type=float, default=1.0)
    moe.add_argument("--expert-dropout", type=float, default=0.0)
    moe.add_argument("--moe-ffn-hidden", type=int, default=0, help="0: --ffn-hidden")
    moe.add_argument("--expect-routing", default="",
                     help="comma-separated, what the fp64 reference's step-0 training forward "
                          "must show: " + ", ".join(ROUTING_EXPECTATIONS))
    p.add_argument("--fp64-tol", type=float, default=1e-10,
                   help="fp64 run: largest relative error against PyTorch fp64")
    p.add_argument("--fp32-slack", type=float, default=2.0,
                   help="fp32 run: the engine's error in logits, loss, gradients and losses may "
                        "be this many times PyTorch fp32's")
    p.add_argument("--fp32-final-slack", type=float, default=8.0,
                   help="fp32 run: the same for the parameters after training")
    p.add_argument("--fp32-variants", type=int, default=3,
                   help="fp32 run: PyTorch fp32 runs (batch rows in different orders) whose "
                        "largest error is PyTorch fp32's")
    p.add_argument("--fp32-floor", type=float, default=4 * UNIT_ROUNDOFF_FP32,
                   help="fp32 run: relative error always allowed (default 4 * 2^-24)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one engine run may take")
    p.add_argument("--verbose", action="store_true", help="print every tensor's errors")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.tp < 1:
        p.error("--tp must be at least 1")
    if args.kv_heads is None:
        args.kv_heads = args.heads
    elif args.arch != "llama" and args.kv_heads != args.heads:
        p.error(f"--kv-heads differs from --heads, but {args.arch} has no grouped-query "
                "attention")
    if args.norm_eps is None:
        args.norm_eps = DEFAULT_NORM_EPS[args.arch]
    if args.arch == "bert" and not 0 < args.mask_fraction <= 1:
        p.error("--mask-fraction must be in (0, 1]")
    args.expect_routing = [e for e in args.expect_routing.split(",") if e]
    unknown = [e for e in args.expect_routing if e not in ROUTING_EXPECTATIONS]
    if unknown:
        p.error(f"--expect-routing: unknown {', '.join(unknown)} (valid: "
                f"{', '.join(ROUTING_EXPECTATIONS)})")
    if args.moe_every > 0:
        if args.arch == "bert":
            p.error("--moe-every: mixture-of-experts layers exist for gpt and llama only")
        group = args.moe_group_size or args.seq_len
        if not (args.seq_len % group == 0 or group % args.seq_len == 0):
            p.error(f"--moe-group-size {group} must divide --seq-len {args.seq_len} or be a "
                    "multiple of it")
        if (args.micro_batch * args.seq_len) % group != 0:
            p.error(f"--moe-group-size {group} must divide the micro-batch's "
                    f"{args.micro_batch * args.seq_len} tokens")
    elif args.expect_routing:
        p.error("--expect-routing needs --moe-every > 0")
    if args.rope_scaling_factor > 0 and args.arch != "llama":
        p.error("--rope-scaling-factor: rotary frequencies exist for llama only")
    if args.hf_folder and args.moe_every > 0:
        p.error("--hf-folder: mixture-of-experts models have no Hugging Face class here")
    return args


def moe_config(args):
    """The torch_moe.MoeConfig of the command line, or None for a dense model."""
    if args.moe_every <= 0:
        return None
    return torch_moe.MoeConfig(
        every=args.moe_every, experts=args.experts, gate=args.moe_gate, top_k=args.moe_top_k,
        capacity_factor=args.capacity_factor, eval_capacity_factor=args.eval_capacity_factor,
        group_size=args.moe_group_size, aux_loss_coef=args.moe_aux_loss_coef,
        z_loss_coef=args.moe_z_loss_coef, router_noise=args.moe_router_noise,
        expert_dropout=args.expert_dropout, ffn_hidden=args.moe_ffn_hidden, seed=args.seed)


def moe_json(args):
    """The mixture-of-experts keys of cfg.json (torch_moe.CONFIG_KEYS)."""
    return {"seed": args.seed, "moe_every": args.moe_every, "experts": args.experts,
            "moe_gate": args.moe_gate, "moe_top_k": args.moe_top_k,
            "capacity_factor": args.capacity_factor,
            "eval_capacity_factor": args.eval_capacity_factor,
            "moe_group_size": args.moe_group_size, "moe_aux_loss_coef": args.moe_aux_loss_coef,
            "moe_z_loss_coef": args.moe_z_loss_coef, "moe_router_noise": args.moe_router_noise,
            "expert_dropout": args.expert_dropout, "moe_ffn_hidden": args.moe_ffn_hidden}


def model_config(args):
    common = dict(layers=args.layers, hidden=args.hidden, heads=args.heads,
                  ffn_hidden=args.ffn_hidden, vocab_size=args.vocab_size, seq_len=args.seq_len,
                  norm_eps=args.norm_eps)
    try:
        moe = moe_config(args)
        if moe is not None:
            common["moe"] = moe
        if args.arch == "gpt":
            return torch_gpt.GPTConfig(**common)
        if args.arch == "llama":
            return torch_llama.LlamaConfig(
                kv_heads=args.kv_heads, rope_theta=args.rope_theta,
                rope_scaling_factor=args.rope_scaling_factor,
                rope_low_freq_factor=args.rope_low_freq_factor,
                rope_high_freq_factor=args.rope_high_freq_factor,
                rope_original_max_positions=args.rope_original_max_positions, **common)
        return torch_bert.BertConfig(**common)
    except ValueError as e:
        fail(f"bad model sizes: {e}", code=2)


def make_batch(args, cfg):
    """inputs, targets: int64 [micro_batch, seq_len].

    Causal models predict every position. BERT predicts about --mask-fraction of them (at
    least one); the others get a negative target, -100 (Hugging Face's ignore index) or -1,
    mixed so that an engine recognising only one of them fails.
    """
    gen = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.micro_batch, args.seq_len)
    inputs = torch.randint(0, cfg.vocab_size, shape, generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg.vocab_size, shape, generator=gen, dtype=torch.int64)
    if args.arch == "bert":
        predicted = torch.rand(shape, generator=gen) < args.mask_fraction
        predicted.view(-1)[0] = True
        ignored = torch.where(torch.rand(shape, generator=gen) < 0.5, -1, -100)
        targets = torch.where(predicted, targets, ignored)
    return inputs, targets


def run_reference(model, cfg, init_params, inputs, targets, args, dtype, order=None):
    """Everything o.safetensors must hold, computed by PyTorch in `dtype`, as float64 numpy.

    `order` (a permutation of the batch rows) runs the same computation with the rows in
    another order, which sums the gradients in another order: an equally valid result whose
    difference from the others is rounding. Logits are returned in the original row order.
    Also returns the pre-clipping gradient norm of every step, to show whether clipping was
    exercised (a test that never clips cannot catch a clipping bug), and for an MoE model the
    torch_moe.MoeRun of every forward ({"train": [one per step], "eval": the logits' run}),
    whose reports say how it routed (None for a dense model).

    An MoE model's row r is global sample order[r] (r without `order`): routing groups and
    Philox counters follow the global sample, not the row.
    """
    moe = getattr(cfg, "moe", None)
    samples = order if order is not None else torch.arange(inputs.shape[0])
    routing = {"train": [], "eval": None} if moe is not None else None
    if order is not None:
        inputs, targets = inputs[order], targets[order]
    params = {n: t.detach().to(dtype).clone().requires_grad_(True)
              for n, t in init_params.items()}
    optimizer = torch.optim.AdamW(
        model.optimizer_param_groups(params, args.weight_decay),
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    out = {}
    losses = []
    grad_norms = []
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        if moe is None:
            logits = model.forward(params, cfg, inputs)
            loss = model.loss_fn(logits, targets)
        else:
            run = torch_moe.MoeRun(training=True, step=step, samples=samples)
            logits = model.forward(params, cfg, inputs, run)
            loss = model.loss_fn(logits, targets) + run.objective()
            run.terms = []
            routing["train"].append(run)
        loss.backward()
        if step == 0:
            # Step 0 runs at the initial weights: its logits, loss and (unclipped) gradients
            # are the single-step part of the contract. An MoE model's logits are those of
            # evaluation mode.
            if moe is not None:
                routing["eval"] = torch_moe.MoeRun(training=False, step=0, samples=samples)
                with torch.no_grad():
                    logits = model.forward(params, cfg, inputs, routing["eval"])
            out["logits"] = logits.detach().clone()
            if order is not None:
                out["logits"] = out["logits"][torch.argsort(order)]
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
    return {k: v.to(torch.float64).numpy() for k, v in out.items()}, grad_norms, routing


def _same_decisions(a, b):
    return a.keys() == b.keys() and all(
        len(a[key]) == len(b[key]) and all(np.array_equal(u, v) for u, v in zip(a[key], b[key]))
        for key in a)


def _forwards(routing):
    """(label, MoeRun) of every forward of a reference run."""
    return [("logits (eval)", routing["eval"])] + [
        (f"step {s} (train)", run) for s, run in enumerate(routing["train"])]


def check_routing(args, routing64, routing32):
    """Prints what the MoE reference's routing did and checks --expect-routing and that the
    PyTorch fp32 runs route as the fp64 run; returns failure messages."""
    failures = []
    for label, run in (("step-0 training", routing64["train"][0]),
                       ("evaluation (logits)", routing64["eval"])):
        for layer, groups in sorted(run.reports.items()):
            per_expert = [sum(g.tokens_per_expert[e] for g in groups)
                          for e in range(args.experts)]
            print(f"routing, {label}, layer {layer}: {len(groups)} group(s), capacity "
                  f"{groups[0].capacity}, kept per expert {per_expert}, dropped choices "
                  f"{sum(g.dropped_choices for g in groups)}, skipped second choices "
                  f"{sum(g.skipped_choices for g in groups)}, unserved tokens "
                  f"{sum(g.unserved_tokens for g in groups)}, shared tokens "
                  f"{sum(g.shared_tokens for g in groups)}, aux "
                  f"{np.mean([g.aux for g in groups]):.6f}, z {np.mean([g.z for g in groups]):.6f}",
                  flush=True)
    step0 = routing64["train"][0].summary()
    expert_choice = args.moe_gate == "expert-choice"
    seen = {"overflow": step0["unserved_tokens" if expert_choice else "dropped_choices"] > 0,
            "random-skip": step0["skipped_choices"] > 0,
            "unserved": step0["unserved_tokens"] > 0,
            "shared": step0["shared_tokens"] > 0}
    print("routing in the fp64 step-0 training forward: " + ", ".join(
        f"{name} {'yes' if happened else 'no'}" for name, happened in seen.items())
        + (f" (expected: {', '.join(args.expect_routing)})" if args.expect_routing else ""),
        flush=True)
    for name in args.expect_routing:
        if not seen[name]:
            failures.append(f"--expect-routing {name}: did not happen in PyTorch's fp64 step-0 "
                            "training forward; the test does not exercise it (change the "
                            "capacity factor, routers or --seed)")
    margins = [(run.summary()["margin"], label) for label, run in _forwards(routing64)]
    worst = min(margins)
    print(f"smallest routing decision margin over every fp64 forward: {worst[0]:.3e} "
          f"({worst[1]}; the gap between the values of a choice made and one not made)",
          flush=True)
    if routing32:
        differ = []
        for variant, r32 in enumerate(routing32):
            for (label, run64), (_, run32) in zip(_forwards(routing64), _forwards(r32)):
                if not _same_decisions(run32.decisions(), run64.decisions()):
                    differ.append(f"PyTorch fp32 (row order {variant}) routes differently from "
                                  f"fp64 in the {label} forward: the configuration sits on a "
                                  "routing tie, where fp32 noise cannot be measured (change "
                                  "--seed)")
                    break
        print(f"PyTorch fp32 routes as fp64 in every forward of {len(routing32)} row "
              f"order(s): {'no' if differ else 'yes'}", flush=True)
        failures += differ
    return failures


def engine_command(args, paths):
    engine = os.path.abspath(args.engine)
    cmd = [engine, "--config", paths["cfg"], "--weights", paths["weights"],
           "--batch", paths["batch"], "--out", paths["out"]]
    if args.tp > 1:
        cmd = [args.mpirun, *MPIRUN_FLAGS, "-np", str(args.tp), *cmd]
    return cmd


def run_engine(args, paths):
    """Runs the engine; returns None on success or a message saying what went wrong."""
    engine = os.path.abspath(args.engine)
    if not os.path.isfile(engine) or not os.access(engine, os.X_OK):
        fail(f"engine binary {engine} does not exist or is not executable "
             "(build the parity_engine target first)")
    if args.tp > 1 and shutil.which(args.mpirun) is None:
        fail(f"--tp {args.tp} needs {args.mpirun}, which is not on PATH")
    cmd = engine_command(args, paths)
    print("running:", " ".join(cmd), flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              cwd=os.path.dirname(paths["out"]))
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-4000:]
        return (f"engine did not finish within {args.timeout:.0f} s; stderr tail:\n"
                f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}")
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        return (f"engine {how} after {elapsed:.1f} s\n"
                f"--- engine stdout ---\n{proc.stdout[-4000:]}\n"
                f"--- engine stderr ---\n{proc.stderr[-8000:]}")
    print(f"engine finished in {elapsed:.1f} s", flush=True)
    if not os.path.isfile(paths["out"]):
        return (f"engine exited 0 but did not write {paths['out']}\n"
                f"--- engine stderr ---\n{proc.stderr[-8000:]}")
    return None


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


def blocks_for(arch, name, hidden):
    """Splits a tensor into the blocks compared separately: (label, index, kind, scale).

    kind "rel": relative to the block's own fp64 norm. kind "inert_grad": the gradient of a key
    bias, whose true value is zero; measured against the norm of `scale`, the fp64 gradients
    of the q|k|v biases of its layer. kind "inert_final": the key bias after training, checked
    only for moving no further than AdamW can (the module docstring says why).
    """
    kind, base = (name.split(".", 1) if name.startswith(("grad.", "final."))
                  else ("", name))
    every = (Ellipsis,)
    if arch == "gpt":
        if base.endswith("attn.c_attn.weight"):
            return [(f"{name}[{part}]", (Ellipsis, slice(k * hidden, (k + 1) * hidden)), "rel",
                     None) for k, part in enumerate("qkv")]
        if base.endswith("attn.c_attn.bias"):
            key = {"final": ("inert_final", None), "grad": ("inert_grad", [name])}.get(
                kind, ("rel", None))
            return [(f"{name}[q]", (slice(0, hidden),), "rel", None),
                    (f"{name}[k]", (slice(hidden, 2 * hidden),), *key),
                    (f"{name}[v]", (slice(2 * hidden, 3 * hidden),), "rel", None)]
    if arch == "bert" and base.endswith("attention.self.key.bias"):
        if kind == "final":
            return [(name, every, "inert_final", None)]
        if kind == "grad":
            layer = name[:-len("key.bias")]
            return [(name, every, "inert_grad",
                     [layer + proj + ".bias" for proj in ("query", "key", "value")])]
    return [(name, every, "rel", None)]


def _norm(x):
    return float(np.linalg.norm(x))


def check_names(engine_out, precision, expected_names):
    """Failure messages for missing tensors, unexpected ones (when some are missing) and
    tensors that are not in the run's dtype."""
    failures = []
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
    want_dtype = np.dtype(NUMPY_DTYPE[precision])
    wrong_dtype = sorted(n for n in expected_names
                         if n in engine_out and engine_out[n].dtype != want_dtype)
    if wrong_dtype:
        found = sorted({str(engine_out[n].dtype) for n in wrong_dtype})
        failures.append(f"{len(wrong_dtype)} tensor(s) are {'/'.join(found)}, not "
                        f"{SAFETENSORS_DTYPE[precision]} as a {precision} run must write "
                        f"(first: {wrong_dtype[0]}); compared after conversion anyway")
    return failures


def compare_block(precision, label, got, w64, t32, denom, args):
    """One block's errors against fp64: (err, torch_err, ratio, failure message or None).

    torch_err and ratio are None in an fp64 run. `denom` is the norm errors are relative to.
    """
    denom = denom if denom > 0 else 1.0  # an all-zero reference: absolute error
    err = _norm(got - w64) / denom
    if precision == "fp64":
        if err <= args.fp64_tol:
            return err, None, None, None
        return err, None, None, (f"engine fp64 error {err:.3e} > tolerance "
                                 f"{args.fp64_tol:.0e}")
    torch_err = max(_norm(t - w64) for t in t32) / denom
    ratio = err / torch_err if torch_err > 0 else (math.inf if err > 0 else 0.0)
    slack = args.fp32_final_slack if label == "final" else args.fp32_slack
    if err <= slack * torch_err + args.fp32_floor:
        return err, torch_err, ratio, None
    return err, torch_err, ratio, (f"engine fp32 error {err:.3e} > {slack:g} x torch fp32 "
                                   f"error {torch_err:.3e} + floor {args.fp32_floor:.1e} "
                                   f"(ratio {ratio:.2f})")


def check_tensors(engine_out, precision, ref64, ref32, groups, ctx):
    """Checks every expected tensor of one engine run.

    Returns (failures, rows): failure messages (empty on success) and, per group, a summary
    for the table: label, count, worst engine error, worst torch32 error, worst ratio, status.
    ctx: arch, hidden, init (name -> float64 initial values), drift_bound, args.
    """
    args = ctx["args"]
    failures = check_names(engine_out, precision,
                           {name for _, names in groups for name in names})
    rows = []
    worst_inert_drift = None  # (drift, label)
    for label, names in groups:
        row = {"label": label, "count": len(names), "engine": None, "torch32": None,
               "ratio": None, "failed": False}
        rows.append(row)
        for name in names:
            if name not in engine_out:
                continue
            got = engine_out[name].astype(np.float64)
            if got.shape != ref64[name].shape:
                failures.append(f"{precision} {name}: shape {list(got.shape)}, expected "
                                f"{list(ref64[name].shape)}")
                row["failed"] = True
                continue
            if not np.all(np.isfinite(got)):
                bad = int(np.count_nonzero(~np.isfinite(got)))
                failures.append(f"{precision} {name}: {bad} non-finite value(s) (NaN or inf)")
                row["failed"] = True
                continue
            for check, index, kind, scale in blocks_for(ctx["arch"], name, ctx["hidden"]):
                if kind == "inert_final":
                    drift = float(np.max(np.abs(got[index]
                                                - ctx["init"][name.split(".", 1)[1]][index])))
                    if args.verbose:
                        print(f"    {check:56s} inert: max drift from init {drift:.3e} "
                              f"(bound {ctx['drift_bound']:.3e})", flush=True)
                    if worst_inert_drift is None or drift > worst_inert_drift[0]:
                        worst_inert_drift = (drift, check)
                    if not drift <= ctx["drift_bound"]:
                        failures.append(
                            f"{precision} {check}: moved {drift:.3e} from its initial value, "
                            f"more than AdamW can move any element in these steps "
                            f"({ctx['drift_bound']:.3e})")
                        row["failed"] = True
                    continue
                w64 = ref64[name][index]
                if kind == "inert_grad":
                    denom = math.sqrt(sum(_norm(ref64[s]) ** 2 for s in scale))
                    note = "  (zero true value: vs the q|k|v bias gradient norm)"
                else:
                    denom, note = _norm(w64), ""
                t32 = [r[name][index] for r in ref32] if precision == "fp32" else None
                err, torch_err, ratio, problem = compare_block(precision, label, got[index],
                                                               w64, t32, denom, args)
                if args.verbose:
                    more = "" if ratio is None else (f"  torch32 {torch_err:.3e}  "
                                                     f"ratio {ratio:6.3f}")
                    print(f"    {check:56s} engine {err:.3e}{more}{note}", flush=True)
                if problem is not None:
                    failures.append(f"{precision} {check}: {problem}{note}")
                    row["failed"] = True
                for key, value in (("engine", err), ("torch32", torch_err), ("ratio", ratio)):
                    if value is not None and (row[key] is None or value > row[key][0]):
                        row[key] = (value, check)
    if worst_inert_drift is not None:
        print(f"note: key biases (zero true gradient) checked only for drift after training: "
              f"worst {worst_inert_drift[1]} moved {worst_inert_drift[0]:.3e}, bound "
              f"{ctx['drift_bound']:.3e}", flush=True)
    return failures, rows


def print_table(precision, rows, args):
    if precision == "fp64":
        print(f"fp64 run: err = ||engine64 - torch64|| / ||torch64||, tolerance "
              f"{args.fp64_tol:.0e}", flush=True)
        print(f"  {'category':8s} {'n':>4s}  {'worst err':>10s}  tensor", flush=True)
        for r in rows:
            status = "FAIL" if r["failed"] else "ok"
            e = r["engine"] or (float("nan"), "-")
            print(f"  {r['label']:8s} {r['count']:4d}  {e[0]:10.3e}  {e[1]}  [{status}]",
                  flush=True)
        return
    print(f"fp32 run: engine = ||engine32 - torch64|| / ||torch64||, torch32 = ||torch32 - "
          f"torch64|| / ||torch64||; pass when engine <= slack x torch32 + "
          f"{args.fp32_floor:.2e}, slack {args.fp32_slack:g} ({args.fp32_final_slack:g} for "
          f"final)", flush=True)
    print(f"  {'category':8s} {'n':>4s}  {'worst engine':>12s}  {'worst torch32':>13s}  "
          f"{'worst ratio':>11s}  tensor with the worst ratio", flush=True)
    worst = {}
    for r in rows:
        status = "FAIL" if r["failed"] else "ok"
        e = r["engine"] or (float("nan"), "-")
        t = r["torch32"] or (float("nan"), "-")
        q = r["ratio"] or (float("nan"), "-")
        print(f"  {r['label']:8s} {r['count']:4d}  {e[0]:12.3e}  {t[0]:13.3e}  {q[0]:11.3f}  "
              f"{q[1]}  [{status}]", flush=True)
        kind = "final" if r["label"] == "final" else "other"
        if r["ratio"] is not None and (kind not in worst or r["ratio"][0] > worst[kind][0]):
            worst[kind] = r["ratio"]
    if "other" in worst:
        print(f"  worst engine/torch32 ratio, logits to losses: {worst['other'][0]:.3f} "
              f"({worst['other'][1]}; slack {args.fp32_slack:g})", flush=True)
    if "final" in worst:
        print(f"  worst engine/torch32 ratio, final parameters: {worst['final'][0]:.3f} "
              f"({worst['final'][1]}; slack {args.fp32_final_slack:g})", flush=True)


def hf_config(args):
    """config.json of the model as transformers writes it for GPT2LMHeadModel,
    LlamaForCausalLM or BertForMaskedLM (dropout off, as in the parity runs)."""
    if args.arch == "gpt":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "activation_function": "gelu_new", "attn_pdrop": 0.0, "embd_pdrop": 0.0,
                "resid_pdrop": 0.0, "initializer_range": 0.02,
                "layer_norm_epsilon": args.norm_eps, "n_ctx": args.seq_len,
                "n_embd": args.hidden, "n_head": args.heads, "n_inner": args.ffn_hidden,
                "n_layer": args.layers, "n_positions": args.seq_len,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "use_cache": True,
                "vocab_size": args.vocab_size}
    if args.arch == "llama":
        scaling = None
        if args.rope_scaling_factor > 0:
            scaling = {"rope_type": "llama3", "factor": args.rope_scaling_factor,
                       "low_freq_factor": args.rope_low_freq_factor,
                       "high_freq_factor": args.rope_high_freq_factor,
                       "original_max_position_embeddings": args.rope_original_max_positions}
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "attention_bias": False, "attention_dropout": 0.0,
                "head_dim": args.hidden // args.heads, "hidden_act": "silu",
                "hidden_size": args.hidden, "initializer_range": 0.02,
                "intermediate_size": args.ffn_hidden, "max_position_embeddings": args.seq_len,
                "mlp_bias": False, "num_attention_heads": args.heads,
                "num_hidden_layers": args.layers, "num_key_value_heads": args.kv_heads,
                "pretraining_tp": 1, "rms_norm_eps": args.norm_eps, "rope_scaling": scaling,
                "rope_theta": args.rope_theta, "tie_word_embeddings": False, "use_cache": True,
                "vocab_size": args.vocab_size}
    return {"architectures": ["BertForMaskedLM"], "model_type": "bert",
            "attention_probs_dropout_prob": 0.0, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "hidden_size": args.hidden, "initializer_range": 0.02,
            "intermediate_size": args.ffn_hidden, "layer_norm_eps": args.norm_eps,
            "max_position_embeddings": args.seq_len, "num_attention_heads": args.heads,
            "num_hidden_layers": args.layers, "pad_token_id": 0,
            "position_embedding_type": "absolute", "type_vocab_size": 2, "use_cache": True,
            "vocab_size": args.vocab_size}


def write_hf_folder(args, folder, tensors):
    """A Hugging Face model folder: config.json, the tensors (GPT-2's under "transformer.")
    in three shards of consecutive names, and model.safetensors.index.json naming each
    tensor's shard with the total bytes."""
    os.makedirs(folder, exist_ok=True)
    for stale in os.listdir(folder):
        os.remove(os.path.join(folder, stale))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(args), f, indent=2)
    prefix = "transformer." if args.arch == "gpt" else ""
    names = sorted(tensors)
    count = 3
    weight_map, total = {}, 0
    for k in range(count):
        part = names[k * len(names) // count:(k + 1) * len(names) // count]
        file = f"model-{k + 1:05d}-of-{count:05d}.safetensors"
        safetensors_io.save(os.path.join(folder, file),
                            {prefix + n: tensors[n] for n in part}, {"format": "pt"})
        for n in part:
            weight_map[prefix + n] = file
            total += tensors[n].nbytes
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def write_inputs(args, precision, init, inputs, targets):
    """Writes cfg.json, w.safetensors and b.safetensors for one run; returns the paths."""
    workdir = os.path.join(args.workdir, precision)
    os.makedirs(workdir, exist_ok=True)
    paths = {k: os.path.join(workdir, f) for k, f in
             [("weights", "w.safetensors"), ("batch", "b.safetensors"),
              ("cfg", "cfg.json"), ("out", "o.safetensors")]}
    # A stale output from an earlier run must never be mistaken for this run's.
    if os.path.exists(paths["out"]):
        os.remove(paths["out"])
    dtype = NUMPY_DTYPE[precision]
    weights = {n: t.detach().numpy().astype(dtype) for n, t in init.items()}
    if args.hf_folder:
        paths["weights"] = os.path.join(workdir, "hf")
        write_hf_folder(args, paths["weights"], weights)
    else:
        safetensors_io.save(paths["weights"], weights)
    safetensors_io.save(paths["batch"], {"inputs": inputs.numpy().astype(np.int32),
                                         "targets": targets.numpy().astype(np.int32)})
    config = {"arch": args.arch, "precision": precision, "layers": args.layers,
              "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
              "ffn_hidden": args.ffn_hidden, "vocab_size": args.vocab_size,
              "seq_len": args.seq_len, "micro_batch": args.micro_batch, "steps": args.steps,
              "lr": args.lr, "beta1": args.beta1, "beta2": args.beta2, "eps": args.eps,
              "weight_decay": args.weight_decay, "grad_clip": args.grad_clip,
              "norm_eps": args.norm_eps, "rope_theta": args.rope_theta, "tp": args.tp,
              "rope_scaling_factor": args.rope_scaling_factor,
              "rope_low_freq_factor": args.rope_low_freq_factor,
              "rope_high_freq_factor": args.rope_high_freq_factor,
              "rope_original_max_positions": args.rope_original_max_positions,
              **moe_json(args)}
    with open(paths["cfg"], "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"{precision} config {json.dumps(config)}", flush=True)
    return paths


def check_run(args, precision, init, inputs, targets, refs, groups, ctx):
    """One engine run in `precision`: writes its files, runs it, compares; returns failures."""
    print(f"=== {args.arch} {precision} run ===", flush=True)
    paths = write_inputs(args, precision, init, inputs, targets)
    problem = run_engine(args, paths)
    if problem is not None:
        return [f"{precision} {problem}"]
    try:
        engine_out = safetensors_io.load(paths["out"])
    except (safetensors_io.SafetensorsError, OSError) as e:
        return [f"{precision}: cannot read the engine's output: {e}"]
    if "losses" in engine_out and engine_out["losses"].size:
        print(f"engine losses:     "
              f"{' '.join(f'{x:.9f}' for x in np.ravel(engine_out['losses']))}", flush=True)
    failures, rows = check_tensors(engine_out, precision, refs["fp64"], refs.get("fp32"),
                                   groups, ctx)
    print_table(precision, rows, args)
    return failures


def main():
    args = parse_args()
    model = MODELS[args.arch]
    cfg = model_config(args)
    os.makedirs(args.workdir, exist_ok=True)
    args.workdir = os.path.abspath(args.workdir)
    precisions = ["fp64", "fp32"] if args.precision == "both" else [args.precision]

    init = model.init_params(cfg, args.seed, torch.float32)
    inputs, targets = make_batch(args, cfg)
    predicted = int((targets >= 0).sum())
    print(f"torch {torch.__version__}; {args.arch} {cfg}; {predicted} of {targets.numel()} "
          f"targets predicted", flush=True)

    refs = {}
    refs["fp64"], norms, routing64 = run_reference(model, cfg, init, inputs, targets, args,
                                                   torch.float64)
    routing32 = None
    if "fp32" in precisions:
        # PyTorch fp32's distance from fp64 is measured over several equally valid row orders
        # and the largest taken: after AdamW steps, which turn the rounding of near-zero
        # gradient elements into steps of up to lr, one order can be far luckier than another.
        gen = torch.Generator().manual_seed(args.seed + 7)
        orders = [None] + [torch.randperm(args.micro_batch, generator=gen)
                           for _ in range(args.fp32_variants - 1)]
        runs32 = [run_reference(model, cfg, init, inputs, targets, args, torch.float32, order)
                  for order in orders]
        refs["fp32"] = [r[0] for r in runs32]
        routing32 = [r[2] for r in runs32] if routing64 is not None else None
    clipped = [k for k, n in enumerate(norms) if n > args.grad_clip]
    print(f"torch fp64 losses: {' '.join(f'{x:.9f}' for x in refs['fp64']['losses'])}",
          flush=True)
    print(f"gradient norms before clipping: {' '.join(f'{n:.4f}' for n in norms)} "
          f"(clipping active in {len(clipped)} of {len(norms)} steps)", flush=True)
    if routing64 is not None:
        problems = check_routing(args, routing64, routing32)
        if problems:
            for message in problems:
                print(f"FAIL {message}", file=sys.stderr, flush=True)
            fail(f"{args.arch} MoE reference: {len(problems)} problem(s) with the test's "
                 "routing; the engine was not run")

    names = list(init)
    # A vocab-parallel head (tp > 1) never holds every logit: there the loss, every gradient
    # and the trajectory check the forward pass.
    groups = ([("logits", ["logits"])] if args.tp == 1 else []) + [
              ("loss", ["loss"]),
              ("grad", ["grad." + n for n in names]),
              ("losses", ["losses"]),
              ("final", ["final." + n for n in names])]
    ctx = {"arch": args.arch, "hidden": args.hidden, "args": args,
           "init": {n: t.detach().to(torch.float64).numpy() for n, t in init.items()},
           "drift_bound": adam_drift_bound(args.lr, args.beta1, args.beta2, args.steps)}
    failures = {p: check_run(args, p, init, inputs, targets, refs, groups, ctx)
                for p in precisions}

    failed = [p for p in precisions if failures[p]]
    for p in failed:
        print(f"FAIL: {args.arch} {p} run: {len(failures[p])} problem(s) comparing the engine "
              f"with PyTorch:", file=sys.stderr, flush=True)
        shown = failures[p] if args.verbose else failures[p][:MAX_FAILURE_LINES]
        for message in shown:
            print(f"FAIL {message}", file=sys.stderr, flush=True)
        if len(shown) < len(failures[p]):
            print(f"FAIL ... and {len(failures[p]) - len(shown)} more in the {p} run "
                  "(--verbose lists them all)", file=sys.stderr, flush=True)
    if failed:
        sys.exit(1)
    print(f"PASS: {args.arch} engine matches PyTorch ({', '.join(precisions)})", flush=True)


if __name__ == "__main__":
    main()
