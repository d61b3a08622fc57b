#include "data/loader.h"

#include "core/error.h"
#include "core/philox.h"

#include <algorithm>
#include <cstring>

namespace oases::data {
namespace {

__extension__ typedef unsigned __int128 u128;

// The target of a token that does not count: the loss ignores negative targets.
constexpr std::int32_t kNoTarget = -1;

// Feistel permutation for shuffled windows.

// A keyed bijection of [0, domain): a balanced Feistel network over the smallest even number
// of bits that covers the domain, applied repeatedly (cycle-walking) until the value falls in
// the domain. Because the network is a bijection on the covering range, walking from an
// in-domain value must reach another in-domain value before cycling back, so the restriction
// is a bijection too. The covering range is < 4 * domain, so walks are short.
std::uint64_t feistel_permute(std::uint64_t index, std::uint64_t domain, std::uint64_t seed,
                              std::uint64_t epoch) {
  OASES_ASSERT(index < domain && domain <= (std::uint64_t{1} << 62), "index {} domain {}", index,
               domain);
  int bits = 2;
  while ((std::uint64_t{1} << bits) < domain) bits += 2;
  const int half = bits / 2;
  const std::uint64_t mask = (std::uint64_t{1} << half) - 1;
  static constexpr std::uint64_t kStream = fnv1a64("data.shuffle");
  const PhiloxKey key = philox_key(seed, kStream);
  constexpr int kRounds = 6;

  std::uint64_t x = index;
  do {
    std::uint64_t left = x >> half, right = x & mask;
    for (int round = 0; round < kRounds; ++round) {
      const PhiloxCounter counter = {
          static_cast<std::uint32_t>(right), static_cast<std::uint32_t>(round),
          static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32)};
      const std::uint64_t f = philox4x32(counter, key)[0] & mask;
      const std::uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
  } while (x >= domain);
  return x;
}

}  // namespace

DataLoader::DataLoader(const TokenShard& shard, std::int64_t seq_len, std::int64_t global_batch,
                       bool shuffle, std::uint64_t seed)
    : shard_(&shard),
      seq_len_(seq_len),
      global_batch_(global_batch),
      shuffle_(shuffle),
      seed_(seed),
      windows_(0) {
  OASES_CHECK(seq_len >= 1, "model.seq_len = {} must be at least 1", seq_len);
  OASES_CHECK(global_batch >= 1, "train.global_batch = {} must be at least 1", global_batch);
  OASES_CHECK(shard.size() >= seq_len + 1,
              "data shard '{}' holds {} tokens, too few for one sample of seq_len + 1 = {} "
              "tokens (model.seq_len = {}); use more text or a shorter seq_len",
              shard.path, shard.size(), seq_len + 1, seq_len);
  OASES_CHECK(!shard.has_loss_mask() || std::find(shard.loss_mask.begin(), shard.loss_mask.end(),
                                                  std::uint8_t{1}) != shard.loss_mask.end(),
              "data shard '{}' has a loss mask that counts none of its {} tokens as a target, so "
              "nothing could be learnt from it; prepare it again with targets (for chat data: "
              "at least one assistant turn)",
              shard.path, shard.size());
  windows_ = shard.size() / seq_len;
}

std::int64_t DataLoader::window_start(std::int64_t step, std::int64_t sample) const {
  OASES_ASSERT(step >= 0 && sample >= 0 && sample < global_batch_,
               "step {} sample {} (global batch {})", step, sample, global_batch_);
  const u128 global_sample =
      static_cast<u128>(step) * static_cast<u128>(global_batch_) + static_cast<u128>(sample);
  const auto count = static_cast<u128>(shard_->size());
  if (!shuffle_) {
    // Reduced before multiplying so that no step count can overflow.
    return static_cast<std::int64_t>((global_sample % count) * static_cast<u128>(seq_len_) % count);
  }
  const auto windows = static_cast<u128>(windows_);
  const auto epoch = static_cast<std::uint64_t>(global_sample / windows);
  const auto index = static_cast<std::uint64_t>(global_sample % windows);
  const std::uint64_t window =
      feistel_permute(index, static_cast<std::uint64_t>(windows_), seed_, epoch);
  return static_cast<std::int64_t>(window) * seq_len_;
}

void DataLoader::fill(std::int64_t step, std::int64_t first_sample, std::int64_t num_samples,
                      std::int32_t* inputs, std::int32_t* targets) const {
  OASES_ASSERT(first_sample >= 0 && num_samples >= 0 && first_sample + num_samples <= global_batch_,
               "samples [{}, {}) outside the global batch of {}", first_sample,
               first_sample + num_samples, global_batch_);
  OASES_ASSERT(num_samples == 0 || (inputs != nullptr && targets != nullptr), "null output arrays");
  const std::int32_t* tokens = shard_->tokens.data();
  // Null without a loss mask: every target counts.
  const std::uint8_t* mask = shard_->has_loss_mask() ? shard_->loss_mask.data() : nullptr;
  const std::int64_t count = shard_->size();
  const auto row_bytes = static_cast<std::size_t>(seq_len_) * sizeof(std::int32_t);
  for (std::int64_t r = 0; r < num_samples; ++r) {
    const std::int64_t start = window_start(step, first_sample + r);
    std::int32_t* in_row = inputs + r * seq_len_;
    std::int32_t* target_row = targets + r * seq_len_;
    if (start + seq_len_ + 1 <= count) {
      std::memcpy(in_row, tokens + start, row_bytes);
      std::memcpy(target_row, tokens + start + 1, row_bytes);
      if (mask != nullptr)
        for (std::int64_t t = 0; t < seq_len_; ++t)
          if (mask[start + 1 + t] == 0) target_row[t] = kNoTarget;
      continue;
    }
    // start < count and seq_len < count, so one subtraction wraps any position.
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      std::int64_t pos = start + t;
      if (pos >= count) pos -= count;
      std::int64_t next = pos + 1;
      if (next >= count) next -= count;
      in_row[t] = tokens[pos];
      target_row[t] = mask != nullptr && mask[next] == 0 ? kNoTarget : tokens[next];
    }
  }
}

std::int64_t DataLoader::counted_targets(std::int64_t step, std::int64_t first_sample,
                                         std::int64_t num_samples) const {
  OASES_ASSERT(first_sample >= 0 && num_samples >= 0 && first_sample + num_samples <= global_batch_,
               "samples [{}, {}) outside the global batch of {}", first_sample,
               first_sample + num_samples, global_batch_);
  if (!shard_->has_loss_mask()) return num_samples * seq_len_;
  const std::uint8_t* mask = shard_->loss_mask.data();
  const std::int64_t count = shard_->size();
  std::int64_t counted = 0;
  for (std::int64_t r = 0; r < num_samples; ++r) {
    // The targets are tokens start + 1 .. start + seq_len, wrapped.
    std::int64_t next = window_start(step, first_sample + r);
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      if (++next >= count) next -= count;
      counted += mask[next];
    }
  }
  return counted;
}

}  // namespace oases::data
