// AdamW, SGD and global-norm gradient clipping, with PyTorch's exact formulas
// (torch.optim.AdamW, torch.optim.SGD, torch.nn.utils.clip_grad_norm_).
#pragma once

#include "kernels/types.h"

#include "kernels/cpu/threads.h"

#include <cstdint>

namespace oases::kernels::cpu {

using kernels::AdamWStep;

// p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Evaluated in PyTorch's order (torch.optim.AdamW, single-tensor path): p *= T(1 - lr*wd)
// (only when wd != 0); m += T(1-b1) * (g - m) (lerp); v = v * T(b2) + T(1-b2) * g * g; the
// scalars lr / (1 - b1^t) and sqrt(1 - b2^t) are computed in double and rounded to T once.
template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, std::int64_t n, const AdamWStep& hp);

using kernels::SgdStep;

// torch.optim.SGD with dampening 0, in its order of operations (single-tensor path):
//   d = g + wd * p                      (only when wd != 0)
//   buf = momentum * buf + d            (only when momentum != 0; buf starts at zero, so the
//                                        first step sets buf = d, as torch's clone does)
//   d = nesterov ? d + momentum * buf : buf
//   p = p + (-lr) * d
// Scalars are rounded to T once. momentum_buffer may be null when momentum == 0.
template <class T>
void sgd_update(T* param, const T* grad, T* momentum_buffer, std::int64_t n, const SgdStep& hp);

// sum_i x[i]^2, accumulated in double. Deterministic and independent of the thread count: the
// input is split into blocks by n alone and the block sums are added in block order.
template <class T>
double sum_of_squares(const T* x, std::int64_t n);

// x[i] *= factor
template <class T>
void scale_in_place(T* x, std::int64_t n, T factor, Threads threads = Threads::team);

// The factor clip_grad_norm_ multiplies gradients by: min(1, max_norm / (total_norm + 1e-6)).
// A NaN total_norm gives NaN (as torch.clamp does), so a non-finite gradient is not hidden.
double clip_coefficient(double total_norm, double max_norm);

}  // namespace oases::kernels::cpu
