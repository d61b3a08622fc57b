#include "train/loss_scaler.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace oases::train {
namespace {

// Feeds `outcomes` (true: finite gradients) and returns the scale before each step and whether
// each step was applied.
struct Trace {
  std::vector<double> scales;
  std::vector<bool> applied;
};
Trace run(LossScaler& scaler, const std::vector<bool>& outcomes) {
  Trace t;
  for (bool finite : outcomes) {
    t.scales.push_back(scaler.scale());
    t.applied.push_back(scaler.update(finite));
  }
  return t;
}

std::vector<bool> clean(std::int64_t n) { return std::vector<bool>(static_cast<std::size_t>(n), true); }

TEST(LossScaler, AnOverflowIsSkippedAndTheSecondBacksOffByHalf) {
  LossScaler scaler = LossScaler::dynamic({});  // 2^16, window 1000, hysteresis 2, min 1
  EXPECT_EQ(scaler.scale(), 65536);
  run(scaler, clean(10));
  EXPECT_FALSE(scaler.update(false));  // skipped; hysteresis 2 -> 1: the scale holds
  EXPECT_EQ(scaler.scale(), 65536);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_FALSE(scaler.update(false));  // hysteresis used up: back off
  EXPECT_EQ(scaler.scale(), 32768);
  EXPECT_FALSE(scaler.update(false));  // and again on every overflow until the scale grows
  EXPECT_EQ(scaler.scale(), 16384);
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(LossScaler, GrowsAfterExactlyAWindowOfCleanStepsAndRefillsHysteresis) {
  LossScaler scaler = LossScaler::dynamic({.initial_scale = 1024, .window = 5});
  scaler.update(false);
  scaler.update(false);  // backed off to 512, hysteresis at 0
  ASSERT_EQ(scaler.scale(), 512);
  run(scaler, clean(4));
  EXPECT_EQ(scaler.scale(), 512);  // four clean steps: not yet
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1024);  // the fifth grows it
  scaler.update(false);             // hysteresis refilled to 2: this one only skips
  EXPECT_EQ(scaler.scale(), 1024);
  // An overflow restarts the count: 4 clean, overflow (backs off, hysteresis now 0), 4 clean.
  run(scaler, clean(4));
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 512);
  run(scaler, clean(4));
  EXPECT_EQ(scaler.scale(), 512);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_EQ(scaler.skipped_steps(), 4);
}

TEST(LossScaler, NeverBacksOffBelowTheMinimum) {
  LossScaler scaler = LossScaler::dynamic({.initial_scale = 8, .min_scale = 2, .hysteresis = 1});
  const Trace t = run(scaler, {false, false, false, false});
  EXPECT_EQ(t.scales, (std::vector<double>{8, 4, 2, 2}));
  EXPECT_EQ(scaler.scale(), 2);
  EXPECT_EQ(t.applied, (std::vector<bool>{false, false, false, false}));
}

TEST(LossScaler, AConstantScaleNeverMovesButStillSkipsOverflows) {
  LossScaler scaler = LossScaler::constant(128);
  const Trace t = run(scaler, {true, false, false, false, true});
  EXPECT_EQ(t.scales, (std::vector<double>(5, 128)));
  EXPECT_EQ(t.applied, (std::vector<bool>{true, false, false, false, true}));
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_FALSE(scaler.is_dynamic());
  EXPECT_EQ(LossScaler::identity().scale(), 1);
}

// The rule written out once more, step by step, as the reference for a long random sequence.
TEST(LossScaler, FollowsTheRuleOverALongSequenceAndResumesFromItsState) {
  const DynamicLossScale settings{.initial_scale = 4096, .window = 7, .min_scale = 1, .hysteresis = 3};
  std::vector<bool> outcomes;
  std::uint64_t x = 12345;
  for (int i = 0; i < 400; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    outcomes.push_back((x >> 33) % 9 != 0);  // about one overflow in nine steps
  }
  double scale = 4096;
  std::int64_t clean_run = 0, hysteresis = 3, skipped = 0;
  std::vector<double> expected;
  for (bool finite : outcomes) {
    expected.push_back(scale);
    if (finite) {
      if (++clean_run == 7) {
        clean_run = 0;
        hysteresis = 3;
        scale *= 2;
      }
    } else {
      ++skipped;
      clean_run = 0;
      if (--hysteresis <= 0) scale = std::max(1.0, scale / 2);
    }
  }
  LossScaler whole = LossScaler::dynamic(settings);
  EXPECT_EQ(run(whole, outcomes).scales, expected);
  EXPECT_EQ(whole.skipped_steps(), skipped);

  // Stopped after 150 steps and resumed from the saved state in a fresh scaler (configured with
  // another initial scale, which the state overrides): the same scales, bit for bit.
  LossScaler first = LossScaler::dynamic(settings);
  const std::vector<bool> head(outcomes.begin(), outcomes.begin() + 150);
  const std::vector<bool> tail(outcomes.begin() + 150, outcomes.end());
  const Trace t1 = run(first, head);
  LossScaler second = LossScaler::dynamic({.initial_scale = 2, .window = 7, .hysteresis = 3});
  second.restore(first.state(), "checkpoint step 150");
  const Trace t2 = run(second, tail);
  std::vector<double> joined = t1.scales;
  joined.insert(joined.end(), t2.scales.begin(), t2.scales.end());
  EXPECT_EQ(joined, expected);
  EXPECT_EQ(second.state().skipped_steps, skipped);
}

TEST(LossScaler, RejectsACheckpointedScaleBelowOne) {
  LossScaler scaler = LossScaler::dynamic({});
  try {
    scaler.restore({.scale = 0.5}, "checkpoint step_000010");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint step_000010"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("0.5"), std::string::npos);
  }
}

}  // namespace
}  // namespace oases::train
