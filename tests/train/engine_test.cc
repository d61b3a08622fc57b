#include "train/engine.h"

#include "kernels/kernels.h"
#include "support/numbers.h"
#include "support/tiny_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace oases::train {
namespace {

// The tiny run with dropout, in micro-batches of `micro_batch` sequences.
plan::RunConfig tiny(std::int64_t micro_batch, std::int64_t global_batch) {
  plan::RunConfig c = testing::tiny_run();
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
  return testing::philox_tokens(0, stream, static_cast<std::int64_t>(n), 50, {1, 2});
}

plan::RunConfig fp64(plan::RunConfig c) {
  c.train.precision = "fp64";
  return c;
}

// Relative difference of two flat fp64 parameter arrays.
double relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    diff += std::pow(a.data<double>()[i] - b.data<double>()[i], 2);
    norm += std::pow(b.data<double>()[i], 2);
  }
  return std::sqrt(diff / norm);
}

// Gradient accumulation over micro-batches is the same computation as one big micro-batch,
// dropout and attention dropout included (masks are keyed by the global sample index): in fp64
// the two agree to the verification tolerance, relative 1e-10.
TEST(TrainingEngine, AccumulationEqualsOneLargeMicroBatch) {
  for (const std::string arch : {"gpt", "llama", "bert"}) {
    plan::RunConfig c = fp64(tiny(8, 8)), d = fp64(tiny(2, 8));
    c.model.arch = d.model.arch = model::parse_architecture(arch);
    c.model.attention_dropout = d.model.attention_dropout = 0.1;
    TrainingEngine whole(c), split(d);
    const auto in = tokens(8 * 16, 1), out = tokens(8 * 16, 2);
    for (int step = 0; step < 3; ++step) {
      const StepResult a = whole.train_step(step, in.data(), out.data());
      const StepResult b = split.train_step(step, in.data(), out.data());
      EXPECT_NEAR(a.loss, b.loss, 1e-10 * std::abs(a.loss)) << arch;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-10 * a.grad_norm) << arch;
    }
    EXPECT_LT(relative_difference(split.model().params(), whole.model().params()), 1e-10) << arch;
  }
}

// The loss and its gradient average over the counted targets only: a negative target (a
// position a masked-language model does not predict) changes neither.
TEST(TrainingEngine, IgnoredTargetsDoNotCount) {
  plan::RunConfig c = fp64(tiny(4, 4));
  c.model.arch = model::ArchitectureKind::bert;
  c.model.dropout = 0;
  TrainingEngine engine(c);
  const auto in = tokens(4 * 16, 5);
  auto targets = tokens(4 * 16, 6);
  const double all = engine.compute_gradients(0, in.data(), targets.data(), 4);
  // Keep every third target: the mean over them, from the per-token losses of a run that
  // counts only that one token at a time, is what the engine must report.
  std::vector<std::int32_t> some(targets.size(), -1);
  double sum = 0;
  int counted = 0;
  for (std::size_t i = 0; i < targets.size(); i += 3) {
    std::vector<std::int32_t> one(targets.size(), -1);
    one[i] = some[i] = targets[i];
    sum += engine.compute_gradients(0, in.data(), one.data(), 4);
    ++counted;
  }
  const double mean = engine.compute_gradients(0, in.data(), some.data(), 4);
  EXPECT_NEAR(mean, sum / counted, 1e-12 * mean);
  EXPECT_NE(mean, all);
  EXPECT_NEAR(engine.evaluate(in.data(), some.data(), 4), mean, 1e-12 * mean);
  // No counted target: no loss, no gradient.
  const std::vector<std::int32_t> none(targets.size(), -1);
  EXPECT_EQ(engine.compute_gradients(0, in.data(), none.data(), 4), 0.0);
  EXPECT_EQ(kernels::sum_of_squares(engine.model().grads()), 0.0);
}

// The production precision follows the verification run closely: fp32 losses and parameters
// after a few steps are within fp32's rounding of the fp64 ones.
TEST(TrainingEngine, Fp32TracksFp64) {
  TrainingEngine narrow(tiny(4, 8)), wide(fp64(tiny(4, 8)));
  EXPECT_EQ(narrow.model().params().dtype(), DType::f32);
  EXPECT_EQ(wide.model().params().dtype(), DType::f64);
  const auto in = tokens(8 * 16, 7), out = tokens(8 * 16, 8);
  for (int step = 0; step < 3; ++step) {
    const double a = narrow.train_step(step, in.data(), out.data()).loss;
    const double b = wide.train_step(step, in.data(), out.data()).loss;
    EXPECT_NEAR(a, b, 1e-5 * b);
  }
  // Optimizer state is reported in the run's element type.
  EXPECT_EQ(wide.optimizer().state_bytes(), 2 * narrow.optimizer().state_bytes());
  EXPECT_EQ(narrow.memory_bytes() - narrow.activation_bytes(),
            2 * static_cast<std::size_t>(narrow.model().param_count()) * sizeof(float) +
                narrow.optimizer().state_bytes());
}

TEST(TrainingEngine, DropoutChangesTrainingLossButNotEvaluation) {
  plan::RunConfig with = tiny(4, 4), without = tiny(4, 4);
  without.model.dropout = 0;
  TrainingEngine a(with), b(without);
  const auto in = tokens(4 * 16, 3), out = tokens(4 * 16, 4);
  EXPECT_EQ(a.evaluate(in.data(), out.data(), 4), b.evaluate(in.data(), out.data(), 4));
  EXPECT_NE(a.compute_gradients(0, in.data(), out.data(), 4), b.compute_gradients(0, in.data(), out.data(), 4));
}

TEST(TrainingEngine, AttentionDropoutChangesTrainingLossButNotEvaluation) {
  for (const std::string arch : {"gpt", "llama", "bert"}) {
    plan::RunConfig with = fp64(tiny(4, 4)), without = fp64(tiny(4, 4));
    with.model.arch = without.model.arch = model::parse_architecture(arch);
    with.model.dropout = without.model.dropout = 0;
    with.model.attention_dropout = 0.2;
    TrainingEngine a(with), b(without);
    const auto in = tokens(4 * 16, 3), out = tokens(4 * 16, 4);
    EXPECT_EQ(a.evaluate(in.data(), out.data(), 4), b.evaluate(in.data(), out.data(), 4)) << arch;
    EXPECT_NE(a.compute_gradients(0, in.data(), out.data(), 4),
              b.compute_gradients(0, in.data(), out.data(), 4))
        << arch;
  }
}

TEST(TrainingEngine, LearningRateWarmsUpThenFollowsCosine) {
  TrainingEngine e(tiny(4, 4));
  EXPECT_DOUBLE_EQ(e.learning_rate(0), 1e-2 / 3);
  EXPECT_DOUBLE_EQ(e.learning_rate(2), 1e-2);
  EXPECT_DOUBLE_EQ(e.learning_rate(3), 1e-2);
  EXPECT_NEAR(e.learning_rate(6), 1e-3 + 0.5 * (1 + std::cos(M_PI * 3.0 / 7.0)) * 9e-3, 1e-15);
  EXPECT_DOUBLE_EQ(e.learning_rate(10), 1e-3);
  EXPECT_DOUBLE_EQ(e.learning_rate(50), 1e-3);
  plan::RunConfig constant = tiny(4, 4);
  constant.train.warmup_steps = 0;
  constant.train.min_lr = constant.train.lr;
  TrainingEngine c(constant);
  for (int s = 0; s < 12; ++s) EXPECT_DOUBLE_EQ(c.learning_rate(s), constant.train.lr);
}

}  // namespace
}  // namespace oases::train
