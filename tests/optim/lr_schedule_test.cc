#include "optim/lr_schedule.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>

namespace oases::optim {
namespace {

// lr 1e-3 warming up over 10 steps, then a cosine over 100 steps down to 1e-4 at step 110.
LrSchedule warmup_cosine() {
  return {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .decay_steps = 0, .total_steps = 110};
}

TEST(LrSchedule, WarmsUpLinearlyToTheFullRateOnTheLastWarmupStep) {
  const LrSchedule s = warmup_cosine();
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
}

TEST(LrSchedule, DecaysAlongACosineToMinLr) {
  const LrSchedule s = warmup_cosine();
  EXPECT_EQ(s.at(10), 1e-3);                           // progress 0: cos 0 = 1
  EXPECT_DOUBLE_EQ(s.at(20), 0.0009779754323328191);   // progress 0.1
  EXPECT_DOUBLE_EQ(s.at(35), 0.0008681980515339464);   // progress 0.25
  EXPECT_DOUBLE_EQ(s.at(60), 0.00055);                 // progress 0.5: halfway
  EXPECT_DOUBLE_EQ(s.at(85), 0.00023180194846605365);  // progress 0.75
  EXPECT_EQ(s.at(110), 1e-4);                          // progress 1: cos pi = -1
  EXPECT_EQ(s.at(500), 1e-4);                          // past the end: stays at min_lr
}

TEST(LrSchedule, DecayStepsEndTheDecayBeforeTheRunEnds) {
  LrSchedule s = warmup_cosine();
  s.decay_steps = 60;  // the decay runs over steps 10..60
  EXPECT_DOUBLE_EQ(s.at(35), 0.00055);
  EXPECT_EQ(s.at(60), 1e-4);
  EXPECT_EQ(s.at(100), 1e-4);
}

TEST(LrSchedule, ConstantWithoutWarmupWhenMinLrEqualsLr) {
  const LrSchedule s{
      .lr = 3e-4, .min_lr = 3e-4, .warmup_steps = 0, .decay_steps = 0, .total_steps = 100};
  for (std::int64_t step = 0; step < 200; ++step) EXPECT_EQ(s.at(step), 3e-4) << step;
}

TEST(LrSchedule, NoDecayWhenWarmupTakesTheWholeRun) {
  const LrSchedule s{
      .lr = 1e-3, .min_lr = 0, .warmup_steps = 10, .decay_steps = 0, .total_steps = 10};
  EXPECT_DOUBLE_EQ(s.at(3), 4e-4);
  EXPECT_EQ(s.at(10), 1e-3);
  EXPECT_EQ(s.at(50), 1e-3);
}

TEST(LrSchedule, ANegativeStepIsAnInternalError) {
  EXPECT_THROW(warmup_cosine().at(-1), InternalError);
}

// TrainingEngine::learning_rate as it was before optim/ existed (src/train/engine.cc), on the
// [train] settings it read: LrSchedule gives the engine's rates bit for bit.
struct OldTrainSettings {
  double lr, min_lr;
  std::int64_t warmup_steps, lr_decay_steps, steps;
};

double old_learning_rate(const OldTrainSettings& t, std::int64_t step) {
  if (step < t.warmup_steps)
    return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  const std::int64_t decay_steps =
      (t.lr_decay_steps > 0 ? t.lr_decay_steps : t.steps) - t.warmup_steps;
  if (decay_steps <= 0) return t.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - t.warmup_steps) / static_cast<double>(decay_steps));
  return t.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (t.lr - t.min_lr);
}

TEST(LrSchedule, MatchesTheOldEngineFormulaBitwise) {
  const OldTrainSettings settings[] = {{3e-4, 3e-5, 0, 0, 100},  {3e-4, 3e-5, 17, 0, 250},
                                       {6e-4, 0, 5, 40, 100},    {1e-3, 1e-3, 0, 0, 50},
                                       {1e-3, 1e-4, 30, 20, 60}, {2.5e-4, 1e-5, 1, 3, 3}};
  for (const OldTrainSettings& t : settings) {
    const LrSchedule s{t.lr, t.min_lr, t.warmup_steps, t.lr_decay_steps, t.steps};
    for (std::int64_t step = 0; step < 2 * t.steps + 5; ++step) {
      const double got = s.at(step), want = old_learning_rate(t, step);
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0)
          << "step " << step << ": " << got << " vs " << want;
    }
  }
}

}  // namespace
}  // namespace oases::optim
