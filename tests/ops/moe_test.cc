#include "ops/moe.h"

#include "core/error.h"
#include "core/philox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace oases::ops {
namespace {

MoeRouterSpec spec_of(MoeGate gate, int experts, int top_k, double capacity_factor) {
  MoeRouterSpec spec;
  spec.gate = gate;
  spec.experts = experts;
  spec.top_k = top_k;
  spec.train_capacity_factor = spec.eval_capacity_factor = capacity_factor;
  spec.router_noise = 1.0;
  return spec;
}

// Logits drawn from Philox (no ties), [S, E].
std::vector<double> random_logits(std::int64_t S, int E, std::uint64_t stream, double scale) {
  std::vector<double> v(static_cast<std::size_t>(S * E));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = scale * normal_from_block(philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0},
                                                philox_key(7, stream)));
  return v;
}

struct Routed {
  std::vector<int> token;
  std::vector<double> weight;
  MoeGroupStats stats;
};

Routed route(const MoeRouterSpec& spec, const MoeRandom& random, std::int64_t S,
             const std::vector<double>& logits, const std::vector<double>& noise) {
  Routed r;
  const int capacity = moe_capacity(spec, S, random.training);
  r.token.resize(static_cast<std::size_t>(spec.experts * capacity));
  r.weight.resize(r.token.size());
  r.stats = moe_route<double>(spec, random, S, logits.data(), noise.empty() ? nullptr : noise.data(),
                              capacity, r.token.data(), r.weight.data());
  return r;
}

TEST(MoeCapacity, IsCeilOfFactorTimesChoicesTimesTokensOverExpertsClampedToTheGroup) {
  EXPECT_EQ(moe_capacity(spec_of(MoeGate::switch_top1, 4, 1, 1.0), 16, true), 4);
  EXPECT_EQ(moe_capacity(spec_of(MoeGate::switch_top1, 4, 1, 1.25), 16, true), 5);
  EXPECT_EQ(moe_capacity(spec_of(MoeGate::gshard, 4, 2, 1.0), 16, true), 8);
  EXPECT_EQ(moe_capacity(spec_of(MoeGate::gshard, 3, 2, 1.0), 16, true), 11);  // ceil(32 / 3)
  EXPECT_EQ(moe_capacity(spec_of(MoeGate::expert_choice, 4, 1, 2.0), 16, true), 8);
  EXPECT_EQ(moe_capacity(spec_of(MoeGate::switch_top1, 4, 1, 100.0), 16, true), 16);
  EXPECT_EQ(moe_capacity(spec_of(MoeGate::switch_top1, 64, 1, 0.01), 16, true), 1);
  MoeRouterSpec spec = spec_of(MoeGate::switch_top1, 4, 1, 1.0);
  spec.eval_capacity_factor = 2.0;
  EXPECT_EQ(moe_capacity(spec, 16, false), 8);
}

TEST(MoeRoute, SwitchFillsSlotsInTokenOrderAndDropsTheOverflow) {
  const int E = 2;
  const std::int64_t S = 8;
  // Tokens 0-5 prefer expert 0, 6-7 expert 1; capacity 4.
  std::vector<double> logits(S * E);
  for (std::int64_t t = 0; t < S; ++t) {
    logits[static_cast<std::size_t>(t * E)] = t < 6 ? 1.0 + 0.1 * static_cast<double>(t) : 0;
    logits[static_cast<std::size_t>(t * E + 1)] = t < 6 ? 0 : 2;
  }
  const Routed r = route(spec_of(MoeGate::switch_top1, E, 1, 1.0), {}, S, logits, {});
  EXPECT_EQ(r.token, (std::vector<int>{0, 1, 2, 3, 6, 7, -1, -1}));
  EXPECT_EQ(r.stats.tokens_per_expert, (std::vector<std::int64_t>{4, 2}));
  EXPECT_EQ(r.stats.dropped_tokens, 2);
  const double p0 = 1 / (1 + std::exp(-1.0));  // token 0: softmax of (1, 0)
  EXPECT_NEAR(r.weight[0], p0, 1e-15);
  EXPECT_EQ(r.weight[6], 0);
  // aux = E * sum_i f_i P_i with f = (6/8, 2/8).
  double P0 = 0;
  for (std::int64_t t = 0; t < S; ++t) {
    const double a = logits[static_cast<std::size_t>(t * E)], b = logits[static_cast<std::size_t>(t * E + 1)];
    P0 += std::exp(a) / (std::exp(a) + std::exp(b)) / S;
  }
  EXPECT_NEAR(r.stats.aux, E * (0.75 * P0 + 0.25 * (1 - P0)), 1e-15);
}

TEST(MoeRoute, GshardSkipsSecondChoicesByTheirPhiloxDrawsAndRoutesThemAllInEvaluation) {
  const int E = 4;
  const std::int64_t S = 64;
  const auto logits = random_logits(S, E, 1, 1.0);
  const MoeRouterSpec spec = spec_of(MoeGate::gshard, E, 2, 4.0);  // no capacity drops
  MoeRandom random{.seed = 11, .step = 3, .layer = 1, .global_token = 96, .seq_len = 32};
  const Routed train = route(spec, random, S, logits, {});
  random.training = false;
  const Routed eval = route(spec, random, S, logits, {});
  const PhiloxKey key = philox_key(11, ((std::uint64_t{1} << 32) | kDropoutSiteRandomRouting) + 1);
  int skipped = 0, expected_skipped = 0;
  for (std::int64_t t = 0; t < S; ++t) {
    std::vector<double> p(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    const double max = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& x : p) sum += (x = std::exp(x - max));
    std::vector<int> order{0, 1, 2, 3};
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    const double g2 = p[order[1]] / (p[order[0]] + p[order[1]]);
    const std::int64_t global = 96 + t;
    const PhiloxCounter bits = philox4x32(
        {0, static_cast<std::uint32_t>(global % 32), static_cast<std::uint32_t>(global / 32), 3}, key);
    const bool keep = uniform_open0_f64(bits[0], bits[1]) < 2 * g2;
    expected_skipped += !keep;
    // The second choice's slot holds the token exactly when it was kept.
    const int capacity = moe_capacity(spec, S, true);
    const auto& slots = train.token;
    const bool routed = std::find(slots.begin() + order[1] * capacity,
                                  slots.begin() + (order[1] + 1) * capacity,
                                  static_cast<int>(t)) != slots.begin() + (order[1] + 1) * capacity;
    EXPECT_EQ(routed, keep) << "token " << t;
    skipped += !routed;
  }
  EXPECT_GT(expected_skipped, 5);  // random routing happened
  EXPECT_EQ(skipped, expected_skipped);
  std::int64_t eval_assignments = 0, train_assignments = 0;
  for (auto n : eval.stats.tokens_per_expert) eval_assignments += n;
  for (auto n : train.stats.tokens_per_expert) train_assignments += n;
  EXPECT_EQ(eval_assignments, 2 * S);
  EXPECT_EQ(train_assignments, 2 * S - expected_skipped);
}

TEST(MoeRoute, ExpertChoiceTakesEachExpertsTopTokens) {
  const int E = 4;
  const std::int64_t S = 16;
  const auto logits = random_logits(S, E, 2, 1.0);
  const MoeRouterSpec spec = spec_of(MoeGate::expert_choice, E, 1, 1.0);
  const Routed r = route(spec, {}, S, logits, {});
  const int capacity = 4;
  for (int e = 0; e < E; ++e) {
    std::vector<std::pair<double, int>> scores;
    for (std::int64_t t = 0; t < S; ++t) {
      const double* row = &logits[static_cast<std::size_t>(t * E)];
      double sum = 0;
      for (int j = 0; j < E; ++j) sum += std::exp(row[j]);
      scores.push_back({std::exp(row[e]) / sum, static_cast<int>(t)});
    }
    std::sort(scores.begin(), scores.end(), [](auto a, auto b) { return a.first > b.first; });
    std::vector<int> expected;
    for (int s = 0; s < capacity; ++s) expected.push_back(scores[static_cast<std::size_t>(s)].second);
    std::sort(expected.begin(), expected.end());
    const std::vector<int> got(r.token.begin() + e * capacity, r.token.begin() + (e + 1) * capacity);
    EXPECT_EQ(got, expected) << "expert " << e;
  }
  EXPECT_EQ(r.stats.aux, 0);
}

// d(J)/d(logits) and d(J)/d(noise logits) of J = sum c . slot weights + a * aux + b * z against
// central differences in fp64, with the routing held by the same Philox draws.
void check_backward(const MoeRouterSpec& spec, std::int64_t S, double logit_scale) {
  const int E = spec.experts;
  const auto logits = random_logits(S, E, 3, logit_scale);
  const bool noisy = spec.gate == MoeGate::noisy_top_k;
  const auto noise = noisy ? random_logits(S, E, 4, 0.5) : std::vector<double>{};
  const MoeRandom random{.seed = 5, .step = 2, .layer = 0, .global_token = 0, .seq_len = S};
  const int capacity = moe_capacity(spec, S, true);
  const auto c = random_logits(1, E * capacity, 5, 1.0);
  const double a = 0.3, b = 0.07;
  const auto objective = [&](const std::vector<double>& l, const std::vector<double>& n) {
    const Routed r = route(spec, random, S, l, n);
    double j = a * r.stats.aux + b * r.stats.z;
    for (std::size_t i = 0; i < c.size(); ++i) j += c[i] * r.weight[i];
    return j;
  };
  std::vector<double> d_logits(logits.size()), d_noise(noise.size());
  moe_route_backward<double>(spec, random, S, logits.data(), noisy ? noise.data() : nullptr,
                             capacity, c.data(), a, b, d_logits.data(),
                             noisy ? d_noise.data() : nullptr);
  const double h = 1e-6;
  // Perturbs `target` (the logits or the noise logits) element by element.
  std::vector<double> l = logits, n = noise;
  const auto check = [&](std::vector<double>& target, const std::vector<double>& grad,
                         const char* what) {
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < grad.size(); ++i) {
      const double keep = target[i];
      target[i] = keep + h;
      const double up = objective(l, n);
      target[i] = keep - h;
      const double down = objective(l, n);
      target[i] = keep;
      const double fd = (up - down) / (2 * h);
      err = std::max(err, std::abs(fd - grad[i]));
      norm = std::max(norm, std::abs(fd));
    }
    EXPECT_LT(err, 1e-7 * std::max(1.0, norm)) << moe_gate_name(spec.gate) << " " << what;
    EXPECT_GT(norm, 1e-3) << what << ": the gradient must not vanish";
  };
  check(l, d_logits, "d logits");
  if (noisy) check(n, d_noise, "d noise logits");
}

TEST(MoeRouteBackward, MatchesFiniteDifferencesForEveryGate) {
  check_backward(spec_of(MoeGate::switch_top1, 4, 1, 1.0), 24, 2.0);
  check_backward(spec_of(MoeGate::gshard, 4, 2, 1.0), 24, 2.0);
  check_backward(spec_of(MoeGate::noisy_top_k, 5, 2, 1.0), 24, 1.0);
  check_backward(spec_of(MoeGate::noisy_top_k, 4, 3, 0.8), 24, 1.0);
  check_backward(spec_of(MoeGate::expert_choice, 4, 1, 1.0), 24, 2.0);
}

TEST(MoeGate, ParsesEveryNameAndRejectsOthers) {
  for (MoeGate gate : {MoeGate::noisy_top_k, MoeGate::gshard, MoeGate::switch_top1, MoeGate::expert_choice})
    EXPECT_EQ(parse_moe_gate(moe_gate_name(gate)), gate);
  EXPECT_THROW(parse_moe_gate("top2"), UserError);
}

}  // namespace
}  // namespace oases::ops
