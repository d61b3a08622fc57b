#include "kernels/cpu/cached_attention.h"

#include "core/error.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace oases::kernels::cpu {

using std::int64_t;

constexpr int64_t kParallelWork = int64_t{1} << 16;

template <class T>
void cached_attention_forward(const T* qkv, int64_t ld_qkv, T* keys, T* values, T* out,
                              int64_t ld_out, const CachedAttentionShape& s) {
  const int64_t hd = s.head_dim, H = s.heads, G = s.kv_heads;
  OASES_ASSERT(s.rows >= 0 && s.past >= 0 && s.past + s.rows <= s.capacity && hd > 0 && G > 0 &&
                   H % G == 0 && ld_qkv >= (H + 2 * G) * hd && ld_out >= H * hd,
               "cached attention: {} rows after {} of {}, heads {}/{} of {}, strides {} {}",
               s.rows, s.past, s.capacity, H, G, hd, ld_qkv, ld_out);
  if (s.rows == 0) return;
  for (int64_t i = 0; i < s.rows; ++i) {
    const T* row = qkv + i * ld_qkv;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t slot = (g * s.capacity + s.past + i) * hd;
      std::copy_n(row + (H + g) * hd, hd, keys + slot);
      std::copy_n(row + (H + G + g) * hd, hd, values + slot);
    }
  }
  const int64_t group = H / G, tasks = s.rows * H;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  // One scores row per thread, allocated before the parallel region so that nothing inside it
  // can throw.
  const int threads = std::max(1, omp_get_max_threads());
  std::vector<T> scratch(static_cast<std::size_t>(threads * s.capacity));
  // A decoding step is a few thousand multiply-adds per head, less than waking the thread
  // team costs on a busy machine; threads pay from about a prefill's worth of work on.
  const int64_t work = tasks * (s.past + s.rows) * hd;
#pragma omp parallel for schedule(static) if (work >= kParallelWork)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t i = task / H, h = task % H, g = h / group, length = s.past + i + 1;
    T* scores = scratch.data() + static_cast<int64_t>(omp_get_thread_num()) * s.capacity;
    const T* q = qkv + i * ld_qkv + h * hd;
    const T* k = keys + g * s.capacity * hd;
    const T* v = values + g * s.capacity * hd;
    T top = -std::numeric_limits<T>::infinity();
    for (int64_t t = 0; t < length; ++t) {
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < hd; ++d) dot += q[d] * k[t * hd + d];
      scores[t] = dot * scale;
      top = std::max(top, scores[t]);
    }
    T total = 0;
    for (int64_t t = 0; t < length; ++t) {
      scores[t] = std::exp(scores[t] - top);
      total += scores[t];
    }
    T* o = out + i * ld_out + h * hd;
    std::fill_n(o, hd, T(0));
    for (int64_t t = 0; t < length; ++t) {
      const T p = scores[t];
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) o[d] += p * v[t * hd + d];
    }
    const T inverse = T(1) / total;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) o[d] *= inverse;
  }
}

template void cached_attention_forward<float>(const float*, int64_t, float*, float*, float*,
                                              int64_t, const CachedAttentionShape&);
template void cached_attention_forward<double>(const double*, int64_t, double*, double*, double*,
                                               int64_t, const CachedAttentionShape&);

}  // namespace oases::kernels::cpu
