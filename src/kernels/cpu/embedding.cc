#include "kernels/cpu/embedding.h"

#include "core/error.h"

#include <omp.h>

#include <cstdint>

namespace oases::kernels::cpu {
namespace {

// Below this many elements the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

}  // namespace

template <class T>
void embedding_forward(const std::int32_t* tokens, const T* wte, const T* wpe, T* out,
                       std::int64_t B, std::int64_t seq, std::int64_t C, VocabRange range) {
  OASES_ASSERT(B >= 0 && seq >= 0 && C >= 0, "embedding_forward: negative size B={} seq={} C={}", B,
               seq, C);
  const std::int64_t rows = B * seq;
#pragma omp parallel for schedule(static) if (rows * C >= kMinParallelWork)
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t t = row % seq;
    const std::int64_t token = tokens[row];
    T* dst = out + row * C;
    if (token >= range.begin && token < range.end) {
      const T* token_row = wte + (token - range.begin) * C;
      for (std::int64_t c = 0; c < C; ++c) dst[c] = token_row[c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) dst[c] = T(0);
    }
    if (wpe != nullptr) {
      const T* position_row = wpe + t * C;
      for (std::int64_t c = 0; c < C; ++c) dst[c] += position_row[c];
    }
  }
}

template <class T>
void embedding_backward(const T* dout, const std::int32_t* tokens, T* dwte, T* dwpe, std::int64_t B,
                        std::int64_t seq, std::int64_t C, VocabRange range) {
  OASES_ASSERT(B >= 0 && seq >= 0 && C >= 0, "embedding_backward: negative size B={} seq={} C={}",
               B, seq, C);
  const std::int64_t rows = B * seq;
  // A token can repeat anywhere in the batch, so rows cannot be split between threads without
  // two threads adding to one dwte row. Splitting the columns instead keeps every element's
  // additions in row order, which makes the result independent of the thread count too.
#pragma omp parallel if (rows * C >= kMinParallelWork)
  {
    const std::int64_t threads = omp_get_num_threads();
    const std::int64_t thread = omp_get_thread_num();
    const std::int64_t c0 = C * thread / threads;
    const std::int64_t c1 = C * (thread + 1) / threads;
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t t = row % seq;
      const T* src = dout + row * C;
      const std::int64_t token = tokens[row];
      if (token >= range.begin && token < range.end) {
        T* token_grad = dwte + (token - range.begin) * C;
        for (std::int64_t c = c0; c < c1; ++c) token_grad[c] += src[c];
      }
      if (dwpe != nullptr) {
        T* position_grad = dwpe + t * C;
        for (std::int64_t c = c0; c < c1; ++c) position_grad[c] += src[c];
      }
    }
  }
}

template <class T>
void embedding_accumulate(const std::int32_t* ids, const T* table, T* out, std::int64_t B,
                          std::int64_t seq, std::int64_t C) {
  OASES_ASSERT(B >= 0 && seq >= 0 && C >= 0, "embedding_accumulate: negative size B={} seq={} C={}",
               B, seq, C);
  const std::int64_t rows = B * seq;
#pragma omp parallel for schedule(static) if (rows * C >= kMinParallelWork)
  for (std::int64_t row = 0; row < rows; ++row) {
    const T* src = table + static_cast<std::int64_t>(ids[row]) * C;
    T* dst = out + row * C;
    for (std::int64_t c = 0; c < C; ++c) dst[c] += src[c];
  }
}

template <class T>
void embedding_accumulate_backward(const T* dout, const std::int32_t* ids, T* dtable,
                                   std::int64_t B, std::int64_t seq, std::int64_t C) {
  // The token-table half of embedding_backward: same scatter-add, same column split.
  embedding_backward(dout, ids, dtable, static_cast<T*>(nullptr), B, seq, C);
}

template void embedding_forward<float>(const std::int32_t*, const float*, const float*, float*,
                                       std::int64_t, std::int64_t, std::int64_t, VocabRange);
template void embedding_forward<double>(const std::int32_t*, const double*, const double*, double*,
                                        std::int64_t, std::int64_t, std::int64_t, VocabRange);
template void embedding_backward<float>(const float*, const std::int32_t*, float*, float*,
                                        std::int64_t, std::int64_t, std::int64_t, VocabRange);
template void embedding_backward<double>(const double*, const std::int32_t*, double*, double*,
                                         std::int64_t, std::int64_t, std::int64_t, VocabRange);
template void embedding_accumulate<float>(const std::int32_t*, const float*, float*, std::int64_t,
                                          std::int64_t, std::int64_t);
template void embedding_accumulate<double>(const std::int32_t*, const double*, double*,
                                           std::int64_t, std::int64_t, std::int64_t);
template void embedding_accumulate_backward<float>(const float*, const std::int32_t*, float*,
                                                   std::int64_t, std::int64_t, std::int64_t);
template void embedding_accumulate_backward<double>(const double*, const std::int32_t*, double*,
                                                    std::int64_t, std::int64_t, std::int64_t);

}  // namespace oases::kernels::cpu
