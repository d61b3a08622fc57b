#include "kernels/cpu/gemm.h"

#include "core/error.h"
#include "kernels/finite_difference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::expect_gradient_matches;
using oases::testing::random_vector;

template <class T>
std::vector<T> cast_vector(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// op(X)(r, c) of a stored row-major matrix with row stride ld.
double element(const std::vector<double>& stored, std::int64_t ld, Trans trans, std::int64_t r,
               std::int64_t c) {
  return trans == Trans::no ? stored[static_cast<std::size_t>(r * ld + c)]
                            : stored[static_cast<std::size_t>(c * ld + r)];
}

template <class T>
class GemmTest : public ::testing::Test {};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(GemmTest, Floats);

// All four transpose combinations, non-square, padded leading dimensions, alpha and beta not
// 0 or 1, against a triple loop in double. The padding of C must stay untouched.
TYPED_TEST(GemmTest, MatchesTripleLoopForEveryTransposeCombination) {
  using T = TypeParam;
  const std::int64_t M = 7, N = 5, K = 9;
  const double alpha = 0.75, beta = -1.25;
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-13;
  for (Trans ta : {Trans::no, Trans::yes}) {
    for (Trans tb : {Trans::no, Trans::yes}) {
      SCOPED_TRACE(::testing::Message()
                   << "trans_a=" << (ta == Trans::yes) << " trans_b=" << (tb == Trans::yes));
      const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
      const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
      const std::int64_t lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 4;
      const auto a = random_vector(static_cast<std::size_t>(a_rows * lda), 1);
      const auto b = random_vector(static_cast<std::size_t>(b_rows * ldb), 2);
      const auto c0 = random_vector(static_cast<std::size_t>(M * ldc), 3);
      auto a_t = cast_vector<T>(a), b_t = cast_vector<T>(b), c_t = cast_vector<T>(c0);
      gemm<T>(ta, tb, M, N, K, T(alpha), a_t.data(), lda, b_t.data(), ldb, T(beta), c_t.data(),
              ldc);
      for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t j = 0; j < ldc; ++j) {
          const auto at = static_cast<std::size_t>(i * ldc + j);
          if (j >= N) {
            EXPECT_EQ(c_t[at], static_cast<T>(c0[at]))
                << "padding of C written at " << i << "," << j;
            continue;
          }
          double sum = 0, magnitude = 0;
          for (std::int64_t k = 0; k < K; ++k) {
            const double term = element(a, lda, ta, i, k) * element(b, ldb, tb, k, j);
            sum += term;
            magnitude += std::abs(term);
          }
          const double expected = alpha * sum + beta * c0[at];
          EXPECT_NEAR(c_t[at], expected, tol * (1 + magnitude)) << "C[" << i << "," << j << "]";
        }
      }
    }
  }
}

TYPED_TEST(GemmTest, BetaZeroIgnoresGarbageInC) {
  using T = TypeParam;
  const std::int64_t M = 3, N = 4, K = 2;
  const auto a = cast_vector<T>(random_vector(M * K, 4));
  const auto b = cast_vector<T>(random_vector(K * N, 5));
  std::vector<T> c(M * N, std::numeric_limits<T>::quiet_NaN());
  gemm<T>(Trans::no, Trans::no, M, N, K, T(1), a.data(), K, b.data(), N, T(0), c.data(), N);
  for (T v : c) EXPECT_TRUE(std::isfinite(v));
}

TYPED_TEST(GemmTest, EmptyInnerDimensionScalesC) {
  using T = TypeParam;
  std::vector<T> c = {1, 2, 3, 4, 5, 6};
  gemm<T>(Trans::no, Trans::no, 2, 3, 0, T(1), nullptr, 1, nullptr, 3, T(2), c.data(), 3);
  EXPECT_EQ(c, (std::vector<T>{2, 4, 6, 8, 10, 12}));
  std::vector<T> garbage(6, std::numeric_limits<T>::quiet_NaN());
  gemm<T>(Trans::no, Trans::no, 2, 3, 0, T(1), nullptr, 1, nullptr, 3, T(0), garbage.data(), 3);
  EXPECT_EQ(garbage, std::vector<T>(6, T(0)));
}

TEST(Gemm, RejectsTooSmallLeadingDimension) {
  std::vector<double> a(12), b(12), c(12);
  EXPECT_THROW(
      gemm<double>(Trans::no, Trans::no, 3, 4, 3, 1.0, a.data(), 2, b.data(), 4, 0.0, c.data(), 4),
      InternalError);
  EXPECT_THROW(
      gemm<double>(Trans::yes, Trans::no, 3, 4, 2, 1.0, a.data(), 2, b.data(), 4, 0.0, c.data(), 4),
      InternalError);
}

TYPED_TEST(GemmTest, LinearForwardMatchesNaive) {
  using T = TypeParam;
  const std::int64_t n = 3, in = 5, out = 4;
  const auto x = random_vector(n * in, 6), w = random_vector(in * out, 7),
             b = random_vector(out, 8);
  const auto xt = cast_vector<T>(x), wt = cast_vector<T>(w), bt = cast_vector<T>(b);
  std::vector<T> y(n * out), y_no_bias(n * out);
  linear_forward<T>(xt.data(), wt.data(), bt.data(), y.data(), n, in, out);
  linear_forward(xt.data(), wt.data(), nullptr, y_no_bias.data(), n, in, out);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-14;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < out; ++j) {
      double sum = 0;
      for (std::int64_t k = 0; k < in; ++k) sum += x[i * in + k] * w[k * out + j];
      EXPECT_NEAR(y_no_bias[i * out + j], sum, tol);
      EXPECT_NEAR(y[i * out + j], sum + b[j], tol);
    }
  }
}

// Backward against central differences of L = sum(dy_weights * y). dx is overwritten; dw and
// db accumulate onto what they held.
TEST(Gemm, LinearBackwardMatchesFiniteDifferences) {
  const std::int64_t n = 3, in = 5, out = 4;
  auto x = random_vector(n * in, 11), w = random_vector(in * out, 12), b = random_vector(out, 13);
  const auto dy = random_vector(n * out, 14);
  const auto dw0 = random_vector(in * out, 15), db0 = random_vector(out, 16);
  std::vector<double> dx(n * in, 1e30), dw = dw0, db = db0;
  linear_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), n, in, out);
  std::vector<double> y(n * out);
  auto loss = [&] {
    linear_forward(x.data(), w.data(), b.data(), y.data(), n, in, out);
    return oases::testing::dot(y, dy);
  };
  std::vector<double> dw_new(dw.size()), db_new(db.size());
  for (std::size_t i = 0; i < dw.size(); ++i) dw_new[i] = dw[i] - dw0[i];
  for (std::size_t i = 0; i < db.size(); ++i) db_new[i] = db[i] - db0[i];
  expect_gradient_matches("dx", x, dx, loss);
  expect_gradient_matches("dw", w, dw_new, loss);
  expect_gradient_matches("db", b, db_new, loss);
}

TEST(Gemm, LinearBackwardSkipsNullGradients) {
  const std::int64_t n = 4, in = 3, out = 5;
  const auto x = random_vector(n * in, 21), w = random_vector(in * out, 22),
             dy = random_vector(n * out, 23);
  std::vector<double> dx(n * in), dw_full(in * out), db(out), dw_only(in * out);
  linear_backward(dy.data(), x.data(), w.data(), dx.data(), dw_full.data(), db.data(), n, in, out);
  linear_backward(dy.data(), x.data(), w.data(), nullptr, dw_only.data(), nullptr, n, in, out);
  EXPECT_EQ(dw_full, dw_only);
}

}  // namespace
}  // namespace oases::kernels::cpu
