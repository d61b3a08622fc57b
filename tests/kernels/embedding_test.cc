#include "kernels/cpu/embedding.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_gradient_matches;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::random_vector;

TEST(Embedding, ForwardAddsTokenAndPositionRows) {
  const std::int64_t B = 2, seq = 3, C = 5, vocab = 7, max_seq = 4;
  const std::vector<std::int32_t> tokens = {6, 0, 3, 3, 6, 1};
  const auto wte = random_vector(vocab * C, 1), wpe = random_vector(max_seq * C, 2);
  std::vector<double> out(B * seq * C);
  embedding_forward(tokens.data(), wte.data(), wpe.data(), out.data(), B, seq, C);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < seq; ++t)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t tok = tokens[b * seq + t];
        EXPECT_EQ(out[(b * seq + t) * C + c], wte[tok * C + c] + wpe[t * C + c]);
      }

  std::vector<float> wte_f(wte.begin(), wte.end()), wpe_f(wpe.begin(), wpe.end());
  std::vector<float> out_f(B * seq * C);
  embedding_forward(tokens.data(), wte_f.data(), wpe_f.data(), out_f.data(), B, seq, C);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out_f[i], out[i], 1e-6);
}

// Tokens repeat (within and across samples) so the scatter-add is exercised; wpe has more rows
// than seq, and the gradient of the unused rows stays what it was. Both gradients accumulate.
TEST(Embedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const std::int64_t B = 2, seq = 3, C = 5, vocab = 7, max_seq = 4;
  const std::vector<std::int32_t> tokens = {6, 0, 6, 3, 6, 1};
  auto wte = random_vector(vocab * C, 3), wpe = random_vector(max_seq * C, 4);
  const auto dout = random_vector(B * seq * C, 5);
  const auto dwte0 = random_vector(vocab * C, 6), dwpe0 = random_vector(max_seq * C, 7);
  auto dwte = dwte0, dwpe = dwpe0;
  embedding_backward(dout.data(), tokens.data(), dwte.data(), dwpe.data(), B, seq, C);
  std::vector<double> out(B * seq * C);
  auto loss = [&] {
    embedding_forward(tokens.data(), wte.data(), wpe.data(), out.data(), B, seq, C);
    return oases::testing::dot(out, dout);
  };
  for (std::size_t i = 0; i < dwte.size(); ++i) dwte[i] -= dwte0[i];
  for (std::size_t i = 0; i < dwpe.size(); ++i) dwpe[i] -= dwpe0[i];
  expect_gradient_matches("dwte", wte, dwte, loss);
  expect_gradient_matches("dwpe", wpe, dwpe, loss);
}

// Column ownership makes the scatter-add independent of the thread count, not only
// deterministic: forward and backward, with a vocabulary range, at 1, 2 and 3 threads.
TEST(Embedding, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t B = 4, seq = 32, C = 201, vocab = 11;
  const VocabRange range{2, 9};
  std::vector<std::int32_t> tokens(B * seq);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7) % vocab);
  const auto dout_d = random_vector(B * seq * C, 8);
  const auto wte_d = random_vector((range.end - range.begin) * C, 9);
  const auto wpe_d = random_vector(seq * C, 10);
  const std::vector<float> dout(dout_d.begin(), dout_d.end()), wte(wte_d.begin(), wte_d.end()),
      wpe(wpe_d.begin(), wpe_d.end());
  expect_independent_of_thread_count("embedding", [&] {
    std::vector<float> out(B * seq * C), dwte(wte.size(), 0.5f), dwpe(seq * C, -0.25f);
    embedding_forward(tokens.data(), wte.data(), wpe.data(), out.data(), B, seq, C, range);
    embedding_backward(dout.data(), tokens.data(), dwte.data(), dwpe.data(), B, seq, C, range);
    append(out, dwte);
    append(out, dwpe);
    return out;
  });
}

}  // namespace
}  // namespace oases::kernels::cpu

namespace oases::kernels::cpu {
namespace {

// Vocab-parallel lookup: summing the partial outputs of shards (positions added by one shard)
// gives the full lookup, and each shard's gradient is its rows of the full gradient.
TEST(EmbeddingShards, PartialLookupsSumToTheFullEmbedding) {
  const std::int64_t B = 2, seq = 3, C = 4, vocab = 10;
  const std::vector<std::int32_t> tokens = {0, 9, 4, 5, 4, 3};
  const auto wte = oases::testing::random_vector(static_cast<std::size_t>(vocab * C), 5);
  const auto wpe = oases::testing::random_vector(static_cast<std::size_t>(seq * C), 6);
  std::vector<double> full(static_cast<std::size_t>(B * seq * C)), sum(full.size(), 0.0);
  embedding_forward(tokens.data(), wte.data(), wpe.data(), full.data(), B, seq, C);
  const auto dout = oases::testing::random_vector(full.size(), 7);
  std::vector<double> dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  embedding_backward(dout.data(), tokens.data(), dwte.data(), dwpe.data(), B, seq, C);
  for (std::int64_t begin : {0, 5}) {
    const VocabRange range{begin, begin + 5};
    std::vector<double> part(full.size());
    embedding_forward(tokens.data(), wte.data() + begin * C, begin == 0 ? wpe.data() : nullptr,
                      part.data(), B, seq, C, range);
    for (std::size_t i = 0; i < part.size(); ++i) sum[i] += part[i];
    std::vector<double> shard_grad(static_cast<std::size_t>(5 * C), 0.0);
    embedding_backward(dout.data(), tokens.data(), shard_grad.data(), static_cast<double*>(nullptr),
                       B, seq, C, range);
    for (std::int64_t i = 0; i < 5 * C; ++i) EXPECT_EQ(shard_grad[i], dwte[begin * C + i]);
  }
  for (std::size_t i = 0; i < full.size(); ++i) EXPECT_DOUBLE_EQ(sum[i], full[i]);
}

}  // namespace
}  // namespace oases::kernels::cpu

namespace oases::kernels::cpu {
namespace {

// BERT's token types: a small table added onto the token + position sum.
TEST(EmbeddingAccumulate, AddsTheTableRowsOntoOut) {
  const std::int64_t B = 2, seq = 3, C = 5, types = 2;
  const std::vector<std::int32_t> ids = {0, 1, 1, 1, 0, 0};
  const auto table = oases::testing::random_vector(static_cast<std::size_t>(types * C), 1);
  const auto out0 = oases::testing::random_vector(static_cast<std::size_t>(B * seq * C), 2);
  std::vector<double> out = out0;
  embedding_accumulate(ids.data(), table.data(), out.data(), B, seq, C);
  const std::vector<float> table_f(table.begin(), table.end());
  std::vector<float> out_f(out0.begin(), out0.end());
  embedding_accumulate(ids.data(), table_f.data(), out_f.data(), B, seq, C);
  for (std::int64_t row = 0; row < B * seq; ++row) {
    for (std::int64_t c = 0; c < C; ++c) {
      const auto k = static_cast<std::size_t>(row * C + c);
      const double expected = out0[k] + table[static_cast<std::size_t>(ids[row] * C + c)];
      EXPECT_EQ(out[k], expected) << row << "," << c;
      EXPECT_EQ(out_f[k],
                static_cast<float>(out0[k]) + table_f[static_cast<std::size_t>(ids[row] * C + c)]);
    }
  }
}

// L = sum(w * out) with out = out0 + table[ids]: the table gradient accumulates onto dtable.
TEST(EmbeddingAccumulate, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const std::int64_t B = 3, seq = 5, C = 3, rows = 4;
  const std::vector<std::int32_t> ids = {3, 0, 3, 1, 1, 0, 0, 3, 1, 0, 1, 1, 3, 0, 0};
  auto table = oases::testing::random_vector(static_cast<std::size_t>(rows * C), 11);
  const auto out0 = oases::testing::random_vector(static_cast<std::size_t>(B * seq * C), 12);
  const auto w = oases::testing::random_vector(out0.size(), 13);
  const auto dtable0 = oases::testing::random_vector(table.size(), 14);
  std::vector<double> dtable = dtable0;
  embedding_accumulate_backward(w.data(), ids.data(), dtable.data(), B, seq, C);
  for (std::size_t i = 0; i < dtable.size(); ++i) dtable[i] -= dtable0[i];
  for (std::int64_t c = 0; c < C; ++c) EXPECT_EQ(dtable[2 * C + c], 0.0);  // row 2 is unused
  oases::testing::expect_gradient_matches("dtable", table, dtable, [&] {
    std::vector<double> out = out0;
    embedding_accumulate(ids.data(), table.data(), out.data(), B, seq, C);
    return oases::testing::dot(out, w);
  });
}

TEST(EmbeddingAccumulate, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t B = 4, seq = 64, C = 130, rows = 2;
  std::vector<std::int32_t> ids(B * seq);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i / 5) % rows);
  const auto dout_d = random_vector(static_cast<std::size_t>(B * seq * C), 21);
  const auto table_d = random_vector(static_cast<std::size_t>(rows * C), 22);
  const std::vector<float> dout(dout_d.begin(), dout_d.end()),
      table(table_d.begin(), table_d.end());
  expect_independent_of_thread_count("embedding_accumulate", [&] {
    std::vector<float> out(dout), dtable(rows * C, 0.5f);
    embedding_accumulate(ids.data(), table.data(), out.data(), B, seq, C);
    embedding_accumulate_backward(dout.data(), ids.data(), dtable.data(), B, seq, C);
    append(out, dtable);
    return out;
  });
}

}  // namespace
}  // namespace oases::kernels::cpu
