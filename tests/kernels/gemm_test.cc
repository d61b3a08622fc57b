#include "kernels/cpu/gemm.h"

#include "core/error.h"
#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

extern "C" int openblas_get_parallel(void);  // 0: sequential, 1: pthreads, 2: OpenMP

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_gradient_matches;
using oases::testing::expect_independent_of_thread_count;
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

// Products that span several tiles of C (detail::gemm_tiles), with partial tiles at both
// edges, padded leading dimensions and every transpose combination, against a triple loop in
// double: each tile must read its own rows of op(A) and columns of op(B).
TYPED_TEST(GemmTest, MatchesTripleLoopAcrossSeveralTiles) {
  using T = TypeParam;
  const std::int64_t M = 600, N = 530, K = 37;
  ASSERT_GE(detail::gemm_tiles(M, N).count(M, N), 4);
  const double alpha = 0.5, beta = 1.5;
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-13;
  for (Trans ta : {Trans::no, Trans::yes}) {
    for (Trans tb : {Trans::no, Trans::yes}) {
      SCOPED_TRACE(::testing::Message()
                   << "trans_a=" << (ta == Trans::yes) << " trans_b=" << (tb == Trans::yes));
      const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
      const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
      const std::int64_t lda = a_cols + 1, ldb = b_cols + 3, ldc = N + 2;
      const auto a = random_vector(static_cast<std::size_t>(a_rows * lda), 71);
      const auto b = random_vector(static_cast<std::size_t>(b_rows * ldb), 72);
      const auto c0 = random_vector(static_cast<std::size_t>(M * ldc), 73);
      auto a_t = cast_vector<T>(a), b_t = cast_vector<T>(b), c_t = cast_vector<T>(c0);
      gemm<T>(ta, tb, M, N, K, T(alpha), a_t.data(), lda, b_t.data(), ldb, T(beta), c_t.data(),
              ldc);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t j = 0; j < ldc; ++j) {
          const auto at = static_cast<std::size_t>(i * ldc + j);
          if (j >= N) {
            wrong += c_t[at] != static_cast<T>(c0[at]) ? 1 : 0;  // padding untouched
            continue;
          }
          double sum = 0, magnitude = 0;
          for (std::int64_t k = 0; k < K; ++k) {
            const double term = element(a, lda, ta, i, k) * element(b, ldb, tb, k, j);
            sum += term;
            magnitude += std::abs(term);
          }
          const double expected = alpha * sum + beta * c0[at];
          wrong += std::abs(c_t[at] - expected) > tol * (1 + magnitude) ? 1 : 0;
        }
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

// The tiles of C: a function of its shape alone, covering it with edges that are whole
// multiples of kGemmTileAlign no shorter than kGemmMinTileEdge (unless C is smaller), and
// enough of them on large products to keep many threads busy.
TEST(GemmTiles, DependOnTheShapeAloneAndCoverC) {
  for (const auto& [M, N] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 5}, {300, 40},
                            {600, 530}, {2048, 1536}, {2048, 512}, {256, 50304}, {50304, 512}}) {
    SCOPED_TRACE(::testing::Message() << M << " x " << N);
    const detail::GemmTiles t = detail::gemm_tiles(M, N);
    EXPECT_TRUE(t.rows == M || t.rows % kGemmTileAlign == 0) << t.rows;
    EXPECT_TRUE(t.cols == N || t.cols % kGemmTileAlign == 0) << t.cols;
    EXPECT_GE(t.rows, std::min(M, kGemmMinTileEdge));
    EXPECT_GE(t.cols, std::min(N, kGemmMinTileEdge));
    EXPECT_LE(t.rows, M);
    EXPECT_LE(t.cols, N);
  }
  EXPECT_EQ(detail::gemm_tiles(7, 5).count(7, 5), 1);
  // configs/bench.toml: the layer products of 2048 tokens and the vocabulary chunks.
  EXPECT_EQ(detail::gemm_tiles(2048, 1536).count(2048, 1536), kGemmTargetTiles);
  EXPECT_GE(detail::gemm_tiles(2048, 512).count(2048, 512), 8);
  EXPECT_GE(detail::gemm_tiles(256, 50304).count(256, 50304), kGemmTargetTiles);
}

// gemm relies on BLAS calls inside an OpenMP parallel region running on the calling thread
// alone, which OpenBLAS's OpenMP (and sequential) builds do; its pthreads build would thread
// them by a count of its own.
TEST(Gemm, OpenBlasIsTheOpenMpOrSequentialBuild) {
  EXPECT_NE(openblas_get_parallel(), 1) << "OpenBLAS uses pthreads: install libopenblas0-openmp";
}

// Bitwise-equal products at 1, 2 and 3 threads (OpenMP and OpenBLAS counts alike), for the
// shapes of the engine: forward and input-gradient products (NN, NT), weight gradients (TN)
// with K = tokens, K values whose last blocks OpenBLAS's threaded and serial drivers cut
// differently, a tall-skinny weight gradient with a long K, and accumulation onto C (beta 1).
// OpenBLAS's own threading changes the bits of every one of these (with its Prescott, Haswell
// or SkylakeX kernels); the tiles of gemm do not.
TYPED_TEST(GemmTest, IsBitwiseIndependentOfThreadCount) {
  using T = TypeParam;
  struct Case {
    Trans ta, tb;
    std::int64_t M, N, K;
    T beta;
  };
  const Case cases[] = {
      {Trans::no, Trans::no, 700, 530, 333, T(0)},    // x @ W ([in, out])
      {Trans::no, Trans::yes, 700, 530, 333, T(0)},   // x @ W^T ([out, in]); dy @ W^T
      {Trans::yes, Trans::no, 530, 390, 1500, T(1)},  // dW += x^T dy, K = tokens
      {Trans::yes, Trans::yes, 300, 520, 200, T(1)},
      {Trans::yes, Trans::no, 96, 200, 6000, T(1)},   // tall-skinny weight gradient
  };
  for (const Case& c : cases) {
    const std::int64_t lda = c.ta == Trans::no ? c.K : c.M, ldb = c.tb == Trans::no ? c.N : c.K;
    const auto a = cast_vector<T>(random_vector(static_cast<std::size_t>(c.M * c.K), 81));
    const auto b = cast_vector<T>(random_vector(static_cast<std::size_t>(c.K * c.N), 82));
    const auto c0 = cast_vector<T>(random_vector(static_cast<std::size_t>(c.M * c.N), 83));
    expect_independent_of_thread_count(
        ::testing::PrintToString(std::vector<std::int64_t>{c.M, c.N, c.K}) +
            (c.ta == Trans::yes ? " T" : " N") + (c.tb == Trans::yes ? "T" : "N"),
        [&] {
          std::vector<T> out = c0;
          gemm<T>(c.ta, c.tb, c.M, c.N, c.K, T(1), a.data(), lda, b.data(), ldb, c.beta,
                  out.data(), c.N);
          return out;
        });
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

// A strided linear problem: x rows at stride in + 2, y rows at stride out + 3, w in either
// layout. weight(k, j) is W[k, j] of y = x @ W + b whatever the storage.
struct StridedLinear {
  std::int64_t n = 3, in = 5, out = 4, ldx = in + 2, ldy = out + 3;
  WeightLayout layout;
  std::vector<double> x, w, b;
  StridedLinear(WeightLayout l, std::uint64_t seed)
      : layout(l),
        x(random_vector(static_cast<std::size_t>(n * ldx), seed)),
        w(random_vector(static_cast<std::size_t>(in * out), seed + 1)),
        b(random_vector(static_cast<std::size_t>(out), seed + 2)) {}
  double weight(std::int64_t k, std::int64_t j) const {
    return layout == WeightLayout::in_out ? w[static_cast<std::size_t>(k * out + j)]
                                          : w[static_cast<std::size_t>(j * in + k)];
  }
  double product(std::int64_t i, std::int64_t j) const {
    double sum = 0;
    for (std::int64_t k = 0; k < in; ++k)
      sum += x[static_cast<std::size_t>(i * ldx + k)] * weight(k, j);
    return sum;
  }
};

const char* name(WeightLayout layout) {
  return layout == WeightLayout::in_out ? "in_out" : "out_in";
}

TYPED_TEST(GemmTest, StridedLinearForwardMatchesNaiveForBothLayouts) {
  using T = TypeParam;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-14;
  for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
    for (bool bias : {false, true}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << name(layout) << " bias=" << bias << " accumulate=" << accumulate);
        const StridedLinear p(layout, 31);
        const auto y0 = random_vector(static_cast<std::size_t>(p.n * p.ldy), 34);
        const auto xt = cast_vector<T>(p.x), wt = cast_vector<T>(p.w), bt = cast_vector<T>(p.b);
        auto y = cast_vector<T>(y0);
        linear_forward(xt.data(), p.ldx, wt.data(), layout, bias ? bt.data() : nullptr, y.data(),
                       p.ldy, p.n, p.in, p.out, accumulate);
        for (std::int64_t i = 0; i < p.n; ++i) {
          for (std::int64_t j = 0; j < p.ldy; ++j) {
            const auto k = static_cast<std::size_t>(i * p.ldy + j);
            if (j >= p.out) {
              EXPECT_EQ(y[k], static_cast<T>(y0[k])) << "padding of y written at " << i << "," << j;
              continue;
            }
            const double expected = p.product(i, j) +
                                    (bias ? p.b[static_cast<std::size_t>(j)] : 0.0) +
                                    (accumulate ? static_cast<double>(static_cast<T>(y0[k])) : 0.0);
            EXPECT_NEAR(y[k], expected, tol) << i << "," << j;
          }
        }
      }
    }
  }
}

// Central differences of L = sum(wts * y) over every stored element of x (padding columns
// included, whose derivative is 0), w and b, for both layouts. dx is written at its own stride,
// onto garbage (overwrite) or onto earlier values (accumulate); dw and db accumulate.
TEST(Gemm, StridedLinearBackwardMatchesFiniteDifferencesForBothLayouts) {
  for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
    for (bool accumulate_dx : {false, true}) {
      SCOPED_TRACE(::testing::Message() << name(layout) << " accumulate_dx=" << accumulate_dx);
      StridedLinear p(layout, 41);
      const std::int64_t lddy = p.out + 1, lddx = p.in + 4;
      const auto dy = random_vector(static_cast<std::size_t>(p.n * lddy), 44);
      const auto dx0 = random_vector(static_cast<std::size_t>(p.n * lddx), 45);
      const auto dw0 = random_vector(p.w.size(), 46), db0 = random_vector(p.b.size(), 47);
      std::vector<double> dx = accumulate_dx ? dx0 : std::vector<double>(dx0.size(), 1e30);
      std::vector<double> dw = dw0, db = db0;
      linear_backward(dy.data(), lddy, p.x.data(), p.ldx, p.w.data(), layout, dx.data(), lddx,
                      accumulate_dx, dw.data(), db.data(), p.n, p.in, p.out);
      // The new gradient of x, in x's storage layout (0 on its padding columns).
      std::vector<double> dx_new(p.x.size(), 0.0);
      for (std::int64_t i = 0; i < p.n; ++i) {
        for (std::int64_t k = 0; k < p.in; ++k) {
          dx_new[i * p.ldx + k] = dx[i * lddx + k] - (accumulate_dx ? dx0[i * lddx + k] : 0.0);
        }
        for (std::int64_t k = p.in; k < lddx; ++k) {
          EXPECT_EQ(dx[i * lddx + k], accumulate_dx ? dx0[i * lddx + k] : 1e30) << "dx padding";
        }
      }
      std::vector<double> dw_new(dw.size()), db_new(db.size());
      for (std::size_t i = 0; i < dw.size(); ++i) dw_new[i] = dw[i] - dw0[i];
      for (std::size_t i = 0; i < db.size(); ++i) db_new[i] = db[i] - db0[i];
      std::vector<double> y(static_cast<std::size_t>(p.n * lddy), 0.0);
      auto loss = [&] {
        linear_forward(p.x.data(), p.ldx, p.w.data(), layout, p.b.data(), y.data(), lddy, p.n, p.in,
                       p.out);
        return oases::testing::dot(y, dy);  // y's padding stays 0
      };
      expect_gradient_matches("dx", p.x, dx_new, loss);
      expect_gradient_matches("dw", p.w, dw_new, loss);
      expect_gradient_matches("db", p.b, db_new, loss);
    }
  }
}

// torch.nn.Linear's [out, in] weight is the transpose of Conv1D's [in, out]: both layouts give
// the same outputs and transposed weight gradients.
TEST(Gemm, OutInLayoutIsTheTransposedWeight) {
  const std::int64_t n = 6, in = 7, out = 5;
  const auto x = random_vector(n * in, 51), w = random_vector(in * out, 52),
             b = random_vector(out, 53), dy = random_vector(n * out, 54);
  std::vector<double> w_t(w.size());
  for (std::int64_t k = 0; k < in; ++k)
    for (std::int64_t j = 0; j < out; ++j) w_t[j * in + k] = w[k * out + j];
  std::vector<double> y(n * out), y_t(n * out), dx(n * in), dx_t(n * in), dw(in * out, 0.0),
      dw_t(in * out, 0.0), db(out, 0.0), db_t(out, 0.0);
  linear_forward(x.data(), in, w.data(), WeightLayout::in_out, b.data(), y.data(), out, n, in, out);
  linear_forward(x.data(), in, w_t.data(), WeightLayout::out_in, b.data(), y_t.data(), out, n, in,
                 out);
  linear_backward(dy.data(), out, x.data(), in, w.data(), WeightLayout::in_out, dx.data(), in,
                  false, dw.data(), db.data(), n, in, out);
  linear_backward(dy.data(), out, x.data(), in, w_t.data(), WeightLayout::out_in, dx_t.data(), in,
                  false, dw_t.data(), db_t.data(), n, in, out);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y_t[i], y[i], 1e-14);
  for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx_t[i], dx[i], 1e-14);
  for (std::int64_t k = 0; k < in; ++k)
    for (std::int64_t j = 0; j < out; ++j) EXPECT_NEAR(dw_t[j * in + k], dw[k * out + j], 1e-14);
  EXPECT_EQ(db_t, db);
}

// The contiguous Conv1D signatures are the strided functions with ld = width and in_out.
TEST(Gemm, ContiguousSignaturesAreTheInOutSpecialCase) {
  const std::int64_t n = 40, in = 33, out = 17;
  const auto xd = random_vector(n * in, 61), wd = random_vector(in * out, 62),
             bd = random_vector(out, 63), dyd = random_vector(n * out, 64);
  const auto x = cast_vector<float>(xd), w = cast_vector<float>(wd), b = cast_vector<float>(bd),
             dy = cast_vector<float>(dyd);
  std::vector<float> y_a(n * out), y_b(n * out), dx_a(n * in), dx_b(n * in), dw_a(in * out, 0.5f),
      dw_b(in * out, 0.5f), db_a(out, 0.25f), db_b(out, 0.25f);
  linear_forward(x.data(), w.data(), b.data(), y_a.data(), n, in, out);
  linear_forward(x.data(), in, w.data(), WeightLayout::in_out, b.data(), y_b.data(), out, n, in,
                 out);
  linear_backward(dy.data(), x.data(), w.data(), dx_a.data(), dw_a.data(), db_a.data(), n, in, out);
  linear_backward(dy.data(), out, x.data(), in, w.data(), WeightLayout::in_out, dx_b.data(), in,
                  false, dw_b.data(), db_b.data(), n, in, out);
  EXPECT_EQ(y_a, y_b);
  EXPECT_EQ(dx_a, dx_b);
  EXPECT_EQ(dw_a, dw_b);
  EXPECT_EQ(db_a, db_b);
}

TEST(Gemm, StridedLinearRejectsStridesBelowWidths) {
  std::vector<double> x(64), w(64), y(64);
  EXPECT_THROW(
      linear_forward(x.data(), 3, w.data(), WeightLayout::out_in, nullptr, y.data(), 4, 2, 4, 4),
      InternalError);
  EXPECT_THROW(linear_backward(y.data(), 3, x.data(), 4, w.data(), WeightLayout::in_out, x.data(),
                               4, false, w.data(), nullptr, 2, 4, 4),
               InternalError);
}

// The linear layer's gradients at 1, 2 and 3 threads, both weight layouts, strided rows: dx,
// the weight gradient x^T dy (K = rows) and the bias gradient's column sums, all accumulated
// onto earlier values.
TYPED_TEST(GemmTest, LinearIsBitwiseIndependentOfThreadCount) {
  using T = TypeParam;
  const std::int64_t n = 650, in = 300, out = 520, ldx = in + 3, ldy = out + 5;
  const auto x = cast_vector<T>(random_vector(static_cast<std::size_t>(n * ldx), 91));
  const auto w = cast_vector<T>(random_vector(static_cast<std::size_t>(in * out), 92));
  const auto b = cast_vector<T>(random_vector(static_cast<std::size_t>(out), 93));
  const auto dy = cast_vector<T>(random_vector(static_cast<std::size_t>(n * ldy), 94));
  for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
    expect_independent_of_thread_count(name(layout), [&] {
      std::vector<T> y(static_cast<std::size_t>(n * ldy), T(0.5));
      std::vector<T> dx(static_cast<std::size_t>(n * ldx), T(0.25));
      std::vector<T> dw(static_cast<std::size_t>(in * out), T(-0.5)), db(out, T(0.125));
      linear_forward(x.data(), ldx, w.data(), layout, b.data(), y.data(), ldy, n, in, out, true);
      linear_backward(dy.data(), ldy, x.data(), ldx, w.data(), layout, dx.data(), ldx, true,
                      dw.data(), db.data(), n, in, out);
      append(y, dx);
      append(y, dw);
      append(y, db);
      return y;
    });
  }
}

}  // namespace
}  // namespace oases::kernels::cpu
