#include "kernels/cpu/layernorm.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace oases::kernels::cpu {
namespace {

// Below this many elements the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                       std::int64_t n, std::int64_t C, double eps, Threads threads) {
  OASES_ASSERT(n >= 0 && C > 0, "layernorm_forward: bad size n={} C={}", n, C);
  OASES_ASSERT(eps > 0, "layernorm_forward: eps must be positive, got {}", eps);
  for_each_index(n, threads, n * C >= kMinParallelWork, [&](std::int64_t i) {
    const T* xr = x + i * C;
    // Two passes in double: the one-pass E[x^2] - E[x]^2 cancels badly when |mean| >> std.
    double sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += static_cast<double>(xr[c]);
    const double mu = sum / static_cast<double>(C);
    double sq = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(xr[c]) - mu;
      sq += d * d;
    }
    const double var = sq / static_cast<double>(C);
    // The output is formed from the rounded statistics that backward will read, so forward
    // and backward (and recomputation) see one consistent function.
    const T m = static_cast<T>(mu);
    const T r = static_cast<T>(1.0 / std::sqrt(var + eps));
    mean[i] = m;
    rstd[i] = r;
    T* yr = y + i * C;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * r * gamma[c] + beta[c];
  });
}

template <class T>
void layernorm_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                        T* dx, T* dgamma, T* dbeta, std::int64_t n, std::int64_t C) {
  OASES_ASSERT(n >= 0 && C > 0, "layernorm_backward: bad size n={} C={}", n, C);
  // With xhat = (x - mean) * rstd and g = dy * gamma:
  //   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
  // Rows are independent, so they split across threads freely.
#pragma omp parallel for schedule(static) if (n * C >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const T* dyr = dy + i * C;
    const T* xr = x + i * C;
    const T m = mean[i];
    const T r = rstd[i];
    double sum_g = 0, sum_gx = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const T g = dyr[c] * gamma[c];
      const T xhat = (xr[c] - m) * r;
      sum_g += static_cast<double>(g);
      sum_gx += static_cast<double>(g * xhat);
    }
    const T mean_g = static_cast<T>(sum_g / static_cast<double>(C));
    const T mean_gx = static_cast<T>(sum_gx / static_cast<double>(C));
    T* dxr = dx + i * C;
    for (std::int64_t c = 0; c < C; ++c) {
      const T xhat = (xr[c] - m) * r;
      dxr[c] = r * (dyr[c] * gamma[c] - mean_g - xhat * mean_gx);
    }
  }
  // dgamma and dbeta sum over rows. Each thread owns whole column tiles and walks the rows in
  // order, so every sum is formed in one fixed order whatever the thread count (no per-thread
  // partials to combine, no scratch memory).
  constexpr std::int64_t kTile = 16;
  const std::int64_t tiles = (C + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (n * C >= kMinParallelWork)
  for (std::int64_t tile = 0; tile < tiles; ++tile) {
    const std::int64_t c0 = tile * kTile;
    const std::int64_t width = std::min(kTile, C - c0);
    double acc_gamma[kTile] = {};
    double acc_beta[kTile] = {};
    for (std::int64_t i = 0; i < n; ++i) {
      const T* dyr = dy + i * C + c0;
      const T* xr = x + i * C + c0;
      const T m = mean[i];
      const T r = rstd[i];
      for (std::int64_t j = 0; j < width; ++j) {
        const T xhat = (xr[j] - m) * r;
        acc_gamma[j] += static_cast<double>(dyr[j] * xhat);
        acc_beta[j] += static_cast<double>(dyr[j]);
      }
    }
    for (std::int64_t j = 0; j < width; ++j) {
      dgamma[c0 + j] += static_cast<T>(acc_gamma[j]);
      dbeta[c0 + j] += static_cast<T>(acc_beta[j]);
    }
  }
}

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*,
                                       float*, std::int64_t, std::int64_t, double, Threads);
template void layernorm_forward<double>(const double*, const double*, const double*, double*,
                                        double*, double*, std::int64_t, std::int64_t, double,
                                        Threads);
template void layernorm_backward<float>(const float*, const float*, const float*, const float*,
                                        const float*, float*, float*, float*, std::int64_t,
                                        std::int64_t);
template void layernorm_backward<double>(const double*, const double*, const double*, const double*,
                                         const double*, double*, double*, double*, std::int64_t,
                                         std::int64_t);

}  // namespace oases::kernels::cpu
