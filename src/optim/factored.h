// What Adafactor and SM3 share: a parameter of two or more dimensions seen as a stack of
// matrices over its last two dimensions, [batch, rows, cols], with one statistic per row
// ("_row" state, shaped like the parameter without its last dimension) and one per column
// ("_col" state, without the dimension before it); and where a shard's rows and columns sit in
// the whole parameter.
#pragma once

#include "optim/flat_layout.h"
#include "optim/optimizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oases::optim {

// A slot of >= 2 dimensions as [batch, rows, cols] (this rank's shard).
struct MatrixShape {
  std::int64_t batch = 1, rows = 0, cols = 0;
  // Rows of the flattened [batch * rows, cols] shard that the whole parameter has: a prefix
  // (ParamSlot::padding is trailing).
  std::int64_t valid_rows = 0;
  // The whole parameter's rows and columns: the divisors of column and row means.
  std::int64_t full_rows = 0, full_cols = 0;
  // Other ranks hold other columns (row statistics are partial) / other rows (column
  // statistics and sums over rows are partial).
  bool split_cols = false, split_rows = false;

  std::int64_t row_count() const { return batch * rows; }  // row statistics
  std::int64_t col_count() const { return batch * cols; }  // column statistics
};

// True for slots Adafactor and SM3 factor (two or more dimensions).
inline bool is_factored(const ParamSlot& slot) {
  return slot.shape.size() >= 2;
}

// REQUIRES: is_factored(slot).
MatrixShape matrix_shape(const ParamSlot& slot);

// Elements of the slot that the whole parameter has (numel - padding).
inline std::int64_t valid_numel(const ParamSlot& slot) {
  return slot.numel() - slot.padding;
}

// The "<kind>_row.<param>" and "<kind>_col.<param>" state tensors of a factored slot, with
// null views of their shapes.
std::vector<StateTensor> factored_state_layout(const ParamSlot& slot, const std::string& kind,
                                               DType dtype);

}  // namespace oases::optim
