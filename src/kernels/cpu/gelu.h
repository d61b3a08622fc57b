// GeLU in its tanh approximation, as GPT-2 and torch.nn.functional.gelu(approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n);  // y may alias x

// dx = dy * gelu'(x)  (overwritten; dx may alias dy)
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n);

}  // namespace oases::kernels::cpu
