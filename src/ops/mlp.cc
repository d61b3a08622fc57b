#include "ops/mlp.h"

#include "kernels/kernels.h"

namespace oases::ops {

void MlpActivation::forward(const Tensor& pre, const Tensor& act) const {
  switch (kind_) {
    case Activation::gelu_tanh: return kernels::gelu_forward(pre, act, kernels::GeluForm::tanh);
    case Activation::gelu_erf: return kernels::gelu_forward(pre, act, kernels::GeluForm::erf);
    case Activation::swiglu:
      return kernels::swiglu_forward(pre.columns(0, width_), pre.columns(width_, 2 * width_), act);
  }
}

void MlpActivation::backward(const Tensor& pre, const Tensor& dact, const Tensor& dpre) const {
  switch (kind_) {
    case Activation::gelu_tanh:
      return kernels::gelu_backward(pre, dact, dpre, kernels::GeluForm::tanh);
    case Activation::gelu_erf:
      return kernels::gelu_backward(pre, dact, dpre, kernels::GeluForm::erf);
    case Activation::swiglu:
      return kernels::swiglu_backward(pre.columns(0, width_), pre.columns(width_, 2 * width_), dact,
                                      dpre.columns(0, width_), dpre.columns(width_, 2 * width_));
  }
}

}  // namespace oases::ops
