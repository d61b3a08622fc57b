#include "optim/adafactor.h"

#include "core/error.h"
#include "optim/factored.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace oases::optim {
namespace {

// Below this many elements the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

template <class T>
double sum_of_squares(const T* x, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

}  // namespace

Adafactor::Adafactor(FlatLayout layout, const AdafactorHyperParams& hyper,
                     std::unique_ptr<ShardReducer> reducer, StateAllocator allocate)
    : Optimizer(std::move(layout), std::move(reducer), std::move(allocate)), hyper_(hyper) {
  OASES_ASSERT(hyper.beta1 >= 0 && hyper.beta1 < 1 && hyper.weight_decay >= 0,
               "Adafactor beta1 = {} must be in [0, 1) and weight_decay = {} >= 0", hyper.beta1,
               hyper.weight_decay);
  std::int64_t second = 0, first = 0;
  for (const ParamSlot& p : this->layout().params) {
    second_offsets_.push_back(second);
    exp_avg_offsets_.push_back(first);
    if (is_factored(p)) {
      const MatrixShape m = matrix_shape(p);
      second += m.row_count() + m.col_count();
    } else {
      second += p.numel();
    }
    first += p.numel();
  }
  const std::size_t element = dtype_size(this->layout().dtype);
  second_ = allocate_state(static_cast<std::size_t>(second) * element);
  if (hyper_.beta1 > 0) exp_avg_ = allocate_state(static_cast<std::size_t>(first) * element);
}

std::vector<StateTensor> Adafactor::state_layout(const ParamSlot& slot) const {
  const DType dtype = layout().dtype;
  std::vector<StateTensor> out =
      is_factored(slot) ? factored_state_layout(slot, "exp_avg_sq", dtype)
                        : std::vector<StateTensor>{{"exp_avg_sq." + slot.name, slot.name,
                                                    Tensor(nullptr, dtype, Shape(slot.shape))}};
  if (hyper_.beta1 > 0)
    out.push_back({"exp_avg." + slot.name, slot.name, Tensor(nullptr, dtype, Shape(slot.shape))});
  return out;
}

std::vector<StateTensor> Adafactor::state_tensors() {
  std::vector<StateTensor> out;
  const FlatLayout& flat = layout();
  const std::size_t element = dtype_size(flat.dtype);
  for (std::size_t i = 0; i < flat.params.size(); ++i) {
    char* second =
        static_cast<char*>(second_.data()) + static_cast<std::size_t>(second_offsets_[i]) * element;
    for (StateTensor& s : state_layout(flat.params[i])) {
      char* at = second;
      if (s.name.starts_with("exp_avg.")) {
        at = static_cast<char*>(exp_avg_.data()) +
             static_cast<std::size_t>(exp_avg_offsets_[i]) * element;
      } else {
        second += s.view.nbytes();
      }
      s.view = Tensor(at, s.view.dtype(), s.view.shape());
      out.push_back(std::move(s));
    }
  }
  return out;
}

void Adafactor::update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                       const StepInfo& info) {
  for_each_param_slice(layout(), begin, end, [&](std::size_t i, std::int64_t lo, std::int64_t hi) {
    const ParamSlot& p = layout().params[i];
    OASES_ASSERT(lo == p.offset && hi == p.end(), "Adafactor steps {} only whole", p.name);
    if (layout().dtype == DType::f64) {
      update_param<double>(i, params.data<double>() + lo, grads.data<double>() + lo, info);
    } else {
      update_param<float>(i, params.data<float>() + lo, grads.data<float>() + lo, info);
    }
  });
}

template <class T>
double Adafactor::update_factored_statistics(std::size_t index, const T* param, const T* grad,
                                             double beta2t) {
  const ParamSlot& p = layout().params[index];
  const MatrixShape m = matrix_shape(p);
  T* row = second_.as<T>() + second_offsets_[index];
  T* col = row + m.row_count();
  const std::int64_t cols = m.cols, valid_rows = m.valid_rows;
  const double eps1 = hyper_.eps1;
  const double full_rows = static_cast<double>(m.full_rows);
  const double full_cols = static_cast<double>(m.full_cols);
  const T beta2 = static_cast<T>(beta2t), weight = static_cast<T>(1.0 - beta2t);
  // Sums of G^2 + eps1 over each row and each column of this rank's valid rows.
  row_factor_.assign(static_cast<std::size_t>(m.row_count()), 0.0);
  col_factor_.assign(static_cast<std::size_t>(m.col_count()), 0.0);
#pragma omp parallel for schedule(static) if (valid_rows * cols >= kMinParallelWork)
  for (std::int64_t q = 0; q < valid_rows; ++q) {
    double s = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const double g = static_cast<double>(grad[q * cols + c]);
      s += g * g + eps1;
    }
    row_factor_[static_cast<std::size_t>(q)] = s;
  }
  for (std::int64_t q = 0; q < valid_rows; ++q) {
    double* sums = col_factor_.data() + (q / m.rows) * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const double g = static_cast<double>(grad[q * cols + c]);
      sums[c] += g * g + eps1;
    }
  }
  const double param_squares = hyper_.relative_step ? sum_of_squares(param, valid_numel(p)) : 0.0;
  const auto update_rows = [&](const double* sums) {
    for (std::int64_t q = 0; q < valid_rows; ++q)
      row[q] = row[q] * beta2 + weight * static_cast<T>(sums[q] / full_cols);
  };
  const auto update_cols = [&](const double* sums) {
    for (std::int64_t j = 0; j < m.col_count(); ++j)
      col[j] = col[j] * beta2 + weight * static_cast<T>(sums[j] / full_rows);
  };
  // Sums of the updated row statistics of each matrix of the stack, over this rank's rows.
  const auto row_statistic_sums = [&](double* out) {
    for (std::int64_t b = 0; b < m.batch; ++b) out[b] = 0;
    for (std::int64_t q = 0; q < valid_rows; ++q) out[q / m.rows] += static_cast<double>(row[q]);
  };
  row_means_.assign(static_cast<std::size_t>(m.batch), 0.0);
  double squares = param_squares;
  if (m.split_cols) {
    // Other ranks hold other columns: the row sums are partial.
    statistics_.assign(row_factor_.begin(), row_factor_.end());
    statistics_.push_back(param_squares);
    reduce_over_shards(index, statistics_, comm::ReduceOp::sum);
    squares = statistics_.back();
    update_rows(statistics_.data());
    update_cols(col_factor_.data());
    row_statistic_sums(row_means_.data());
  } else if (m.split_rows) {
    // Other ranks hold other rows: the column sums and the sums of row statistics are partial.
    update_rows(row_factor_.data());
    statistics_.assign(col_factor_.begin(), col_factor_.end());
    statistics_.resize(col_factor_.size() + static_cast<std::size_t>(m.batch) + 1);
    row_statistic_sums(statistics_.data() + col_factor_.size());
    statistics_.back() = param_squares;
    reduce_over_shards(index, statistics_, comm::ReduceOp::sum);
    squares = statistics_.back();
    update_cols(statistics_.data());
    std::copy_n(statistics_.data() + col_factor_.size(), m.batch, row_means_.data());
  } else {
    // Whole matrices here (the parameter is whole, or split along a stacking dimension).
    update_rows(row_factor_.data());
    update_cols(col_factor_.data());
    row_statistic_sums(row_means_.data());
    if (p.split_dim >= 0 && hyper_.relative_step) {
      statistics_.assign(1, param_squares);
      reduce_over_shards(index, statistics_, comm::ReduceOp::sum);
      squares = statistics_[0];
    }
  }
  for (double& mean : row_means_) mean /= full_rows;
  for (std::int64_t q = 0; q < valid_rows; ++q)
    row_factor_[static_cast<std::size_t>(q)] =
        1.0 /
        std::sqrt(static_cast<double>(row[q]) / row_means_[static_cast<std::size_t>(q / m.rows)]);
  for (std::int64_t j = 0; j < m.col_count(); ++j)
    col_factor_[static_cast<std::size_t>(j)] = 1.0 / std::sqrt(static_cast<double>(col[j]));
  return squares;
}

template <class T>
void Adafactor::update_param(std::size_t index, T* param, const T* grad, const StepInfo& info) {
  const ParamSlot& p = layout().params[index];
  const double t = static_cast<double>(info.step);
  const double beta2t = 1.0 - std::pow(t, hyper_.decay_rate);
  const std::int64_t valid = valid_numel(p);
  const double whole = static_cast<double>(p.whole_numel());
  const bool factored = is_factored(p);
  T* second = second_.as<T>() + second_offsets_[index];

  double param_squares = 0;
  if (factored) {
    param_squares = update_factored_statistics(index, param, grad, beta2t);
  } else {
    const T beta2 = static_cast<T>(beta2t), weight = static_cast<T>(1.0 - beta2t);
    const T eps1 = static_cast<T>(hyper_.eps1);
    for (std::int64_t j = 0; j < valid; ++j)
      second[j] = second[j] * beta2 + weight * (grad[j] * grad[j] + eps1);
    if (hyper_.relative_step) {
      statistics_.assign(1, sum_of_squares(param, valid));
      reduce_over_shards(index, statistics_, comm::ReduceOp::sum);
      param_squares = statistics_[0];
    }
  }
  const double lr = hyper_.relative_step
                        ? std::min(hyper_.max_relative_step, 1.0 / std::sqrt(t)) *
                              std::max(hyper_.eps2, std::sqrt(param_squares / whole))
                        : info.lr;

  // The unclipped update of element (row q, column c) or vector element q (cols = 1).
  const MatrixShape m = factored ? matrix_shape(p) : MatrixShape{1, 1, 1, valid, 1, 1};
  const std::int64_t rows = factored ? m.valid_rows : valid, cols = m.cols;
  const auto unclipped = [&](std::int64_t q, std::int64_t c) -> T {
    const std::int64_t e = q * cols + c;
    if (!factored) return grad[e] / std::sqrt(second[e]);
    const double scale = row_factor_[static_cast<std::size_t>(q)] *
                         col_factor_[static_cast<std::size_t>((q / m.rows) * cols + c)];
    return static_cast<T>(static_cast<double>(grad[e]) * scale);
  };
  // Per-row partial sums added in row order: the same bits at any thread count.
  row_squares_.assign(static_cast<std::size_t>(rows), 0.0);
#pragma omp parallel for schedule(static) if (rows * cols >= kMinParallelWork)
  for (std::int64_t q = 0; q < rows; ++q) {
    double s = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const double u = static_cast<double>(unclipped(q, c));
      s += u * u;
    }
    row_squares_[static_cast<std::size_t>(q)] = s;
  }
  statistics_.assign(1, 0.0);
  for (const double s : row_squares_) statistics_[0] += s;
  reduce_over_shards(index, statistics_, comm::ReduceOp::sum);
  const double clip = std::max(1.0, std::sqrt(statistics_[0] / whole) / hyper_.clip_threshold);

  const T clip_t = static_cast<T>(clip), lr_t = static_cast<T>(lr);
  const bool momentum = hyper_.beta1 > 0;
  const T beta1 = static_cast<T>(hyper_.beta1), weight1 = static_cast<T>(1.0 - hyper_.beta1);
  const double decay_rate = p.weight_decay ? hyper_.weight_decay : 0.0;
  const bool decay = decay_rate != 0.0;
  const T decay_factor = static_cast<T>(-decay_rate * lr);
  T* exp_avg = momentum ? exp_avg_.as<T>() + exp_avg_offsets_[index] : nullptr;
#pragma omp parallel for schedule(static) if (rows * cols >= kMinParallelWork)
  for (std::int64_t q = 0; q < rows; ++q) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t e = q * cols + c;
      T u = unclipped(q, c) / clip_t * lr_t;
      if (momentum) {
        exp_avg[e] = exp_avg[e] * beta1 + weight1 * u;
        u = exp_avg[e];
      }
      T w = param[e];
      if (decay) w = w + decay_factor * w;
      param[e] = w - u;
    }
  }
}

}  // namespace oases::optim
