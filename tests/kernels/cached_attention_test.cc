#include "kernels/cpu/cached_attention.h"

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::random_vector;

// Appending a sequence's rows in chunks gives, row by row, the full causal attention over the
// sequence (attention_forward), with grouped-query attention and a strided out matrix.
TEST(CachedAttention, ChunkedAppendsMatchFullCausalAttentionInDouble) {
  const std::int64_t seq = 23, heads = 6, kv_heads = 2, hd = 7, capacity = 29;
  const std::int64_t width = (heads + 2 * kv_heads) * hd, out_width = heads * hd;
  const std::vector<double> qkv = random_vector(static_cast<std::size_t>(seq * width), 3, -2, 2);
  std::vector<double> full(static_cast<std::size_t>(seq * out_width));
  std::vector<double> lse(static_cast<std::size_t>(heads * seq));
  attention_forward(qkv.data(), full.data(), lse.data(), {1, seq, heads, kv_heads, hd, true});

  std::vector<double> keys(static_cast<std::size_t>(kv_heads * capacity * hd), std::nan(""));
  std::vector<double> values(keys.size(), std::nan(""));
  const std::int64_t ld_out = out_width + 5;
  std::vector<double> out(static_cast<std::size_t>(seq * ld_out), -7.0);
  std::int64_t past = 0;
  for (const std::int64_t rows : {1, 4, 1, 1, 9, 1, 6}) {
    cached_attention_forward(qkv.data() + past * width, width, keys.data(), values.data(),
                             out.data() + past * ld_out, ld_out,
                             {rows, past, capacity, heads, kv_heads, hd});
    past += rows;
  }
  ASSERT_EQ(past, seq);
  double worst = 0;
  for (std::int64_t t = 0; t < seq; ++t) {
    for (std::int64_t c = 0; c < out_width; ++c) {
      const double expected = full[static_cast<std::size_t>(t * out_width + c)];
      const double got = out[static_cast<std::size_t>(t * ld_out + c)];
      worst = std::max(worst, std::abs(got - expected) / std::max(1.0, std::abs(expected)));
    }
    for (std::int64_t c = out_width; c < ld_out; ++c)  // the padding columns are untouched
      EXPECT_EQ(out[static_cast<std::size_t>(t * ld_out + c)], -7.0);
  }
  EXPECT_LE(worst, 1e-13);
  // The cache holds each position's k and v, head-major.
  for (std::int64_t g = 0; g < kv_heads; ++g)
    for (std::int64_t t = 0; t < seq; ++t)
      for (std::int64_t d = 0; d < hd; ++d) {
        const auto at = static_cast<std::size_t>((g * capacity + t) * hd + d);
        EXPECT_EQ(keys[at], qkv[static_cast<std::size_t>(t * width + (heads + g) * hd + d)]);
        EXPECT_EQ(values[at],
                  qkv[static_cast<std::size_t>(t * width + (heads + kv_heads + g) * hd + d)]);
      }
}

TEST(CachedAttention, IsIndependentOfThreadCount) {
  // A prefill large enough to go parallel, then single steps, in float.
  const std::int64_t seq = 120, heads = 5, kv_heads = 5, hd = 16;
  const std::int64_t width = (heads + 2 * kv_heads) * hd, out_width = heads * hd;
  const std::vector<double> source = random_vector(static_cast<std::size_t>(seq * width), 5);
  const std::vector<float> qkv(source.begin(), source.end());
  oases::testing::expect_independent_of_thread_count("cached attention", [&] {
    std::vector<float> keys(static_cast<std::size_t>(kv_heads * seq * hd)), values(keys.size());
    std::vector<float> out(static_cast<std::size_t>(seq * out_width));
    cached_attention_forward(qkv.data(), width, keys.data(), values.data(), out.data(), out_width,
                             {seq - 3, 0, seq, heads, kv_heads, hd});
    for (std::int64_t t = seq - 3; t < seq; ++t)
      cached_attention_forward(qkv.data() + t * width, width, keys.data(), values.data(),
                               out.data() + t * out_width, out_width,
                               {1, t, seq, heads, kv_heads, hd});
    return out;
  });
}

TEST(CachedAttention, OverfullCacheIsAnInternalError) {
  std::vector<double> qkv(3 * 6), keys(4 * 2), values(4 * 2), out(3 * 2);
  EXPECT_THROW(cached_attention_forward(qkv.data(), 6, keys.data(), values.data(), out.data(), 2,
                                        {3, 2, 4, 1, 1, 2}),
               InternalError);
}

}  // namespace
}  // namespace oases::kernels::cpu
