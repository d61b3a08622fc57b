"""GPT-2 reference in PyTorch, written from the "Reference semantics" of docs/models.md.

Parameters are plain leaf tensors keyed by their Hugging Face GPT-2 names, in HF's Conv1D
layout ([in, out], y = x @ W + b), because that is exactly what oases' checkpoints hold: the
parity test can then hand the same dict to the engine (via safetensors) and to this model
without any transposes that could hide a layout bug.

Semantics: pre-LN blocks, LayerNorm eps 1e-5 (GPTConfig.norm_eps), GeLU in its tanh form,
causal attention scaled by 1/sqrt(head_dim), learned positions, LM head tied to wte without
bias, mean cross-entropy over every target token, no dropout.

Mixture of experts (GPTConfig.moe, a torch_moe.MoeConfig; None: dense): in layer i with
moe.is_moe_layer(i) the MLP is replaced by torch_moe's MoE block on the ln_2 output, with
  h.{i}.mlp.router.weight        [C, E]  (logits = x @ W)
  h.{i}.mlp.router.noise_weight  [C, E]  (noisy-topk with moe_router_noise > 0 only)
  h.{i}.mlp.experts.{j}.c_fc.weight [C, F], .c_fc.bias [F], .c_proj.weight [F, C],
                        .c_proj.bias [C]  (F = moe_ffn_hidden or ffn_hidden)
and no h.{i}.mlp.c_fc / c_proj. forward() then takes a torch_moe.MoeRun (training or
evaluation, step, global sample indices) and adds the layers' aux and z terms to it; the
objective is loss_fn(logits, targets) + run.objective().
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import torch_moe

LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class GPTConfig:
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    norm_eps: float = LAYER_NORM_EPS
    moe: torch_moe.MoeConfig = None  # None: every layer dense

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "ffn_hidden", "vocab_size", "seq_len"):
            if getattr(self, field) <= 0:
                raise ValueError(f"GPTConfig.{field} must be positive, got {getattr(self, field)}")
        if self.hidden % self.heads != 0:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if not self.norm_eps > 0:
            raise ValueError("norm_eps must be positive")
        if self.moe is not None and self.moe.every > self.layers:
            raise ValueError(f"moe_every ({self.moe.every}) exceeds layers ({self.layers})")

    @property
    def head_dim(self):
        return self.hidden // self.heads


def param_shapes(cfg):
    """Name -> shape for every parameter, in a fixed order (embeddings, blocks, final LN)."""
    C, F_, V, T = cfg.hidden, cfg.ffn_hidden, cfg.vocab_size, cfg.seq_len
    shapes = {"wte.weight": (V, C), "wpe.weight": (T, C)}
    for i in range(cfg.layers):
        p = f"h.{i}."
        shapes[p + "ln_1.weight"] = (C,)
        shapes[p + "ln_1.bias"] = (C,)
        shapes[p + "attn.c_attn.weight"] = (C, 3 * C)
        shapes[p + "attn.c_attn.bias"] = (3 * C,)
        shapes[p + "attn.c_proj.weight"] = (C, C)
        shapes[p + "attn.c_proj.bias"] = (C,)
        shapes[p + "ln_2.weight"] = (C,)
        shapes[p + "ln_2.bias"] = (C,)
        if _is_moe_layer(cfg, i):
            shapes.update(torch_moe.gpt_shapes(p, cfg.moe, C, F_))
            continue
        shapes[p + "mlp.c_fc.weight"] = (C, F_)
        shapes[p + "mlp.c_fc.bias"] = (F_,)
        shapes[p + "mlp.c_proj.weight"] = (F_, C)
        shapes[p + "mlp.c_proj.bias"] = (C,)
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def _is_moe_layer(cfg, i):
    return cfg.moe is not None and cfg.moe.is_moe_layer(i)


def init_params(cfg, seed, dtype=torch.float32):
    """Random parameters as leaf tensors with requires_grad.

    Unlike GPT-2's own init (zero biases, unit LN gains) every tensor here is random and
    nonzero, so a backward pass that forgets a bias or LN term shows up as a gradient
    mismatch instead of hiding behind zeros. Values are drawn in float32 and then cast, so a
    float64 model built from the same seed starts from exactly the float32 values.
    MoE routers are N(0, 0.5^2) (decisive routing, no ties), noise weights N(0, 0.1^2),
    experts like the dense MLP.
    """
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            # Gains near 1 keep activations well scaled while still differing per feature.
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float32)
        elif torch_moe.router_init_std(name) is not None:
            value = torch_moe.router_init_std(name) * torch.randn(shape, generator=gen,
                                                                  dtype=torch.float32)
        else:
            value = 0.02 * torch.randn(shape, generator=gen, dtype=torch.float32)
        params[name] = value.to(dtype).requires_grad_(True)
    return params


def _linear(x, weight, bias):
    # Conv1D as HF GPT-2 computes it: one addmm over the flattened leading dimensions.
    out = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight)
    return out.reshape(*x.shape[:-1], weight.shape[1])


def _causal_self_attention(x, params, prefix, cfg):
    B, T, C = x.shape
    H, D = cfg.heads, cfg.head_dim
    qkv = _linear(x, params[prefix + "attn.c_attn.weight"], params[prefix + "attn.c_attn.bias"])
    q, k, v = qkv.split(C, dim=2)
    # [B, T, C] -> [B, H, T, D]: head h owns columns h*D..(h+1)*D of each of q, k, v.
    q = q.reshape(B, T, H, D).transpose(1, 2)
    k = k.reshape(B, T, H, D).transpose(1, 2)
    v = v.reshape(B, T, H, D).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # [B, H, T, T]
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # [B, H, T, D]
    y = y.transpose(1, 2).reshape(B, T, C)
    return _linear(y, params[prefix + "attn.c_proj.weight"], params[prefix + "attn.c_proj.bias"])


def _mlp(x, params, prefix):
    h = _linear(x, params[prefix + "mlp.c_fc.weight"], params[prefix + "mlp.c_fc.bias"])
    h = F.gelu(h, approximate="tanh")
    return _linear(h, params[prefix + "mlp.c_proj.weight"], params[prefix + "mlp.c_proj.bias"])


def _layer_norm(x, params, prefix, cfg):
    return F.layer_norm(x, (x.shape[-1],), params[prefix + ".weight"], params[prefix + ".bias"],
                        cfg.norm_eps)


def forward(params, cfg, inputs, moe_run=None):
    """inputs: int64 [B, T] with T <= seq_len. Returns logits [B, T, vocab_size].

    moe_run: a torch_moe.MoeRun for a model with MoE layers (None: evaluation, samples
    0..B-1); ignored by a dense model.
    """
    B, T = inputs.shape
    if T > cfg.seq_len:
        raise ValueError(f"sequence of {T} tokens exceeds seq_len {cfg.seq_len}")
    positions = torch.arange(T, device=inputs.device)
    x = F.embedding(inputs, params["wte.weight"]) + F.embedding(positions, params["wpe.weight"])
    for i in range(cfg.layers):
        p = f"h.{i}."
        x = x + _causal_self_attention(_layer_norm(x, params, p + "ln_1", cfg), params, p, cfg)
        if _is_moe_layer(cfg, i):
            if moe_run is None:
                moe_run = torch_moe.MoeRun(training=False)
            x = x + torch_moe.gpt_moe_block(_layer_norm(x, params, p + "ln_2", cfg), params, p,
                                            i, cfg.moe, cfg.ffn_hidden, moe_run)
            continue
        x = x + _mlp(_layer_norm(x, params, p + "ln_2", cfg), params, p)
    x = _layer_norm(x, params, "ln_f", cfg)
    return x @ params["wte.weight"].t()  # tied head, no bias


def loss_fn(logits, targets):
    """Mean cross-entropy over every target token. logits [B, T, V], targets int64 [B, T]."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def optimizer_param_groups(params, weight_decay):
    """AdamW groups (docs/models.md): decay on tensors with >= 2 dims, none on biases and norms."""
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
