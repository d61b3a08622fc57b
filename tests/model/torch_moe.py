#!/usr/bin/python3
"""Mixture-of-experts feed-forward reference in PyTorch, following src/ops/moe.h exactly.

A GPT or LLaMA layer l is an MoE layer when moe.every > 0 and (l + 1) % moe.every == 0. Its
dense MLP is replaced by a router and `experts` expert FFNs of hidden width F (moe_ffn_hidden,
0: the model's ffn_hidden), applied to the same pre-norm output x:

  L = router logits [tokens, E]; routing per group of S consecutive tokens in global order
  (global token = global sample * seq_len + position; S = moe_group_size, 0: seq_len);
  y_t = sum over t's kept (expert e, weight w) of w * FFN_e(x_t); the block adds h + y.

The routing of the four gates ("switch", "gshard", "noisy-topk", "expert-choice"), capacity,
the auxiliary losses, the router z-loss and the Philox keys of the router noise (site 3),
random routing (site 4) and expert dropout (site 5) are those of the header comment of
src/ops/moe.h. Everything here is plain differentiable PyTorch in the model's dtype: the
gradients are autograd's; routing decisions (which expert, which slot, which token is kept)
are made on detached values and are piecewise constant.

The objective of an MoE model is mean cross-entropy + sum over MoE layers of
(aux_loss_coef * mean over groups of aux + z_loss_coef * mean over groups of z). A forward pass
takes a MoeRun that says training or evaluation, the optimizer step that keys the random
numbers, and the global sample index of each row of the micro-batch; it collects the layers'
objective terms and reports what routing did (dropped choices, skipped second choices,
unserved tokens, decision margins) for the parity driver. Evaluation (the logits of the parity
protocol) draws no noise, routes every gshard second choice, applies no expert dropout and
uses eval_capacity_factor (0: capacity_factor).

`python3 torch_moe.py --self-test` checks the layer against a naive per-token loop in Python
floats for every gate, the gradients against finite differences (gradcheck, float64, routing
held fixed), whole GPT and LLaMA MoE models by gradcheck, batch-row permutation invariance and
the random draws against philox.py.
"""

import math
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import philox

GATES = ("noisy-topk", "gshard", "switch", "expert-choice")
DEFAULT_TOP_K = {"noisy-topk": 2, "gshard": 2, "switch": 1, "expert-choice": 1}
SITE_ROUTER_NOISE, SITE_RANDOM_ROUTING, SITE_EXPERT = 3, 4, 5
CV_EPS = 1e-10

# cfg.json key -> MoeConfig field.
CONFIG_KEYS = {"moe_every": "every", "experts": "experts", "moe_gate": "gate",
               "moe_top_k": "top_k", "capacity_factor": "capacity_factor",
               "eval_capacity_factor": "eval_capacity_factor", "moe_group_size": "group_size",
               "moe_aux_loss_coef": "aux_loss_coef", "moe_z_loss_coef": "z_loss_coef",
               "moe_router_noise": "router_noise", "expert_dropout": "expert_dropout",
               "moe_ffn_hidden": "ffn_hidden", "seed": "seed"}


@dataclass(frozen=True)
class MoeConfig:
    every: int
    experts: int
    gate: str = "switch"
    top_k: int = 0                    # 0: the gate's default (DEFAULT_TOP_K)
    capacity_factor: float = 1.0      # training
    eval_capacity_factor: float = 0.0  # evaluation; 0: capacity_factor
    group_size: int = 0               # tokens per group; 0: seq_len
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 0.0
    router_noise: float = 1.0         # noisy-topk's noise scale
    expert_dropout: float = 0.0
    ffn_hidden: int = 0               # each expert's hidden width; 0: the model's ffn_hidden
    seed: int = 0                     # train.seed: keys noise, random routing, expert dropout

    def __post_init__(self):
        if self.every <= 0:
            raise ValueError(f"moe_every must be positive in an MoE config, got {self.every}")
        if self.experts < 2:
            raise ValueError(f"experts must be at least 2, got {self.experts}")
        if self.gate not in GATES:
            raise ValueError(f"moe_gate {self.gate!r} is not one of {', '.join(GATES)}")
        if not 0 <= self.top_k <= self.experts:
            raise ValueError(f"moe_top_k {self.top_k} must be in [0, experts]")
        if self.gate == "switch" and self.top_k > 1:
            raise ValueError("the switch gate routes each token to one expert (moe_top_k 1)")
        if self.gate == "gshard" and self.top_k not in (0, 2):
            raise ValueError("the gshard gate routes each token to 2 experts (moe_top_k 2)")
        if self.gate == "expert-choice" and self.top_k != 0:
            raise ValueError("expert-choice takes moe_top_k 0 (capacity_factor sets the load)")
        if not self.capacity_factor > 0 or not self.eval_capacity_factor >= 0:
            raise ValueError("capacity_factor must be positive, eval_capacity_factor >= 0")
        for name in ("group_size", "ffn_hidden"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.aux_loss_coef < 0 or self.z_loss_coef < 0 or self.router_noise < 0:
            raise ValueError("moe_aux_loss_coef, moe_z_loss_coef, moe_router_noise must be >= 0")
        if not 0 <= self.expert_dropout < 1:
            raise ValueError("expert_dropout must be in [0, 1)")

    @property
    def k(self):
        """Choices per token; expert-choice: 1 (the k of its capacity)."""
        if self.gate == "expert-choice":
            return 1
        return self.top_k if self.top_k > 0 else DEFAULT_TOP_K[self.gate]

    @property
    def has_noise_weight(self):
        """Only a noisy-topk router with noise draws noise and so has a noise_weight."""
        return self.gate == "noisy-topk" and self.router_noise > 0

    def is_moe_layer(self, layer):
        return (layer + 1) % self.every == 0

    def group_tokens(self, seq_len):
        return self.group_size if self.group_size > 0 else seq_len

    def expert_hidden(self, ffn_hidden):
        return self.ffn_hidden if self.ffn_hidden > 0 else ffn_hidden

    def cf(self, training):
        if training:
            return self.capacity_factor
        return self.eval_capacity_factor if self.eval_capacity_factor > 0 else self.capacity_factor


def config_from_dict(c):
    """The MoeConfig of a cfg.json dict (keys CONFIG_KEYS), or None for a dense model."""
    if int(c.get("moe_every", 0)) <= 0:
        return None
    kwargs = {f: c[key] for key, f in CONFIG_KEYS.items() if key in c}
    for f in ("every", "experts", "top_k", "group_size", "ffn_hidden", "seed"):
        if f in kwargs:
            kwargs[f] = int(kwargs[f])
    return MoeConfig(**kwargs)


def capacity(cf, k, S, E):
    """min(S, max(1, ceil(cf * k * S / E))), the product evaluated as ((cf * k) * S) / E."""
    return int(min(S, max(1, math.ceil(((float(cf) * k) * S) / E))))


# --- random draws --------------------------------------------------------------------------

@dataclass
class Draws:
    """The Philox draws of one group: keys by (seed, layer, site), counters by token."""
    seed: int
    step: int
    layer: int
    sample: np.ndarray    # [S] global sample of each token
    position: np.ndarray  # [S] position of each token

    def router_noise(self, E):
        """eps [S, E]: normal_from_block of counter {expert, position, sample, step}."""
        r = philox.philox4x32_np(np.arange(E)[None, :], self.position[:, None],
                                 self.sample[:, None], self.step,
                                 philox.site_key(self.seed, self.layer, SITE_ROUTER_NOISE))
        return philox.normal_from_block_np(r)

    def routing_uniform(self):
        """u [S]: uniform_open0_f64(r[0], r[1]) of counter {0, position, sample, step}."""
        r = philox.philox4x32_np(0, self.position, self.sample, self.step,
                                 philox.site_key(self.seed, self.layer, SITE_RANDOM_ROUTING))
        return philox.uniform_open0_f64_np(r[0], r[1])


def expert_dropout_mask(mcfg, layer, step, expert, F_, sample, position, dtype):
    """(keep ? T(1 / (1 - p)) : 0) [M, F] for tokens (sample, position) of one expert, with
    the dropout kernel's rule at site 5 and global feature expert * F + feature."""
    p = mcfg.expert_dropout
    keep = philox.dropout_keep_np(mcfg.seed, step, layer, SITE_EXPERT, p, sample[:, None],
                                  position[:, None], expert * F_ + np.arange(F_)[None, :])
    scale = torch.tensor(1.0 / (1.0 - p), dtype=dtype)
    return torch.where(torch.from_numpy(keep), scale, torch.zeros((), dtype=dtype))


# --- one group ----------------------------------------------------------------------------

@dataclass
class Decision:
    """What routing decided for a group: piecewise-constant, replayable."""
    choice: torch.Tensor = None     # [S, k] expert of each choice (token-choice gates)
    routed: torch.Tensor = None     # [S, k] not skipped by random routing
    kept: torch.Tensor = None       # [S, k] routed and within capacity
    order: torch.Tensor = None      # [S, E] noisy-topk: experts by H descending
    tokens: torch.Tensor = None     # [E, C] expert-choice: each expert's tokens

    def key(self):
        """Comparable form (numpy arrays) of the decision."""
        if self.tokens is not None:
            return (self.tokens.numpy().copy(),)
        out = [self.choice.numpy().copy(), self.routed.numpy().copy()]
        if self.order is not None:
            out.append(self.order.numpy().copy())
        return tuple(out)


@dataclass
class GroupReport:
    decision: Decision
    capacity: int
    tokens_per_expert: list
    dropped_choices: int = 0    # routed choices dropped because their expert was full
    skipped_choices: int = 0    # gshard second choices skipped by random routing
    unserved_tokens: int = 0    # tokens that reach no expert
    shared_tokens: int = 0      # expert-choice: tokens taken by several experts
    margin: float = math.inf    # smallest gap between values a decision compared
    aux: float = 0.0
    z: float = 0.0


def _stable_desc(values, dim):
    """Indices sorting `values` descending along `dim`, ties by lower index."""
    return torch.sort(values, dim=dim, descending=True, stable=True)[1]


def cv_squared(v):
    """var(v) / (mean(v)^2 + 1e-10), var the unbiased (n - 1) estimate."""
    mean = v.mean()
    var = (v - mean).pow(2).sum() / (v.numel() - 1)
    return var / (mean * mean + CV_EPS)


def normal_cdf(z):
    return 0.5 * torch.erfc(-z * (1.0 / math.sqrt(2.0)))


def route_group(mcfg, L, A, training, draws, fixed=None):
    """Routes one group: L [S, E] router logits, A [S, E] noise logits (noisy-topk with noise,
    else None).

    Returns (tokens [M], experts [M], weights [M], aux, z, report): the kept assignments with
    differentiable weights, the group's aux and z terms (0-dim tensors) and what routing did.
    `fixed`: a Decision to reuse instead of deciding (replays routing, e.g. for gradcheck).
    """
    S, E = L.shape
    k = mcfg.k
    dtype = L.dtype
    p = torch.softmax(L, dim=-1)
    z = torch.logsumexp(L, dim=-1).pow(2).mean()
    margin = math.inf

    if mcfg.gate == "expert-choice":
        C = capacity(mcfg.cf(training), 1, S, E)
        if fixed is None:
            with torch.no_grad():
                order = _stable_desc(p.detach().t(), 1)  # [E, S] tokens by p[:, i]
                tokens = order[:, :C]
                if C < S:
                    sorted_p = p.detach().t().gather(1, order)
                    margin = float((sorted_p[:, C - 1] - sorted_p[:, C]).min())
            fixed = Decision(tokens=tokens)
        tokens = fixed.tokens
        weights = p.t().gather(1, tokens).reshape(-1)
        experts = torch.arange(E).repeat_interleave(C)
        taken = torch.bincount(tokens.reshape(-1), minlength=S)
        report = GroupReport(decision=fixed, capacity=C, tokens_per_expert=[C] * E,
                             unserved_tokens=int((taken == 0).sum()),
                             shared_tokens=int((taken > 1).sum()), margin=margin,
                             z=float(z))
        return tokens.reshape(-1), experts, weights, torch.zeros((), dtype=dtype), z, report

    C = capacity(mcfg.cf(training), k, S, E)
    noise_on = mcfg.gate == "noisy-topk" and training and mcfg.router_noise > 0
    if mcfg.gate == "noisy-topk":
        if noise_on:
            sigma = mcfg.router_noise * F.softplus(A)
            eps = torch.from_numpy(draws.router_noise(E)).to(dtype)
            H = L + eps * sigma
        else:
            H = L
        scores = H
    else:
        scores = p

    if fixed is None:
        with torch.no_grad():
            order = _stable_desc(scores.detach(), 1)  # [S, E]
            choice = order[:, :k]
            sorted_scores = scores.detach().gather(1, order)
            for j in range(1, min(k, E - 1) + 1):
                margin = min(margin, float((sorted_scores[:, j - 1] - sorted_scores[:, j]).min()))
            routed = torch.ones(S, k, dtype=torch.bool)
            if mcfg.gate == "gshard" and training:
                p12 = p.detach().gather(1, choice)
                g2 = (p12[:, 1] / (p12[:, 0] + p12[:, 1])).to(torch.float64).numpy()
                u = draws.routing_uniform()
                routed[:, 1] = torch.from_numpy(u < 2.0 * g2)
                margin = min(margin, float(np.min(np.abs(u - 2.0 * g2))))
            # Slots fill in order: every first choice in token order, then every second, ...
            flat = choice.t().reshape(-1)
            flat_routed = routed.t().reshape(-1)
            onehot = F.one_hot(flat, E) * flat_routed[:, None].long()
            slot = (onehot.cumsum(0) - 1).gather(1, flat[:, None]).squeeze(1)
            kept = (flat_routed & (slot < C)).reshape(k, S).t()
        fixed = Decision(choice=choice, routed=routed, kept=kept,
                         order=order if mcfg.gate == "noisy-topk" else None)
    choice, routed, kept = fixed.choice, fixed.routed, fixed.kept

    if mcfg.gate == "switch":
        w = p.gather(1, choice)
    elif mcfg.gate == "gshard":
        p12 = p.gather(1, choice)
        w = p12 / (p12[:, :1] + p12[:, 1:])
    else:
        w = torch.softmax(H.gather(1, choice), dim=-1)

    # Auxiliary load-balancing term (before capacity and random routing).
    if mcfg.gate in ("switch", "gshard"):
        f = F.one_hot(choice[:, 0], E).to(dtype).sum(0) / S
        P = p.sum(0) / S
        aux = (f * P).sum()
        if mcfg.gate == "switch":
            aux = E * aux
    else:
        G = torch.zeros(S, E, dtype=dtype).scatter(1, choice, w)
        aux = cv_squared(G.sum(0))
        if noise_on and k < E:
            order = fixed.order
            in_top = torch.zeros(S, E, dtype=torch.bool).scatter(1, choice, True)
            theta = torch.where(in_top, H.gather(1, order[:, k:k + 1]),
                                H.gather(1, order[:, k - 1:k]))
            aux = aux + cv_squared(normal_cdf((L - theta) / sigma).sum(0))
        # k == E: every expert is in every row's top k, the load is S for every expert and
        # its CV^2 is 0 (ops/moe.h leaves theta undefined there).

    token_index = torch.arange(S)[:, None].expand(S, k)
    served = torch.zeros(S, dtype=torch.bool)
    served[token_index[kept]] = True
    report = GroupReport(decision=fixed, capacity=C,
                         tokens_per_expert=torch.bincount(choice[kept], minlength=E).tolist(),
                         dropped_choices=int((routed & ~kept).sum()),
                         skipped_choices=int((~routed).sum()),
                         unserved_tokens=int((~served).sum()), margin=margin,
                         aux=float(aux), z=float(z))
    return token_index[kept], choice[kept], w[kept], aux, z, report


# --- the layer ------------------------------------------------------------------------------

class MoeRun:
    """One forward pass of an MoE model: its mode and keys in, objective terms and routing
    reports out.

    training: noise, random routing, expert dropout and capacity_factor (else evaluation).
    step: the optimizer step in the Philox counters. samples: LongTensor [B], the global
    sample index of each row (default 0..B-1). replay: a MoeRun of the same batch whose
    routing decisions to reuse (piecewise-constant routing held fixed, e.g. for gradcheck).
    """

    def __init__(self, training=False, step=0, samples=None, replay=None):
        self.training = training
        self.step = int(step)
        self.samples = None if samples is None else torch.as_tensor(samples).long()
        self.replay = replay
        self.terms = []     # objective terms (0-dim tensors), one per MoE layer with coefs
        self.reports = {}   # layer -> [GroupReport per group]

    def sample_index(self, B):
        if self.samples is None:
            return torch.arange(B)
        if self.samples.shape != (B,):
            raise ValueError(f"MoeRun.samples has shape {list(self.samples.shape)}, batch {B}")
        return self.samples

    def objective(self):
        """Sum of the MoE layers' aux and z terms (with coefficients); 0.0 when none."""
        total = 0.0
        for term in self.terms:
            total = total + term
        return total

    def summary(self):
        """Totals over layers and groups of what routing did."""
        out = {"dropped_choices": 0, "skipped_choices": 0, "unserved_tokens": 0,
               "shared_tokens": 0, "margin": math.inf, "groups": 0}
        for groups in self.reports.values():
            for g in groups:
                out["groups"] += 1
                for key in ("dropped_choices", "skipped_choices", "unserved_tokens",
                            "shared_tokens"):
                    out[key] += getattr(g, key)
                out["margin"] = min(out["margin"], g.margin)
        return out

    def decisions(self):
        """{(layer, group): Decision.key()} for comparing runs."""
        return {(layer, i): g.decision.key() for layer, groups in self.reports.items()
                for i, g in enumerate(groups)}


def moe_layer(x, layer, mcfg, run, router_logits, noise_logits, expert, expert_hidden):
    """The MoE feed-forward block's output y [B, T, C] for the pre-norm activations x.

    router_logits(x2d) -> [N, E]; noise_logits(x2d) -> [N, E] (called only when the router
    has a noise weight); expert(e, x2d, mask) -> [M, C] is FFN_e on M tokens, with `mask`
    ([M, F], keep ? 1 / (1 - p) : 0, or None) multiplying its hidden activation.
    Adds the layer's objective term to `run` and its group reports to run.reports[layer].
    """
    B, T, C = x.shape
    E = mcfg.experts
    samples = run.sample_index(B)
    order = torch.argsort(samples)
    sorted_samples = samples[order]
    first = int(sorted_samples[0])
    if not torch.equal(sorted_samples, torch.arange(first, first + B)):
        raise ValueError("the micro-batch's global sample indices must be consecutive")
    S = mcfg.group_tokens(T)
    N = B * T
    if N % S != 0 or (first * T) % S != 0:
        raise ValueError(f"{N} tokens from global token {first * T} do not split into groups "
                         f"of {S}")
    # Routing sees the tokens in global order (sample-major, position-minor): global token j
    # is x's row order[j // T], position j % T, at x_rows[row_of[j]]. The router and the
    # experts run over x's rows in the order given, so a batch given in another row order sums
    # the weight gradients in another order, as another correct engine may.
    x_rows = x.reshape(N, C)
    row_of = (order[:, None] * T + torch.arange(T)[None, :]).reshape(N)
    sample_of = sorted_samples.repeat_interleave(T).numpy()
    position_of = torch.arange(T).repeat(B).numpy()
    L = router_logits(x_rows)[row_of]
    A = noise_logits(x_rows)[row_of] if mcfg.has_noise_weight else None

    tokens, experts, weights, auxes, zs, reports = [], [], [], [], [], []
    replayed = run.replay.reports[layer] if run.replay is not None else None
    for g in range(N // S):
        rows = slice(g * S, (g + 1) * S)
        draws = Draws(mcfg.seed, run.step, layer, sample_of[rows], position_of[rows])
        t, e, w, aux, z, report = route_group(
            mcfg, L[rows], None if A is None else A[rows], run.training, draws,
            fixed=None if replayed is None else replayed[g].decision)
        tokens.append(t + g * S)
        experts.append(e)
        weights.append(w)
        auxes.append(aux)
        zs.append(z)
        reports.append(report)
    run.reports[layer] = reports
    term = None
    if mcfg.aux_loss_coef != 0 and mcfg.gate != "expert-choice":
        term = mcfg.aux_loss_coef * torch.stack(auxes).mean()
    if mcfg.z_loss_coef != 0:
        zterm = mcfg.z_loss_coef * torch.stack(zs).mean()
        term = zterm if term is None else term + zterm
    if term is not None:
        run.terms.append(term)

    tokens, experts, weights = torch.cat(tokens), torch.cat(experts), torch.cat(weights)
    F_ = expert_hidden
    dropout = run.training and mcfg.expert_dropout > 0
    y = torch.zeros_like(x_rows)
    for e in range(E):
        sel = experts == e
        if not bool(sel.any()):
            continue
        rows = row_of[tokens[sel]]
        by_row = torch.argsort(rows)  # expert e's tokens in x's row order
        idx, rows, w = tokens[sel][by_row].numpy(), rows[by_row], weights[sel][by_row]
        mask = None
        if dropout:
            mask = expert_dropout_mask(mcfg, layer, run.step, e, F_, sample_of[idx],
                                       position_of[idx], x.dtype)
        y = y.index_add(0, rows, w[:, None] * expert(e, x_rows[rows], mask))
    return y.reshape(B, T, C)


# --- expert FFNs of the two architectures (used by torch_gpt.py and torch_llama.py) --------

def gpt_expert(params, prefix):
    """FFN_e(x) = gelu_tanh(x W_fc + b_fc) W_proj + b_proj, Conv1D layouts [in, out]."""
    def apply(e, x, mask):
        p = f"{prefix}mlp.experts.{e}."
        h = F.gelu(torch.addmm(params[p + "c_fc.bias"], x, params[p + "c_fc.weight"]),
                   approximate="tanh")
        if mask is not None:
            h = h * mask
        return torch.addmm(params[p + "c_proj.bias"], h, params[p + "c_proj.weight"])
    return apply


def llama_expert(params, prefix):
    """FFN_e(x) = (silu(x Wg^T) * (x Wu^T)) Wd^T, nn.Linear layouts [out, in]."""
    def apply(e, x, mask):
        p = f"{prefix}mlp.experts.{e}."
        h = F.silu(F.linear(x, params[p + "gate_proj.weight"])) * F.linear(
            x, params[p + "up_proj.weight"])
        if mask is not None:
            h = h * mask
        return F.linear(h, params[p + "down_proj.weight"])
    return apply


def gpt_moe_block(x, params, prefix, layer, mcfg, ffn_hidden, run):
    """GPT's MoE block: router [C, E] (y = x @ W), experts as gpt_expert."""
    return moe_layer(x, layer, mcfg, run,
                     lambda xs: xs @ params[prefix + "mlp.router.weight"],
                     lambda xs: xs @ params[prefix + "mlp.router.noise_weight"],
                     gpt_expert(params, prefix), mcfg.expert_hidden(ffn_hidden))


def llama_moe_block(x, params, prefix, layer, mcfg, ffn_hidden, run):
    """LLaMA's MoE block: router [E, C] (y = x @ W^T), experts as llama_expert."""
    return moe_layer(x, layer, mcfg, run,
                     lambda xs: F.linear(xs, params[prefix + "mlp.router.weight"]),
                     lambda xs: F.linear(xs, params[prefix + "mlp.router.noise_weight"]),
                     llama_expert(params, prefix), mcfg.expert_hidden(ffn_hidden))


def gpt_shapes(prefix, mcfg, C, ffn_hidden):
    F_, E = mcfg.expert_hidden(ffn_hidden), mcfg.experts
    shapes = {prefix + "mlp.router.weight": (C, E)}
    if mcfg.has_noise_weight:
        shapes[prefix + "mlp.router.noise_weight"] = (C, E)
    for e in range(E):
        p = f"{prefix}mlp.experts.{e}."
        shapes[p + "c_fc.weight"] = (C, F_)
        shapes[p + "c_fc.bias"] = (F_,)
        shapes[p + "c_proj.weight"] = (F_, C)
        shapes[p + "c_proj.bias"] = (C,)
    return shapes


def llama_shapes(prefix, mcfg, C, ffn_hidden):
    F_, E = mcfg.expert_hidden(ffn_hidden), mcfg.experts
    shapes = {prefix + "mlp.router.weight": (E, C)}
    if mcfg.has_noise_weight:
        shapes[prefix + "mlp.router.noise_weight"] = (E, C)
    for e in range(E):
        p = f"{prefix}mlp.experts.{e}."
        shapes[p + "gate_proj.weight"] = (F_, C)
        shapes[p + "up_proj.weight"] = (F_, C)
        shapes[p + "down_proj.weight"] = (C, F_)
    return shapes


# Router init for the tests: decisive (no ties, clear top choices) and nonzero everywhere.
ROUTER_STD = 0.5
NOISE_WEIGHT_STD = 0.1


def router_init_std(name):
    """Std of a router tensor's random init, or None for a tensor that is not a router's."""
    if name.endswith("mlp.router.weight"):
        return ROUTER_STD
    if name.endswith("mlp.router.noise_weight"):
        return NOISE_WEIGHT_STD
    return None


# --- self-test ----------------------------------------------------------------------------

def _naive_layer(x, params, mcfg, training, step, layer, samples, arch, T):
    """The MoE layer in Python floats, one token at a time (an independent formulation).

    Returns (y as nested lists [B][T][C], aux per group, z per group, dropped choices,
    skipped choices).
    """
    B = len(x)
    E, k = mcfg.experts, mcfg.k
    P = {n: t.detach().tolist() for n, t in params.items()}
    pre = "h.0." if arch == "gpt" else "model.layers.0."
    C = len(x[0][0])
    Fh = len(P[pre + ("mlp.experts.0.c_fc.bias" if arch == "gpt"
                      else "mlp.experts.0.gate_proj.weight")])

    def logits_of(vec, name):
        w = P[pre + name]
        if arch == "gpt":  # [C, E]
            return [sum(vec[c] * w[c][e] for c in range(C)) for e in range(E)]
        return [sum(vec[c] * w[e][c] for c in range(C)) for e in range(E)]

    def ffn(e, vec, sample, position):
        p = f"{pre}mlp.experts.{e}."
        if arch == "gpt":
            wf, bf = P[p + "c_fc.weight"], P[p + "c_fc.bias"]
            pre_act = [bf[f] + sum(vec[c] * wf[c][f] for c in range(C)) for f in range(Fh)]
            h = [0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
                 for a in pre_act]
        else:
            wg, wu = P[p + "gate_proj.weight"], P[p + "up_proj.weight"]
            g = [sum(vec[c] * wg[f][c] for c in range(C)) for f in range(Fh)]
            u = [sum(vec[c] * wu[f][c] for c in range(C)) for f in range(Fh)]
            h = [g[f] / (1 + math.exp(-g[f])) * u[f] for f in range(Fh)]
        if training and mcfg.expert_dropout > 0:
            q = mcfg.expert_dropout
            h = [h[f] / (1 - q) if philox.dropout_keep(mcfg.seed, step, layer, SITE_EXPERT, q,
                                                       sample, position, e * Fh + f) else 0.0
                 for f in range(Fh)]
        if arch == "gpt":
            wp, bp = P[p + "c_proj.weight"], P[p + "c_proj.bias"]
            return [bp[c] + sum(h[f] * wp[f][c] for f in range(Fh)) for c in range(C)]
        wd = P[p + "down_proj.weight"]
        return [sum(h[f] * wd[c][f] for f in range(Fh)) for c in range(C)]

    def softmax(v):
        top = max(v)
        ex = [math.exp(a - top) for a in v]
        return [a / sum(ex) for a in ex]

    def ranked(v):  # indices by value descending, ties by lower index
        return sorted(range(len(v)), key=lambda i: (-v[i], i))

    def cv2(v):
        mean = sum(v) / len(v)
        return (sum((a - mean) ** 2 for a in v) / (len(v) - 1)) / (mean * mean + CV_EPS)

    def phi(zv):
        return 0.5 * math.erfc(-zv / math.sqrt(2))

    # Tokens in global order.
    rows = sorted(range(B), key=lambda b: samples[b])
    tokens = [(b, t) for b in rows for t in range(T)]
    S = mcfg.group_tokens(T)
    y = [[[0.0] * C for _ in range(T)] for _ in range(B)]
    auxes, zs, dropped, skipped = [], [], 0, 0
    for g0 in range(0, len(tokens), S):
        group = tokens[g0:g0 + S]
        xs = [x[b][t] for b, t in group]
        Ls = [logits_of(v, "mlp.router.weight") for v in xs]
        ps = [softmax(v) for v in Ls]
        zs.append(sum((max(v) + math.log(sum(math.exp(a - max(v)) for a in v))) ** 2
                      for v in Ls) / S)
        assignments = []  # (token in group, expert, weight)
        if mcfg.gate == "expert-choice":
            cap = capacity(mcfg.cf(training), 1, S, E)
            for e in range(E):
                for t in ranked([ps[t][e] for t in range(S)])[:cap]:
                    assignments.append((t, e, ps[t][e]))
            auxes.append(0.0)
        else:
            cap = capacity(mcfg.cf(training), k, S, E)
            choices = []  # per token: [(expert, weight, routed)]
            noise_on = mcfg.gate == "noisy-topk" and training and mcfg.router_noise > 0
            Hs, sig = Ls, None
            if noise_on:
                As = [logits_of(v, "mlp.router.noise_weight") for v in xs]
                sig = [[mcfg.router_noise * math.log1p(math.exp(a)) for a in row] for row in As]
                Hs = []
                for t, (b, pos) in enumerate(group):
                    key = philox.site_key(mcfg.seed, layer, SITE_ROUTER_NOISE)
                    Hs.append([Ls[t][e] + philox.normal_from_block(
                        philox.philox4x32((e, pos, samples[b], step), key)) * sig[t][e]
                        for e in range(E)])
            for t, (b, pos) in enumerate(group):
                if mcfg.gate == "switch":
                    e1 = ranked(ps[t])[0]
                    choices.append([(e1, ps[t][e1], True)])
                elif mcfg.gate == "gshard":
                    e1, e2 = ranked(ps[t])[:2]
                    g1 = ps[t][e1] / (ps[t][e1] + ps[t][e2])
                    g2 = ps[t][e2] / (ps[t][e1] + ps[t][e2])
                    keep2 = True
                    if training:
                        r = philox.philox4x32(
                            (0, pos, samples[b], step),
                            philox.site_key(mcfg.seed, layer, SITE_RANDOM_ROUTING))
                        keep2 = philox.uniform_open0_f64(r[0], r[1]) < 2 * g2
                    choices.append([(e1, g1, True), (e2, g2, keep2)])
                else:
                    top = ranked(Hs[t])[:k]
                    ws = softmax([Hs[t][e] for e in top])
                    choices.append([(e, w, True) for e, w in zip(top, ws)])
            fill = [0] * E
            for r in range(k):
                for t in range(S):
                    e, w, routed = choices[t][r]
                    if not routed:
                        skipped += 1
                        continue
                    if fill[e] >= cap:
                        dropped += 1
                        continue
                    fill[e] += 1
                    assignments.append((t, e, w))
            if mcfg.gate in ("switch", "gshard"):
                f = [sum(1 for t in range(S) if choices[t][0][0] == i) / S for i in range(E)]
                m = [sum(ps[t][i] for t in range(S)) / S for i in range(E)]
                aux = sum(f[i] * m[i] for i in range(E))
                auxes.append(E * aux if mcfg.gate == "switch" else aux)
            else:
                importance = [sum(w for t in range(S) for e, w, _ in choices[t] if e == i)
                              for i in range(E)]
                aux = cv2(importance)
                if noise_on and k < E:
                    load = [0.0] * E
                    for t in range(S):
                        for i in range(E):
                            others = sorted((Hs[t][j] for j in range(E) if j != i),
                                            reverse=True)
                            theta = others[k - 1]
                            load[i] += phi((Ls[t][i] - theta) / sig[t][i])
                    aux += cv2(load)
                auxes.append(aux)
        for t, e, w in assignments:
            b, pos = group[t]
            out = ffn(e, xs[t], samples[b], pos)
            for c in range(C):
                y[b][pos][c] += w * out[c]
    return y, auxes, zs, dropped, skipped


def _layer_setup(arch, mcfg, C=6, Fh=5, B=2, T=6, seed=0, dtype=torch.float64):
    """Random layer-0 MoE parameters of `arch` and activations x [B, T, C]."""
    gen = torch.Generator().manual_seed(seed)
    shapes = (gpt_shapes if arch == "gpt" else llama_shapes)("h.0." if arch == "gpt"
                                                             else "model.layers.0.", mcfg, C, Fh)
    params = {}
    for name, shape in shapes.items():
        std = router_init_std(name) or 0.4
        params[name] = (std * torch.randn(shape, generator=gen, dtype=torch.float64)).to(
            dtype).requires_grad_(True)
    x = torch.randn(B, T, C, generator=gen, dtype=torch.float64).to(dtype)
    return params, x


def _layer(arch, params, x, mcfg, run, Fh):
    block = gpt_moe_block if arch == "gpt" else llama_moe_block
    return block(x, params, "h.0." if arch == "gpt" else "model.layers.0.", 0, mcfg, Fh, run)


def _check_naive(check):
    """Vectorised layer == naive per-token loop, every gate, training and evaluation."""
    cases = [
        ("gpt", dict(gate="switch", capacity_factor=1.0), True),
        ("gpt", dict(gate="switch", capacity_factor=1.0, group_size=3), False),
        ("llama", dict(gate="gshard", capacity_factor=0.75, group_size=12), True),
        ("gpt", dict(gate="gshard", capacity_factor=1.0, expert_dropout=0.3), True),
        ("gpt", dict(gate="gshard", capacity_factor=0.5, eval_capacity_factor=2.0), False),
        ("gpt", dict(gate="noisy-topk", capacity_factor=1.0, router_noise=1.0), True),
        ("llama", dict(gate="noisy-topk", top_k=3, capacity_factor=1.25, router_noise=0.7,
                       group_size=4, expert_dropout=0.2), True),
        ("llama", dict(gate="noisy-topk", top_k=2, capacity_factor=1.0), False),
        ("gpt", dict(gate="noisy-topk", top_k=1, router_noise=0.0), True),
        ("gpt", dict(gate="expert-choice", capacity_factor=1.0), True),
        ("gpt", dict(gate="expert-choice", capacity_factor=0.5), True),
        ("llama", dict(gate="expert-choice", capacity_factor=0.5, group_size=12,
                       eval_capacity_factor=1.5), False),
        # Zero routers: every value ties, so the lower expert / token index wins everywhere.
        ("gpt", dict(gate="switch", capacity_factor=2.0, tie=True), True),
        ("llama", dict(gate="gshard", capacity_factor=1.0, tie=True), True),
        ("gpt", dict(gate="noisy-topk", capacity_factor=1.0, router_noise=0.0, tie=True), True),
        ("llama", dict(gate="expert-choice", capacity_factor=0.5, tie=True), False),
    ]
    totals = {"dropped": 0, "skipped": 0}
    for arch, kw, training in cases:
        kw = dict(kw)
        tie = kw.pop("tie", False)
        mcfg = MoeConfig(every=1, experts=4, seed=321, **kw)
        params, x = _layer_setup(arch, mcfg, seed=len(kw) + 7 * training)
        if tie:
            with torch.no_grad():
                for name, t in params.items():
                    if ".router." in name:
                        t.zero_()
        samples = [1, 0]
        step = 3
        run = MoeRun(training=training, step=step, samples=samples)
        y = _layer(arch, params, x, mcfg, run, 5).detach()
        ny, auxes, zs, dropped, skipped = _naive_layer(x.tolist(), params, mcfg, training, step,
                                                       0, samples, arch, x.shape[1])
        ny = torch.tensor(ny, dtype=torch.float64)
        what = (f"{arch} {mcfg.gate} k={mcfg.k} cf={mcfg.cf(training)} group={mcfg.group_size} "
                f"dropout={mcfg.expert_dropout} {'train' if training else 'eval'}"
                + (" zero router (ties)" if tie else ""))
        s = run.summary()
        rep = run.reports[0]
        err = max(relative(y, ny),
                  max(abs(g.aux - a) / max(abs(a), 1e-300) for g, a in zip(rep, auxes)),
                  max(abs(g.z - zv) / abs(zv) for g, zv in zip(rep, zs)))
        check.at_most(f"{what}: layer output, aux and z equal the naive loop "
                      f"(dropped {s['dropped_choices']}, skipped {s['skipped_choices']}, "
                      f"unserved {s['unserved_tokens']}, shared {s['shared_tokens']})", err,
                      1e-13)
        if tie:
            d = rep[0].decision
            if d.tokens is not None:
                C = d.tokens.shape[1]
                ok = all(d.tokens[e].tolist() == list(range(C)) for e in range(4))
            else:
                ok = all(d.choice[t].tolist() == list(range(mcfg.k))
                         for t in range(d.choice.shape[0]))
            check.holds(f"{what}: ties go to the lower expert (expert-choice: token) index", ok)
        check.holds(f"{what}: same dropped/skipped choices as the naive loop",
                    (s["dropped_choices"], s["skipped_choices"]) == (dropped, skipped),
                    f"{dropped} dropped, {skipped} skipped")
        totals["dropped"] += dropped
        totals["skipped"] += skipped
    check.holds("the naive cases exercise capacity overflow and random routing",
                totals["dropped"] > 0 and totals["skipped"] > 0, str(totals))


def _check_gradcheck(check):
    """Autograd gradients of layer output and objective == finite differences, routing
    held fixed (a replayed decision), every gate."""
    for arch, kw in [("gpt", dict(gate="switch", capacity_factor=1.0)),
                     ("llama", dict(gate="gshard", capacity_factor=1.0)),
                     ("gpt", dict(gate="noisy-topk", top_k=2, router_noise=1.0,
                                  expert_dropout=0.25)),
                     ("llama", dict(gate="noisy-topk", top_k=3, router_noise=0.5)),
                     ("gpt", dict(gate="expert-choice", capacity_factor=1.0))]:
        mcfg = MoeConfig(every=1, experts=4, seed=5, aux_loss_coef=0.3, z_loss_coef=0.05, **kw)
        params, x = _layer_setup(arch, mcfg, C=4, Fh=3, B=2, T=4, seed=11)
        x.requires_grad_(True)
        names = list(params)
        reference = MoeRun(training=True, step=1)
        _layer(arch, params, x, mcfg, reference, 3)

        def fn(xx, *tensors):
            run = MoeRun(training=True, step=1, replay=reference)
            y = _layer(arch, dict(zip(names, tensors)), xx, mcfg, run, 3)
            return y, run.objective()

        what = (f"{arch} {mcfg.gate} k={mcfg.k}: autograd gradients of the output and the "
                f"aux + z objective equal finite differences (gradcheck, routing fixed)")
        try:
            ok = torch.autograd.gradcheck(fn, (x, *[params[n] for n in names]), eps=1e-6,
                                          atol=1e-8, rtol=1e-6)
            check.holds(what, ok)
        except RuntimeError as e:
            check.holds(what, False, str(e).splitlines()[0])


def _check_tie_order(check):
    """torch.sort(descending, stable) keeps equal values in index order (the tie rule)."""
    order = _stable_desc(torch.tensor([[1.0, 2.0, 2.0, 1.0, 2.0, 3.0]]), 1)[0].tolist()
    check.holds("stable descending sort puts ties in index order", order == [5, 1, 2, 4, 0, 3],
                str(order))


def _check_draws(check):
    """The layer's noise and random routing draw what philox.py's scalar functions draw."""
    draws = Draws(seed=99, step=7, layer=2, sample=np.array([4, 4, 5]),
                  position=np.array([0, 9, 0]))
    eps = draws.router_noise(3)
    key = philox.site_key(99, 2, SITE_ROUTER_NOISE)
    exact = np.array([[philox.normal_from_block(philox.philox4x32((e, pos, smp, 7), key))
                       for e in range(3)] for smp, pos in zip([4, 4, 5], [0, 9, 0])])
    check.at_most("router noise equals normal_from_block of {expert, position, sample, step}",
                  float(np.max(np.abs(eps - exact))), 1e-15)
    key = philox.site_key(99, 2, SITE_RANDOM_ROUTING)
    u = [philox.uniform_open0_f64(*philox.philox4x32((0, pos, smp, 7), key)[:2])
         for smp, pos in zip([4, 4, 5], [0, 9, 0])]
    check.holds("random-routing uniforms equal uniform_open0_f64 of {0, position, sample, step}",
                list(draws.routing_uniform()) == u)
    check.holds("capacity(): ((cf * k) * S) / E rounded up, clamped to [1, S]",
                [capacity(1.0, 1, 16, 4), capacity(1.0, 2, 16, 4), capacity(1.25, 2, 10, 4),
                 capacity(0.01, 1, 16, 4), capacity(10.0, 2, 16, 4), capacity(0.3, 1, 10, 3)]
                == [4, 8, 7, 1, 16, 1])


def _models():
    import torch_gpt
    import torch_llama
    return torch_gpt, torch_llama


def _model_setups():
    torch_gpt, torch_llama = _models()
    gpt = torch_gpt.GPTConfig(layers=2, hidden=8, heads=2, ffn_hidden=6, vocab_size=11,
                              seq_len=4, moe=MoeConfig(every=1, experts=3, gate="gshard",
                                                       capacity_factor=1.0, group_size=8,
                                                       aux_loss_coef=0.1, z_loss_coef=0.01,
                                                       expert_dropout=0.2, seed=3))
    llama = torch_llama.LlamaConfig(layers=2, hidden=8, heads=2, kv_heads=1, ffn_hidden=6,
                                    vocab_size=11, seq_len=4,
                                    moe=MoeConfig(every=2, experts=4, gate="noisy-topk",
                                                  capacity_factor=1.0, aux_loss_coef=0.1,
                                                  z_loss_coef=0.01, ffn_hidden=5, seed=3))
    return [("gpt", torch_gpt, gpt), ("llama", torch_llama, llama)]


def _check_models(check):
    """Whole GPT and LLaMA MoE models: gradcheck of the objective with routing fixed, batch
    rows in another order with their sample indices, evaluation without randomness."""
    for arch, model, cfg in _model_setups():
        params = model.init_params(cfg, 4, torch.float64)
        names = list(params)
        gen = torch.Generator().manual_seed(5)
        inputs = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=gen)
        targets = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=gen)
        moe_names = [n for n in names if ".mlp.router." in n or ".mlp.experts." in n]
        check.holds(f"{arch}: MoE layers hold routers and experts, no dense MLP",
                    len(moe_names) > 0 and not any(
                        n.startswith(f"{'h' if arch == 'gpt' else 'model.layers'}.{i}.mlp.")
                        and n not in moe_names for n in names
                        for i in range(cfg.layers) if cfg.moe.is_moe_layer(i)))

        reference = MoeRun(training=True, step=2)
        logits = model.forward(params, cfg, inputs, reference)
        obj = model.loss_fn(logits, targets) + reference.objective()

        def objective(*tensors):
            run = MoeRun(training=True, step=2, replay=reference)
            out = model.forward(dict(zip(names, tensors)), cfg, inputs, run)
            return model.loss_fn(out, targets) + run.objective()

        what = f"{arch}: gradients of the whole MoE objective equal finite differences"
        try:
            ok = torch.autograd.gradcheck(objective, tuple(params[n] for n in names), eps=1e-6,
                                          atol=1e-8, rtol=1e-6)
            check.holds(what, ok)
        except RuntimeError as e:
            check.holds(what, False, str(e).splitlines()[0])

        perm = torch.tensor([2, 0, 3, 1])
        run = MoeRun(training=True, step=2, samples=perm)
        plogits = model.forward(params, cfg, inputs[perm], run)
        pobj = model.loss_fn(plogits, targets[perm]) + run.objective()
        check.at_most(f"{arch}: rows permuted with their sample indices: same logits",
                      relative(plogits.detach()[torch.argsort(perm)], logits.detach()), 1e-14)
        check.at_most(f"{arch}: rows permuted with their sample indices: same objective",
                      abs(float(pobj) - float(obj)) / abs(float(obj)), 1e-14)
        check.holds(f"{arch}: rows permuted: same routing decisions",
                    _same_decisions(run.decisions(), reference.decisions()))
        other_step = MoeRun(training=True, step=3)
        ologits = model.forward(params, cfg, inputs, other_step)
        check.at_least(f"{arch}: another step draws other noise / routing / dropout",
                       relative(ologits.detach(), logits.detach()), 1e-8)
        e2, e3 = (model.forward(params, cfg, inputs, MoeRun(training=False, step=s)).detach()
                  for s in (2, 3))
        check.at_most(f"{arch}: evaluation draws nothing (same logits at every step)",
                      relative(e2, e3), 0.0)
        check.at_most(f"{arch}: forward without a MoeRun is evaluation",
                      relative(model.forward(params, cfg, inputs).detach(), e2), 0.0)


def _same_decisions(a, b):
    return a.keys() == b.keys() and all(
        len(a[key]) == len(b[key]) and all(np.array_equal(u, v) for u, v in zip(a[key], b[key]))
        for key in a)


def relative(a, b):
    return float((a - b).norm() / b.norm())


def self_test():
    from self_check import SelfCheck
    check = SelfCheck("torch_moe self-test")
    for run in (_check_tie_order, _check_draws, _check_naive, _check_gradcheck, _check_models):
        run(check)
    return check.exit_code()


if __name__ == "__main__":
    if sys.argv[1:] != ["--self-test"]:
        print(f"usage: {sys.argv[0]} --self-test", file=sys.stderr)
        sys.exit(2)
    sys.exit(self_test())
