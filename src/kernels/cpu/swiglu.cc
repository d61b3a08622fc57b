#include "kernels/cpu/swiglu.h"

#include "core/error.h"
#include "kernels/cpu/fast_exp.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace oases::kernels::cpu {
namespace {

// exp is far dearer than an add, so a smaller batch already pays for the OpenMP team.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 12;

// exp(-g). Float's exp_approx clamps its own argument (at 88, bit-wise so that the loop still
// vectorises); double's std::exp would overflow to inf below g = -709, and inf * 0 in the
// gradient would be NaN, so its argument is capped at 700.
template <class T>
T exp_minus(T g) {
  if constexpr (std::is_same_v<T, double>) {
    return exp_approx(std::min(-g, 700.0));
  } else {
    return exp_approx(-g);
  }
}

template <class T>
OASES_VECTOR_CLONES void swiglu_forward_row(const T* gate, const T* up, T* out, std::int64_t F) {
  for (std::int64_t j = 0; j < F; ++j) {
    const T g = gate[j];
    out[j] = g / (T(1) + exp_minus(g)) * up[j];
  }
}

template <class T>
OASES_VECTOR_CLONES void swiglu_backward_row(const T* gate, const T* up, const T* dout, T* dgate,
                                             T* dup, std::int64_t F) {
  for (std::int64_t j = 0; j < F; ++j) {
    const T g = gate[j];
    const T e = exp_minus(g);
    const T s = T(1) / (T(1) + e);
    // 1 - s written as e * s: no cancellation when s is close to 1.
    dgate[j] = dout[j] * up[j] * s * (T(1) + g * (e * s));
    dup[j] = dout[j] * (g * s);
  }
}

void check_shape(const char* what, std::int64_t n, std::int64_t F, std::int64_t ld_in,
                 std::int64_t ld_out, std::int64_t ld_grad) {
  OASES_ASSERT(n >= 0 && F >= 0, "{}: negative size n={} F={}", what, n, F);
  OASES_ASSERT(ld_in >= F && ld_out >= F && ld_grad >= F,
               "{}: row strides ld_in={} ld_out={} ld_grad={} must be >= F={}", what, ld_in, ld_out,
               ld_grad, F);
}

}  // namespace

template <class T>
void swiglu_forward(const T* gate, const T* up, std::int64_t ld_in, T* out, std::int64_t ld_out,
                    std::int64_t n, std::int64_t F, Threads threads) {
  check_shape("swiglu_forward", n, F, ld_in, ld_out, F);
  for_each_index(n, threads, n * F >= kMinParallelWork, [&](std::int64_t i) {
    swiglu_forward_row(gate + i * ld_in, up + i * ld_in, out + i * ld_out, F);
  });
}

template <class T>
void swiglu_backward(const T* gate, const T* up, std::int64_t ld_in, const T* dout,
                     std::int64_t ld_out, T* dgate, T* dup, std::int64_t ld_grad, std::int64_t n,
                     std::int64_t F, Threads threads) {
  check_shape("swiglu_backward", n, F, ld_in, ld_out, ld_grad);
  for_each_index(n, threads, n * F >= kMinParallelWork, [&](std::int64_t i) {
    swiglu_backward_row(gate + i * ld_in, up + i * ld_in, dout + i * ld_out, dgate + i * ld_grad,
                        dup + i * ld_grad, F);
  });
}

#define OASES_INSTANTIATE(T)                                                                     \
  template void swiglu_forward<T>(const T*, const T*, std::int64_t, T*, std::int64_t,            \
                                  std::int64_t, std::int64_t, Threads);                          \
  template void swiglu_backward<T>(const T*, const T*, std::int64_t, const T*, std::int64_t, T*, \
                                   T*, std::int64_t, std::int64_t, std::int64_t, Threads);
OASES_INSTANTIATE(float)
OASES_INSTANTIATE(double)
#undef OASES_INSTANTIATE

}  // namespace oases::kernels::cpu
