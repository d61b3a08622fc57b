// Mixture-of-experts routing: which experts each token of a dispatch group goes to, with what
// weight, and the auxiliary losses of the four gates (Shazeer et al. 2017, GShard, Switch
// Transformer, Expert Choice). Pure functions of the router's logits and of Philox keys, so
// every layout and every recomputation routes identically; the expert FFNs around them live in
// the MoE segment (ops/layer_segments.h).
//
// Exact semantics (the PyTorch reference in tests/model/torch_moe.py implements the same):
//
// A group is `S` consecutive tokens in global order (global token index = global sample *
// seq_len + position); capacity and auxiliary losses are per group. E experts, logits
// L = x W_router [S, E] computed in the router type (fp64 in fp64 runs, fp32 otherwise),
// p = softmax(L) over experts. Choices sort by value descending, ties by lower index.
// capacity(k) = min(S, max(1, ceil(cf * k * S / E))) evaluated as ((cf * k) * S) / E in double.
// Slots fill in order: all first choices in token order, then all second choices, ...; a
// choice whose expert already holds `capacity` tokens is dropped (weight 0). Dropped weights
// are not renormalised; a token all of whose choices are dropped passes through the residual.
//
//   switch (k = 1)  e = argmax p, weight p[e], capacity(1).
//                   aux = E * sum_i f_i P_i, f_i = (1/S) #{t: e_t = i} (before capacity,
//                   no gradient), P_i = (1/S) sum_t p[t, i].
//   gshard (k = 2)  e1 = argmax p, e2 = argmax of p without e1; g1 = p1 / (p1 + p2),
//                   g2 = p2 / (p1 + p2) (the gradient flows through both). In training the
//                   second choice is kept only when u < 2 * g2, u uniform in (0, 1] (random
//                   routing; in evaluation it is always kept). capacity(2).
//                   aux = E * mean_i (f_i * m_i) = sum_i f_i m_i, f_i = (1/S) #{t: e1_t = i}
//                   (no gradient), m_i = (1/S) sum_t p[t, i].
//   noisy-topk (k)  H = L + noise * eps * softplus(A), A = x W_noise [S, E], eps ~ N(0, 1)
//                   (training only; in evaluation H = L); the top k of H, weights = softmax
//                   over those k values of H. capacity(k).
//                   aux = CV^2(importance) + CV^2(load), importance_i = sum_t G[t, i] (G: the
//                   weights before capacity), load_i = sum_t Phi((L[t, i] - theta[t, i]) /
//                   sigma[t, i]) with sigma = noise * softplus(A) and theta[t, i] the k-th
//                   largest H[t, j] over j != i (the (k+1)-th of the row when i is among the
//                   top k, else the k-th); the load term only where noise is drawn (training,
//                   noise > 0). CV^2(v) = var(v) / (mean(v)^2 + 1e-10), var the unbiased
//                   (E - 1) estimate.
//   expert-choice   each expert takes the top C = capacity(1) tokens of the group by p[:, i]
//                   (ties: lower token index); the token's weight for that expert is p[t, i];
//                   a token may be taken by several experts or none. No aux loss.
//
// Every gate also has the router z-loss z = (1/S) sum_t logsumexp(L[t, :])^2. The objective a
// layer adds to the loss is aux_coef * mean over groups of aux + z_coef * mean over groups of
// z, the mean over every group of the global batch.
//
// Random numbers (Philox 4x32-10, core/philox.h), keyed like dropout masks
// (kernels/cpu/dropout.h): key = philox_key(seed, ((uint64(layer) << 32) | site) + 1), counter
// = {c0, uint32(position), uint32(global sample), uint32(step)}, r = philox4x32(counter, key):
//   router noise   site 3, c0 = expert i: eps[t, i] = normal_from_block(r)
//   random routing site 4, c0 = 0:        u[t] = uniform_open0_f64(r[0], r[1])
//   expert dropout site 5, the dropout kernel's rule (kernels/cpu/dropout.h) over the
//                  expert's hidden activations with global feature = expert * F + feature
//                  (F: the expert's hidden width)
#pragma once

#include "core/named_values.h"
#include "ops/context.h"

#include <array>

#include <cstdint>
#include <string>
#include <vector>

namespace oases::ops {

enum class MoeGate : std::uint8_t { noisy_top_k, gshard, switch_top1, expert_choice };
// model.moe_gate's words.
inline constexpr std::array<NamedValue<MoeGate>, 4> kMoeGateNames{{
    {MoeGate::noisy_top_k, "noisy-topk"},
    {MoeGate::gshard, "gshard"},
    {MoeGate::switch_top1, "switch"},
    {MoeGate::expert_choice, "expert-choice"}}};

inline constexpr std::uint32_t kDropoutSiteRouterNoise = 3;
inline constexpr std::uint32_t kDropoutSiteRandomRouting = 4;
inline constexpr std::uint32_t kDropoutSiteExpert = 5;

// The gate kMoeGateNames names (UserError naming model.moe_gate otherwise), and its name.
// Inline: readers of model configs (profiles, checkpoints) name gates without the router.
inline MoeGate parse_moe_gate(const std::string& name) {
  return parse_named_value<MoeGate>(kMoeGateNames, name, "model.moe_gate");
}
inline const char* moe_gate_name(MoeGate gate) {
  return value_name<MoeGate>(kMoeGateNames, gate).data();
}
// Experts per token a gate routes to when moe_top_k is 0 (expert-choice: 1, the capacity's k).
inline int default_top_k(MoeGate gate) {
  return gate == MoeGate::noisy_top_k || gate == MoeGate::gshard ? 2 : 1;
}

struct MoeRouterSpec {
  MoeGate gate = MoeGate::switch_top1;
  int experts = 1;
  int top_k = 1;                   // choices per token (1 for switch and expert-choice)
  double train_capacity_factor = 1;
  double eval_capacity_factor = 1;
  double router_noise = 1;         // noisy-topk's noise scale
  double aux_coef = 0;
  double z_coef = 0;
};

// Expert slots of a group, capacity per expert: slot_token[e * capacity + s] is the token
// (index within the group) in slot s of expert e, -1 when empty; slot_weight the same slot's
// weight (0 for empty slots). Slots of an expert fill from 0 without gaps.
int moe_capacity(const MoeRouterSpec& spec, std::int64_t group_tokens, bool training);

// What one group's routing draws from: Philox keys and the global indices of its first token.
struct MoeRandom {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t layer = 0;
  std::int64_t global_token = 0;  // of the group's first token
  std::int64_t seq_len = 1;       // turns a global token index into (sample, position)
  bool training = true;           // noise and random routing only in training
};

// Per-group results the segment reports (summed over groups by the caller).
struct MoeGroupStats {
  std::vector<std::int64_t> tokens_per_expert;  // kept assignments per expert
  std::int64_t dropped_tokens = 0;              // tokens routed to no expert
  double aux = 0, z = 0;                        // the group's aux and z terms (no coefficients)
};

// What the MoE segment of one layer reports over a run (summed over its groups; the engine sums
// over ranks): tokens kept per expert, tokens routed to no expert, and the aux and z terms.
struct MoeLayerStats {
  std::vector<double> tokens_per_expert;
  double tokens = 0, dropped_tokens = 0, groups = 0, aux_sum = 0, z_sum = 0;
  void reset(int experts) {
    tokens_per_expert.assign(static_cast<std::size_t>(experts), 0);
    tokens = dropped_tokens = groups = aux_sum = z_sum = 0;
  }
};

// Routes one group of S tokens. logits [S, E]; noise_logits [S, E] (A = x W_noise; empty
// unless noisy-topk). Writes slot_token / slot_weight ([E * capacity]) and returns the stats.
template <class T>
MoeGroupStats moe_route(const MoeRouterSpec& spec, const MoeRandom& random, std::int64_t S,
                        const T* logits, const T* noise_logits, int capacity, int* slot_token,
                        T* slot_weight);

// Backward of one group: given d(slot weight) [E * capacity] (the combine's gradient) and the
// scales of the auxiliary terms (aux_scale = aux_coef / groups of the global batch, times the
// loss's gradient scale; z_scale likewise), writes d(logits) and d(noise_logits) [S, E]
// (overwritten). Routing is recomputed from the logits and keys, so nothing else is kept.
template <class T>
void moe_route_backward(const MoeRouterSpec& spec, const MoeRandom& random, std::int64_t S,
                        const T* logits, const T* noise_logits, int capacity,
                        const T* d_slot_weight, double aux_scale, double z_scale, T* d_logits,
                        T* d_noise_logits);

}  // namespace oases::ops
