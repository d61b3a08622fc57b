// FlatLayout: where each parameter this rank updates lives in the flat parameter array.
//
// Parameters, gradients and everything an optimizer keeps per element are indexed by the same
// element offsets, so that an optimizer step, gradient clipping, ZeRO's partition of the
// state and a checkpoint are all ranges of one array (docs/architecture.md, "Tensors, buffers
// and the flat parameter layout").
//
//   flat array:  | p0 ........ | pad | p1 .... | p2 .............. | pad |
//                ^ p0.offset         ^ p1.offset                         ^ total_numel
//
// Invariants (checked by validate_layout; a violation is a bug in whoever built the layout):
//   - params are in ascending offset order and do not overlap;
//   - every param lies inside [0, total_numel);
//   - names are non-empty and unique (they name checkpoint tensors);
//   - shapes have at most Shape::kMaxDims non-negative dimensions;
//   - dtype is f32 or f64 (the precisions optimizer kernels exist for; docs/precision.md:
//     master weights and optimizer state are fp32, fp64 in fp64 runs);
//   - a slot's whole-parameter geometry (full_shape, split_dim, padding) is consistent with
//     its shape (see ParamSlot).
// Gaps between params are alignment padding: no optimizer reads or writes them.
#pragma once

#include "core/dtype.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace oases::optim {

// One parameter, or this rank's shard of it, in the flat arrays.
//
// Element-wise optimizers (AdamW, SGD) need only the first four fields. Optimizers whose
// statistics span a parameter (Adafactor's row and column means and update RMS, SM3's row and
// column maxima) also need where the shard sits in the whole parameter:
//   full_shape  the whole parameter's shape; empty means `shape` (the slot holds it whole).
//               Same number of dimensions as `shape`; equal to it in every dimension but
//               split_dim, and but dim 0 when there is padding.
//   split_dim   the dimension along which other ranks hold the rest of the parameter (0 or
//               shape.size() - 1), or -1 when no other rank holds a different part (the slot
//               is whole, or a replica of the whole). The ranks holding the other parts are
//               the parameter's shard group (see optim/shard_reducer.h).
//   padding     trailing elements of the shard that the whole parameter does not have, a
//               whole number of dim-0 entries (the zero rows that pad a vocabulary to a
//               multiple of the tensor-parallel degree). Gradients there are zero; optimizers
//               leave them out of every statistic and keep them at zero.
struct ParamSlot {
  std::string name;                 // e.g. "h.3.attn.c_attn.weight" (the checkpoint name)
  std::int64_t offset = 0;          // element offset of the first element
  std::vector<std::int64_t> shape;  // this rank's shard, row-major
  bool weight_decay = false;        // true for matrices, false for biases and norm weights
  std::vector<std::int64_t> full_shape = {};  // empty: shape
  int split_dim = -1;
  std::int64_t padding = 0;

  // Product of the shape (1 for a scalar).
  std::int64_t numel() const;
  std::int64_t end() const { return offset + numel(); }
  // The whole parameter's shape (full_shape, or shape when full_shape is empty) and its
  // element count.
  const std::vector<std::int64_t>& whole_shape() const {
    return full_shape.empty() ? shape : full_shape;
  }
  std::int64_t whole_numel() const;
};

struct FlatLayout {
  std::vector<ParamSlot> params;  // ascending offsets, no overlaps
  std::int64_t total_numel = 0;   // length of the flat arrays, padding included
  DType dtype = DType::f32;       // of parameters, gradients and optimizer state

  // Elements that belong to some parameter: total_numel minus padding.
  std::int64_t param_numel() const;
};

// Throws InternalError naming the first broken invariant listed above.
void validate_layout(const FlatLayout& layout);

// Calls visit(index, begin, end) for every parameter params[index] that shares elements with
// the flat range [begin, end), in ascending order, with [begin, end) narrowed to that
// intersection (never empty). A range may start or end inside a parameter: that parameter
// is visited for its part inside the range. Padding is never visited.
// REQUIRES: layout is valid; 0 <= begin <= end <= total_numel.
template <class Visit>
void for_each_param_slice(const FlatLayout& layout, std::int64_t begin, std::int64_t end,
                          Visit&& visit) {
  const auto& params = layout.params;
  // Parameters are sorted, so the first one reaching past `begin` is found by bisection;
  // a ZeRO rank stepping its own short range does not walk the whole model.
  auto it = std::partition_point(params.begin(), params.end(),
                                 [begin](const ParamSlot& p) { return p.end() <= begin; });
  for (; it != params.end() && it->offset < end; ++it) {
    const std::int64_t lo = std::max(begin, it->offset);
    const std::int64_t hi = std::min(end, it->end());
    if (lo < hi) visit(static_cast<std::size_t>(it - params.begin()), lo, hi);
  }
}

}  // namespace oases::optim
