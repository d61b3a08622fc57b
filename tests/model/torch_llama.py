#!/usr/bin/python3
"""LLaMA reference in PyTorch, with the semantics of Hugging Face's LlamaForCausalLM.

Parameters are plain leaf tensors keyed by their Hugging Face names, in torch.nn.Linear's
[out, in] layout (y = x @ W^T), with no biases anywhere, so the parity test hands the same dict
to the engine (via safetensors) and to this model:

  model.embed_tokens.weight                          [V, C]
  model.layers.{i}.input_layernorm.weight            [C]
  model.layers.{i}.self_attn.q_proj.weight           [heads * hd, C]
  model.layers.{i}.self_attn.k_proj.weight           [kv_heads * hd, C]
  model.layers.{i}.self_attn.v_proj.weight           [kv_heads * hd, C]
  model.layers.{i}.self_attn.o_proj.weight           [C, heads * hd]
  model.layers.{i}.post_attention_layernorm.weight   [C]
  model.layers.{i}.mlp.gate_proj.weight              [F, C]
  model.layers.{i}.mlp.up_proj.weight                [F, C]
  model.layers.{i}.mlp.down_proj.weight              [C, F]
  model.norm.weight                                  [C]
  lm_head.weight                                     [V, C]   (not tied to embed_tokens)

with hd = C / heads. Semantics:
- pre-norm blocks with RMSNorm: x * rsqrt(mean(x^2) + norm_eps) * w, in the model's dtype
  (HF computes mean(x^2) in float32 whatever the dtype; that would cap an fp64 run at fp32);
- rotary position embedding on q and k, paired as HF's rotate_half pairs them (element i
  with element i + hd/2): inv_freq[i] = rope_theta^(-2i/hd) for i in [0, hd/2), angle
  t * inv_freq[i] for position t, cos and sin duplicated over both halves of a head, and
  q' = q * cos + rotate_half(q) * sin with rotate_half([x1, x2]) = [-x2, x1].
  inv_freq and the angles are computed in float64 and only cos/sin are cast to the model's
  dtype (HF computes inv_freq in float32; float64 makes the fp64 reference exact to fp64 and
  costs the fp32 run nothing it would notice); with rope_scaling_factor > 0 the frequencies
  are first scaled as Hugging Face's rope_type "llama3" scales them (rope_inverse_frequencies);
- grouped-query attention: query head h reads key/value head h // (heads / kv_heads);
- causal softmax attention scaled by 1 / sqrt(hd);
- SwiGLU MLP: down(silu(gate(x)) * up(x));
- residual adds after attention and after the MLP; final RMSNorm, lm_head, mean
  cross-entropy over every target (targets < 0 are ignored; the causal parity runs have none);
- no dropout.

Mixture of experts (LlamaConfig.moe, a torch_moe.MoeConfig; None: dense): in layer i with
moe.is_moe_layer(i) the MLP is replaced by torch_moe's MoE block on the
post_attention_layernorm output, with

  model.layers.{i}.mlp.router.weight                 [E, C]  (logits = x @ W^T)
  model.layers.{i}.mlp.router.noise_weight           [E, C]  (noisy-topk with noise only)
  model.layers.{i}.mlp.experts.{j}.gate_proj.weight  [F, C]
  model.layers.{i}.mlp.experts.{j}.up_proj.weight    [F, C]
  model.layers.{i}.mlp.experts.{j}.down_proj.weight  [C, F]

(F = moe_ffn_hidden or ffn_hidden; FFN_j(x) = down(silu(gate(x)) * up(x))) and no dense
mlp.*_proj. forward() then takes a torch_moe.MoeRun; the objective is loss_fn(logits, targets)
+ run.objective().

`python3 torch_llama.py --self-test` checks the model against itself and against independent
formulations (GQA vs MHA with repeated k/v weights, rotate_half vs complex rotation, a naive
per-element loop, finite differences); it exits non-zero when any check fails.
"""

import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import torch_moe
from self_check import SelfCheck, relative

DEFAULT_NORM_EPS = 1e-5
DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    norm_eps: float = DEFAULT_NORM_EPS
    rope_theta: float = DEFAULT_ROPE_THETA
    moe: torch_moe.MoeConfig = None  # None: every layer dense
    # LLaMA 3's rotary frequency scaling (HF rope_scaling, rope_type "llama3"); 0: none.
    rope_scaling_factor: float = 0.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab_size",
                      "seq_len"):
            if getattr(self, field) <= 0:
                raise ValueError(
                    f"LlamaConfig.{field} must be positive, got {getattr(self, field)}")
        if self.hidden % self.heads != 0:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads != 0:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2 != 0:
            raise ValueError(f"rotary embedding needs an even head_dim, got {self.head_dim}")
        if not self.norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("norm_eps and rope_theta must be positive")
        if self.moe is not None and self.moe.every > self.layers:
            raise ValueError(f"moe_every ({self.moe.every}) exceeds layers ({self.layers})")

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def group_size(self):
        """Query heads per key/value head."""
        return self.heads // self.kv_heads


def param_shapes(cfg):
    """Name -> shape for every parameter, in a fixed order (embedding, layers, norm, head)."""
    C, F_, V = cfg.hidden, cfg.ffn_hidden, cfg.vocab_size
    q_rows, kv_rows = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (C,)
        shapes[p + "self_attn.q_proj.weight"] = (q_rows, C)
        shapes[p + "self_attn.k_proj.weight"] = (kv_rows, C)
        shapes[p + "self_attn.v_proj.weight"] = (kv_rows, C)
        shapes[p + "self_attn.o_proj.weight"] = (C, q_rows)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        if _is_moe_layer(cfg, i):
            shapes.update(torch_moe.llama_shapes(p, cfg.moe, C, F_))
            continue
        shapes[p + "mlp.gate_proj.weight"] = (F_, C)
        shapes[p + "mlp.up_proj.weight"] = (F_, C)
        shapes[p + "mlp.down_proj.weight"] = (C, F_)
    shapes["model.norm.weight"] = (C,)
    shapes["lm_head.weight"] = (V, C)
    return shapes


def _is_moe_layer(cfg, i):
    return cfg.moe is not None and cfg.moe.is_moe_layer(i)


def init_params(cfg, seed, dtype=torch.float32):
    """Random parameters as leaf tensors with requires_grad.

    Values are drawn in float32 and then cast, so a float64 model from the same seed starts
    from exactly the float32 values. Norm gains are 1 + 0.1 N(0, 1) (near one, differing per
    feature); projections are N(0, 1/fan_in) so that q.k scores are O(1) and attention is far
    from uniform (a wrong rotation, mask or head grouping then changes the result by much more
    than rounding); token embeddings are N(0, 1). MoE routers are N(0, 0.5^2) (decisive
    routing, no ties), noise weights N(0, 0.1^2), experts like the dense MLP.
    """
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            value = 1.0 + 0.1 * noise
        elif name == "model.embed_tokens.weight":
            value = noise
        elif torch_moe.router_init_std(name) is not None:
            value = torch_moe.router_init_std(name) * noise
        else:
            value = noise / math.sqrt(shape[1])
        params[name] = value.to(dtype).requires_grad_(True)
    return params


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_inverse_frequencies(cfg, device=None):
    """inv_freq [hd/2] in float64: rope_theta^(-2i/hd), then, with rope_scaling_factor > 0,
    LLaMA 3's bands (transformers' _compute_llama3_parameters): wavelengths 2 pi / f longer than
    original_max / low_freq_factor divided by the factor, shorter than original_max /
    high_freq_factor kept, and those between blended with weight
    s = (original_max / wavelength - low) / (high - low)."""
    hd = cfg.head_dim
    inv_freq = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=device) / hd)
    if cfg.rope_scaling_factor <= 0:
        return inv_freq
    factor, low, high = cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old = float(cfg.rope_original_max_positions)
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= old / high) & (wavelength <= old / low)
    return torch.where(medium, blended, scaled)


def rotary_cos_sin(cfg, T, dtype, device=None):
    """cos, sin: [T, hd], each half of a head holding the same T x hd/2 angles.

    Computed in float64 whatever `dtype` is, then cast (see the module docstring).
    """
    inv_freq = rope_inverse_frequencies(cfg, device)
    angles = torch.outer(torch.arange(T, dtype=torch.float64, device=device), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x, cos, sin):
    """x: [B, heads, T, hd]; cos, sin: [T, hd]."""
    return x * cos + rotate_half(x) * sin


def _attention(x, params, prefix, cfg):
    B, T, _ = x.shape
    H, KV, D = cfg.heads, cfg.kv_heads, cfg.head_dim
    q = F.linear(x, params[prefix + "self_attn.q_proj.weight"])
    k = F.linear(x, params[prefix + "self_attn.k_proj.weight"])
    v = F.linear(x, params[prefix + "self_attn.v_proj.weight"])
    # [B, T, heads * hd] -> [B, heads, T, hd]: head h owns rows h*hd..(h+1)*hd of its proj.
    q = q.reshape(B, T, H, D).transpose(1, 2)
    k = k.reshape(B, T, KV, D).transpose(1, 2)
    v = v.reshape(B, T, KV, D).transpose(1, 2)
    cos, sin = rotary_cos_sin(cfg, T, x.dtype, x.device)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    # Query head h reads kv head h // group_size: each kv head repeated group_size times.
    k = k.repeat_interleave(cfg.group_size, dim=1)
    v = v.repeat_interleave(cfg.group_size, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # [B, H, T, T]
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # [B, H, T, D]
    y = y.transpose(1, 2).reshape(B, T, H * D)
    return F.linear(y, params[prefix + "self_attn.o_proj.weight"])


def _mlp(x, params, prefix):
    gate = F.linear(x, params[prefix + "mlp.gate_proj.weight"])
    up = F.linear(x, params[prefix + "mlp.up_proj.weight"])
    return F.linear(F.silu(gate) * up, params[prefix + "mlp.down_proj.weight"])


def forward(params, cfg, inputs, moe_run=None):
    """inputs: int64 [B, T] with T <= seq_len. Returns logits [B, T, vocab_size].

    moe_run: a torch_moe.MoeRun for a model with MoE layers (None: evaluation, samples
    0..B-1); ignored by a dense model.
    """
    B, T = inputs.shape
    if T > cfg.seq_len:
        raise ValueError(f"sequence of {T} tokens exceeds seq_len {cfg.seq_len}")
    x = F.embedding(inputs, params["model.embed_tokens.weight"])
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        x = x + _attention(rms_norm(x, params[p + "input_layernorm.weight"], cfg.norm_eps),
                           params, p, cfg)
        if _is_moe_layer(cfg, i):
            if moe_run is None:
                moe_run = torch_moe.MoeRun(training=False)
            x = x + torch_moe.llama_moe_block(
                rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.norm_eps),
                params, p, i, cfg.moe, cfg.ffn_hidden, moe_run)
            continue
        x = x + _mlp(rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.norm_eps),
                     params, p)
    x = rms_norm(x, params["model.norm.weight"], cfg.norm_eps)
    return F.linear(x, params["lm_head.weight"])


def loss_fn(logits, targets):
    """Mean cross-entropy over targets >= 0. logits [B, T, V], targets int64 [B, T]."""
    valid = targets.reshape(-1) >= 0
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1])[valid],
                           targets.reshape(-1)[valid])


def optimizer_param_groups(params, weight_decay):
    """AdamW groups (docs/models.md): decay on tensors with >= 2 dims, none on norm weights."""
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# --- self-test ----------------------------------------------------------------------------

def _check_gqa_equals_mha(check):
    """GQA with kv_heads < heads equals MHA whose k/v weights repeat each kv head's rows."""
    gqa = LlamaConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=40, vocab_size=23,
                      seq_len=9)
    mha = LlamaConfig(layers=2, hidden=32, heads=4, kv_heads=4, ffn_hidden=40, vocab_size=23,
                      seq_len=9)
    params = {n: t.detach() for n, t in init_params(gqa, 7, torch.float64).items()}
    repeated = dict(params)
    D = gqa.head_dim
    for name, t in params.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            # [kv_heads * hd, C] -> [kv_heads, hd, C] -> each head g copied to heads
            # g*group .. (g+1)*group - 1 -> [heads * hd, C]
            blocks = t.reshape(gqa.kv_heads, D, gqa.hidden)
            repeated[name] = blocks.repeat_interleave(gqa.group_size, dim=0).reshape(
                -1, gqa.hidden)
    inputs = torch.randint(0, gqa.vocab_size, (3, gqa.seq_len),
                           generator=torch.Generator().manual_seed(8))
    rel = relative(forward(params, gqa, inputs), forward(repeated, mha, inputs))
    check.at_most("GQA (4 heads, 2 kv heads) equals MHA with repeated k/v weights", rel, 1e-13)


def _scaled_frequency(cfg, f):
    """One frequency through LLaMA 3's scaling, band by band in Python floats."""
    if cfg.rope_scaling_factor <= 0:
        return f
    old = cfg.rope_original_max_positions
    wavelength = 2 * math.pi / f
    if wavelength < old / cfg.rope_high_freq_factor:
        return f
    if wavelength > old / cfg.rope_low_freq_factor:
        return f / cfg.rope_scaling_factor
    s = (old / wavelength - cfg.rope_low_freq_factor) / (
        cfg.rope_high_freq_factor - cfg.rope_low_freq_factor)
    return (1 - s) * f / cfg.rope_scaling_factor + s * f


def _complex_rotary(x, cfg):
    """Rotary as a complex rotation: element i and i + hd/2 of a head are the real and the
    imaginary part of z_i, and position t multiplies z_i by exp(1j * t * inv_freq[i])."""
    hd, T = cfg.head_dim, x.shape[-2]
    half = hd // 2
    z = torch.complex(x[..., :half], x[..., half:])
    inv_freq = torch.tensor([_scaled_frequency(cfg, cfg.rope_theta ** (-2.0 * i / hd))
                             for i in range(half)], dtype=torch.float64)
    t = torch.arange(T, dtype=torch.float64)
    rotation = torch.polar(torch.ones(T, half, dtype=torch.float64), torch.outer(t, inv_freq))
    z = z * rotation
    return torch.cat([z.real, z.imag], dim=-1)


def _check_rotary(check):
    cfg = LlamaConfig(layers=1, hidden=48, heads=3, kv_heads=3, ffn_hidden=8, vocab_size=5,
                      seq_len=29, rope_theta=500.0)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, cfg.heads, cfg.seq_len, cfg.head_dim, generator=gen, dtype=torch.float64)
    cos, sin = rotary_cos_sin(cfg, cfg.seq_len, torch.float64)
    rotated = apply_rotary(x, cos, sin)
    check.at_most("rotary via rotate_half equals the complex rotation",
                  relative(rotated, _complex_rotary(x, cfg)), 1e-14)
    check.at_most("rotary keeps every head's norm",
                  relative(rotated.norm(dim=-1), x.norm(dim=-1)), 1e-14)
    # LLaMA 3 scaling with bands that all occur at head_dim 16: the vectorised frequencies
    # against the rule applied one frequency at a time.
    scaled = LlamaConfig(layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=8, vocab_size=5,
                         seq_len=29, rope_theta=500.0, rope_scaling_factor=4.0,
                         rope_original_max_positions=64)
    inv_freq = rope_inverse_frequencies(scaled)
    plain = rope_inverse_frequencies(LlamaConfig(layers=1, hidden=64, heads=4, kv_heads=4,
                                                 ffn_hidden=8, vocab_size=5, seq_len=29,
                                                 rope_theta=500.0))
    bands = {("kept" if a == b else "divided" if abs(a * 4 - b) <= 1e-15 * b else "blended")
             for a, b in zip(inv_freq.tolist(), plain.tolist())}
    check.at_most("llama3 scaling has all three bands at this size",
                  0.0 if bands == {"kept", "divided", "blended"} else 1.0, 0.0)
    y = torch.randn(2, 4, 29, 16, generator=gen, dtype=torch.float64)
    cos, sin = rotary_cos_sin(scaled, 29, torch.float64)
    check.at_most("llama3-scaled rotary equals the complex rotation by the per-band rule",
                  relative(apply_rotary(y, cos, sin), _complex_rotary(y, scaled)), 1e-14)
    # q at position m and k at position n score the same as at m + s and n + s.
    q, k = x[0, 0], x[1, 0]  # [T, hd]
    rq, rk = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    shift = 5
    qs = torch.roll(q, shift, dims=0)  # row t + shift holds q[t]
    ks = torch.roll(k, shift, dims=0)
    rqs, rks = apply_rotary(qs, cos, sin), apply_rotary(ks, cos, sin)
    n = cfg.seq_len - shift
    check.at_most("rotary scores depend only on relative position",
                  relative((rqs @ rks.T)[shift:, shift:], (rq @ rk.T)[:n, :n]), 1e-13)


def _naive_logits(params, cfg, inputs):
    """LLaMA written element by element in Python floats (float64), one loop per formula."""
    P = {n: t.detach().tolist() for n, t in params.items()}
    B, T = inputs.shape
    C, H, D, V = cfg.hidden, cfg.heads, cfg.head_dim, cfg.vocab_size

    def rms(vec, w):
        scale = 1.0 / math.sqrt(sum(v * v for v in vec) / len(vec) + cfg.norm_eps)
        return [vec[c] * scale * w[c] for c in range(len(vec))]

    def matvec(w, vec):  # w [out][in]
        return [sum(row[c] * vec[c] for c in range(len(vec))) for row in w]

    def rotate(vec, t):
        out = list(vec)
        for i in range(D // 2):
            angle = t * cfg.rope_theta ** (-2.0 * i / D)
            c, s = math.cos(angle), math.sin(angle)
            for h in range(len(vec) // D):
                a, b = vec[h * D + i], vec[h * D + i + D // 2]
                out[h * D + i] = a * c - b * s
                out[h * D + i + D // 2] = b * c + a * s
        return out

    logits = []
    for b in range(B):
        xs = [list(P["model.embed_tokens.weight"][int(inputs[b, t])]) for t in range(T)]
        for i in range(cfg.layers):
            p = f"model.layers.{i}."
            hs = [rms(x, P[p + "input_layernorm.weight"]) for x in xs]
            qs = [rotate(matvec(P[p + "self_attn.q_proj.weight"], h), t) for t, h in enumerate(hs)]
            ks = [rotate(matvec(P[p + "self_attn.k_proj.weight"], h), t) for t, h in enumerate(hs)]
            vs = [matvec(P[p + "self_attn.v_proj.weight"], h) for h in hs]
            for t in range(T):
                y = [0.0] * (H * D)
                for h in range(H):
                    g = h // cfg.group_size
                    scores = [sum(qs[t][h * D + d] * ks[u][g * D + d] for d in range(D))
                              / math.sqrt(D) for u in range(t + 1)]
                    top = max(scores)
                    weights = [math.exp(s - top) for s in scores]
                    total = sum(weights)
                    for u in range(t + 1):
                        for d in range(D):
                            y[h * D + d] += weights[u] / total * vs[u][g * D + d]
                out = matvec(P[p + "self_attn.o_proj.weight"], y)
                xs[t] = [xs[t][c] + out[c] for c in range(C)]
            for t in range(T):
                h = rms(xs[t], P[p + "post_attention_layernorm.weight"])
                gate = matvec(P[p + "mlp.gate_proj.weight"], h)
                up = matvec(P[p + "mlp.up_proj.weight"], h)
                act = [gate[f] / (1.0 + math.exp(-gate[f])) * up[f] for f in range(len(gate))]
                out = matvec(P[p + "mlp.down_proj.weight"], act)
                xs[t] = [xs[t][c] + out[c] for c in range(C)]
        logits.append([matvec(P["lm_head.weight"], rms(x, P["model.norm.weight"])) for x in xs])
    return torch.tensor(logits, dtype=torch.float64).reshape(B, T, V)


def _naive_loss(logits, targets):
    terms = []
    for row, target in zip(logits.reshape(-1, logits.shape[-1]).tolist(),
                           targets.reshape(-1).tolist()):
        if target < 0:
            continue
        top = max(row)
        terms.append(top + math.log(sum(math.exp(v - top) for v in row)) - row[target])
    return sum(terms) / len(terms)


def _check_naive(check):
    cfg = LlamaConfig(layers=2, hidden=16, heads=4, kv_heads=2, ffn_hidden=10, vocab_size=13,
                      seq_len=6, norm_eps=1e-6, rope_theta=100.0)
    params = init_params(cfg, 11, torch.float64)
    gen = torch.Generator().manual_seed(12)
    inputs = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)
    logits = forward(params, cfg, inputs).detach()
    naive = _naive_logits(params, cfg, inputs)
    check.at_most("logits equal a naive per-element loop (4 heads, 2 kv heads, 2 layers)",
                  relative(logits, naive), 1e-13)
    expected = _naive_loss(naive, targets)
    check.at_most("loss equals a naive cross-entropy",
                  abs(float(loss_fn(logits, targets)) - expected) / abs(expected), 1e-13)
    targets[0, 1:4] = -100
    targets[1, 0] = -1
    expected = _naive_loss(naive, targets)
    check.at_most("loss is the mean over non-negative targets only",
                  abs(float(loss_fn(logits, targets)) - expected) / abs(expected), 1e-13)


def _check_causal(check):
    cfg = LlamaConfig(layers=2, hidden=16, heads=4, kv_heads=2, ffn_hidden=24, vocab_size=17,
                      seq_len=8)
    params = init_params(cfg, 5, torch.float64)
    inputs = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len),
                           generator=torch.Generator().manual_seed(6))
    changed = inputs.clone()
    changed[:, 5] = (changed[:, 5] + 1) % cfg.vocab_size
    a, b = forward(params, cfg, inputs).detach(), forward(params, cfg, changed).detach()
    check.at_most("logits before a changed token do not move (causal mask)",
                  float((a[:, :5] - b[:, :5]).abs().max()), 0.0)
    check.at_least("logits from the changed token on do move",
                   float((a[:, 5:] - b[:, 5:]).abs().max()), 1e-6)


def _check_gradcheck(check):
    cfg = LlamaConfig(layers=2, hidden=8, heads=2, kv_heads=1, ffn_hidden=6, vocab_size=7,
                      seq_len=5)
    params = init_params(cfg, 9, torch.float64)
    names = list(params)
    gen = torch.Generator().manual_seed(10)
    inputs = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)

    def loss_of(*tensors):
        return loss_fn(forward(dict(zip(names, tensors)), cfg, inputs), targets)

    what = "autograd gradients of every parameter equal finite differences (gradcheck, float64)"
    try:
        ok = torch.autograd.gradcheck(loss_of, tuple(params[n] for n in names), eps=1e-6,
                                      atol=1e-8, rtol=1e-6)
        check.holds(what, ok)
    except RuntimeError as e:  # gradcheck raises on a mismatch
        check.holds(what, False, str(e).splitlines()[0])


def self_test():
    check = SelfCheck("torch_llama self-test")
    for run in (_check_gqa_equals_mha, _check_rotary, _check_naive, _check_causal,
                _check_gradcheck):
        run(check)
    return check.exit_code()


if __name__ == "__main__":
    if sys.argv[1:] != ["--self-test"]:
        print(f"usage: {sys.argv[0]} --self-test", file=sys.stderr)
        sys.exit(2)
    sys.exit(self_test())
