#include "kernels/cpu/gemm.h"

#include "core/error.h"
#include "kernels/cpu/column_sums.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace oases::kernels::cpu {
namespace {

// Below this many elements the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

bool fits_blasint(std::int64_t v) {
  return v <= static_cast<std::int64_t>(std::numeric_limits<blasint>::max());
}

// Products of fewer multiply-adds run their tiles on the calling thread: waking the team
// would cost more than it saves.
constexpr double kMinParallelGemmWork = double{1 << 21};

// Half of a tile edge, rounded up to whole kGemmTileAlign blocks.
std::int64_t half_edge(std::int64_t edge) {
  return ((edge + 1) / 2 + kGemmTileAlign - 1) / kGemmTileAlign * kGemmTileAlign;
}

}  // namespace

namespace detail {

GemmTiles gemm_tiles(std::int64_t M, std::int64_t N) {
  GemmTiles t{std::max<std::int64_t>(M, 1), std::max<std::int64_t>(N, 1)};
  // Halve the longer edge (the other when the longer one would fall below the minimum) until
  // there are enough tiles, and no further: each tile packs its own rows of op(A) and columns
  // of op(B), so every extra tile costs packing.
  while (t.count(M, N) < kGemmTargetTiles) {
    const std::int64_t half_rows = half_edge(t.rows), half_cols = half_edge(t.cols);
    const bool split_rows = half_rows >= kGemmMinTileEdge && half_rows < t.rows;
    const bool split_cols = half_cols >= kGemmMinTileEdge && half_cols < t.cols;
    if (split_rows && (t.rows >= t.cols || !split_cols)) {
      t.rows = half_rows;
    } else if (split_cols) {
      t.cols = half_cols;
    } else {
      break;
    }
  }
  return t;
}

}  // namespace detail

template <class T>
void gemm_on_calling_thread(Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N,
                            std::int64_t K, T alpha, const T* A, std::int64_t lda, const T* B,
                            std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  // OpenBLAS's OpenMP build runs a call made inside an active parallel region on the calling
  // thread, and otherwise on up to omp_get_max_threads() threads, with results that depend on
  // that count; so outside an active region the limit is lowered to 1 for the call (the ICV
  // is the calling thread's own, and is restored).
  const auto ta = trans_a == Trans::no ? CblasNoTrans : CblasTrans;
  const auto tb = trans_b == Trans::no ? CblasNoTrans : CblasTrans;
  const auto m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  const auto la = static_cast<blasint>(lda), lb = static_cast<blasint>(ldb),
             lc = static_cast<blasint>(ldc);
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads > 1) omp_set_num_threads(1);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, la, B, lb, beta, C, lc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, la, B, lb, beta, C, lc);
  }
  if (threads > 1) omp_set_num_threads(threads);
}

template <class T>
void gemm(Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
          const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C,
          std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  OASES_ASSERT(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M={} N={} K={}", M, N, K);
  // Row strides of the matrices as stored: A is [M, K] or, transposed, [K, M].
  const std::int64_t a_cols = trans_a == Trans::no ? K : M;
  const std::int64_t b_cols = trans_b == Trans::no ? N : K;
  OASES_ASSERT(lda >= std::max<std::int64_t>(1, a_cols), "gemm: lda={} < {}", lda, a_cols);
  OASES_ASSERT(ldb >= std::max<std::int64_t>(1, b_cols), "gemm: ldb={} < {}", ldb, b_cols);
  OASES_ASSERT(ldc >= std::max<std::int64_t>(1, N), "gemm: ldc={} < {}", ldc, N);
  OASES_ASSERT(fits_blasint(M) && fits_blasint(N) && fits_blasint(K) && fits_blasint(lda) &&
                   fits_blasint(ldb) && fits_blasint(ldc),
               "gemm: sizes exceed the BLAS integer range (M={} N={} K={})", M, N, K);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    // BLAS semantics: with an empty product C = beta * C, and beta = 0 means C is not read
    // (so NaN garbage in C does not survive). Done here rather than trusting every BLAS.
    for (std::int64_t i = 0; i < M; ++i) {
      T* row = C + i * ldc;
      for (std::int64_t j = 0; j < N; ++j) row[j] = beta == T(0) ? T(0) : beta * row[j];
    }
    return;
  }
  // C is cut into a grid of tiles that depends on M and N alone, and each tile is one BLAS call
  // on one thread, the tiles shared among the threads. So every thread count computes every
  // tile the same way (OpenBLAS's own threading would not: see gemm.h), and schedule(dynamic)
  // balances the tiles on a busy machine without changing a bit.
  const detail::GemmTiles tiles = detail::gemm_tiles(M, N);
  const std::int64_t across = (N + tiles.cols - 1) / tiles.cols;
  const std::int64_t count = tiles.count(M, N);
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
#pragma omp parallel for schedule(dynamic) if (count > 1 && work >= kMinParallelGemmWork)
  for (std::int64_t t = 0; t < count; ++t) {
    const std::int64_t i0 = t / across * tiles.rows, j0 = t % across * tiles.cols;
    const std::int64_t m = std::min(tiles.rows, M - i0), n = std::min(tiles.cols, N - j0);
    // op(A) rows i0.. and op(B) columns j0.., as stored: A is [M, K] or [K, M], B [K, N] or
    // [N, K].
    const T* a = trans_a == Trans::no ? A + i0 * lda : A + i0;
    const T* b = trans_b == Trans::no ? B + j0 : B + j0 * ldb;
    gemm_on_calling_thread(trans_a, trans_b, m, n, K, alpha, a, lda, b, ldb, beta,
                           C + i0 * ldc + j0, ldc);
  }
}

template <class T>
void linear_forward(const T* x, std::int64_t ldx, const T* w, WeightLayout layout,
                    const std::type_identity_t<T>* b, T* y, std::int64_t ldy, std::int64_t n,
                    std::int64_t in, std::int64_t out, bool accumulate) {
  OASES_ASSERT(n >= 0 && in >= 0 && out >= 0, "linear_forward: negative size n={} in={} out={}", n,
               in, out);
  OASES_ASSERT(ldx >= in && ldy >= out,
               "linear_forward: row strides ldx={} ldy={} below in={} out={}", ldx, ldy, in, out);
  if (b != nullptr) {
    // As torch.addmm(b, x, w): the bias goes into y first and the GEMM adds the product onto it.
#pragma omp parallel for schedule(static) if (n * out >= kMinParallelWork)
    for (std::int64_t i = 0; i < n; ++i) {
      T* row = y + i * ldy;
      if (accumulate) {
        for (std::int64_t j = 0; j < out; ++j) row[j] += b[j];
      } else {
        for (std::int64_t j = 0; j < out; ++j) row[j] = b[j];
      }
    }
  }
  const T beta = accumulate || b != nullptr ? T(1) : T(0);
  if (layout == WeightLayout::in_out) {
    gemm<T>(Trans::no, Trans::no, n, out, in, T(1), x, ldx, w, out, beta, y, ldy);
  } else {
    gemm<T>(Trans::no, Trans::yes, n, out, in, T(1), x, ldx, w, in, beta, y, ldy);
  }
}

template <class T>
void linear_backward(const T* dy, std::int64_t lddy, const T* x, std::int64_t ldx, const T* w,
                     WeightLayout layout, std::type_identity_t<T>* dx, std::int64_t lddx,
                     bool accumulate_dx, std::type_identity_t<T>* dw, std::type_identity_t<T>* db,
                     std::int64_t n, std::int64_t in, std::int64_t out) {
  OASES_ASSERT(n >= 0 && in >= 0 && out >= 0, "linear_backward: negative size n={} in={} out={}", n,
               in, out);
  OASES_ASSERT(lddy >= out && ldx >= in && (dx == nullptr || lddx >= in),
               "linear_backward: row strides lddy={} ldx={} lddx={} below in={} out={}", lddy, ldx,
               lddx, in, out);
  const T dx_beta = accumulate_dx ? T(1) : T(0);
  if (layout == WeightLayout::in_out) {
    // dx[n, in] (+)= dy[n, out] @ w[in, out]^T;  dw[in, out] += x[n, in]^T @ dy[n, out]
    if (dx != nullptr)
      gemm<T>(Trans::no, Trans::yes, n, in, out, T(1), dy, lddy, w, out, dx_beta, dx, lddx);
    if (dw != nullptr)
      gemm<T>(Trans::yes, Trans::no, in, out, n, T(1), x, ldx, dy, lddy, T(1), dw, out);
  } else {
    // dx[n, in] (+)= dy[n, out] @ w[out, in];  dw[out, in] += dy[n, out]^T @ x[n, in]
    if (dx != nullptr)
      gemm<T>(Trans::no, Trans::no, n, in, out, T(1), dy, lddy, w, in, dx_beta, dx, lddx);
    if (dw != nullptr)
      gemm<T>(Trans::yes, Trans::no, out, in, n, T(1), dy, lddy, x, ldx, T(1), dw, in);
  }
  if (db != nullptr) accumulate_column_sums(dy, n, out, lddy, db);
}

template <class T>
void linear_forward(const T* x, const T* w, const std::type_identity_t<T>* b, T* y, std::int64_t n,
                    std::int64_t in, std::int64_t out) {
  linear_forward(x, in, w, WeightLayout::in_out, b, y, out, n, in, out);
}

template <class T>
void linear_backward(const T* dy, const T* x, const T* w, std::type_identity_t<T>* dx, T* dw,
                     std::type_identity_t<T>* db, std::int64_t n, std::int64_t in,
                     std::int64_t out) {
  linear_backward(dy, out, x, in, w, WeightLayout::in_out, dx, in, false, dw, db, n, in, out);
}

template void gemm<float>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, float,
                          const float*, std::int64_t, const float*, std::int64_t, float, float*,
                          std::int64_t);
template void gemm<double>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, double,
                           const double*, std::int64_t, const double*, std::int64_t, double,
                           double*, std::int64_t);
template void gemm_on_calling_thread<float>(Trans, Trans, std::int64_t, std::int64_t,
                                            std::int64_t, float, const float*, std::int64_t,
                                            const float*, std::int64_t, float, float*,
                                            std::int64_t);
template void gemm_on_calling_thread<double>(Trans, Trans, std::int64_t, std::int64_t,
                                             std::int64_t, double, const double*, std::int64_t,
                                             const double*, std::int64_t, double, double*,
                                             std::int64_t);
template void linear_forward<float>(const float*, const float*, const float*, float*, std::int64_t,
                                    std::int64_t, std::int64_t);
template void linear_forward<double>(const double*, const double*, const double*, double*,
                                     std::int64_t, std::int64_t, std::int64_t);
template void linear_backward<float>(const float*, const float*, const float*, float*, float*,
                                     float*, std::int64_t, std::int64_t, std::int64_t);
template void linear_backward<double>(const double*, const double*, const double*, double*, double*,
                                      double*, std::int64_t, std::int64_t, std::int64_t);
#define OASES_INSTANTIATE_STRIDED(T)                                                             \
  template void linear_forward<T>(const T*, std::int64_t, const T*, WeightLayout, const T*, T*,  \
                                  std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool); \
  template void linear_backward<T>(const T*, std::int64_t, const T*, std::int64_t, const T*,     \
                                   WeightLayout, T*, std::int64_t, bool, T*, T*, std::int64_t,   \
                                   std::int64_t, std::int64_t);
OASES_INSTANTIATE_STRIDED(float)
OASES_INSTANTIATE_STRIDED(double)
#undef OASES_INSTANTIATE_STRIDED

}  // namespace oases::kernels::cpu
