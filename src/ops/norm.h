// Normalisation over the hidden dimension: LayerNorm (torch.nn.LayerNorm: weight and bias,
// biased variance, eps inside the square root) or RMSNorm (LLaMA: x * rsqrt(mean(x^2) + eps)
// * weight, no bias). Statistics are kept per row for the backward pass.
#pragma once

#include "ops/context.h"

#include <cstdint>

namespace oases::ops {

enum class NormKind : std::uint8_t { layer, rms };

class Norm {
 public:
  Norm() = default;
  Norm(NormKind kind, ParamRef weight, ParamRef bias, double eps)
      : kind_(kind), weight_(weight), bias_(bias), eps_(eps) {}

  bool present() const { return weight_.present(); }
  const ParamRef& weight() const { return weight_; }
  const ParamRef& bias() const { return bias_; }  // absent for RMSNorm
  // Statistics kept per row: mean and rstd (LayerNorm) or rstd (RMSNorm).
  std::int64_t stats_per_row() const { return kind_ == NormKind::layer ? 2 : 1; }

  // x, y [n, C]; stats [stats_per_row() * n].
  void forward(const Tensor& x, const Tensor& y, const Tensor& stats) const;
  // dx [n, C] overwritten (no aliasing with dy or x); parameter gradients accumulated.
  void backward(const Tensor& dy, const Tensor& x, const Tensor& stats, const Tensor& dx) const;

 private:
  NormKind kind_ = NormKind::layer;
  ParamRef weight_, bias_;
  double eps_ = 1e-5;
};

}  // namespace oases::ops
