#include "ops/norm.h"

#include "core/error.h"
#include "kernels/kernels.h"

namespace oases::ops {

void Norm::forward(const Tensor& x, const Tensor& y, const Tensor& stats) const {
  const std::int64_t n = x.numel() / weight_.value.numel();
  if (kind_ == NormKind::layer) {
    kernels::layernorm_forward(x, weight_.value, bias_.value, y, stats.view(0, {n}),
                               stats.view(n, {n}), eps_);
    return;
  }
  kernels::rmsnorm_forward(x, weight_.value, y, stats.view(0, {n}), eps_);
}

void Norm::backward(const Tensor& dy, const Tensor& x, const Tensor& stats,
                    const Tensor& dx) const {
  const std::int64_t n = x.numel() / weight_.value.numel();
  if (kind_ == NormKind::layer) {
    kernels::layernorm_backward(dy, x, weight_.value, stats.view(0, {n}), stats.view(n, {n}), dx,
                                weight_.grad, bias_.grad);
    return;
  }
  kernels::rmsnorm_backward(dy, x, weight_.value, stats.view(0, {n}), dx, weight_.grad);
}

}  // namespace oases::ops
