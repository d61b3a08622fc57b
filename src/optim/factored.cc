#include "optim/factored.h"

#include "core/error.h"

namespace oases::optim {

MatrixShape matrix_shape(const ParamSlot& slot) {
  OASES_ASSERT(is_factored(slot), "parameter {} has {} dimensions; factoring needs two or more",
               slot.name, slot.shape.size());
  const std::size_t n = slot.shape.size();
  MatrixShape m;
  for (std::size_t d = 0; d + 2 < n; ++d) m.batch *= slot.shape[d];
  m.rows = slot.shape[n - 2];
  m.cols = slot.shape[n - 1];
  m.valid_rows = m.cols == 0 ? 0 : valid_numel(slot) / m.cols;
  const std::vector<std::int64_t>& whole = slot.whole_shape();
  m.full_rows = whole[n - 2];
  m.full_cols = whole[n - 1];
  const int last = static_cast<int>(n) - 1;
  m.split_cols = slot.split_dim == last;
  m.split_rows = slot.split_dim == last - 1;
  return m;
}

std::vector<StateTensor> factored_state_layout(const ParamSlot& slot, const std::string& kind,
                                               DType dtype) {
  const int n = static_cast<int>(slot.shape.size());
  std::vector<std::int64_t> row_shape(slot.shape.begin(), slot.shape.end() - 1);
  std::vector<std::int64_t> col_shape = slot.shape;
  col_shape.erase(col_shape.end() - 2);
  return {{kind + "_row." + slot.name, slot.name, Tensor(nullptr, dtype, Shape(row_shape)), false,
           n - 1},
          {kind + "_col." + slot.name, slot.name, Tensor(nullptr, dtype, Shape(col_shape)), false,
           n - 2}};
}

}  // namespace oases::optim
