#include "model/param_layout.h"

#include "core/error.h"
#include "core/philox.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace oases::model {

void ParamLayout::begin_group(int group) {
  OASES_ASSERT(group >= 0, "parameter group {}", group);
  group_ = group;  // add() checks that each group stays contiguous
}

void ParamLayout::scale_last_init(double std_scale) {
  OASES_ASSERT(!params_.empty(), "no parameter to scale");
  params_.back().init_std_scale = std_scale;
}

void ParamLayout::add(std::string name, Shape full_shape, ParamInit init, Sharding sharding,
                      std::int64_t padded_rows, int degree) {
  OASES_ASSERT(!index_.contains(name), "parameter '{}' added twice", name);
  std::vector<std::int64_t> dims = full_shape.to_vector();
  if (degree == 0) degree = tp_size_;
  OASES_ASSERT(degree >= 1 && tp_size_ % degree == 0, "{}: degree {} does not divide the group of {}",
               name, degree, tp_size_);
  const std::int64_t parts = sharding == Sharding::replicated ? 1 : degree;
  switch (sharding) {
    case Sharding::replicated:
      break;
    case Sharding::rows: {
      const std::int64_t rows = padded_rows > 0 ? padded_rows : dims[0];
      OASES_ASSERT(rows % parts == 0, "{}: {} rows do not split over {} ranks", name, rows, parts);
      dims[0] = rows / parts;
      break;
    }
    case Sharding::columns:
    case Sharding::qkv_columns: {
      const std::int64_t blocks = sharding == Sharding::qkv_columns ? 3 : 1;
      OASES_ASSERT(dims.back() % (blocks * parts) == 0, "{}: {} columns do not split over {} ranks",
                   name, dims.back(), parts);
      dims.back() /= parts;
      break;
    }
  }
  const Shape shape(dims);
  const bool decay = full_shape.ndim() >= 2;
  ParamSpec spec{name, shape, full_shape, sharding, total_, init, decay};
  spec.parts = static_cast<int>(parts);
  spec.part = tp_rank_ % spec.parts;
  spec.group = group_;
  auto [range, inserted] = groups_.try_emplace(group_, total_, total_);
  OASES_ASSERT(inserted || range->second.second == total_, "group {} is not contiguous", group_);
  // Keep every parameter 16-element aligned so vector loops over one view start aligned.
  total_ += (spec.numel() + 15) / 16 * 16;
  range->second.second = total_;
  index_.emplace(name, params_.size());
  params_.push_back(std::move(spec));
}

std::int64_t ParamLayout::global_index(const ParamSpec& spec, std::int64_t local) const {
  const std::int64_t cols = spec.shape[spec.shape.ndim() - 1];
  const std::int64_t full_cols = spec.full_shape[spec.full_shape.ndim() - 1];
  const std::int64_t row = local / cols, col = local % cols;
  switch (spec.sharding) {
    case Sharding::replicated:
      return local;
    case Sharding::rows: {
      if (spec.shape.ndim() == 1) {  // a vector split in blocks
        const std::int64_t global = spec.part * cols + col;
        return global < full_cols ? global : -1;
      }
      const std::int64_t global_row = spec.part * spec.shape[0] + row;
      return global_row < spec.full_shape[0] ? global_row * full_cols + col : -1;
    }
    case Sharding::columns:
      return row * full_cols + spec.part * cols + col;
    case Sharding::qkv_columns: {
      const std::int64_t part_width = cols / 3;  // this rank's share of q, k or v
      const std::int64_t part = col / part_width, within = col % part_width;
      return row * full_cols + part * (full_cols / 3) + spec.part * part_width + within;
    }
  }
  return -1;
}

const ParamSpec& ParamLayout::find(const std::string& name) const {
  const auto it = index_.find(name);
  OASES_ASSERT(it != index_.end(), "no parameter named '{}'", name);
  return params_[it->second];
}

Tensor ParamLayout::view(const Tensor& flat, const std::string& name) const {
  return view(flat, find(name));
}

Tensor ParamLayout::view(const Tensor& flat, const ParamSpec& spec) const {
  OASES_ASSERT(flat.numel() >= total_, "a flat array of {} elements for a layout of {}",
               flat.numel(), total_);
  return flat.view(spec.offset, spec.shape);
}

void initialize_parameters(const ParamLayout& layout, std::int64_t layers, std::uint64_t seed,
                           const Tensor& flat) {
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  for (const ParamSpec& p : layout.params()) {
    const std::int64_t n = p.numel();
    // Values are drawn in double and stored in the array's type.
    std::vector<double> values(static_cast<std::size_t>(n));
    if (p.init == ParamInit::zeros || p.init == ParamInit::ones) {
      const double value = p.init == ParamInit::ones ? 1.0 : 0.0;
      for (std::int64_t i = 0; i < n; ++i)
        values[static_cast<std::size_t>(i)] = layout.global_index(p, i) < 0 ? 0.0 : value;
    } else {
      const double stddev = (p.init == ParamInit::normal ? 0.02 : residual_std) * p.init_std_scale;
      const PhiloxKey key = philox_key(seed, fnv1a64(p.name));
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t global = layout.global_index(p, i);
        if (global < 0) {
          values[static_cast<std::size_t>(i)] = 0.0;
          continue;
        }
        const auto u = static_cast<std::uint64_t>(global);
        const PhiloxCounter block = philox4x32(
            {static_cast<std::uint32_t>(u), static_cast<std::uint32_t>(u >> 32), 0, 0}, key);
        // Rounded through float first: the values of every precision are the same numbers.
        values[static_cast<std::size_t>(i)] =
            static_cast<double>(static_cast<float>(stddev * normal_from_block(block)));
      }
    }
    const Tensor view = layout.view(flat, p);
    if (flat.dtype() == DType::f64) {
      std::copy(values.begin(), values.end(), view.data<double>());
    } else {
      float* out = view.data<float>();
      for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(values[static_cast<std::size_t>(i)]);
    }
  }
}

}  // namespace oases::model
