// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm (no mean subtraction, no
// bias, eps inside the square root).
#pragma once

#include "kernels/cpu/threads.h"

#include <cstdint>

namespace oases::kernels::cpu {

// y[i, :] = x[i, :] * rstd_i * weight, rstd_i = 1 / sqrt(mean_j x[i, j]^2 + eps), for rows i in
// [0, n) of width C; x, y [n, C], weight [C]. Saves rstd[n] for the backward pass. The mean
// square is computed in double and rstd rounded to T; y is formed from the rounded value, as
// (x * rstd) * weight. y may alias x. REQUIRES: eps > 0.
template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, std::int64_t n, std::int64_t C,
                     double eps, Threads threads = Threads::team);

// With xhat = x * rstd and g = dy * weight:
//   dx[i, :] = rstd_i * (g - xhat * mean_j(g * xhat))    (overwritten; must not alias dy or x)
//   dweight += sum_i dy[i, :] * xhat[i, :]               (accumulated)
// Deterministic, and independent of the thread count: each column's sum over rows is formed
// in row order by one thread (in double, then added onto dweight).
template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                      std::int64_t n, std::int64_t C);

}  // namespace oases::kernels::cpu
