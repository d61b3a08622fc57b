#!/usr/bin/python3
"""The parity_engine protocol implemented with the PyTorch reference models.

It reads cfg.json, w.safetensors and b.safetensors exactly as parity_engine does and writes
o.safetensors in the run's dtype (see parity_test.py for the protocol), so the driver can be
checked on a correct engine of every architecture before the real engine has it, and on a
deliberately wrong one. To be an independent implementation rather than a copy of the
driver's reference, it feeds the micro-batch in reverse order: the mean loss is the same, but
every sum over the batch rounds differently, as another correct engine's would.

Mixture-of-experts configs (moe_every > 0, the keys in parity_test.py) run torch_moe's layers
with the reversed rows' global sample indices, so routing groups and Philox draws follow the
global sample as the engine's must: logits in evaluation mode, loss, gradients and losses of
the training objective (cross-entropy + aux and z terms) with step s in the keys.

  torch_engine.py --config cfg.json --weights w.safetensors --batch b.safetensors \
                  --out o.safetensors

The environment variable OASES_TORCH_ENGINE_BUG plants a bug for the driver to find:
  grad_scale   every gradient written times (1 + 1e-5): over fp32's noise as well as fp64's
  no_clip      the updates skip gradient clipping
  wrong_dtype  writes F32 in an fp64 run
  moe_no_aux   (MoE) the objective leaves out the aux and z terms
  moe_step0    (MoE) every step draws noise, random routing and dropout with step 0's keys
  moe_train_logits  (MoE) logits computed in training mode
Under mpirun (tp > 1) every rank computes the whole model and only rank 0 writes.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402
import torch_bert  # noqa: E402
import torch_gpt  # noqa: E402
import torch_llama  # noqa: E402
import torch_moe  # noqa: E402


def model_and_config(c):
    common = dict(layers=c["layers"], hidden=c["hidden"], heads=c["heads"],
                  ffn_hidden=c["ffn_hidden"], vocab_size=c["vocab_size"], seq_len=c["seq_len"],
                  norm_eps=c["norm_eps"])
    moe = torch_moe.config_from_dict(c)
    if moe is not None:
        common["moe"] = moe
    if c["arch"] == "gpt":
        return torch_gpt, torch_gpt.GPTConfig(**common)
    if c["arch"] == "llama":
        return torch_llama, torch_llama.LlamaConfig(kv_heads=c["kv_heads"],
                                                    rope_theta=c["rope_theta"], **common)
    if c["arch"] == "bert":
        return torch_bert, torch_bert.BertConfig(**common)
    raise ValueError(f"unknown arch {c['arch']!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--config", "--weights", "--batch", "--out"):
        p.add_argument(flag, required=True)
    args = p.parse_args()
    bug = os.environ.get("OASES_TORCH_ENGINE_BUG", "")
    with open(args.config) as f:
        c = json.load(f)
    dtype = {"fp64": torch.float64, "fp32": torch.float32}[c["precision"]]
    model, cfg = model_and_config(c)

    weights = safetensors_io.load(args.weights)
    params = {n: torch.from_numpy(weights[n]).to(dtype).requires_grad_(True)
              for n in model.param_shapes(cfg)}
    batch = safetensors_io.load(args.batch)
    reverse = torch.arange(c["micro_batch"] - 1, -1, -1)
    inputs = torch.from_numpy(batch["inputs"]).long()[reverse]
    targets = torch.from_numpy(batch["targets"]).long()[reverse]

    optimizer = torch.optim.AdamW(model.optimizer_param_groups(params, c["weight_decay"]),
                                  lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    moe = getattr(cfg, "moe", None)
    out = {}
    losses = []
    for step in range(c["steps"]):
        optimizer.zero_grad(set_to_none=True)
        if moe is None:
            logits = model.forward(params, cfg, inputs)
            loss = model.loss_fn(logits, targets)
        else:
            run = torch_moe.MoeRun(training=True, step=0 if bug == "moe_step0" else step,
                                   samples=reverse)
            logits = model.forward(params, cfg, inputs, run)
            loss = model.loss_fn(logits, targets)
            if bug != "moe_no_aux":
                loss = loss + run.objective()
        loss.backward()
        if step == 0:
            if moe is not None and bug != "moe_train_logits":
                with torch.no_grad():
                    logits = model.forward(params, cfg, inputs,
                                           torch_moe.MoeRun(training=False, samples=reverse))
            out["logits"] = logits.detach()[reverse]
            out["loss"] = loss.detach().reshape(1)
            scale = 1 + 1e-5 if bug == "grad_scale" else 1.0
            for n, t in params.items():
                out["grad." + n] = t.grad.detach() * scale
        if bug != "no_clip":
            torch.nn.utils.clip_grad_norm_(list(params.values()), c["grad_clip"])
        optimizer.step()
        losses.append(loss.detach().reshape(()))
    out["losses"] = torch.stack(losses)
    for n, t in params.items():
        out["final." + n] = t.detach()

    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == 0:
        written = np.float32 if bug == "wrong_dtype" else {torch.float64: np.float64,
                                                           torch.float32: np.float32}[dtype]
        safetensors_io.save(args.out, {k: v.clone().numpy().astype(written)
                                       for k, v in out.items()})


if __name__ == "__main__":
    main()
