#include "generate/sampling.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace oases::generate {

void validate(const SamplingOptions& o) {
  OASES_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
              "--temperature = {} must be a finite number >= 0 (0: greedy)", o.temperature);
  OASES_CHECK(o.top_k >= 0, "--top-k = {} must be >= 0 (0: no limit)", o.top_k);
  OASES_CHECK(o.top_p > 0 && o.top_p <= 1,
              "--top-p = {} must be in (0, 1]: the probability mass of the likeliest tokens "
              "to sample from (1: no limit)",
              o.top_p);
}

TokenSampler::TokenSampler(SamplingOptions options, std::int64_t vocab)
    : options_(options),
      order_(static_cast<std::size_t>(vocab)),
      candidates_(static_cast<std::size_t>(vocab)) {
  validate(options_);
  OASES_ASSERT(vocab >= 1, "sampling from a vocabulary of {}", vocab);
}

std::span<const Candidate> TokenSampler::candidates(std::span<const double> logits) {
  OASES_ASSERT(logits.size() == order_.size(), "{} logits for a vocabulary of {}", logits.size(),
               order_.size());
  const auto likelier = [&](std::int32_t a, std::int32_t b) {
    const double la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  const std::int64_t vocab = static_cast<std::int64_t>(order_.size());
  std::iota(order_.begin(), order_.end(), 0);
  std::int64_t count = options_.top_k > 0 ? std::min(options_.top_k, vocab) : vocab;
  if (options_.temperature == 0) count = 1;
  std::partial_sort(order_.begin(), order_.begin() + count, order_.end(), likelier);
  const double top = logits[static_cast<std::size_t>(order_[0])];
  double total = 0;
  for (std::int64_t c = 0; c < count; ++c) {
    const std::int32_t token = order_[static_cast<std::size_t>(c)];
    const double weight =
        options_.temperature == 0
            ? 1.0
            : std::exp((logits[static_cast<std::size_t>(token)] - top) / options_.temperature);
    candidates_[static_cast<std::size_t>(c)] = {token, weight};
    total += weight;
  }
  if (options_.top_p < 1) {
    // The nucleus: the shortest prefix whose share of the weight reaches top_p.
    const double needed = options_.top_p * total;
    double running = 0;
    std::int64_t kept = 0;
    while (kept < count && running < needed)
      running += candidates_[static_cast<std::size_t>(kept++)].weight;
    count = std::max<std::int64_t>(kept, 1);
  }
  return {candidates_.data(), static_cast<std::size_t>(count)};
}

std::int32_t TokenSampler::sample(std::span<const double> logits, double uniform) {
  const std::span<const Candidate> chosen = candidates(logits);
  double total = 0;
  for (const Candidate& c : chosen) total += c.weight;
  double target = uniform * total;
  for (const Candidate& c : chosen) {
    target -= c.weight;
    if (target <= 0) return c.token;
  }
  return chosen.back().token;  // rounding left a sliver of `target`
}

}  // namespace oases::generate
