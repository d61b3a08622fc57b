#include "kernels/cpu/fast_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace oases::kernels::cpu {
namespace {

TEST(FastExp, RelativeErrorBelowThreeTenMillionthsOverTheRange) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.000731f) {
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(static_cast<double>(exp_approx(x)) - exact) / exact);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
}

TEST(FastExp, ClampsOutOfRangeInputsAndPropagatesNan) {
  const float inf = std::numeric_limits<float>::infinity();
  const float floor_value = exp_approx(-87.0f), ceiling_value = exp_approx(88.0f);
  EXPECT_GT(floor_value, 0.0f);
  EXPECT_LT(floor_value, 2e-38f);
  EXPECT_EQ(exp_approx(-1000.0f), floor_value);
  EXPECT_EQ(exp_approx(-inf), floor_value);
  EXPECT_EQ(exp_approx(1000.0f), ceiling_value);
  EXPECT_EQ(exp_approx(inf), ceiling_value);
  EXPECT_TRUE(std::isfinite(ceiling_value));
  EXPECT_TRUE(std::isnan(exp_approx(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp_approx(-std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastExp, DoubleIsStdExp) {
  for (double x : {-700.0, -1.5, 0.0, 0.3, 700.0}) EXPECT_EQ(exp_approx(x), std::exp(x));
}

}  // namespace
}  // namespace oases::kernels::cpu
