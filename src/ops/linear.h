// Tensor-parallel linear layers (Megatron-LM's two kinds), over weights stored either as
// [in, out] (GPT-2's Conv1D) or [out, in] (torch.nn.Linear).
//
//   ColumnParallelLinear  y[n, out / k] = x[n, in] @ W[:, this rank's columns] + b[same]
//                         The input is whole on every rank of the group; the output is this
//                         rank's columns. The input gradient is a partial sum: the group sums
//                         it (the segment's backward collective).
//   RowParallelLinear     y[n, out] = x[n, in / k] @ W[this rank's rows, :]  (partial sums)
//                         The group sums the output (the segment's forward collective); the
//                         bias is added after that reduction, by the next segment's epilogue,
//                         so it is not part of this op.
// Gradients of the weight (and bias) accumulate: they sum over micro-batches and sub-batches.
// backward() forms the input gradient and the parameters' together; a zero-bubble pipeline
// calls backward_input() first and backward_weight() later with the same dy and x, which gives
// the same results (the caller keeps dy and x alive in between). 16-bit products go by the
// paths the caller passes (the model's ModelContext::gemm16).
#pragma once

#include "kernels/kernels.h"
#include "ops/context.h"

namespace oases::ops {

using kernels::Gemm16Paths;
using kernels::WeightLayout;

class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  ColumnParallelLinear(ParamRef weight, ParamRef bias, WeightLayout layout)
      : weight_(weight), bias_(bias), layout_(layout) {}

  // y [n, local out] (may be a column block of a wider matrix); with `accumulate`, y +=.
  void forward(const Tensor& x, const Tensor& y, const Gemm16Paths& paths,
               bool accumulate = false) const {
    kernels::linear_forward(x, weight_.value, layout_, bias_.value, y, accumulate, paths);
  }
  // The product alone, without the bias: where another rank adds it (an expert split over a
  // tensor-parallel group adds its output bias on one rank; each rank still forms its gradient).
  void forward_without_bias(const Tensor& x, const Tensor& y, const Gemm16Paths& paths) const {
    kernels::linear_forward(x, weight_.value, layout_, Tensor(), y, false, paths);
  }
  // dx [n, in]: overwritten, or added to with accumulate_dx; empty to skip.
  void backward(const Tensor& dy, const Tensor& x, const Tensor& dx, bool accumulate_dx,
                const Gemm16Paths& paths) const {
    kernels::linear_backward(dy, x, weight_.value, layout_, dx, accumulate_dx, weight_.grad,
                             bias_.grad, paths);
  }
  // The dx part of backward() alone; then the weight's and bias's part alone.
  void backward_input(const Tensor& dy, const Tensor& x, const Tensor& dx, bool accumulate_dx,
                      const Gemm16Paths& paths) const {
    kernels::linear_backward(dy, x, weight_.value, layout_, dx, accumulate_dx, Tensor(), Tensor(),
                             paths);
  }
  void backward_weight(const Tensor& dy, const Tensor& x, const Gemm16Paths& paths) const {
    kernels::linear_backward(dy, x, weight_.value, layout_, Tensor(), false, weight_.grad,
                             bias_.grad, paths);
  }
  std::int64_t local_out() const {
    return layout_ == WeightLayout::in_out ? weight_.value.dim(1) : weight_.value.dim(0);
  }
  const ParamRef& weight() const { return weight_; }
  const ParamRef& bias() const { return bias_; }
  WeightLayout layout() const { return layout_; }

 private:
  ParamRef weight_, bias_;
  WeightLayout layout_ = WeightLayout::in_out;
};

class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  RowParallelLinear(ParamRef weight, WeightLayout layout) : weight_(weight), layout_(layout) {}

  // y [n, out]: this rank's partial sums.
  void forward(const Tensor& x, const Tensor& y, const Gemm16Paths& paths) const {
    kernels::linear_forward(x, weight_.value, layout_, Tensor(), y, false, paths);
  }
  // dy [n, out] is the gradient of the reduced output (whole); dx [n, local in] overwritten.
  void backward(const Tensor& dy, const Tensor& x, const Tensor& dx,
                const Gemm16Paths& paths) const {
    kernels::linear_backward(dy, x, weight_.value, layout_, dx, false, weight_.grad, Tensor(),
                             paths);
  }
  void backward_input(const Tensor& dy, const Tensor& x, const Tensor& dx,
                      const Gemm16Paths& paths) const {
    kernels::linear_backward(dy, x, weight_.value, layout_, dx, false, Tensor(), Tensor(), paths);
  }
  void backward_weight(const Tensor& dy, const Tensor& x, const Gemm16Paths& paths) const {
    kernels::linear_backward(dy, x, weight_.value, layout_, Tensor(), false, weight_.grad,
                             Tensor(), paths);
  }

 private:
  ParamRef weight_;
  WeightLayout layout_ = WeightLayout::in_out;
};

}  // namespace oases::ops
