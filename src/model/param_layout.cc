#include "model/param_layout.h"

#include "core/error.h"
#include "core/philox.h"

#include <cmath>

namespace oases::model {

void ParamLayout::add(std::string name, Shape full_shape, ParamInit init, Sharding sharding,
                      std::int64_t padded_rows, int degree) {
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
  ParamSpec spec{std::move(name), shape, full_shape, sharding, total_, init, decay};
  spec.parts = static_cast<int>(parts);
  spec.part = tp_rank_ % spec.parts;
  // Keep every parameter 16-element aligned so vector loops over one view start aligned.
  total_ += (spec.numel() + 15) / 16 * 16;
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
  for (const auto& p : params_)
    if (p.name == name) return p;
  OASES_ASSERT(false, "no parameter named '{}'", name);
  __builtin_unreachable();
}

Tensor ParamLayout::view(float* flat, const std::string& name) const {
  const ParamSpec& p = find(name);
  return Tensor::of(flat + p.offset, p.shape);
}

ParamLayout gpt_param_layout(const GptConfig& c, int tp_rank, int tp_size,
                             const std::vector<int>& layer_degrees) {
  const std::int64_t C = c.hidden, F = c.ffn_hidden;
  OASES_ASSERT(layer_degrees.empty() || static_cast<std::int64_t>(layer_degrees.size()) == c.layers,
               "{} layer degrees for {} layers", layer_degrees.size(), c.layers);
  ParamLayout layout(tp_rank, tp_size);
  layout.add("wte.weight", {c.vocab_size, C}, ParamInit::normal, Sharding::rows,
             c.padded_vocab(tp_size));
  layout.add("wpe.weight", {c.seq_len, C}, ParamInit::normal);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    const int k = layer_degrees.empty() ? tp_size : layer_degrees[static_cast<std::size_t>(l)];
    layout.add(p + "ln_1.weight", {C}, ParamInit::ones);
    layout.add(p + "ln_1.bias", {C}, ParamInit::zeros);
    layout.add(p + "attn.c_attn.weight", {C, 3 * C}, ParamInit::normal, Sharding::qkv_columns, 0, k);
    layout.add(p + "attn.c_attn.bias", {3 * C}, ParamInit::zeros, Sharding::qkv_columns, 0, k);
    layout.add(p + "attn.c_proj.weight", {C, C}, ParamInit::normal_residual, Sharding::rows, 0, k);
    layout.add(p + "attn.c_proj.bias", {C}, ParamInit::zeros);
    layout.add(p + "ln_2.weight", {C}, ParamInit::ones);
    layout.add(p + "ln_2.bias", {C}, ParamInit::zeros);
    layout.add(p + "mlp.c_fc.weight", {C, F}, ParamInit::normal, Sharding::columns, 0, k);
    layout.add(p + "mlp.c_fc.bias", {F}, ParamInit::zeros, Sharding::columns, 0, k);
    layout.add(p + "mlp.c_proj.weight", {F, C}, ParamInit::normal_residual, Sharding::rows, 0, k);
    layout.add(p + "mlp.c_proj.bias", {C}, ParamInit::zeros);
  }
  layout.add("ln_f.weight", {C}, ParamInit::ones);
  layout.add("ln_f.bias", {C}, ParamInit::zeros);
  return layout;
}

void initialize_parameters(const ParamLayout& layout, const GptConfig& config,
                           std::uint64_t seed, float* flat) {
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
  for (const ParamSpec& p : layout.params()) {
    float* out = flat + p.offset;
    const std::int64_t n = p.numel();
    if (p.init == ParamInit::zeros || p.init == ParamInit::ones) {
      const float value = p.init == ParamInit::ones ? 1.0f : 0.0f;
      for (std::int64_t i = 0; i < n; ++i) out[i] = layout.global_index(p, i) < 0 ? 0.0f : value;
      continue;
    }
    const double stddev = p.init == ParamInit::normal ? 0.02 : residual_std;
    const PhiloxKey key = philox_key(seed, fnv1a64(p.name));
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t global = layout.global_index(p, i);
      if (global < 0) {
        out[i] = 0.0f;
        continue;
      }
      const auto u = static_cast<std::uint64_t>(global);
      const PhiloxCounter block = philox4x32(
          {static_cast<std::uint32_t>(u), static_cast<std::uint32_t>(u >> 32), 0, 0}, key);
      out[i] = static_cast<float>(stddev * normal_from_block(block));
    }
  }
}

}  // namespace oases::model
