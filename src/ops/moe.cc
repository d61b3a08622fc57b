#include "ops/moe.h"

#include "core/error.h"
#include "core/philox.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace oases::ops {
namespace {

PhiloxKey site_key(const MoeRandom& random, std::uint32_t site) {
  return philox_key(random.seed, ((static_cast<std::uint64_t>(random.layer) << 32) | site) + 1);
}

PhiloxCounter token_counter(const MoeRandom& random, std::int64_t t, std::uint32_t c0) {
  const std::int64_t global = random.global_token + t;
  return {c0, static_cast<std::uint32_t>(global % random.seq_len),
          static_cast<std::uint32_t>(global / random.seq_len), random.step};
}

double softplus(double a) { return std::max(a, 0.0) + std::log1p(std::exp(-std::abs(a))); }
double sigmoid(double a) {
  return a >= 0 ? 1 / (1 + std::exp(-a)) : std::exp(a) / (1 + std::exp(a));
}
double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }
double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }

// CV^2(v) = var(v) / (mean(v)^2 + 1e-10) with the unbiased variance, and its gradient.
double cv_squared(const std::vector<double>& v, std::vector<double>* grad) {
  const auto n = static_cast<double>(v.size());
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  const double var = ss / (n - 1), denom = mean * mean + 1e-10;
  if (grad) {
    grad->resize(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      (*grad)[i] = 2 * (v[i] - mean) / (n - 1) / denom - var * (2 * mean / n) / (denom * denom);
  }
  return var / denom;
}

// Everything routing decides for a group, in double, shared by forward and backward.
struct Routing {
  std::int64_t S = 0;
  int E = 0, k = 0, capacity = 0;
  std::vector<double> l, p, lse;           // logits and softmax [S, E], log-sum-exp [S]
  // Token-choice gates: choice r of token t is expert[t * k + r] with weight[t * k + r]
  // (before capacity); routed[...] false for a gshard second choice skipped at random.
  std::vector<int> expert;
  std::vector<double> weight;
  std::vector<char> routed;
  // Slots: token and (for token choice) the choice index t * k + r, per expert slot.
  std::vector<int> slot_token, slot_choice;
  std::vector<int> count;                  // filled slots per expert
  // noisy-topk
  bool noise_active = false;
  std::vector<double> sigma, eps, h;       // [S, E]
  std::vector<int> order;                  // [S, E]: experts of each row by H descending
};

template <class T>
Routing route(const MoeRouterSpec& spec, const MoeRandom& random, std::int64_t S, const T* logits,
              const T* noise_logits, int capacity) {
  Routing r;
  const int E = spec.experts;
  r.S = S;
  r.E = E;
  r.capacity = capacity;
  r.k = spec.gate == MoeGate::expert_choice ? 1 : spec.top_k;
  const auto SE = static_cast<std::size_t>(S * E);
  r.l.assign(logits, logits + SE);
  r.p.resize(SE);
  r.lse.resize(static_cast<std::size_t>(S));
  for (std::int64_t t = 0; t < S; ++t) {
    const T* row = logits + t * E;
    double max = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < E; ++e) max = std::max(max, static_cast<double>(row[e]));
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(row[e]) - max);
    for (int e = 0; e < E; ++e)
      r.p[static_cast<std::size_t>(t * E + e)] = std::exp(static_cast<double>(row[e]) - max) / sum;
    r.lse[static_cast<std::size_t>(t)] = max + std::log(sum);
  }
  r.slot_token.assign(static_cast<std::size_t>(E) * capacity, -1);
  r.slot_choice.assign(static_cast<std::size_t>(E) * capacity, -1);
  r.count.assign(static_cast<std::size_t>(E), 0);
  const auto by_value_then_index = [](const double* v) {
    return [v](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };

  if (spec.gate == MoeGate::expert_choice) {
    std::vector<int> tokens(static_cast<std::size_t>(S));
    std::vector<double> column(static_cast<std::size_t>(S));
    for (int e = 0; e < E; ++e) {
      for (std::int64_t t = 0; t < S; ++t)
        column[static_cast<std::size_t>(t)] = r.p[static_cast<std::size_t>(t * E + e)];
      std::iota(tokens.begin(), tokens.end(), 0);
      std::partial_sort(tokens.begin(), tokens.begin() + capacity, tokens.end(),
                        by_value_then_index(column.data()));
      std::sort(tokens.begin(), tokens.begin() + capacity);  // slots in token order
      for (int s = 0; s < capacity; ++s)
        r.slot_token[static_cast<std::size_t>(e * capacity + s)] = tokens[static_cast<std::size_t>(s)];
      r.count[static_cast<std::size_t>(e)] = capacity;
    }
    return r;
  }

  const int k = r.k;
  r.expert.assign(static_cast<std::size_t>(S * k), -1);
  r.weight.assign(static_cast<std::size_t>(S * k), 0);
  r.routed.assign(static_cast<std::size_t>(S * k), 1);
  std::vector<int> order(static_cast<std::size_t>(E));
  switch (spec.gate) {
    case MoeGate::switch_top1:
      for (std::int64_t t = 0; t < S; ++t) {
        const double* row = &r.p[static_cast<std::size_t>(t * E)];
        const int e = static_cast<int>(std::max_element(row, row + E) - row);
        r.expert[static_cast<std::size_t>(t)] = e;
        r.weight[static_cast<std::size_t>(t)] = row[e];
      }
      break;
    case MoeGate::gshard: {
      const PhiloxKey key = site_key(random, kDropoutSiteRandomRouting);
      for (std::int64_t t = 0; t < S; ++t) {
        const double* row = &r.p[static_cast<std::size_t>(t * E)];
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + 2, order.end(), by_value_then_index(row));
        const int e1 = order[0], e2 = order[1];
        const double sum = row[e1] + row[e2];
        const auto c = static_cast<std::size_t>(t * 2);
        r.expert[c] = e1;
        r.expert[c + 1] = e2;
        r.weight[c] = row[e1] / sum;
        r.weight[c + 1] = row[e2] / sum;
        if (random.training) {
          const PhiloxCounter bits = philox4x32(token_counter(random, t, 0), key);
          r.routed[c + 1] = uniform_open0_f64(bits[0], bits[1]) < 2 * r.weight[c + 1];
        }
      }
      break;
    }
    case MoeGate::noisy_top_k: {
      r.noise_active = random.training && spec.router_noise > 0;
      r.h.resize(SE);
      r.order.resize(SE);
      if (r.noise_active) {
        OASES_ASSERT(noise_logits != nullptr, "noisy-topk routing without noise logits");
        r.sigma.resize(SE);
        r.eps.resize(SE);
        const PhiloxKey key = site_key(random, kDropoutSiteRouterNoise);
        for (std::int64_t t = 0; t < S; ++t)
          for (int e = 0; e < E; ++e) {
            const auto i = static_cast<std::size_t>(t * E + e);
            r.sigma[i] = spec.router_noise * softplus(static_cast<double>(noise_logits[i]));
            r.eps[i] = normal_from_block(
                philox4x32(token_counter(random, t, static_cast<std::uint32_t>(e)), key));
            r.h[i] = static_cast<double>(logits[i]) + r.eps[i] * r.sigma[i];
          }
      } else {
        for (std::size_t i = 0; i < SE; ++i) r.h[i] = static_cast<double>(logits[i]);
      }
      for (std::int64_t t = 0; t < S; ++t) {
        const double* row = &r.h[static_cast<std::size_t>(t * E)];
        int* sorted = &r.order[static_cast<std::size_t>(t * E)];
        std::iota(sorted, sorted + E, 0);
        std::sort(sorted, sorted + E, by_value_then_index(row));
        double max = row[sorted[0]], sum = 0;
        for (int j = 0; j < k; ++j) sum += std::exp(row[sorted[j]] - max);
        for (int j = 0; j < k; ++j) {
          const auto c = static_cast<std::size_t>(t * k + j);
          r.expert[c] = sorted[j];
          r.weight[c] = std::exp(row[sorted[j]] - max) / sum;
        }
      }
      break;
    }
    case MoeGate::expert_choice: break;
  }
  for (int rank = 0; rank < k; ++rank)
    for (std::int64_t t = 0; t < S; ++t) {
      const auto c = static_cast<std::size_t>(t * k + rank);
      if (!r.routed[c]) continue;
      const auto e = static_cast<std::size_t>(r.expert[c]);
      if (r.count[e] >= capacity) continue;
      const auto slot = e * static_cast<std::size_t>(capacity) + static_cast<std::size_t>(r.count[e]++);
      r.slot_token[slot] = static_cast<int>(t);
      r.slot_choice[slot] = static_cast<int>(c);
    }
  return r;
}

// The group's aux term and, with `d_p` / `d_h` / `d_sigma`, its gradient times `scale` added to
// d(p) (switch, gshard) or to d(weights before capacity) / d(L) / d(sigma) (noisy-topk).
double aux_term(const MoeRouterSpec& spec, const Routing& r, double scale, std::vector<double>* d_p,
                std::vector<double>* d_weight, std::vector<double>* d_logits,
                std::vector<double>* d_h, std::vector<double>* d_sigma) {
  const int E = r.E, k = r.k;
  const std::int64_t S = r.S;
  const auto Sd = static_cast<double>(S);
  switch (spec.gate) {
    case MoeGate::switch_top1:
    case MoeGate::gshard: {
      std::vector<double> f(static_cast<std::size_t>(E), 0), mean_p(static_cast<std::size_t>(E), 0);
      for (std::int64_t t = 0; t < S; ++t) {
        f[static_cast<std::size_t>(r.expert[static_cast<std::size_t>(t * k)])] += 1 / Sd;
        for (int e = 0; e < E; ++e)
          mean_p[static_cast<std::size_t>(e)] += r.p[static_cast<std::size_t>(t * E + e)] / Sd;
      }
      const double factor = spec.gate == MoeGate::switch_top1 ? E : 1;
      double aux = 0;
      for (int e = 0; e < E; ++e) aux += f[static_cast<std::size_t>(e)] * mean_p[static_cast<std::size_t>(e)];
      if (d_p)
        for (std::int64_t t = 0; t < S; ++t)
          for (int e = 0; e < E; ++e)
            (*d_p)[static_cast<std::size_t>(t * E + e)] += scale * factor * f[static_cast<std::size_t>(e)] / Sd;
      return factor * aux;
    }
    case MoeGate::noisy_top_k: {
      std::vector<double> importance(static_cast<std::size_t>(E), 0), grad;
      for (std::int64_t t = 0; t < S; ++t)
        for (int j = 0; j < k; ++j) {
          const auto c = static_cast<std::size_t>(t * k + j);
          importance[static_cast<std::size_t>(r.expert[c])] += r.weight[c];
        }
      double aux = cv_squared(importance, d_weight ? &grad : nullptr);
      if (d_weight)
        for (std::int64_t t = 0; t < S; ++t)
          for (int j = 0; j < k; ++j) {
            const auto c = static_cast<std::size_t>(t * k + j);
            (*d_weight)[c] += scale * grad[static_cast<std::size_t>(r.expert[c])];
          }
      if (!r.noise_active) return aux;
      // Smooth load estimator: P(t, i) = Phi((L - theta) / sigma).
      std::vector<double> load(static_cast<std::size_t>(E), 0), z(r.p.size()), theta_index(r.p.size());
      for (std::int64_t t = 0; t < S; ++t) {
        const int* sorted = &r.order[static_cast<std::size_t>(t * E)];
        std::vector<char> in_top(static_cast<std::size_t>(E), 0);
        for (int j = 0; j < k; ++j) in_top[static_cast<std::size_t>(sorted[j])] = 1;
        for (int e = 0; e < E; ++e) {
          const auto i = static_cast<std::size_t>(t * E + e);
          const int position = in_top[static_cast<std::size_t>(e)] ? k : k - 1;
          if (position >= E) {  // every expert is chosen: the probability is 1
            theta_index[i] = -1;
            load[static_cast<std::size_t>(e)] += 1;
            continue;
          }
          const int other = sorted[position];
          theta_index[i] = other;
          z[i] = (r.l[i] - r.h[static_cast<std::size_t>(t * E + other)]) / r.sigma[i];
          load[static_cast<std::size_t>(e)] += normal_cdf(z[i]);
        }
      }
      aux += cv_squared(load, d_logits ? &grad : nullptr);
      if (d_logits)
        for (std::int64_t t = 0; t < S; ++t)
          for (int e = 0; e < E; ++e) {
            const auto i = static_cast<std::size_t>(t * E + e);
            if (theta_index[i] < 0) continue;
            const double dz = scale * grad[static_cast<std::size_t>(e)] * normal_pdf(z[i]);
            (*d_logits)[i] += dz / r.sigma[i];
            (*d_h)[static_cast<std::size_t>(t * E) + static_cast<std::size_t>(theta_index[i])] -= dz / r.sigma[i];
            (*d_sigma)[i] -= dz * z[i] / r.sigma[i];
          }
      return aux;
    }
    case MoeGate::expert_choice: return 0;
  }
  return 0;
}

}  // namespace

int moe_capacity(const MoeRouterSpec& spec, std::int64_t group_tokens, bool training) {
  const int k = spec.gate == MoeGate::expert_choice ? 1 : spec.top_k;
  const double cf = training ? spec.train_capacity_factor : spec.eval_capacity_factor;
  const double exact = cf * k * static_cast<double>(group_tokens) / spec.experts;
  const auto capacity = static_cast<std::int64_t>(std::ceil(exact));
  return static_cast<int>(std::clamp<std::int64_t>(capacity, 1, group_tokens));
}

template <class T>
MoeGroupStats moe_route(const MoeRouterSpec& spec, const MoeRandom& random, std::int64_t S,
                        const T* logits, const T* noise_logits, int capacity, int* slot_token,
                        T* slot_weight) {
  const Routing r = route(spec, random, S, logits, noise_logits, capacity);
  MoeGroupStats stats;
  stats.tokens_per_expert.assign(r.count.begin(), r.count.end());
  std::vector<char> served(static_cast<std::size_t>(S), 0);
  for (std::size_t slot = 0; slot < r.slot_token.size(); ++slot) {
    const int t = r.slot_token[slot];
    slot_token[slot] = t;
    if (t < 0) {
      slot_weight[slot] = T(0);
      continue;
    }
    served[static_cast<std::size_t>(t)] = 1;
    const std::size_t e = slot / static_cast<std::size_t>(capacity);
    slot_weight[slot] = static_cast<T>(
        spec.gate == MoeGate::expert_choice
            ? r.p[static_cast<std::size_t>(t) * static_cast<std::size_t>(r.E) + e]
            : r.weight[static_cast<std::size_t>(r.slot_choice[slot])]);
  }
  stats.dropped_tokens = std::count(served.begin(), served.end(), 0);
  stats.aux = aux_term(spec, r, 0, nullptr, nullptr, nullptr, nullptr, nullptr);
  double z = 0;
  for (double lse : r.lse) z += lse * lse;
  stats.z = z / static_cast<double>(S);
  return stats;
}

template <class T>
void moe_route_backward(const MoeRouterSpec& spec, const MoeRandom& random, std::int64_t S,
                        const T* logits, const T* noise_logits, int capacity,
                        const T* d_slot_weight, double aux_scale, double z_scale, T* d_logits,
                        T* d_noise_logits) {
  const Routing r = route(spec, random, S, logits, noise_logits, capacity);
  const int E = r.E, k = r.k;
  const auto SE = static_cast<std::size_t>(S * E);
  std::vector<double> d_p(SE, 0), d_l(SE, 0);
  if (spec.gate == MoeGate::expert_choice) {
    for (std::size_t slot = 0; slot < r.slot_token.size(); ++slot) {
      const int t = r.slot_token[slot];
      if (t < 0) continue;
      const std::size_t e = slot / static_cast<std::size_t>(capacity);
      d_p[static_cast<std::size_t>(t) * static_cast<std::size_t>(E) + e] += static_cast<double>(d_slot_weight[slot]);
    }
  } else {
    std::vector<double> d_weight(static_cast<std::size_t>(S * k), 0);
    for (std::size_t slot = 0; slot < r.slot_choice.size(); ++slot)
      if (r.slot_choice[slot] >= 0)
        d_weight[static_cast<std::size_t>(r.slot_choice[slot])] += static_cast<double>(d_slot_weight[slot]);
    switch (spec.gate) {
      case MoeGate::switch_top1:
        for (std::int64_t t = 0; t < S; ++t)
          d_p[static_cast<std::size_t>(t * E + r.expert[static_cast<std::size_t>(t)])] +=
              d_weight[static_cast<std::size_t>(t)];
        aux_term(spec, r, aux_scale, &d_p, nullptr, nullptr, nullptr, nullptr);
        break;
      case MoeGate::gshard:
        for (std::int64_t t = 0; t < S; ++t) {
          const auto c = static_cast<std::size_t>(t * 2);
          const auto e1 = static_cast<std::size_t>(r.expert[c]), e2 = static_cast<std::size_t>(r.expert[c + 1]);
          const double p1 = r.p[static_cast<std::size_t>(t * E) + e1], p2 = r.p[static_cast<std::size_t>(t * E) + e2];
          const double s2 = (p1 + p2) * (p1 + p2), dw1 = d_weight[c], dw2 = d_weight[c + 1];
          d_p[static_cast<std::size_t>(t * E) + e1] += p2 / s2 * (dw1 - dw2);
          d_p[static_cast<std::size_t>(t * E) + e2] += p1 / s2 * (dw2 - dw1);
        }
        aux_term(spec, r, aux_scale, &d_p, nullptr, nullptr, nullptr, nullptr);
        break;
      case MoeGate::noisy_top_k: {
        std::vector<double> d_h(SE, 0), d_sigma(r.noise_active ? SE : 0, 0);
        aux_term(spec, r, aux_scale, nullptr, &d_weight, &d_l, &d_h, &d_sigma);
        // Softmax over the top k values of H.
        for (std::int64_t t = 0; t < S; ++t) {
          double dot = 0;
          for (int j = 0; j < k; ++j) {
            const auto c = static_cast<std::size_t>(t * k + j);
            dot += r.weight[c] * d_weight[c];
          }
          for (int j = 0; j < k; ++j) {
            const auto c = static_cast<std::size_t>(t * k + j);
            d_h[static_cast<std::size_t>(t * E + r.expert[c])] += r.weight[c] * (d_weight[c] - dot);
          }
        }
        for (std::size_t i = 0; i < SE; ++i) {
          d_l[i] += d_h[i];
          if (r.noise_active) d_sigma[i] += d_h[i] * r.eps[i];
        }
        if (d_noise_logits) {
          for (std::size_t i = 0; i < SE; ++i)
            d_noise_logits[i] = static_cast<T>(
                r.noise_active ? d_sigma[i] * spec.router_noise *
                                     sigmoid(static_cast<double>(noise_logits[i]))
                               : 0.0);
        }
        break;
      }
      case MoeGate::expert_choice: break;
    }
  }
  const auto Sd = static_cast<double>(S);
  for (std::int64_t t = 0; t < S; ++t) {
    const auto row = static_cast<std::size_t>(t * E);
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += r.p[row + static_cast<std::size_t>(e)] * d_p[row + static_cast<std::size_t>(e)];
    const double z_grad = z_scale * 2 * r.lse[static_cast<std::size_t>(t)] / Sd;
    for (int e = 0; e < E; ++e) {
      const std::size_t i = row + static_cast<std::size_t>(e);
      d_logits[i] = static_cast<T>(d_l[i] + r.p[i] * (d_p[i] - dot) + z_grad * r.p[i]);
    }
  }
}

#define OASES_MOE_INSTANTIATE(T)                                                               \
  template MoeGroupStats moe_route<T>(const MoeRouterSpec&, const MoeRandom&, std::int64_t,    \
                                      const T*, const T*, int, int*, T*);                      \
  template void moe_route_backward<T>(const MoeRouterSpec&, const MoeRandom&, std::int64_t,    \
                                      const T*, const T*, int, const T*, double, double, T*,   \
                                      T*);
OASES_MOE_INSTANTIATE(float)
OASES_MOE_INSTANTIATE(double)
#undef OASES_MOE_INSTANTIATE

}  // namespace oases::ops
