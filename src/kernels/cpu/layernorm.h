// LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance, eps inside sqrt).
#pragma once

#include "kernels/cpu/threads.h"

#include <cstdint>

namespace oases::kernels::cpu {

// y[i, :] = (x[i, :] - mean_i) * rstd_i * gamma + beta, for rows i in [0, n) of width C.
// Saves mean[n] and rstd[n] = 1 / sqrt(var_i + eps) for the backward pass. The statistics are
// computed in double (two passes) and rounded to T; y is formed from the rounded values.
template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                       std::int64_t n, std::int64_t C, double eps, Threads threads = Threads::team);

// dx[n, C] overwritten (must not alias dy or x); dgamma[C] and dbeta[C] accumulated.
// Deterministic, and independent of the thread count: each column's sum over rows is formed
// in row order by one thread (in double, then added onto dgamma/dbeta).
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                        T* dx, T* dgamma, T* dbeta, std::int64_t n, std::int64_t C);

}  // namespace oases::kernels::cpu
