#include "kernels/cpu/rmsnorm.h"

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
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, std::int64_t n, std::int64_t C,
                     double eps, Threads threads) {
  OASES_ASSERT(n >= 0 && C > 0, "rmsnorm_forward: bad size n={} C={}", n, C);
  OASES_ASSERT(eps > 0, "rmsnorm_forward: eps must be positive, got {}", eps);
  for_each_index(n, threads, n * C >= kMinParallelWork, [&](std::int64_t i) {
    const T* xr = x + i * C;
    double sq = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double v = static_cast<double>(xr[c]);
      sq += v * v;
    }
    // The output is formed from the rounded statistic that backward will read, so forward and
    // backward (and recomputation) see one consistent function.
    const T r = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(C) + eps));
    rstd[i] = r;
    T* yr = y + i * C;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * weight[c];
  });
}

template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                      std::int64_t n, std::int64_t C) {
  OASES_ASSERT(n >= 0 && C > 0, "rmsnorm_backward: bad size n={} C={}", n, C);
  // y_c = x_c r w_c with r = (mean(x^2) + eps)^(-1/2), dr/dx_c = -r^3 x_c / C, so
  //   dx_c = r g_c - x_c r^3 mean(g x) = r (g_c - xhat_c mean(g xhat)).
  // Rows are independent, so they split across threads freely.
#pragma omp parallel for schedule(static) if (n * C >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const T* dyr = dy + i * C;
    const T* xr = x + i * C;
    const T r = rstd[i];
    double sum_gx = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const T g = dyr[c] * weight[c];
      sum_gx += static_cast<double>(g * (xr[c] * r));
    }
    const T mean_gx = static_cast<T>(sum_gx / static_cast<double>(C));
    T* dxr = dx + i * C;
    for (std::int64_t c = 0; c < C; ++c) dxr[c] = r * (dyr[c] * weight[c] - xr[c] * r * mean_gx);
  }
  // dweight sums over rows. Each thread owns whole column tiles and walks the rows in order,
  // so every sum is formed in one fixed order whatever the thread count.
  constexpr std::int64_t kTile = 16;
  const std::int64_t tiles = (C + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (n * C >= kMinParallelWork)
  for (std::int64_t tile = 0; tile < tiles; ++tile) {
    const std::int64_t c0 = tile * kTile;
    const std::int64_t width = std::min(kTile, C - c0);
    double acc[kTile] = {};
    for (std::int64_t i = 0; i < n; ++i) {
      const T* dyr = dy + i * C + c0;
      const T* xr = x + i * C + c0;
      const T r = rstd[i];
      for (std::int64_t j = 0; j < width; ++j) acc[j] += static_cast<double>(dyr[j] * (xr[j] * r));
    }
    for (std::int64_t j = 0; j < width; ++j) dweight[c0 + j] += static_cast<T>(acc[j]);
  }
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, std::int64_t,
                                     std::int64_t, double, Threads);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, std::int64_t,
                                      std::int64_t, double, Threads);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*,
                                      float*, float*, std::int64_t, std::int64_t);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*,
                                       double*, double*, std::int64_t, std::int64_t);

}  // namespace oases::kernels::cpu
