// Text generation from a checkpoint (`oases generate`): autoregressive sampling with
// temperature and top-k, random draws keyed by (seed, position) so output is reproducible.
#pragma once

#include <cstdint>
#include <string>

namespace oases::train {

struct GenerateOptions {
  std::string checkpoint;       // step_N directory, run checkpoint dir, or model.safetensors
  std::string prompt;
  std::int64_t max_new_tokens = 200;
  double temperature = 0.8;     // 0: greedy
  std::int64_t top_k = 40;      // 0: whole vocabulary
  std::uint64_t seed = 0;
  std::string tokenizer_dir;    // where the gpt2 tokenizer's files are; empty: its default
};

// Returns the prompt followed by the generated continuation, decoded.
std::string generate_text(const GenerateOptions& options);

}  // namespace oases::train
