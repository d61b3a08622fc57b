// The cached incremental forward computes the same function as the training model's full
// forward pass: at every position, in fp64, to relative 1e-10.
#include "model/incremental_decoder.h"

#include "core/buffer.h"
#include "core/error.h"
#include "core/philox.h"
#include "kernels/kernels.h"
#include "support/numbers.h"
#include "train/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace oases::model {
namespace {

using oases::testing::relative_difference;

// Odd sizes everywhere: hidden not a power of two, head_dim not a multiple of the SIMD width,
// ffn_hidden and the vocabulary prime.
plan::RunConfig odd_gpt() {
  plan::RunConfig c;
  c.model.arch = model::ArchitectureKind::gpt;
  c.model.layers = 3;
  c.model.hidden = 30;
  c.model.heads = 3;
  c.model.ffn_hidden = 37;
  c.model.vocab_size = 53;
  c.model.seq_len = 13;
  return c;
}

// Grouped-query attention: 6 query heads share 2 key/value heads; rotary head_dim 6.
plan::RunConfig odd_llama(bool tied = false) {
  plan::RunConfig c;
  c.model.arch = model::ArchitectureKind::llama;
  c.model.layers = 3;
  c.model.hidden = 36;
  c.model.heads = 6;
  c.model.kv_heads = 2;
  c.model.ffn_hidden = 29;
  c.model.vocab_size = 41;
  c.model.seq_len = 11;
  c.model.tie_embeddings = tied;
  return c;
}

plan::RunConfig one_sequence(plan::RunConfig c, const std::string& precision) {
  c.train.precision = precision;
  c.train.micro_batch = 1;
  c.train.global_batch = 1;
  return c;
}

std::vector<std::int32_t> random_tokens(std::int64_t n, std::int64_t vocab, std::uint32_t stream) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int32_t>(
        philox4x32({static_cast<std::uint32_t>(i), stream, 0, 0}, {7, 9})[0] %
        static_cast<std::uint32_t>(vocab));
  return t;
}

// Row r of a [rows, vocab] logits tensor, as doubles.
std::vector<double> row_of(const Tensor& logits, std::int64_t r) {
  const std::int64_t vocab = logits.dim(1);
  std::vector<double> row(static_cast<std::size_t>(vocab));
  for (std::int64_t v = 0; v < vocab; ++v)
    row[static_cast<std::size_t>(v)] =
        logits.dtype() == DType::f64
            ? logits.data<double>()[r * vocab + v]
            : static_cast<double>(logits.data<float>()[r * vocab + v]);
  return row;
}

// The full forward pass's logits [seq, vocab] of `tokens` and the incremental decoder's at
// every position, appended as `chunks` (sizes summing to seq), compared position by position.
void expect_same_logits(const plan::RunConfig& config, const std::vector<std::int64_t>& chunks,
                        double tolerance) {
  train::TrainingEngine engine(config);
  const Model& model = engine.model();
  // Larger weights than the initialisation's N(0, 0.02) make attention far from uniform, so a
  // wrong position or head would show.
  kernels::scale(model.params(), 20.0);
  const std::int64_t seq = config.model.seq_len, vocab = config.model.vocab_size;
  const std::vector<std::int32_t> tokens = random_tokens(seq, vocab, 3);
  const DType dtype = model.dtype();
  const Buffer full_buffer(static_cast<std::size_t>(seq * vocab) * dtype_size(dtype));
  const Tensor full = full_buffer.tensor(dtype, {seq, vocab});
  engine.logits(tokens.data(), full);

  IncrementalDecoder decoder(config.model, model.layout(), model.params());
  const Buffer step_buffer(static_cast<std::size_t>(seq * vocab) * dtype_size(dtype));
  std::int64_t position = 0;
  for (const std::int64_t n : chunks) {
    const Tensor logits = step_buffer.tensor(dtype, {n, vocab});
    decoder.append(std::span(tokens).subspan(static_cast<std::size_t>(position),
                                             static_cast<std::size_t>(n)),
                   logits);
    for (std::int64_t i = 0; i < n; ++i) {
      const double d = relative_difference(row_of(logits, i), row_of(full, position + i));
      EXPECT_LE(d, tolerance) << model::name(config.model.arch) << " position " << position + i;
    }
    position += n;
    EXPECT_EQ(decoder.length(), position);
  }
  ASSERT_EQ(position, seq);
}

TEST(IncrementalDecoder, GptMatchesFullForwardAtEveryPositionFp64) {
  const plan::RunConfig c = one_sequence(odd_gpt(), "fp64");
  expect_same_logits(c, std::vector<std::int64_t>(13, 1), 1e-10);  // one token at a time
  expect_same_logits(c, {5, 1, 1, 4, 1, 1}, 1e-10);                // prefill, then steps
  expect_same_logits(c, {13}, 1e-10);                              // all at once
}

TEST(IncrementalDecoder, LlamaWithGroupedQueryAttentionMatchesFullForwardFp64) {
  for (const bool tied : {false, true}) {
    const plan::RunConfig c = one_sequence(odd_llama(tied), "fp64");
    expect_same_logits(c, std::vector<std::int64_t>(11, 1), 1e-10);
    expect_same_logits(c, {4, 1, 3, 1, 1, 1}, 1e-10);
  }
}

// fp32 computes the same function at fp32's own precision. The reference is the full forward
// in fp64 on the same (fp32-representable) weights; the decoder in fp32 may be no further
// from it than twice the full forward in fp32 is, measured in the same run, at the worst
// position (plus 2.4e-7, a few fp32 ulps, for a full forward that happens to land closer).
void expect_fp32_within_fp32_noise(const plan::RunConfig& fp32_config,
                                   const std::vector<std::int64_t>& chunks) {
  plan::RunConfig fp64_config = fp32_config;
  fp64_config.train.precision = "fp64";
  train::TrainingEngine engine32(fp32_config), engine64(fp64_config);
  kernels::scale(engine32.model().params(), 20.0f);  // far from uniform attention, as above
  kernels::convert(engine32.model().params(), engine64.model().params());
  const std::int64_t seq = fp32_config.model.seq_len, vocab = fp32_config.model.vocab_size;
  const std::vector<std::int32_t> tokens = random_tokens(seq, vocab, 3);
  const Buffer full32_buffer(static_cast<std::size_t>(seq * vocab) * sizeof(float));
  const Buffer full64_buffer(static_cast<std::size_t>(seq * vocab) * sizeof(double));
  const Tensor full32 = full32_buffer.tensor(DType::f32, {seq, vocab});
  const Tensor full64 = full64_buffer.tensor(DType::f64, {seq, vocab});
  engine32.logits(tokens.data(), full32);
  engine64.logits(tokens.data(), full64);

  IncrementalDecoder decoder(fp32_config.model, engine32.model().layout(),
                             engine32.model().params());
  const Buffer step_buffer(static_cast<std::size_t>(seq * vocab) * sizeof(float));
  double worst_decoder = 0, worst_full = 0;
  std::int64_t position = 0;
  for (const std::int64_t n : chunks) {
    const Tensor logits = step_buffer.tensor(DType::f32, {n, vocab});
    decoder.append(std::span(tokens).subspan(static_cast<std::size_t>(position),
                                             static_cast<std::size_t>(n)),
                   logits);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::vector<double> reference = row_of(full64, position + i);
      worst_decoder = std::max(worst_decoder, relative_difference(row_of(logits, i), reference));
      worst_full = std::max(worst_full, relative_difference(row_of(full32, position + i), reference));
    }
    position += n;
  }
  ASSERT_EQ(position, seq);
  EXPECT_GT(worst_full, 0.0);  // fp32 rounding is really there to measure
  EXPECT_LE(worst_decoder, 2 * worst_full + 2.4e-7)
      << model::name(fp32_config.model.arch) << ": full forward in fp32 is " << worst_full << " from fp64";
}

TEST(IncrementalDecoder, MatchesFullForwardFp32WithinFp32Noise) {
  expect_fp32_within_fp32_noise(one_sequence(odd_gpt(), "fp32"), {6, 1, 1, 1, 1, 1, 1, 1});
  expect_fp32_within_fp32_noise(one_sequence(odd_llama(), "fp32"), {3, 1, 1, 1, 1, 1, 1, 1, 1});
}

// Clearing the cache starts again at position 0: the logits are those of a fresh decoder.
TEST(IncrementalDecoder, ClearRestartsAtPositionZero) {
  const plan::RunConfig c = one_sequence(odd_llama(), "fp64");
  train::TrainingEngine engine(c);
  IncrementalDecoder decoder(c.model, engine.model().layout(), engine.model().params());
  const std::vector<std::int32_t> a = random_tokens(7, 41, 1), b = random_tokens(5, 41, 2);
  const Buffer buffer(5 * 41 * sizeof(double));
  decoder.append(a, buffer.tensor(DType::f64, {1, 41}));
  decoder.clear();
  EXPECT_EQ(decoder.length(), 0);
  decoder.append(b, buffer.tensor(DType::f64, {5, 41}));
  const std::vector<double> after_clear = row_of(buffer.tensor(DType::f64, {5, 41}), 4);
  IncrementalDecoder fresh(c.model, engine.model().layout(), engine.model().params());
  fresh.append(b, buffer.tensor(DType::f64, {1, 41}));
  EXPECT_LE(relative_difference(row_of(buffer.tensor(DType::f64, {1, 41}), 0), after_clear),
            1e-13);
}

// MoE layers route each position alone; with an evaluation capacity that drops nothing the full
// forward routes every token the same way, so both agree.
plan::RunConfig with_experts(plan::RunConfig c, const std::string& gate, std::int64_t every) {
  c.model.moe_every = every;
  c.model.experts = 4;
  c.model.moe_gate = ops::parse_moe_gate(gate);
  c.model.moe_ffn_hidden = 23;
  c.model.eval_capacity_factor = 4;  // capacity = the whole group: nothing overflows
  return c;
}

TEST(IncrementalDecoder, MixtureOfExpertsLayersMatchFullForwardFp64) {
  for (const char* gate : {"switch", "gshard", "noisy-topk"}) {
    expect_same_logits(one_sequence(with_experts(odd_gpt(), gate, 2), "fp64"), {5, 1, 1, 4, 1, 1},
                       1e-10);
    expect_same_logits(one_sequence(with_experts(odd_llama(), gate, 1), "fp64"),
                       std::vector<std::int64_t>(11, 1), 1e-10);
  }
}

TEST(IncrementalDecoder, RejectsExpertChoiceRoutingWhichNeedsTheWholeGroup) {
  const plan::RunConfig c = one_sequence(with_experts(odd_gpt(), "expert-choice", 2), "fp64");
  train::TrainingEngine engine(c);
  try {
    IncrementalDecoder decoder(c.model, engine.model().layout(), engine.model().params());
    FAIL() << "an expert-choice decoder was built";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe_gate = \"expert-choice\" cannot generate"),
              std::string::npos)
        << e.what();
  }
}

TEST(IncrementalDecoder, RejectsBert) {
  plan::RunConfig c = one_sequence(odd_gpt(), "fp64");
  c.model.arch = model::ArchitectureKind::bert;
  train::TrainingEngine engine(c);
  try {
    IncrementalDecoder decoder(c.model, engine.model().layout(), engine.model().params());
    FAIL() << "a BERT decoder was built";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.arch = \"bert\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace oases::model
