// GeLU in two forms:
//  - the tanh approximation, as GPT-2 and torch.nn.functional.gelu(approximate="tanh"):
//      gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//  - the exact erf form, as BERT and torch.nn.functional.gelu's default:
//      gelu(x) = 0.5 x (1 + erf(x / sqrt 2))
// Every element is independent; results do not depend on the thread count.
#pragma once

#include "kernels/cpu/threads.h"

#include <cstdint>

namespace oases::kernels::cpu {

// y = gelu(x) (y may alias x)
template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n, Threads threads = Threads::team);

// dx = dy * gelu'(x)  (overwritten; dx may alias dy)
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n, Threads threads = Threads::team);

// The erf form (y may alias x). In double through std::erf and std::exp; in float through a
// vectorised erfc (gelu.cc) and exp_approx: within (1e-6 + 2.4e-7 x^2) relative of the exact
// value for every x, the negative tail included (the x^2 term: exp of a rounded x^2 / 2);
// 1e-6 absolute (1 + |x|), as the other forms, is what the callers rely on.
template <class T>
void gelu_erf_forward(const T* x, T* y, std::int64_t n, Threads threads = Threads::team);

// dx = dy * (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi))  (overwritten; dx may
// alias dy)
template <class T>
void gelu_erf_backward(const T* x, const T* dy, T* dx, std::int64_t n,
                       Threads threads = Threads::team);

}  // namespace oases::kernels::cpu
