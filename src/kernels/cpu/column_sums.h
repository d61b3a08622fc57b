// Shared by the kernels that reduce a gradient over rows (bias gradients).
#pragma once

#include <algorithm>
#include <cstdint>

namespace oases::kernels::cpu {

// out[c] += sum_r a[r, c] for a row-major [rows, cols] matrix with row stride ld >= cols. Each
// thread owns whole column tiles and walks the rows in order, so every sum is formed in the
// same order whatever the thread count; the partial sums are kept in double so a long batch
// does not lose precision. The elements may be of a storage type (BFloat16, Float16) that
// converts to float; out is then float (the sum rounded to float and added).
template <class T, class Out>
void accumulate_column_sums(const T* a, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                            Out* out) {
  constexpr std::int64_t kTile = 16;
  constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;
  const std::int64_t tiles = (cols + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (rows * cols >= kMinParallelWork)
  for (std::int64_t tile = 0; tile < tiles; ++tile) {
    const std::int64_t c0 = tile * kTile;
    const std::int64_t width = std::min(kTile, cols - c0);
    double acc[kTile] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = a + r * ld + c0;
      for (std::int64_t j = 0; j < width; ++j) acc[j] += static_cast<double>(row[j]);
    }
    for (std::int64_t j = 0; j < width; ++j) out[c0 + j] += static_cast<Out>(acc[j]);
  }
}

// The same over a contiguous matrix (ld = cols).
template <class T, class Out>
void accumulate_column_sums(const T* a, std::int64_t rows, std::int64_t cols, Out* out) {
  accumulate_column_sums(a, rows, cols, cols, out);
}

}  // namespace oases::kernels::cpu
