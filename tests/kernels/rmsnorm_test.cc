#include "kernels/cpu/rmsnorm.h"

#include "core/error.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_gradient_matches;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::random_vector;

constexpr double kEps = 1e-6;  // LLaMA's rms_norm_eps

template <class T>
class RmsNormTest : public ::testing::Test {};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(RmsNormTest, Floats);

// Against LlamaRMSNorm's definition evaluated naively in double. Row scales differ by orders
// of magnitude, and one row is all zeros (rstd = 1/sqrt(eps), y = 0).
TYPED_TEST(RmsNormTest, ForwardMatchesNaiveDoubleReference) {
  using T = TypeParam;
  const std::int64_t n = 5, C = 7;
  auto x = random_vector(n * C, 1, -2.0, 2.0);
  for (std::int64_t c = 0; c < C; ++c) {
    x[1 * C + c] *= 100.0;
    x[2 * C + c] *= 1e-3;
    x[4 * C + c] = 0.0;
  }
  const auto w = random_vector(C, 2, 0.5, 1.5);
  const std::vector<T> xt(x.begin(), x.end()), wt(w.begin(), w.end());
  std::vector<T> y(n * C), rstd(n);
  rmsnorm_forward(xt.data(), wt.data(), y.data(), rstd.data(), n, C, kEps);
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-15;
  for (std::int64_t i = 0; i < n; ++i) {
    double sq = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double v = static_cast<double>(xt[i * C + c]);
      sq += v * v;
    }
    const double r = 1.0 / std::sqrt(sq / C + kEps);
    EXPECT_NEAR(rstd[i], r, tol * r) << "row " << i;
    for (std::int64_t c = 0; c < C; ++c) {
      const double expected = static_cast<double>(xt[i * C + c]) * r * static_cast<double>(wt[c]);
      EXPECT_NEAR(y[i * C + c], expected, 4 * tol * (std::abs(expected) + 1e-30))
          << "y[" << i << "," << c << "]";
    }
  }
}

TYPED_TEST(RmsNormTest, ForwardInPlace) {
  using T = TypeParam;
  const std::int64_t n = 3, C = 9;
  const auto x = random_vector(n * C, 3), w = random_vector(C, 4);
  const std::vector<T> xt(x.begin(), x.end()), wt(w.begin(), w.end());
  std::vector<T> expected(n * C), rstd(n), in_place = xt, rstd2(n);
  rmsnorm_forward(xt.data(), wt.data(), expected.data(), rstd.data(), n, C, kEps);
  rmsnorm_forward(in_place.data(), wt.data(), in_place.data(), rstd2.data(), n, C, kEps);
  EXPECT_EQ(in_place, expected);
  EXPECT_EQ(rstd2, rstd);
}

// L = sum(dy * y). Gradients for x (overwritten) and weight (accumulated onto nonzero).
TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const std::int64_t n = 3, C = 5;
  auto x = random_vector(n * C, 11, -2.0, 2.0);
  auto w = random_vector(C, 12, 0.5, 1.5);
  const auto dy = random_vector(n * C, 14);
  std::vector<double> y(n * C), rstd(n);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), n, C, kEps);
  const auto dw0 = random_vector(C, 15);
  std::vector<double> dx(n * C, 1e30), dw = dw0;
  rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), n, C);
  for (std::int64_t c = 0; c < C; ++c) dw[c] -= dw0[c];
  auto loss = [&] {
    std::vector<double> r(n);
    rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), n, C, kEps);
    return oases::testing::dot(y, dy);
  };
  expect_gradient_matches("dx", x, dx, loss);
  expect_gradient_matches("dweight", w, dw, loss);
}

TEST(RmsNorm, FloatBackwardTracksDouble) {
  const std::int64_t n = 4, C = 33;
  const auto x = random_vector(n * C, 21, -3.0, 3.0), dy = random_vector(n * C, 22);
  const auto w = random_vector(C, 23, 0.5, 1.5);
  std::vector<double> y(n * C), rstd(n), dx(n * C), dw(C, 0.0);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), n, C, kEps);
  rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), n, C);
  const std::vector<float> xf(x.begin(), x.end()), dyf(dy.begin(), dy.end()),
      wf(w.begin(), w.end());
  std::vector<float> yf(n * C), rstdf(n), dxf(n * C), dwf(C, 0.0f);
  rmsnorm_forward(xf.data(), wf.data(), yf.data(), rstdf.data(), n, C, kEps);
  rmsnorm_backward(dyf.data(), xf.data(), wf.data(), rstdf.data(), dxf.data(), dwf.data(), n, C);
  for (std::int64_t i = 0; i < n * C; ++i) EXPECT_NEAR(dxf[i], dx[i], 2e-6) << i;
  for (std::int64_t c = 0; c < C; ++c) EXPECT_NEAR(dwf[c], dw[c], 2e-6) << c;
}

// Forward and backward give bitwise-equal results at 1, 2 and 3 threads (and run to run). The
// shape is large enough that both kernels go parallel, and uneven.
TYPED_TEST(RmsNormTest, IsBitwiseIndependentOfThreadCount) {
  using T = TypeParam;
  const std::int64_t n = 301, C = 199;
  const auto xd = random_vector(n * C, 31, -3.0, 3.0), dyd = random_vector(n * C, 32);
  const auto wd = random_vector(C, 33, 0.5, 1.5);
  const std::vector<T> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end()),
      w(wd.begin(), wd.end());
  expect_independent_of_thread_count("rmsnorm", [&] {
    std::vector<T> y(n * C), rstd(n), dx(n * C), dw(C, T(0.125));
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), n, C, kEps);
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), n, C);
    for (const auto* part : {&rstd, &dx, &dw}) append(y, *part);
    return y;
  });
}

TEST(RmsNorm, NonPositiveEpsIsAnInternalError) {
  std::vector<float> x(4, 1.0f), w(4, 1.0f), y(4), rstd(1);
  EXPECT_THROW(rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), 1, 4, 0.0),
               InternalError);
}

}  // namespace
}  // namespace oases::kernels::cpu
