#!/usr/bin/python3
"""PyTorch side of the GPT training-step benchmark (fp32, CPU).

Times full training steps (forward, backward, AdamW step, zero_grad) of the same GPT-2 the
parity test uses (tests/model/torch_gpt.py: Conv1D-style addmm linears as in Hugging Face's
GPT2, F.layer_norm, explicit causal attention since torch 1.13 has no
scaled_dot_product_attention) and prints one JSON object on stdout, to be set beside the
engine's numbers measured in the same run.

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
import torch_gpt  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn-hidden", type=int, default=None, help="default: 4 * hidden")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=50304)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="intra-op threads (default: every core this process may use)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.ffn_hidden is None:
        args.ffn_hidden = 4 * args.hidden
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--steps and --threads must be at least 1, --warmup at least 0")
    return args


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    cfg = torch_gpt.GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                              ffn_hidden=args.ffn_hidden, vocab_size=args.vocab_size,
                              seq_len=args.seq_len)
    params = torch_gpt.init_params(cfg, args.seed, torch.float32)
    optimizer = torch.optim.AdamW(torch_gpt.optimizer_param_groups(params, 0.1),
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.micro_batch, args.seq_len)
    inputs = torch.randint(0, cfg.vocab_size, shape, generator=gen)
    targets = torch.randint(0, cfg.vocab_size, shape, generator=gen)

    def step():
        loss = torch_gpt.loss_fn(torch_gpt.forward(params, cfg, inputs), targets)
        loss.backward()
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
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "step_seconds_median": statistics.median(times),
        "step_seconds_all": times,
        "tokens_per_step": args.micro_batch * args.seq_len,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "config": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                   "ffn_hidden": args.ffn_hidden, "seq_len": args.seq_len,
                   "vocab_size": args.vocab_size, "micro_batch": args.micro_batch,
                   "warmup_steps": args.warmup, "dtype": "float32"},
        "parameters": sum(t.numel() for t in params.values()),
        "last_loss": loss,
    }))


if __name__ == "__main__":
    main()
