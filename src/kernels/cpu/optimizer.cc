#include "kernels/cpu/optimizer.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace oases::kernels::cpu {
namespace {

// Below this many elements the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

// sum_of_squares splits its input into at most kMaxBlocks blocks of at least kMinBlock
// elements. The split depends on n alone, never on the thread count, so the sum is formed
// in one fixed order; the block partials live on the stack (no allocation per call).
constexpr std::int64_t kMaxBlocks = 256;
constexpr std::int64_t kMinBlock = std::int64_t{1} << 14;

template <class T>
double block_sum_of_squares(const T* x, std::int64_t begin, std::int64_t end) {
  // Eight interleaved accumulators let the loop vectorise without reassociating a single sum.
  constexpr std::int64_t kLanes = 8;
  double lanes[kLanes] = {};
  std::int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    for (std::int64_t j = 0; j < kLanes; ++j) {
      const double v = static_cast<double>(x[i + j]);
      lanes[j] += v * v;
    }
  }
  for (; i < end; ++i) {
    const double v = static_cast<double>(x[i]);
    lanes[0] += v * v;
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, std::int64_t n, const AdamWStep& hp) {
  OASES_ASSERT(n >= 0, "adamw_update: negative size {}", n);
  OASES_ASSERT(hp.step >= 1, "adamw_update: step is 1-based, got {}", hp.step);
  OASES_ASSERT(hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1,
               "adamw_update: betas must be in [0, 1), got ({}, {})", hp.beta1, hp.beta2);
  OASES_ASSERT(hp.lr >= 0 && hp.eps >= 0 && hp.weight_decay >= 0,
               "adamw_update: lr={} eps={} weight_decay={} must be non-negative", hp.lr, hp.eps,
               hp.weight_decay);
  // Scalars are formed in double, as PyTorch forms them from Python floats, then rounded once.
  const double step = static_cast<double>(hp.step);
  const double bias_correction1 = 1.0 - std::pow(hp.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(hp.beta2, step);
  const bool decay = hp.weight_decay != 0.0;
  const T decay_factor = static_cast<T>(1.0 - hp.lr * hp.weight_decay);
  const T m_weight = static_cast<T>(1.0 - hp.beta1);
  const T beta2 = static_cast<T>(hp.beta2);
  const T v_weight = static_cast<T>(1.0 - hp.beta2);
  const T step_size = static_cast<T>(hp.lr / bias_correction1);
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T eps = static_cast<T>(hp.eps);
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    T p = param[i];
    if (decay) p *= decay_factor;
    // m.lerp_(g, 1 - beta1): PyTorch's lerp form for a weight below one half.
    const T mi = m[i] + m_weight * (g - m[i]);
    const T vi = v[i] * beta2 + v_weight * g * g;
    const T denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - step_size * (mi / denom);
  }
}

template <class T>
void sgd_update(T* param, const T* grad, T* momentum_buffer, std::int64_t n, const SgdStep& hp) {
  OASES_ASSERT(n >= 0, "sgd_update: negative size {}", n);
  OASES_ASSERT(hp.lr >= 0 && hp.weight_decay >= 0 && hp.momentum >= 0 && hp.momentum < 1,
               "sgd_update: lr={} weight_decay={} must be >= 0 and momentum={} in [0, 1)", hp.lr,
               hp.weight_decay, hp.momentum);
  OASES_ASSERT(hp.momentum == 0 || momentum_buffer != nullptr,
               "sgd_update: momentum {} without a buffer", hp.momentum);
  OASES_ASSERT(!hp.nesterov || hp.momentum > 0, "sgd_update: nesterov without momentum");
  const bool decay = hp.weight_decay != 0.0;
  const bool momentum = hp.momentum != 0.0;
  const T weight_decay = static_cast<T>(hp.weight_decay);
  const T mu = static_cast<T>(hp.momentum);
  const T minus_lr = static_cast<T>(-hp.lr);
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const T p = param[i];
    T d = grad[i];
    if (decay) d = d + weight_decay * p;
    if (momentum) {
      const T buf = momentum_buffer[i] * mu + d;
      momentum_buffer[i] = buf;
      d = hp.nesterov ? d + mu * buf : buf;
    }
    param[i] = p + minus_lr * d;
  }
}

template <class T>
double sum_of_squares(const T* x, std::int64_t n) {
  OASES_ASSERT(n >= 0, "sum_of_squares: negative size {}", n);
  if (n == 0) return 0.0;
  const std::int64_t blocks = std::clamp<std::int64_t>(n / kMinBlock, 1, kMaxBlocks);
  const std::int64_t block_len = (n + blocks - 1) / blocks;
  double partial[kMaxBlocks];
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = std::min(n, b * block_len);
    const std::int64_t end = std::min(n, begin + block_len);
    partial[b] = block_sum_of_squares(x, begin, end);
  }
  double total = 0;
  for (std::int64_t b = 0; b < blocks; ++b) total += partial[b];
  return total;
}

template <class T>
void scale_in_place(T* x, std::int64_t n, T factor, Threads threads) {
  OASES_ASSERT(n >= 0, "scale_in_place: negative size {}", n);
  for_each_index(n, threads, n >= kMinParallelWork, [&](std::int64_t i) { x[i] *= factor; });
}

double clip_coefficient(double total_norm, double max_norm) {
  const double coefficient = max_norm / (total_norm + 1e-6);
  // Written so that a NaN norm yields NaN, as torch.clamp(coef, max=1) does; std::min would
  // hide it behind 1.
  return coefficient > 1.0 ? 1.0 : coefficient;
}

template void adamw_update<float>(float*, const float*, float*, float*, std::int64_t,
                                  const AdamWStep&);
template void adamw_update<double>(double*, const double*, double*, double*, std::int64_t,
                                   const AdamWStep&);
template void sgd_update<float>(float*, const float*, float*, std::int64_t, const SgdStep&);
template void sgd_update<double>(double*, const double*, double*, std::int64_t, const SgdStep&);
template double sum_of_squares<float>(const float*, std::int64_t);
template double sum_of_squares<double>(const double*, std::int64_t);
template void scale_in_place<float>(float*, std::int64_t, float, Threads);
template void scale_in_place<double>(double*, std::int64_t, double, Threads);

}  // namespace oases::kernels::cpu
