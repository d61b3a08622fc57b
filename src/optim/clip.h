// Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_ (docs/models.md,
// "Reference semantics"): with norm = sqrt(sum of every gradient element squared) over the
// whole model, every gradient is multiplied by clip_coefficient(norm, max_norm).
//
// The pieces are separate because the norm is global and the caller alone knows the
// parallel layout: which of its elements a rank counts (a tensor-parallel shard, once per
// replica group), and which groups sum the partial sums. A single process does:
//   double squares = 0;
//   for (const ParamSlot& p : layout.params)
//     squares += sum_of_squares(grads, p.offset, p.end());
//   const double norm = std::sqrt(squares);
//   scale(grads, clip_coefficient(norm, max_norm));
//
// Functions take flat f32 or f64 tensors (any shape; elements indexed in memory order); any
// other dtype is an InternalError.
#pragma once

#include "core/tensor.h"

#include <cstdint>

namespace oases::optim {

// sum of flat[i]^2 for i in [begin, end), accumulated in double. Deterministic: the same
// elements give the same bits regardless of the thread count (kernels::sum_of_squares).
// REQUIRES: 0 <= begin <= end <= flat.numel().
double sum_of_squares(Tensor flat, std::int64_t begin, std::int64_t end);

// flat[i] *= factor for every element, padding included. factor is rounded to the tensor's
// dtype once and every element is multiplied by that value, as PyTorch multiplies by a
// coefficient tensor of the gradients' dtype.
void scale(Tensor flat, double factor);

// The factor clip_grad_norm_ multiplies gradients by: min(1, max_norm / (total_norm + 1e-6)).
// A NaN total_norm gives NaN (as torch.clamp does), so scaling by it turns the gradients NaN
// rather than hiding a non-finite gradient; an infinite norm gives 0.
double clip_coefficient(double total_norm, double max_norm);

}  // namespace oases::optim
