// GeLU in two forms:
//  - the tanh approximation, as GPT-2 and torch.nn.functional.gelu(approximate="tanh"):
//      gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//  - the exact erf form, as BERT and torch.nn.functional.gelu's default:
//      gelu(x) = 0.5 x (1 + erf(x / sqrt 2))
// Every element is independent; results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n);  // y may alias x

// dx = dy * gelu'(x)  (overwritten; dx may alias dy)
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n);

// The erf form, through std::erf in T (glibc's erff and erf are accurate to about an ulp).
template <class T>
void gelu_erf_forward(const T* x, T* y, std::int64_t n);  // y may alias x

// dx = dy * (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi))  (overwritten; dx may
// alias dy)
template <class T>
void gelu_erf_backward(const T* x, const T* dy, T* dx, std::int64_t n);

}  // namespace oases::kernels::cpu
