// Text generation (`oases generate`): autoregressive sampling (generate/sampling.h) from a GPT or
// LLaMA model, with a key/value cache (model/incremental_decoder.h: the prompt is processed
// once, then each new token costs one position) or, for comparison and tests, the full forward
// pass over the whole context for every token. Both paths follow the same rules below and
// choose the same tokens (up to rounding of the logits).
//
// Context window: the model sees at most model.seq_len positions. A sample's context starts at
// its first token; when it would exceed seq_len positions, it restarts with the last
// `slide_keep` tokens (the cache is recomputed from them, at positions 0..slide_keep - 1: GPT's
// learned positions are absolute, so cached keys cannot move). With the default, half of
// seq_len, the cache costs one position per token plus a recomputation of slide_keep
// positions every seq_len - slide_keep tokens; slide_keep = seq_len keeps a full window at
// every token, which then recomputes seq_len positions per token.
//
// Random draws: the uniform number that picks the token at position t (its index in the
// sample's token sequence, prompt included) of sample s is Philox keyed by (seed, "generate")
// at counter (t, s): the output is reproducible, and sample s does not depend on how many
// samples run.
#pragma once

#include "data/tokenizer.h"
#include "train/engine.h"
#include "generate/sampling.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oases::generate {

struct GenerateOptions {
  std::string checkpoint;  // step_N directory, run checkpoint dir, or model.safetensors
  // Text to continue; empty: generation starts after the tokenizer's end-of-document token
  // (data/tokenizer.h), which is not part of the output.
  std::string prompt;
  std::int64_t max_new_tokens = 200;  // per sample, >= 0
  SamplingOptions sampling;
  std::int64_t num_samples = 1;       // >= 1
  // A sample ends as soon as its continuation contains one of these (non-empty) strings; its
  // text is cut right before the first such occurrence.
  std::vector<std::string> stops;
  std::uint64_t seed = 0;
  bool kv_cache = true;               // false: full forward over the context for every token
  std::int64_t slide_keep = 0;        // in [0, model.seq_len]; 0: seq_len / 2 (at least 1)
  // gpt2 checkpoints only: the tokenizer's files (a tokenizer.json or a folder); empty: its
  // default. A sentencepiece checkpoint carries its own model (checkpoint_tokenizer).
  std::string tokenizer_dir;
};

struct Generation {
  std::vector<std::string> samples;  // each the prompt followed by its continuation, decoded
  std::int64_t new_tokens = 0;       // tokens generated over all samples
  double seconds = 0;                // generating them (prompt processing included, loading not)
  double tokens_per_second() const { return seconds > 0 ? new_tokens / seconds : 0.0; }
};

// UserError naming the first bad option (its flag, value and the valid range) among those
// that need no checkpoint to check.
void validate(const GenerateOptions& options);

// Generates from `engine`'s model (options.checkpoint unused). REQUIRES: model.arch gpt or
// llama (UserError otherwise); the engine built with train.micro_batch = 1 on one rank.
// Tokens are drawn from those both the tokenizer and the model know.
Generation generate(train::TrainingEngine& engine, const data::Tokenizer& tokenizer,
                    const GenerateOptions& options);

// Loads options.checkpoint (its model, precision and, by checkpoint_tokenizer, its tokenizer)
// and generates from it.
Generation generate_text(const GenerateOptions& options);

}  // namespace oases::generate
