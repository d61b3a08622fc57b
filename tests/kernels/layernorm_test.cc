#include "kernels/cpu/layernorm.h"

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

constexpr double kEps = 1e-5;

template <class T>
class LayerNormTest : public ::testing::Test {};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LayerNormTest, Floats);

// Against torch.nn.LayerNorm's definition evaluated naively in double. The rows are offset
// far from zero so a one-pass variance would visibly lose digits.
TYPED_TEST(LayerNormTest, ForwardMatchesNaiveDoubleReference) {
  using T = TypeParam;
  const std::int64_t n = 4, C = 5;
  auto x = random_vector(n * C, 1, -2.0, 2.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < C; ++c) x[i * C + c] += 10.0 * static_cast<double>(i);
  const auto gamma = random_vector(C, 2, 0.5, 1.5), beta = random_vector(C, 3);
  const std::vector<T> xt(x.begin(), x.end()), gt(gamma.begin(), gamma.end()),
      bt(beta.begin(), beta.end());
  std::vector<T> y(n * C), mean(n), rstd(n);
  layernorm_forward(xt.data(), gt.data(), bt.data(), y.data(), mean.data(), rstd.data(), n, C,
                    kEps);
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-13;
  for (std::int64_t i = 0; i < n; ++i) {
    double mu = 0;
    for (std::int64_t c = 0; c < C; ++c) mu += static_cast<double>(xt[i * C + c]);
    mu /= C;
    double var = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(xt[i * C + c]) - mu;
      var += d * d;
    }
    var /= C;  // biased, as torch
    const double r = 1.0 / std::sqrt(var + kEps);
    EXPECT_NEAR(mean[i], mu, tol * (1 + std::abs(mu))) << "row " << i;
    EXPECT_NEAR(rstd[i], r, tol * r) << "row " << i;
    double normalised_sum = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double expected = (static_cast<double>(xt[i * C + c]) - mu) * r * gamma[c] + beta[c];
      EXPECT_NEAR(y[i * C + c], expected, tol * 10) << "y[" << i << "," << c << "]";
      normalised_sum += (static_cast<double>(y[i * C + c]) - beta[c]) / gamma[c];
    }
    EXPECT_NEAR(normalised_sum / C, 0.0, tol * 10) << "row " << i << " is not centred";
  }
}

// L = sum(w * y). Gradients for x (overwritten), gamma and beta (accumulated onto nonzero).
TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const std::int64_t n = 3, C = 5;
  auto x = random_vector(n * C, 11, -2.0, 2.0);
  auto gamma = random_vector(C, 12, 0.5, 1.5), beta = random_vector(C, 13);
  const auto dy = random_vector(n * C, 14);
  std::vector<double> y(n * C), mean(n), rstd(n);
  layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), n, C,
                    kEps);
  const auto dgamma0 = random_vector(C, 15), dbeta0 = random_vector(C, 16);
  std::vector<double> dx(n * C, 1e30), dgamma = dgamma0, dbeta = dbeta0;
  layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                     dgamma.data(), dbeta.data(), n, C);
  auto loss = [&] {
    std::vector<double> m(n), r(n);
    layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), m.data(), r.data(), n, C,
                      kEps);
    return oases::testing::dot(y, dy);
  };
  for (std::int64_t c = 0; c < C; ++c) {
    dgamma[c] -= dgamma0[c];
    dbeta[c] -= dbeta0[c];
  }
  expect_gradient_matches("dx", x, dx, loss, 1e-6, 1e-6, 1e-8);
  expect_gradient_matches("dgamma", gamma, dgamma, loss, 1e-6, 1e-6, 1e-8);
  expect_gradient_matches("dbeta", beta, dbeta, loss, 1e-6, 1e-6, 1e-8);
}

// Forward and backward give bitwise-equal results at 1, 2 and 3 threads (and run to run). The
// shape is large enough that both kernels go parallel, and uneven (13 column tiles of 16, the
// last partial, shared by 1, 2 or 3 threads).
TYPED_TEST(LayerNormTest, IsBitwiseIndependentOfThreadCount) {
  using T = TypeParam;
  const std::int64_t n = 301, C = 199;
  const auto xd = random_vector(n * C, 21, -3.0, 3.0), dyd = random_vector(n * C, 22);
  const auto gd = random_vector(C, 23, 0.5, 1.5), bd = random_vector(C, 24);
  const std::vector<T> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end()),
      gamma(gd.begin(), gd.end()), beta(bd.begin(), bd.end());
  expect_independent_of_thread_count("layernorm", [&] {
    std::vector<T> y(n * C), mean(n), rstd(n), dx(n * C), dgamma(C, T(0.125)), dbeta(C, T(-0.5));
    layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), n,
                      C, kEps);
    layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                       dgamma.data(), dbeta.data(), n, C);
    for (const auto* part : {&mean, &rstd, &dx, &dgamma, &dbeta}) append(y, *part);
    return y;
  });
}

}  // namespace
}  // namespace oases::kernels::cpu
