#!/usr/bin/python3
"""BERT reference in PyTorch, with the semantics of Hugging Face's BertForMaskedLM.

Parameters are plain leaf tensors keyed by their Hugging Face names, linear weights in
torch.nn.Linear's [out, in] layout (y = x @ W^T + b), so the parity test hands the same dict to
the engine (via safetensors) and to this model:

  bert.embeddings.word_embeddings.weight            [V, C]  (also the MLM decoder, tied)
  bert.embeddings.position_embeddings.weight        [seq_len, C]
  bert.embeddings.token_type_embeddings.weight      [2, C]
  bert.embeddings.LayerNorm.weight, .bias           [C]
  bert.encoder.layer.{i}.attention.self.query.weight [C, C], .bias [C]   (same for key, value)
  bert.encoder.layer.{i}.attention.output.dense.weight [C, C], .bias [C]
  bert.encoder.layer.{i}.attention.output.LayerNorm.weight, .bias [C]
  bert.encoder.layer.{i}.intermediate.dense.weight  [F, C], .bias [F]
  bert.encoder.layer.{i}.output.dense.weight        [C, F], .bias [C]
  bert.encoder.layer.{i}.output.LayerNorm.weight, .bias [C]
  cls.predictions.transform.dense.weight            [C, C], .bias [C]
  cls.predictions.transform.LayerNorm.weight, .bias [C]
  cls.predictions.bias                              [V]

Semantics (no next-sentence head, no dropout):
- emb = word[ids] + position[t] + token_type[0] (every token type is 0), then LayerNorm;
- post-LN layers: x = LN(x + dense(attention(x))); x = LN(x + out(gelu(intermediate(x))));
  attention is bidirectional (no mask), scaled by 1 / sqrt(hd), hd = C / heads;
- GeLU in its exact erf form; every LayerNorm uses eps = norm_eps;
- head: t = LN(gelu(transform.dense(x))); logits = t @ word^T + cls.predictions.bias;
- loss = mean cross-entropy over the positions whose target is >= 0 (a negative target marks
  a position that is not predicted).

The key bias gets no gradient: it adds q_i . b_k to every score of query i, which softmax
ignores, so its true gradient is identically zero and any computed one is rounding noise.

`python3 torch_bert.py --self-test` checks the model against a naive per-element loop and
finite differences; it exits non-zero when any check fails.
"""

import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from self_check import SelfCheck, relative

DEFAULT_NORM_EPS = 1e-12  # Hugging Face's BertConfig.layer_norm_eps
TOKEN_TYPES = 2


@dataclass(frozen=True)
class BertConfig:
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    norm_eps: float = DEFAULT_NORM_EPS

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "ffn_hidden", "vocab_size", "seq_len"):
            if getattr(self, field) <= 0:
                raise ValueError(
                    f"BertConfig.{field} must be positive, got {getattr(self, field)}")
        if self.hidden % self.heads != 0:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if not self.norm_eps > 0:
            raise ValueError("norm_eps must be positive")

    @property
    def head_dim(self):
        return self.hidden // self.heads


def param_shapes(cfg):
    """Name -> shape for every parameter, in a fixed order (embeddings, layers, MLM head)."""
    C, F_, V, T = cfg.hidden, cfg.ffn_hidden, cfg.vocab_size, cfg.seq_len
    e = "bert.embeddings."
    shapes = {e + "word_embeddings.weight": (V, C),
              e + "position_embeddings.weight": (T, C),
              e + "token_type_embeddings.weight": (TOKEN_TYPES, C),
              e + "LayerNorm.weight": (C,),
              e + "LayerNorm.bias": (C,)}
    for i in range(cfg.layers):
        p = f"bert.encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            shapes[p + f"attention.self.{proj}.weight"] = (C, C)
            shapes[p + f"attention.self.{proj}.bias"] = (C,)
        shapes[p + "attention.output.dense.weight"] = (C, C)
        shapes[p + "attention.output.dense.bias"] = (C,)
        shapes[p + "attention.output.LayerNorm.weight"] = (C,)
        shapes[p + "attention.output.LayerNorm.bias"] = (C,)
        shapes[p + "intermediate.dense.weight"] = (F_, C)
        shapes[p + "intermediate.dense.bias"] = (F_,)
        shapes[p + "output.dense.weight"] = (C, F_)
        shapes[p + "output.dense.bias"] = (C,)
        shapes[p + "output.LayerNorm.weight"] = (C,)
        shapes[p + "output.LayerNorm.bias"] = (C,)
    shapes["cls.predictions.transform.dense.weight"] = (C, C)
    shapes["cls.predictions.transform.dense.bias"] = (C,)
    shapes["cls.predictions.transform.LayerNorm.weight"] = (C,)
    shapes["cls.predictions.transform.LayerNorm.bias"] = (C,)
    shapes["cls.predictions.bias"] = (V,)
    return shapes


def init_params(cfg, seed, dtype=torch.float32):
    """Random parameters as leaf tensors with requires_grad.

    Values are drawn in float32 and then cast, so a float64 model from the same seed starts
    from exactly the float32 values. Every tensor is random and nonzero (a backward pass that
    forgets a bias shows up as a mismatch): LayerNorm gains 1 + 0.1 N(0, 1), biases
    0.1 N(0, 1), linear weights N(0, 1/fan_in) so that attention scores are O(1) and far from
    uniform, embeddings N(0, 1/C) so that the tied decoder's logits are O(1).
    """
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("LayerNorm.weight"):
            value = 1.0 + 0.1 * noise
        elif len(shape) == 1:
            value = 0.1 * noise
        elif name.startswith("bert.embeddings."):
            value = noise / math.sqrt(cfg.hidden)
        else:
            value = noise / math.sqrt(shape[1])
        params[name] = value.to(dtype).requires_grad_(True)
    return params


def _layer_norm(x, params, prefix, cfg):
    return F.layer_norm(x, (x.shape[-1],), params[prefix + ".weight"], params[prefix + ".bias"],
                        cfg.norm_eps)


def _linear(x, params, prefix):
    return F.linear(x, params[prefix + ".weight"], params[prefix + ".bias"])


def _gelu(x):
    return F.gelu(x)  # exact: x * Phi(x), Phi the normal CDF via erf


def _self_attention(x, params, prefix, cfg):
    B, T, C = x.shape
    H, D = cfg.heads, cfg.head_dim
    # [B, T, C] -> [B, H, T, D]: head h owns rows h*D..(h+1)*D of each projection.
    q = _linear(x, params, prefix + "query").reshape(B, T, H, D).transpose(1, 2)
    k = _linear(x, params, prefix + "key").reshape(B, T, H, D).transpose(1, 2)
    v = _linear(x, params, prefix + "value").reshape(B, T, H, D).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # [B, H, T, T], no mask
    y = torch.softmax(scores, dim=-1) @ v
    return y.transpose(1, 2).reshape(B, T, C)


def forward(params, cfg, inputs):
    """inputs: int64 [B, T] with T <= seq_len. Returns logits [B, T, vocab_size]."""
    B, T = inputs.shape
    if T > cfg.seq_len:
        raise ValueError(f"sequence of {T} tokens exceeds seq_len {cfg.seq_len}")
    e = "bert.embeddings."
    positions = torch.arange(T, device=inputs.device)
    # Summed in Hugging Face's order: word + token type, then + position.
    x = (F.embedding(inputs, params[e + "word_embeddings.weight"])
         + params[e + "token_type_embeddings.weight"][0]
         + F.embedding(positions, params[e + "position_embeddings.weight"]))
    x = _layer_norm(x, params, e + "LayerNorm", cfg)
    for i in range(cfg.layers):
        p = f"bert.encoder.layer.{i}."
        a = _linear(_self_attention(x, params, p + "attention.self.", cfg), params,
                    p + "attention.output.dense")
        x = _layer_norm(x + a, params, p + "attention.output.LayerNorm", cfg)
        h = _gelu(_linear(x, params, p + "intermediate.dense"))
        x = _layer_norm(x + _linear(h, params, p + "output.dense"), params,
                        p + "output.LayerNorm", cfg)
    t = _gelu(_linear(x, params, "cls.predictions.transform.dense"))
    t = _layer_norm(t, params, "cls.predictions.transform.LayerNorm", cfg)
    return t @ params[e + "word_embeddings.weight"].t() + params["cls.predictions.bias"]


def loss_fn(logits, targets):
    """Mean cross-entropy over targets >= 0. logits [B, T, V], targets int64 [B, T]."""
    valid = targets.reshape(-1) >= 0
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1])[valid],
                           targets.reshape(-1)[valid])


def optimizer_param_groups(params, weight_decay):
    """AdamW groups (docs/models.md): decay on tensors with >= 2 dims, none on biases and norms."""
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# --- self-test ----------------------------------------------------------------------------

def _naive_logits(params, cfg, inputs):
    """BERT written element by element in Python floats (float64), one loop per formula."""
    P = {n: t.detach().tolist() for n, t in params.items()}
    B, T = inputs.shape
    C, H, D = cfg.hidden, cfg.heads, cfg.head_dim

    def layer_norm(vec, prefix):
        mean = sum(vec) / len(vec)
        var = sum((v - mean) ** 2 for v in vec) / len(vec)
        w, b = P[prefix + ".weight"], P[prefix + ".bias"]
        return [(vec[c] - mean) / math.sqrt(var + cfg.norm_eps) * w[c] + b[c]
                for c in range(len(vec))]

    def linear(vec, prefix):  # weight [out][in]
        return [sum(row[c] * vec[c] for c in range(len(vec))) + bias
                for row, bias in zip(P[prefix + ".weight"], P[prefix + ".bias"])]

    def gelu(v):
        return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))

    e = "bert.embeddings."
    logits = []
    for b in range(B):
        xs = []
        for t in range(T):
            word = P[e + "word_embeddings.weight"][int(inputs[b, t])]
            pos = P[e + "position_embeddings.weight"][t]
            kind = P[e + "token_type_embeddings.weight"][0]
            xs.append(layer_norm([word[c] + kind[c] + pos[c] for c in range(C)],
                                 e + "LayerNorm"))
        for i in range(cfg.layers):
            p = f"bert.encoder.layer.{i}."
            qs = [linear(x, p + "attention.self.query") for x in xs]
            ks = [linear(x, p + "attention.self.key") for x in xs]
            vs = [linear(x, p + "attention.self.value") for x in xs]
            new = []
            for t in range(T):
                y = [0.0] * C
                for h in range(H):
                    scores = [sum(qs[t][h * D + d] * ks[u][h * D + d] for d in range(D))
                              / math.sqrt(D) for u in range(T)]
                    top = max(scores)
                    weights = [math.exp(s - top) for s in scores]
                    total = sum(weights)
                    for u in range(T):
                        for d in range(D):
                            y[h * D + d] += weights[u] / total * vs[u][h * D + d]
                a = linear(y, p + "attention.output.dense")
                x = layer_norm([xs[t][c] + a[c] for c in range(C)],
                               p + "attention.output.LayerNorm")
                inner = [gelu(v) for v in linear(x, p + "intermediate.dense")]
                o = linear(inner, p + "output.dense")
                new.append(layer_norm([x[c] + o[c] for c in range(C)], p + "output.LayerNorm"))
            xs = new
        rows = []
        for x in xs:
            t = layer_norm([gelu(v) for v in linear(x, "cls.predictions.transform.dense")],
                           "cls.predictions.transform.LayerNorm")
            rows.append([sum(word[c] * t[c] for c in range(C)) + bias for word, bias in
                         zip(P[e + "word_embeddings.weight"], P["cls.predictions.bias"])])
        logits.append(rows)
    return torch.tensor(logits, dtype=torch.float64)


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
    cfg = BertConfig(layers=1, hidden=12, heads=3, ffn_hidden=20, vocab_size=11, seq_len=7,
                     norm_eps=1e-5)
    params = init_params(cfg, 21, torch.float64)
    gen = torch.Generator().manual_seed(22)
    inputs = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=gen)
    logits = forward(params, cfg, inputs).detach()
    naive = _naive_logits(params, cfg, inputs)
    check.at_most("logits equal a naive per-element loop (one layer)",
                  relative(logits, naive), 1e-13)
    expected = _naive_loss(naive, targets)
    check.at_most("loss with every target valid equals a naive cross-entropy",
                  abs(float(loss_fn(logits, targets)) - expected) / abs(expected), 1e-13)
    targets[0, :5] = -100
    targets[1, 2:] = -1
    targets[2, 3] = -7
    expected = _naive_loss(naive, targets)
    check.at_most("loss is the mean over non-negative targets only",
                  abs(float(loss_fn(logits, targets)) - expected) / abs(expected), 1e-13)


def _check_bidirectional(check):
    cfg = BertConfig(layers=2, hidden=16, heads=4, ffn_hidden=24, vocab_size=17, seq_len=8)
    params = init_params(cfg, 5, torch.float64)
    inputs = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len),
                           generator=torch.Generator().manual_seed(6))
    changed = inputs.clone()
    changed[:, 6] = (changed[:, 6] + 1) % cfg.vocab_size
    a, b = forward(params, cfg, inputs).detach(), forward(params, cfg, changed).detach()
    check.at_least("logits before a changed token move too (no causal mask)",
                   float((a[:, :6] - b[:, :6]).abs().min()), 1e-9)


def _check_key_bias_inert(check):
    cfg = BertConfig(layers=2, hidden=16, heads=4, ffn_hidden=24, vocab_size=17, seq_len=8)
    params = init_params(cfg, 13, torch.float64)
    gen = torch.Generator().manual_seed(14)
    inputs = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)
    loss_fn(forward(params, cfg, inputs), targets).backward()
    for i in range(cfg.layers):
        p = f"bert.encoder.layer.{i}.attention.self."
        scale = torch.cat([params[p + f"{n}.bias"].grad for n in ("query", "key", "value")])
        check.at_most(f"layer {i} key bias gradient is zero (relative to the q|k|v bias "
                      "gradient)", float(params[p + "key.bias"].grad.norm() / scale.norm()),
                      1e-13)


def _check_gradcheck(check):
    cfg = BertConfig(layers=2, hidden=8, heads=2, ffn_hidden=6, vocab_size=7, seq_len=5,
                     norm_eps=1e-5)
    params = init_params(cfg, 9, torch.float64)
    names = list(params)
    gen = torch.Generator().manual_seed(10)
    inputs = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=gen)
    targets[0, 1] = -100

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
    check = SelfCheck("torch_bert self-test")
    for run in (_check_naive, _check_bidirectional, _check_key_bias_inert, _check_gradcheck):
        run(check)
    return check.exit_code()


if __name__ == "__main__":
    if sys.argv[1:] != ["--self-test"]:
        print(f"usage: {sys.argv[0]} --self-test", file=sys.stderr)
        sys.exit(2)
    sys.exit(self_test())
