#include "data/mlm.h"

#include "core/error.h"
#include "core/philox.h"

#include <cstdint>
#include <limits>

namespace oases::data {
namespace {

constexpr std::uint32_t kSelectBelow = 644245094u;   // floor(0.15 * 2^32)
constexpr std::uint32_t kMaskBelow = 3435973836u;    // floor(0.8 * 2^32)
constexpr std::uint32_t kRandomBelow = 3865470566u;  // floor(0.9 * 2^32)

// Below this many positions the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 12;

// The Philox draws of one (seed, stream): one block per (global sample, position).
class MlmDraws {
 public:
  MlmDraws(std::uint64_t seed, std::uint64_t stream)
      : key_(philox_key(seed, fnv1a64("data.mlm"))),
        stream_low_(static_cast<std::uint32_t>(stream)),
        stream_high_(static_cast<std::uint32_t>(stream >> 32)) {}

  PhiloxCounter block(std::int64_t global_sample, std::int64_t position) const {
    return philox4x32({static_cast<std::uint32_t>(position),
                       static_cast<std::uint32_t>(global_sample), stream_low_, stream_high_},
                      key_);
  }

 private:
  PhiloxKey key_;
  std::uint32_t stream_low_, stream_high_;
};

void check_rows(std::int64_t rows, std::int64_t seq_len, std::int64_t first_global_sample) {
  OASES_ASSERT(rows >= 0 && seq_len >= 2, "mlm: rows={} seq_len={} (seq_len must be >= 2)", rows,
               seq_len);
  OASES_ASSERT(seq_len <= std::numeric_limits<std::uint32_t>::max(), "mlm: seq_len {} too large",
               seq_len);
  OASES_ASSERT(first_global_sample >= 0 && first_global_sample + rows <= (std::int64_t{1} << 32),
               "mlm: global samples [{}, {}) do not fit the 32-bit sample counter",
               first_global_sample, first_global_sample + rows);
}

}  // namespace

MlmSpecialTokens mlm_special_tokens(std::int64_t tokenizer_vocab) {
  OASES_ASSERT(
      tokenizer_vocab >= 1 && tokenizer_vocab + 3 <= std::numeric_limits<std::int32_t>::max(),
      "mlm: tokenizer vocabulary size {} out of range", tokenizer_vocab);
  const auto v = static_cast<std::int32_t>(tokenizer_vocab);
  return {v, v + 1, v + 2, v + 3};
}

std::optional<MlmSpecialTokens> tokenizer_mlm_special_tokens(const Tokenizer& tokenizer) {
  const auto mask = tokenizer.special_token_id("[MASK]");
  const auto cls = tokenizer.special_token_id("[CLS]");
  const auto sep = tokenizer.special_token_id("[SEP]");
  const auto pad = tokenizer.special_token_id("[PAD]");
  if (!mask || !cls || !sep || !pad) return std::nullopt;
  return MlmSpecialTokens{*mask, *cls, *sep, *pad};
}

void mlm_mask(const std::int32_t* text_tokens, std::int64_t rows, std::int64_t seq_len,
              std::int64_t tokenizer_vocab, std::uint64_t seed, std::uint64_t stream,
              std::int64_t first_global_sample, std::int32_t* inputs, std::int32_t* targets) {
  mlm_mask(text_tokens, rows, seq_len, tokenizer_vocab, mlm_special_tokens(tokenizer_vocab), seed,
           stream, first_global_sample, inputs, targets);
}

void mlm_mask(const std::int32_t* text_tokens, std::int64_t rows, std::int64_t seq_len,
              std::int64_t tokenizer_vocab, const MlmSpecialTokens& special, std::uint64_t seed,
              std::uint64_t stream, std::int64_t first_global_sample, std::int32_t* inputs,
              std::int32_t* targets) {
  check_rows(rows, seq_len, first_global_sample);
  const std::int64_t text_len = seq_len - 2;
  for (std::int64_t i = 0; i < rows * text_len; ++i) {
    OASES_CHECK(text_tokens[i] >= 0 && text_tokens[i] < tokenizer_vocab,
                "token {} at position {} of sample {} is outside the tokenizer vocabulary [0, {}): "
                "prepare the data with the tokenizer the model uses",
                text_tokens[i], i % text_len, first_global_sample + i / text_len, tokenizer_vocab);
  }
  const MlmDraws draws(seed, stream);
  const auto vocab = static_cast<std::uint64_t>(tokenizer_vocab);
#pragma omp parallel for schedule(static) if (rows * seq_len >= kMinParallelWork)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t sample = first_global_sample + r;
    const std::int32_t* text = text_tokens + r * text_len;
    std::int32_t* in = inputs + r * seq_len;
    std::int32_t* target = targets + r * seq_len;
    in[0] = special.cls;
    in[seq_len - 1] = special.sep;
    target[0] = -1;
    target[seq_len - 1] = -1;
    for (std::int64_t p = 1; p <= text_len; ++p) {
      const std::int32_t token = text[p - 1];
      const PhiloxCounter bits = draws.block(sample, p);
      if (bits[0] >= kSelectBelow) {
        in[p] = token;
        target[p] = -1;
        continue;
      }
      target[p] = token;
      if (bits[1] < kMaskBelow) {
        in[p] = special.mask;
      } else if (bits[1] < kRandomBelow) {
        in[p] = static_cast<std::int32_t>((std::uint64_t{bits[2]} * vocab) >> 32);
      } else {
        in[p] = token;
      }
    }
  }
}

std::int64_t mlm_selected_count(std::int64_t rows, std::int64_t seq_len, std::uint64_t seed,
                                std::uint64_t stream, std::int64_t first_global_sample) {
  check_rows(rows, seq_len, first_global_sample);
  const MlmDraws draws(seed, stream);
  std::int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count) \
    if (rows * seq_len >= kMinParallelWork)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t p = 1; p <= seq_len - 2; ++p)
      count += draws.block(first_global_sample + r, p)[0] < kSelectBelow ? 1 : 0;
  }
  return count;
}

}  // namespace oases::data
