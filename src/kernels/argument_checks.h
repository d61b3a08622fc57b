// Shape checks the kernel dispatchers (kernels.cc, half_kernels.cc) share. Failures are bugs in
// the caller (InternalError).
#pragma once

#include "core/error.h"
#include "core/tensor.h"

#include <cstdint>
#include <initializer_list>

namespace oases::kernels::detail {

// Every non-empty tensor is contiguous.
inline void check_contiguous(const char* what, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    OASES_ASSERT(t->empty() || t->is_contiguous(), "{}: a strided {} argument", what,
                 t->shape().str());
}

// m is a [rows, cols] matrix.
inline void check_matrix(const char* what, const Tensor& m, std::int64_t rows, std::int64_t cols) {
  OASES_ASSERT(m.ndim() == 2 && m.dim(0) == rows && m.dim(1) == cols,
               "{}: expected a [{}, {}] matrix, got {}", what, rows, cols, m.shape().str());
}

}  // namespace oases::kernels::detail
