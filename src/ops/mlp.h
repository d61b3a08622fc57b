// The elementwise heart of a transformer MLP between its two linear layers:
//   gelu_tanh  act = gelu(pre), tanh form (GPT-2)                 pre [n, F]
//   gelu_erf   act = gelu(pre), exact erf form (BERT)             pre [n, F]
//   swiglu     act = silu(gate) * up, pre = [gate | up] (LLaMA)   pre [n, 2F]
// with act [n, F] (F: this rank's share of ffn_hidden).
#pragma once

#include "ops/context.h"

#include <cstdint>

namespace oases::ops {

enum class Activation : std::uint8_t { gelu_tanh, gelu_erf, swiglu };

class MlpActivation {
 public:
  MlpActivation() = default;
  MlpActivation(Activation kind, std::int64_t width) : kind_(kind), width_(width) {}

  Activation kind() const { return kind_; }
  std::int64_t width() const { return width_; }  // F
  std::int64_t input_width() const { return kind_ == Activation::swiglu ? 2 * width_ : width_; }

  void forward(const Tensor& pre, const Tensor& act) const;
  // dpre [n, input_width()] overwritten; for the GeLU forms it may be dact itself.
  void backward(const Tensor& pre, const Tensor& dact, const Tensor& dpre) const;

 private:
  Activation kind_ = Activation::gelu_tanh;
  std::int64_t width_ = 0;
};

}  // namespace oases::ops
