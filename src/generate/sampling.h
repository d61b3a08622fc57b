// Choosing the next token from a row of logits, as `oases generate` does: greedy (temperature
// 0), or a draw from softmax(logits / temperature) restricted first to the top_k likeliest
// tokens and then to the nucleus: the fewest likeliest tokens whose probability reaches top_p
// (Holtzman et al., "The Curious Case of Neural Text Degeneration"). The draw is a function of
// the logits and one uniform number, so a caller that keys the number by (seed, sample,
// position) makes generation reproducible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace oases::generate {

struct SamplingOptions {
  double temperature = 0.8;  // >= 0; 0: greedy (the likeliest token, the lowest id on a tie)
  std::int64_t top_k = 40;   // >= 0; 0: the whole vocabulary
  double top_p = 1.0;        // in (0, 1]; 1: no nucleus cut
};

// UserError naming the flag (--temperature, --top-k, --top-p), the value and what is valid.
void validate(const SamplingOptions& options);

// A candidate token and its unnormalised weight exp((logit - max logit) / temperature).
struct Candidate {
  std::int32_t token = 0;
  double weight = 0;
};

// Reuses its scratch across calls: one per generating thread.
class TokenSampler {
 public:
  // REQUIRES: validate(options) passes; vocab >= 1.
  TokenSampler(SamplingOptions options, std::int64_t vocab);

  // The tokens a draw chooses from, likeliest first (ties: lower id first), after the greedy,
  // top-k and top-p restrictions, with their weights; valid until the next call.
  // REQUIRES: logits.size() == vocab.
  std::span<const Candidate> candidates(std::span<const double> logits);

  // The token chosen by `uniform` in (0, 1]: the first candidate at which the running sum of
  // weights reaches uniform * (their total).
  std::int32_t sample(std::span<const double> logits, double uniform);

 private:
  SamplingOptions options_;
  std::vector<std::int32_t> order_;
  std::vector<Candidate> candidates_;
};

}  // namespace oases::generate
