#include "kernels/cpu/rotary.h"

#include "core/error.h"

#include <cmath>
#include <cstdint>

namespace oases::kernels::cpu {
namespace {

// Below this many elements the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

// One head: x1 = x[:half], x2 = x[half:]; sign = -1 rotates by -angle.
template <class T>
void rotate_head(T* x, std::int64_t half, const T* cos, const T* sin, T sign) {
  T* x1 = x;
  T* x2 = x + half;
#pragma omp simd
  for (std::int64_t i = 0; i < half; ++i) {
    const T c = cos[i], s = sign * sin[i];
    const T a = x1[i], b = x2[i];
    x1[i] = a * c - b * s;
    x2[i] = b * c + a * s;
  }
}

}  // namespace

std::vector<double> rotary_inverse_frequencies(std::int64_t head_dim, double theta) {
  OASES_ASSERT(head_dim > 0 && head_dim % 2 == 0,
               "rotary_inverse_frequencies: head_dim={} (must be even)", head_dim);
  OASES_ASSERT(theta > 0, "rotary_inverse_frequencies: theta must be positive, got {}", theta);
  std::vector<double> inv_freq(static_cast<std::size_t>(head_dim / 2));
  for (std::size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  return inv_freq;
}

template <class T>
void rotary_tables(std::int64_t seq, std::span<const double> inv_freq, T* cos, T* sin) {
  OASES_ASSERT(seq >= 0 && !inv_freq.empty(), "rotary_tables: seq={} with {} frequencies", seq,
               inv_freq.size());
  const auto half = static_cast<std::int64_t>(inv_freq.size());
#pragma omp parallel for schedule(static) if (seq * half >= kMinParallelWork / 8)
  for (std::int64_t t = 0; t < seq; ++t) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv_freq[static_cast<std::size_t>(i)];
      cos[t * half + i] = static_cast<T>(std::cos(angle));
      sin[t * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

template <class T>
void rotary_apply(T* x, std::int64_t ld, std::int64_t B, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, const T* cos, const T* sin, bool inverse,
                  Threads threads) {
  OASES_ASSERT(B >= 0 && seq >= 0 && heads >= 0 && head_dim > 0 && head_dim % 2 == 0,
               "rotary_apply: B={} seq={} heads={} head_dim={} (head_dim must be even)", B, seq,
               heads, head_dim);
  OASES_ASSERT(ld >= heads * head_dim, "rotary_apply: row stride {} < heads * head_dim = {}", ld,
               heads * head_dim);
  const std::int64_t half = head_dim / 2;
  const std::int64_t rows = B * seq;
  const T sign = inverse ? T(-1) : T(1);
  for_each_index(rows, threads, rows * heads * head_dim >= kMinParallelWork, [&](std::int64_t row) {
    const std::int64_t t = row % seq;
    T* xr = x + row * ld;
    for (std::int64_t h = 0; h < heads; ++h)
      rotate_head(xr + h * head_dim, half, cos + t * half, sin + t * half, sign);
  });
}

template void rotary_tables<float>(std::int64_t, std::span<const double>, float*, float*);
template void rotary_tables<double>(std::int64_t, std::span<const double>, double*, double*);
template void rotary_apply<float>(float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                  std::int64_t, const float*, const float*, bool, Threads);
template void rotary_apply<double>(double*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                   std::int64_t, const double*, const double*, bool, Threads);

}  // namespace oases::kernels::cpu
