#include "kernels/cpu/gelu.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::expect_gradient_matches;
using oases::testing::random_vector;

double gelu_reference(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, ForwardMatchesClosedFormula) {
  const std::int64_t n = 101;
  auto x = random_vector(n, 1, -6.0, 6.0);
  x[0] = 0.0;
  x[1] = 20.0;
  x[2] = -20.0;
  std::vector<double> y(n);
  gelu_forward(x.data(), y.data(), n);
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(y[i], gelu_reference(x[i]), 1e-15 * (1 + std::abs(x[i]))) << "x=" << x[i];
  EXPECT_EQ(y[0], 0.0);
  EXPECT_EQ(y[1], 20.0);
  EXPECT_LT(std::abs(y[2]), 1e-100);  // exact value: -20 * sigmoid(-2 u(20)), about -3e-261

  const std::vector<float> xf(x.begin(), x.end());
  std::vector<float> yf(n);
  gelu_forward(xf.data(), yf.data(), n);
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(yf[i], gelu_reference(xf[i]), 1e-6 * (1 + std::abs(x[i]))) << "x=" << x[i];
}

TEST(Gelu, ForwardInPlace) {
  const auto x = random_vector(7, 2, -3.0, 3.0);
  std::vector<double> expected(7), in_place = x;
  gelu_forward(x.data(), expected.data(), 7);
  gelu_forward(in_place.data(), in_place.data(), 7);
  EXPECT_EQ(in_place, expected);
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const std::int64_t n = 37;
  auto x = random_vector(n, 3, -4.0, 4.0);
  const auto dy = random_vector(n, 4);
  std::vector<double> dx(n, 1e30), y(n);
  gelu_backward(x.data(), dy.data(), dx.data(), n);
  auto loss = [&] {
    gelu_forward(x.data(), y.data(), n);
    return oases::testing::dot(y, dy);
  };
  expect_gradient_matches("dx", x, dx, loss);

  // dx may alias dy.
  auto in_place = dy;
  gelu_backward(x.data(), in_place.data(), in_place.data(), n);
  EXPECT_EQ(in_place, dx);
}

TEST(Gelu, FloatBackwardTracksDouble) {
  const std::int64_t n = 50;
  const auto x = random_vector(n, 5, -5.0, 5.0), dy = random_vector(n, 6);
  std::vector<double> dx(n);
  gelu_backward(x.data(), dy.data(), dx.data(), n);
  const std::vector<float> xf(x.begin(), x.end()), dyf(dy.begin(), dy.end());
  std::vector<float> dxf(n);
  gelu_backward(xf.data(), dyf.data(), dxf.data(), n);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(dxf[i], dx[i], 1e-6) << "x=" << x[i];
}

double gelu_erf_reference(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

TEST(GeluErf, ForwardMatchesDefinitionAndKnownValues) {
  const std::int64_t n = 101;
  auto x = random_vector(n, 11, -7.0, 7.0);
  x[0] = 0.0;
  x[1] = 1.0;
  x[2] = -1.0;
  x[3] = 30.0;
  x[4] = -30.0;
  std::vector<double> y(n);
  gelu_erf_forward(x.data(), y.data(), n);
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(y[i], gelu_erf_reference(x[i]), 1e-15 * (1 + std::abs(x[i]))) << "x=" << x[i];
  // x * Phi(x) with the standard normal CDF Phi(1) = 0.841344746068542948...
  EXPECT_NEAR(y[1], 0.841344746068542948, 4e-16);
  EXPECT_NEAR(y[2], -0.158655253931457051, 4e-16);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_EQ(y[3], 30.0);
  EXPECT_EQ(y[4], -0.0);
  // The erf form differs from the tanh approximation (by up to ~5e-4 near |x| = 2).
  std::vector<double> tanh_form(n);
  gelu_forward(x.data(), tanh_form.data(), n);
  double largest_gap = 0;
  for (std::int64_t i = 0; i < n; ++i)
    largest_gap = std::max(largest_gap, std::abs(y[i] - tanh_form[i]));
  EXPECT_GT(largest_gap, 1e-5);

  const std::vector<float> xf(x.begin(), x.end());
  std::vector<float> yf(n);
  gelu_erf_forward(xf.data(), yf.data(), n);
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(yf[i], gelu_erf_reference(xf[i]), 1e-6 * (1 + std::abs(x[i]))) << "x=" << x[i];
}

TEST(GeluErf, ForwardInPlace) {
  const auto x = random_vector(9, 12, -3.0, 3.0);
  std::vector<double> expected(9), in_place = x;
  gelu_erf_forward(x.data(), expected.data(), 9);
  gelu_erf_forward(in_place.data(), in_place.data(), 9);
  EXPECT_EQ(in_place, expected);
}

TEST(GeluErf, BackwardMatchesFiniteDifferences) {
  const std::int64_t n = 37;
  auto x = random_vector(n, 13, -5.0, 5.0);
  const auto dy = random_vector(n, 14);
  std::vector<double> dx(n, 1e30), y(n);
  gelu_erf_backward(x.data(), dy.data(), dx.data(), n);
  auto loss = [&] {
    gelu_erf_forward(x.data(), y.data(), n);
    return oases::testing::dot(y, dy);
  };
  expect_gradient_matches("dx", x, dx, loss);

  // dx may alias dy.
  auto in_place = dy;
  gelu_erf_backward(x.data(), in_place.data(), in_place.data(), n);
  EXPECT_EQ(in_place, dx);
}

TEST(GeluErf, FloatBackwardTracksDouble) {
  const std::int64_t n = 50;
  const auto x = random_vector(n, 15, -6.0, 6.0), dy = random_vector(n, 16);
  const std::vector<float> xf(x.begin(), x.end()), dyf(dy.begin(), dy.end());
  const std::vector<double> xr(xf.begin(), xf.end()), dyr(dyf.begin(), dyf.end());
  std::vector<double> dx(n);
  gelu_erf_backward(xr.data(), dyr.data(), dx.data(), n);
  std::vector<float> dxf(n);
  gelu_erf_backward(xf.data(), dyf.data(), dxf.data(), n);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(dxf[i], dx[i], 1e-6) << "x=" << x[i];
}

// The float erf form (a vectorised erfc, gelu.cc) is accurate relative to the value itself on
// a dense grid over [-14, 14], the negative tail included, where 1 + erf would cancel. The
// bound is the header's: 1e-6 + 2.4e-7 x^2 relative (erfc's fit 1.2e-7 and exp_approx 3e-7;
// the x^2 term is the rounding of the exponent's argument, x^2 / 2 in float, which exp turns
// into a relative error of about 1.5 u32 x^2, doubled). Below about -13 x Phi(x) leaves
// float's normal range; there the bound is absolute, 1e-37. The slope Phi(x) + x phi(x) is
// held to the same relative bound of |Phi(x)| + |x phi(x)| (its two terms cancel near -1.5).
TEST(GeluErf, FloatIsRelativelyAccurateIncludingTheNegativeTail) {
  std::vector<float> x;
  for (double v = -14.0; v <= 14.0; v += 1.0 / 64) x.push_back(static_cast<float>(v));
  x.push_back(-0.0f);
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> y(x.size()), ones(x.size(), 1.0f), slope(x.size());
  gelu_erf_forward(x.data(), y.data(), n);
  gelu_erf_backward(x.data(), ones.data(), slope.data(), n);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * std::numbers::pi);
    const double relative = 1e-6 + 2.4e-7 * v * v;
    EXPECT_NEAR(y[i], v * cdf, relative * std::abs(v * cdf) + 1e-37) << "x=" << v;
    EXPECT_NEAR(slope[i], cdf + v * pdf, relative * (cdf + std::abs(v * pdf)) + 1e-37) << "x=" << v;
  }
}

// Both forms, forward and backward, are bitwise equal at 1, 2 and 3 threads.
TEST(Gelu, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t n = (std::int64_t{1} << 15) + 123;
  const auto xd = random_vector(n, 41, -6.0, 6.0), dyd = random_vector(n, 42);
  const std::vector<float> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
  expect_independent_of_thread_count("gelu", [&] {
    std::vector<float> y(n), dx(n), y_erf(n), dx_erf(n);
    gelu_forward(x.data(), y.data(), n);
    gelu_backward(x.data(), dy.data(), dx.data(), n);
    gelu_erf_forward(x.data(), y_erf.data(), n);
    gelu_erf_backward(x.data(), dy.data(), dx_erf.data(), n);
    for (const auto* part : {&dx, &y_erf, &dx_erf}) append(y, *part);
    return y;
  });
}

}  // namespace
}  // namespace oases::kernels::cpu
