#include "kernels/cpu/gelu.h"

#include "core/error.h"

#include <cmath>
#include <cstdint>

namespace oases::kernels::cpu {
namespace {

// tanh is far dearer than an add, so a smaller batch already pays for the OpenMP team.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 12;
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;

}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n) {
  OASES_ASSERT(n >= 0, "gelu_forward: negative size {}", n);
  const T k = static_cast<T>(kSqrt2OverPi);
  const T c = static_cast<T>(kCubic);
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T inner = k * (v + c * v * v * v);
    y[i] = T(0.5) * v * (T(1) + std::tanh(inner));
  }
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n) {
  OASES_ASSERT(n >= 0, "gelu_backward: negative size {}", n);
  const T k = static_cast<T>(kSqrt2OverPi);
  const T c = static_cast<T>(kCubic);
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T v2 = v * v;
    const T t = std::tanh(k * (v + c * v2 * v));
    // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2)
    const T slope = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * k * (T(1) + T(3) * c * v2);
    dx[i] = dy[i] * slope;
  }
}

template void gelu_forward<float>(const float*, float*, std::int64_t);
template void gelu_forward<double>(const double*, double*, std::int64_t);
template void gelu_backward<float>(const float*, const float*, float*, std::int64_t);
template void gelu_backward<double>(const double*, const double*, double*, std::int64_t);

}  // namespace oases::kernels::cpu
