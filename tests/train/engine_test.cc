#include "train/engine.h"

#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace oases::train {
namespace {

RunConfig tiny(std::int64_t micro_batch, std::int64_t global_batch) {
  RunConfig c;
  c.model.layers = 2;
  c.model.hidden = 32;
  c.model.heads = 2;
  c.model.ffn_hidden = 64;
  c.model.vocab_size = 50;
  c.model.seq_len = 16;
  c.model.dropout = 0.1;
  c.train.micro_batch = micro_batch;
  c.train.global_batch = global_batch;
  c.train.steps = 10;
  c.train.lr = 1e-2;
  c.train.min_lr = 1e-3;
  c.train.warmup_steps = 3;
  return c;
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint32_t stream) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i)
    t[i] = static_cast<std::int32_t>(philox4x32({static_cast<std::uint32_t>(i), stream, 0, 0}, {1, 2})[0] % 50);
  return t;
}

// Gradient accumulation over micro-batches is the same computation as one big micro-batch,
// dropout included (masks are keyed by the global sample index).
TEST(TrainingEngine, AccumulationEqualsOneLargeMicroBatch) {
  TrainingEngine whole(tiny(8, 8)), split(tiny(2, 8));
  const auto in = tokens(8 * 16, 1), out = tokens(8 * 16, 2);
  for (int step = 0; step < 3; ++step) {
    const StepResult a = whole.train_step(step, in.data(), out.data());
    const StepResult b = split.train_step(step, in.data(), out.data());
    EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(a.loss));
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm);
  }
  double max_diff = 0;
  for (std::int64_t i = 0; i < whole.model().param_count(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::abs(whole.model().params()[i] - split.model().params()[i])));
  EXPECT_LT(max_diff, 1e-5);
}

TEST(TrainingEngine, DropoutChangesTrainingLossButNotEvaluation) {
  RunConfig with = tiny(4, 4), without = tiny(4, 4);
  without.model.dropout = 0;
  TrainingEngine a(with), b(without);
  const auto in = tokens(4 * 16, 3), out = tokens(4 * 16, 4);
  EXPECT_EQ(a.evaluate(in.data(), out.data(), 4), b.evaluate(in.data(), out.data(), 4));
  EXPECT_NE(a.compute_gradients(0, in.data(), out.data(), 4), b.compute_gradients(0, in.data(), out.data(), 4));
}

TEST(TrainingEngine, LearningRateWarmsUpThenFollowsCosine) {
  TrainingEngine e(tiny(4, 4));
  EXPECT_DOUBLE_EQ(e.learning_rate(0), 1e-2 / 3);
  EXPECT_DOUBLE_EQ(e.learning_rate(2), 1e-2);
  EXPECT_DOUBLE_EQ(e.learning_rate(3), 1e-2);
  EXPECT_NEAR(e.learning_rate(6), 1e-3 + 0.5 * (1 + std::cos(M_PI * 3.0 / 7.0)) * 9e-3, 1e-15);
  EXPECT_DOUBLE_EQ(e.learning_rate(10), 1e-3);
  EXPECT_DOUBLE_EQ(e.learning_rate(50), 1e-3);
  RunConfig constant = tiny(4, 4);
  constant.train.warmup_steps = 0;
  constant.train.min_lr = constant.train.lr;
  TrainingEngine c(constant);
  for (int s = 0; s < 12; ++s) EXPECT_DOUBLE_EQ(c.learning_rate(s), constant.train.lr);
}

}  // namespace
}  // namespace oases::train
