#include "kernels/cpu/cross_entropy.h"

#include "core/error.h"
#include "kernels/cpu/fast_exp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace oases::kernels::cpu {
namespace {

using std::int64_t;

// Checked before any parallel region, where an exception could not propagate. Targets come
// from the data loader, which validates them against the vocabulary; one at or past V here
// is an engine bug. Negative targets mark ignored rows.
void check_arguments(const std::int32_t* targets, int64_t n, int64_t V, int64_t ld) {
  OASES_ASSERT(n >= 0 && V > 0 && ld >= V, "cross-entropy shapes: n={} V={} ld={}", n, V, ld);
  for (int64_t i = 0; i < n; ++i) {
    OASES_ASSERT(targets[i] < V,
                 "cross-entropy target {} of row {} is outside the vocabulary [0, {})", targets[i],
                 i, V);
  }
}

bool ignored(std::int32_t target) {
  return target < 0;
}

template <class T>
OASES_VECTOR_CLONES T row_max(const T* x, int64_t V) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < V; ++j) m = m > x[j] ? m : x[j];
  return m;
}

// sum_j exp(x[j] - m) over a row, in double; with kStore each term is also written to
// terms[j] (which may be x itself).
//
// A float running sum over ~50k terms of size <= 1 would lose most of the small terms'
// bits, but a double accumulator inside the vector loop keeps GCC from vectorising it at
// the baseline ISA (mixed float/double lanes). So the row is summed in chunks: each chunk
// in float across the vector lanes (a handful of terms per lane, error ~1e-7 relative),
// the chunk totals in double.
template <bool kStore, class T>
OASES_VECTOR_CLONES double sum_exp(const T* x, T* terms, int64_t V, T m) {
  constexpr int64_t kChunk = 128;
  double sum = 0;
  for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
    const int64_t j1 = std::min(V, j0 + kChunk);
    T partial = 0;
#pragma omp simd reduction(+ : partial)
    for (int64_t j = j0; j < j1; ++j) {
      const T e = exp_approx(x[j] - m);
      if constexpr (kStore) terms[j] = e;
      partial += e;
    }
    sum += static_cast<double>(partial);
  }
  return sum;
}

template <class T>
OASES_VECTOR_CLONES void scale_row(T* x, int64_t V, T factor) {
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) x[j] *= factor;
}

}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, T* losses, int64_t n,
                           int64_t V, int64_t ld) {
  check_arguments(targets, n, V, ld);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if (ignored(targets[i])) {
      losses[i] = T(0);
      continue;
    }
    const T* x = logits + i * ld;
    const T m = row_max(x, V);
    const double sum = sum_exp<false>(x, static_cast<T*>(nullptr), V, m);
    losses[i] =
        static_cast<T>(std::log(sum) + static_cast<double>(m) - static_cast<double>(x[targets[i]]));
  }
}

template <class T>
void cross_entropy_forward_backward(T* logits, const std::int32_t* targets, T* losses, int64_t n,
                                    int64_t V, int64_t ld, T grad_scale) {
  check_arguments(targets, n, V, ld);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T* x = logits + i * ld;
    if (ignored(targets[i])) {
      losses[i] = T(0);
      std::fill(x, x + ld, T(0));
      continue;
    }
    const int64_t target = targets[i];
    const T m = row_max(x, V);
    const double target_logit = static_cast<double>(x[target]);
    // The exponentials go into the row itself: the second pass then rescales them instead
    // of evaluating exp again, and the row (200 KB at V = 50k floats) is still in cache.
    const double sum = sum_exp<true>(x, x, V, m);
    losses[i] = static_cast<T>(std::log(sum) + static_cast<double>(m) - target_logit);
    const T factor = static_cast<T>(static_cast<double>(grad_scale) / sum);
    scale_row(x, V, factor);
    x[target] -= grad_scale;
    std::fill(x + V, x + ld, T(0));
  }
}

template <class T>
void cross_entropy_shard_max(const T* logits, int64_t n, int64_t V, int64_t ld, T* row_max_out) {
  OASES_ASSERT(n >= 0 && V > 0 && ld >= V, "cross-entropy shard shapes: n={} V={} ld={}", n, V, ld);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) row_max_out[i] = row_max(logits + i * ld, V);
}

template <class T>
void cross_entropy_shard_sums(const T* logits, const std::int32_t* targets, int64_t vocab_begin,
                              const T* row_max_in, int64_t n, int64_t V, int64_t ld, T* sum_exp_out,
                              T* target_logit) {
  OASES_ASSERT(n >= 0 && V > 0 && ld >= V, "cross-entropy shard shapes: n={} V={} ld={}", n, V, ld);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if (ignored(targets[i])) {
      sum_exp_out[i] = T(0);
      target_logit[i] = T(0);
      continue;
    }
    const T* x = logits + i * ld;
    sum_exp_out[i] = static_cast<T>(sum_exp<false>(x, static_cast<T*>(nullptr), V, row_max_in[i]));
    const int64_t local = static_cast<int64_t>(targets[i]) - vocab_begin;
    target_logit[i] = local >= 0 && local < V ? x[local] : T(0);
  }
}

template <class T>
void cross_entropy_shard_finish(T* logits, const std::int32_t* targets, int64_t vocab_begin,
                                const T* row_max_in, const T* sum_exp_in, const T* target_logit,
                                int64_t n, int64_t V, int64_t ld, T grad_scale, T* losses,
                                bool gradient) {
  OASES_ASSERT(n >= 0 && V > 0 && ld >= V, "cross-entropy shard shapes: n={} V={} ld={}", n, V, ld);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if (ignored(targets[i])) {
      losses[i] = T(0);
      if (gradient) std::fill(logits + i * ld, logits + (i + 1) * ld, T(0));
      continue;
    }
    const double sum = static_cast<double>(sum_exp_in[i]);
    losses[i] = static_cast<T>(std::log(sum) + static_cast<double>(row_max_in[i]) -
                               static_cast<double>(target_logit[i]));
    if (!gradient) continue;
    T* x = logits + i * ld;
    sum_exp<true>(x, x, V, row_max_in[i]);
    scale_row(x, V, static_cast<T>(static_cast<double>(grad_scale) / sum));
    const int64_t local = static_cast<int64_t>(targets[i]) - vocab_begin;
    if (local >= 0 && local < V) x[local] -= grad_scale;
    std::fill(x + V, x + ld, T(0));
  }
}

template void cross_entropy_forward<float>(const float*, const std::int32_t*, float*, int64_t,
                                           int64_t, int64_t);
template void cross_entropy_forward<double>(const double*, const std::int32_t*, double*, int64_t,
                                            int64_t, int64_t);
template void cross_entropy_forward_backward<float>(float*, const std::int32_t*, float*, int64_t,
                                                    int64_t, int64_t, float);
template void cross_entropy_forward_backward<double>(double*, const std::int32_t*, double*, int64_t,
                                                     int64_t, int64_t, double);

}  // namespace oases::kernels::cpu

namespace oases::kernels::cpu {
#define OASES_INSTANTIATE_SHARD(T)                                                              \
  template void cross_entropy_shard_max<T>(const T*, int64_t, int64_t, int64_t, T*);            \
  template void cross_entropy_shard_sums<T>(const T*, const std::int32_t*, int64_t, const T*,   \
                                            int64_t, int64_t, int64_t, T*, T*);                 \
  template void cross_entropy_shard_finish<T>(T*, const std::int32_t*, int64_t, const T*,       \
                                              const T*, const T*, int64_t, int64_t, int64_t, T, \
                                              T*, bool);
OASES_INSTANTIATE_SHARD(float)
OASES_INSTANTIATE_SHARD(double)
#undef OASES_INSTANTIATE_SHARD
}  // namespace oases::kernels::cpu
