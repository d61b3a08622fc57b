#include "optim/sm3.h"

#include "core/error.h"
#include "optim/factored.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace oases::optim {
namespace {

constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

}  // namespace

Sm3::Sm3(FlatLayout layout, const Sm3HyperParams& hyper, std::unique_ptr<ShardReducer> reducer,
         StateAllocator allocate)
    : Optimizer(std::move(layout), std::move(reducer), std::move(allocate)), hyper_(hyper) {
  OASES_ASSERT(
      hyper.momentum >= 0 && hyper.momentum < 1 && hyper.weight_decay >= 0 && hyper.eps >= 0,
      "SM3 momentum = {} must be in [0, 1), weight_decay = {} and eps = {} >= 0", hyper.momentum,
      hyper.weight_decay, hyper.eps);
  std::int64_t accumulators = 0, momentum = 0;
  for (const ParamSlot& p : this->layout().params) {
    accumulator_offsets_.push_back(accumulators);
    momentum_offsets_.push_back(momentum);
    if (is_factored(p)) {
      const MatrixShape m = matrix_shape(p);
      accumulators += m.row_count() + m.col_count();
    } else {
      accumulators += p.numel();
    }
    momentum += p.numel();
  }
  const std::size_t element = dtype_size(this->layout().dtype);
  accumulators_ = allocate_state(static_cast<std::size_t>(accumulators) * element);
  if (hyper_.momentum > 0) momentum_ = allocate_state(static_cast<std::size_t>(momentum) * element);
}

bool Sm3::accepts_cut(const ParamSlot& slot) const {
  return !is_factored(slot);
}

std::vector<StateTensor> Sm3::state_layout(const ParamSlot& slot) const {
  const DType dtype = layout().dtype;
  std::vector<StateTensor> out =
      is_factored(slot) ? factored_state_layout(slot, "accumulator", dtype)
                        : std::vector<StateTensor>{{"accumulator." + slot.name, slot.name,
                                                    Tensor(nullptr, dtype, Shape(slot.shape))}};
  if (hyper_.momentum > 0)
    out.push_back({"momentum." + slot.name, slot.name, Tensor(nullptr, dtype, Shape(slot.shape))});
  return out;
}

std::vector<StateTensor> Sm3::state_tensors() {
  std::vector<StateTensor> out;
  const FlatLayout& flat = layout();
  const std::size_t element = dtype_size(flat.dtype);
  for (std::size_t i = 0; i < flat.params.size(); ++i) {
    char* accumulator = static_cast<char*>(accumulators_.data()) +
                        static_cast<std::size_t>(accumulator_offsets_[i]) * element;
    for (StateTensor& s : state_layout(flat.params[i])) {
      char* at = accumulator;
      if (s.name.starts_with("momentum.")) {
        at = static_cast<char*>(momentum_.data()) +
             static_cast<std::size_t>(momentum_offsets_[i]) * element;
      } else {
        accumulator += s.view.nbytes();
      }
      s.view = Tensor(at, s.view.dtype(), s.view.shape());
      out.push_back(std::move(s));
    }
  }
  return out;
}

void Sm3::update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                 const StepInfo& info) {
  for_each_param_slice(layout(), begin, end, [&](std::size_t i, std::int64_t lo, std::int64_t hi) {
    const ParamSlot& p = layout().params[i];
    const bool f64 = layout().dtype == DType::f64;
    if (is_factored(p)) {
      OASES_ASSERT(lo == p.offset && hi == p.end(), "SM3 steps matrix {} only whole", p.name);
      if (f64)
        update_matrix<double>(i, params.data<double>() + lo, grads.data<double>() + lo, info);
      else
        update_matrix<float>(i, params.data<float>() + lo, grads.data<float>() + lo, info);
    } else if (f64) {
      update_vector<double>(i, lo - p.offset, params.data<double>() + lo, grads.data<double>() + lo,
                            hi - lo, info);
    } else {
      update_vector<float>(i, lo - p.offset, params.data<float>() + lo, grads.data<float>() + lo,
                           hi - lo, info);
    }
  });
}

template <class T>
void Sm3::update_vector(std::size_t index, std::int64_t first, T* param, const T* grad,
                        std::int64_t n, const StepInfo& info) {
  const ParamSlot& p = layout().params[index];
  T* accumulator = accumulators_.as<T>() + accumulator_offsets_[index] + first;
  T* momentum =
      hyper_.momentum > 0 ? momentum_.as<T>() + momentum_offsets_[index] + first : nullptr;
  const T mu = static_cast<T>(hyper_.momentum), weight = static_cast<T>(1.0 - hyper_.momentum);
  const T eps = static_cast<T>(hyper_.eps), lr = static_cast<T>(info.lr);
  const double decay_rate = p.weight_decay ? hyper_.weight_decay : 0.0;
  const T decay_factor = static_cast<T>(-decay_rate * info.lr);
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    const T nu = accumulator[i] + g * g;
    accumulator[i] = nu;
    T u = g / std::sqrt(nu + eps);
    if (momentum) {
      momentum[i] = momentum[i] * mu + weight * u;
      u = momentum[i];
    }
    T w = param[i];
    if (decay_rate != 0.0) w = w + decay_factor * w;
    param[i] = w - lr * u;
  }
}

template <class T>
void Sm3::update_matrix(std::size_t index, T* param, const T* grad, const StepInfo& info) {
  const ParamSlot& p = layout().params[index];
  const MatrixShape m = matrix_shape(p);
  T* rows = accumulators_.as<T>() + accumulator_offsets_[index];
  T* cols = rows + m.row_count();
  const std::int64_t width = m.cols, valid_rows = m.valid_rows;
  // nu of element (q, c) from the accumulators before this step.
  const auto nu_of = [&](std::int64_t q, std::int64_t c) -> T {
    const T g = grad[q * width + c];
    return std::min(rows[q], cols[(q / m.rows) * width + c]) + g * g;
  };
  // The new accumulators: maxima of nu over this rank's part of each row and column.
  new_rows_.assign(static_cast<std::size_t>(m.row_count()), 0.0);
  new_cols_.assign(static_cast<std::size_t>(m.col_count()), 0.0);
  for (std::int64_t q = 0; q < valid_rows; ++q) {
    double* col_max = new_cols_.data() + (q / m.rows) * width;
    double row_max = 0;
    for (std::int64_t c = 0; c < width; ++c) {
      const double nu = static_cast<double>(nu_of(q, c));
      row_max = std::max(row_max, nu);
      col_max[c] = std::max(col_max[c], nu);
    }
    new_rows_[static_cast<std::size_t>(q)] = row_max;
  }
  if (m.split_cols) reduce_over_shards(index, new_rows_, comm::ReduceOp::max);
  if (m.split_rows) reduce_over_shards(index, new_cols_, comm::ReduceOp::max);

  T* momentum = hyper_.momentum > 0 ? momentum_.as<T>() + momentum_offsets_[index] : nullptr;
  const T mu = static_cast<T>(hyper_.momentum), weight = static_cast<T>(1.0 - hyper_.momentum);
  const T eps = static_cast<T>(hyper_.eps), lr = static_cast<T>(info.lr);
  const double decay_rate = p.weight_decay ? hyper_.weight_decay : 0.0;
  const T decay_factor = static_cast<T>(-decay_rate * info.lr);
#pragma omp parallel for schedule(static) if (valid_rows * width >= kMinParallelWork)
  for (std::int64_t q = 0; q < valid_rows; ++q) {
    for (std::int64_t c = 0; c < width; ++c) {
      const std::int64_t e = q * width + c;
      T u = grad[e] / std::sqrt(nu_of(q, c) + eps);
      if (momentum) {
        momentum[e] = momentum[e] * mu + weight * u;
        u = momentum[e];
      }
      T w = param[e];
      if (decay_rate != 0.0) w = w + decay_factor * w;
      param[e] = w - lr * u;
    }
  }
  for (std::int64_t q = 0; q < valid_rows; ++q)
    rows[q] = static_cast<T>(new_rows_[static_cast<std::size_t>(q)]);
  for (std::int64_t j = 0; j < m.col_count(); ++j)
    cols[j] = static_cast<T>(new_cols_[static_cast<std::size_t>(j)]);
}

}  // namespace oases::optim
