// The deterministic, resumable DataLoader over a token shard.
#pragma once

#include "data/token_shard.h"

#include <cstdint>

namespace oases::data {

// Deterministic batches of (inputs, targets) windows from a shard.
//
// Sample j of step s (j in [0, global_batch), counted over the global batch: every DP rank
// and micro-batch reads a sub-range) is the window of seq_len + 1 tokens starting at
// token `window_start(s, j)`, read modulo the token count (windows wrap around the end);
// inputs are its first seq_len tokens and targets its last seq_len. Where the shard has a loss
// mask (data/token_shard.h), a target whose token does not count is -1 instead (the loss ignores
// negative targets); its input is the token itself all the same.
//  - shuffle = false: window_start = ((s * global_batch + j) * seq_len) mod count
//    (docs/data.md, "Data order").
//  - shuffle = true: the shard is cut into W = count / seq_len windows starting at multiples
//    of seq_len; global sample k = s * global_batch + j lies in epoch k / W and takes window
//    P(seed, epoch, k mod W), where P(seed, epoch, .) is a Philox-keyed Feistel permutation
//    of [0, W) (cycle-walking). Each epoch visits every window exactly once.
// The position in the data is the step number alone: resuming at step s reproduces exactly
// the batches an uninterrupted run would have read. No other state exists.
class DataLoader {
 public:
  // `shard` must outlive the loader. UserError if the shard holds fewer than seq_len + 1
  // tokens, its loss mask counts no token at all (nothing could be learnt from it), or
  // seq_len / global_batch < 1.
  DataLoader(const TokenShard& shard, std::int64_t seq_len, std::int64_t global_batch, bool shuffle,
             std::uint64_t seed);

  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t global_batch() const { return global_batch_; }
  bool shuffle() const { return shuffle_; }
  // Windows per epoch when shuffling (count / seq_len).
  std::int64_t windows_per_epoch() const { return windows_; }
  const TokenShard& shard() const { return *shard_; }

  // First token (before wrapping) of sample `sample` of step `step`.
  std::int64_t window_start(std::int64_t step, std::int64_t sample) const;

  // Writes samples [first_sample, first_sample + num_samples) of `step` as row-major
  // [num_samples, seq_len] arrays; requires first_sample + num_samples <= global_batch.
  void fill(std::int64_t step, std::int64_t first_sample, std::int64_t num_samples,
            std::int32_t* inputs, std::int32_t* targets) const;

  // Targets of samples [first_sample, first_sample + num_samples) of `step` that count (are
  // not -1): num_samples x seq_len without a loss mask. Reads only the mask.
  std::int64_t counted_targets(std::int64_t step, std::int64_t first_sample,
                               std::int64_t num_samples) const;

 private:
  const TokenShard* shard_;
  std::int64_t seq_len_;
  std::int64_t global_batch_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t windows_;
};

}  // namespace oases::data
