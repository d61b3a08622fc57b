#!/usr/bin/python3
"""PyTorch side of the training-step benchmark (fp32, fp64 or bf16 autocast, CPU): GPT, LLaMA or BERT.

Times full training steps (forward, backward, AdamW step, zero_grad) of the same models the
parity tests use (tests/model/torch_gpt.py, torch_llama.py, torch_bert.py: plain PyTorch as a
Hugging Face model computes them, with explicit attention since torch 1.13 has no
scaled_dot_product_attention) and prints one JSON object on stdout, to be set beside the
engine's numbers measured in the same run. BERT predicts 15% of the positions (the others have
target -1), as masked-LM training does; the engine's benchmark masks the same share.

With --autocast bf16 the forward pass and the loss run under torch.autocast("cpu",
dtype=torch.bfloat16) (PyTorch's mixed precision: matrix products in bf16, fp32 master weights,
gradients and optimizer state), the counterpart of the engine's train.precision = "bf16".

Run with /usr/bin/python3 (Debian's python3-torch is only visible there).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "model"))
import torch_bert  # noqa: E402
import torch_gpt  # noqa: E402
import torch_llama  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=["gpt", "llama", "bert"], default="gpt")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="llama; default: heads")
    p.add_argument("--ffn-hidden", type=int, default=None, help="default: 4 * hidden")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=50304)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none",
                   help="bf16: forward and loss under torch.autocast (fp32 master weights)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="intra-op threads (default: every core this process may use)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.ffn_hidden is None:
        args.ffn_hidden = 4 * args.hidden
    if args.kv_heads is None:
        args.kv_heads = args.heads
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--steps and --threads must be at least 1, --warmup at least 0")
    if args.autocast != "none" and args.dtype != "float32":
        p.error("--autocast needs --dtype float32 (the master weights)")
    return args


def model_of(args):
    common = dict(layers=args.layers, hidden=args.hidden, heads=args.heads,
                  ffn_hidden=args.ffn_hidden, vocab_size=args.vocab_size, seq_len=args.seq_len)
    if args.arch == "llama":
        return torch_llama, torch_llama.LlamaConfig(kv_heads=args.kv_heads, **common)
    if args.arch == "bert":
        return torch_bert, torch_bert.BertConfig(**common)
    return torch_gpt, torch_gpt.GPTConfig(**common)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    module, cfg = model_of(args)
    params = module.init_params(cfg, args.seed, dtype)
    optimizer = torch.optim.AdamW(module.optimizer_param_groups(params, 0.1),
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.micro_batch, args.seq_len)
    inputs = torch.randint(0, cfg.vocab_size, shape, generator=gen)
    targets = torch.randint(0, cfg.vocab_size, shape, generator=gen)
    if args.arch == "bert":
        targets[torch.rand(shape, generator=gen) >= 0.15] = -1

    if args.autocast == "bf16" and hasattr(module, "_layer_norm"):
        # torch 1.13's CPU autocast passes a bf16 input with fp32 weights to layer_norm, which
        # refuses them (BERT's prediction transform: GeLU of a bf16 product, then LayerNorm);
        # the norm is computed in fp32, as autocast's fp32 operations are.
        layer_norm = module._layer_norm
        module._layer_norm = lambda x, *rest: layer_norm(x.float(), *rest)

    def forward_and_loss():
        if args.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return module.loss_fn(module.forward(params, cfg, inputs), targets)
        return module.loss_fn(module.forward(params, cfg, inputs), targets)

    def step():
        loss = forward_and_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)

    print(json.dumps({
        "framework": "pytorch",
        "arch": args.arch,
        "precision": "bf16" if args.autocast == "bf16" else
                     {"float32": "fp32", "float64": "fp64"}[args.dtype],
        "autocast": args.autocast,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "step_seconds_median": statistics.median(times),
        "step_seconds_all": times,
        "tokens_per_step": args.micro_batch * args.seq_len,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "config": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                   "kv_heads": args.kv_heads, "ffn_hidden": args.ffn_hidden,
                   "seq_len": args.seq_len, "vocab_size": args.vocab_size,
                   "micro_batch": args.micro_batch, "warmup_steps": args.warmup,
                   "dtype": args.dtype, "autocast": args.autocast},
        "parameters": sum(t.numel() for t in params.values()),
        "last_loss": loss,
    }))


if __name__ == "__main__":
    main()
