#include "model/param_layout.h"

#include "core/error.h"
#include "core/philox.h"

#include <cmath>

namespace oases::model {

void ParamLayout::add(std::string name, Shape shape, ParamInit init) {
  const bool decay = shape.ndim() >= 2;
  ParamSpec spec{std::move(name), shape, total_, init, decay};
  // Keep every parameter 16-element aligned so vector loops over one view start aligned.
  total_ += (spec.numel() + 15) / 16 * 16;
  params_.push_back(std::move(spec));
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

ParamLayout gpt_param_layout(const GptConfig& c) {
  const std::int64_t C = c.hidden, F = c.ffn_hidden;
  ParamLayout layout;
  layout.add("wte.weight", {c.vocab_size, C}, ParamInit::normal);
  layout.add("wpe.weight", {c.seq_len, C}, ParamInit::normal);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    layout.add(p + "ln_1.weight", {C}, ParamInit::ones);
    layout.add(p + "ln_1.bias", {C}, ParamInit::zeros);
    layout.add(p + "attn.c_attn.weight", {C, 3 * C}, ParamInit::normal);
    layout.add(p + "attn.c_attn.bias", {3 * C}, ParamInit::zeros);
    layout.add(p + "attn.c_proj.weight", {C, C}, ParamInit::normal_residual);
    layout.add(p + "attn.c_proj.bias", {C}, ParamInit::zeros);
    layout.add(p + "ln_2.weight", {C}, ParamInit::ones);
    layout.add(p + "ln_2.bias", {C}, ParamInit::zeros);
    layout.add(p + "mlp.c_fc.weight", {C, F}, ParamInit::normal);
    layout.add(p + "mlp.c_fc.bias", {F}, ParamInit::zeros);
    layout.add(p + "mlp.c_proj.weight", {F, C}, ParamInit::normal_residual);
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
      for (std::int64_t i = 0; i < n; ++i) out[i] = value;
      continue;
    }
    const double stddev = p.init == ParamInit::normal ? 0.02 : residual_std;
    const PhiloxKey key = philox_key(seed, fnv1a64(p.name));
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::uint64_t>(i);
      const PhiloxCounter block = philox4x32(
          {static_cast<std::uint32_t>(u), static_cast<std::uint32_t>(u >> 32), 0, 0}, key);
      out[i] = static_cast<float>(stddev * normal_from_block(block));
    }
  }
}

}  // namespace oases::model
