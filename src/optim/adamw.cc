#include "optim/adamw.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <utility>

namespace oases::optim {
namespace {

std::size_t bytes_of(DType dtype, std::int64_t elements) {
  return static_cast<std::size_t>(elements) * dtype_size(dtype);
}

// A packed state buffer as one flat tensor of the layout's dtype.
Tensor packed_state(const Buffer& buffer, DType dtype) {
  return buffer.tensor(dtype, {static_cast<std::int64_t>(buffer.bytes() / dtype_size(dtype))});
}

}  // namespace

AdamW::AdamW(FlatLayout layout, const AdamWHyperParams& hyper, StateAllocator allocate)
    : Optimizer(std::move(layout), nullptr, std::move(allocate)), hyper_(hyper) {
  OASES_ASSERT(hyper.beta1 >= 0 && hyper.beta1 < 1 && hyper.beta2 >= 0 && hyper.beta2 < 1,
               "AdamW betas ({}, {}) must be in [0, 1)", hyper.beta1, hyper.beta2);
  OASES_ASSERT(hyper.eps >= 0 && hyper.weight_decay >= 0,
               "AdamW eps = {} and weight_decay = {} must be >= 0", hyper.eps, hyper.weight_decay);
  std::int64_t packed = 0;
  state_offsets_.reserve(this->layout().params.size());
  for (const ParamSlot& p : this->layout().params) {
    state_offsets_.push_back(packed);
    packed += p.numel();
  }
  // Buffers start zeroed: PyTorch's moments before the first step.
  exp_avg_ = allocate_state(bytes_of(this->layout().dtype, packed));
  exp_avg_sq_ = allocate_state(bytes_of(this->layout().dtype, packed));
}

std::size_t AdamW::state_bytes() const {
  return exp_avg_.bytes() + exp_avg_sq_.bytes();
}

std::vector<StateTensor> AdamW::state_layout(const ParamSlot& slot) const {
  const Shape shape(slot.shape);
  return {{"exp_avg." + slot.name, slot.name, Tensor(nullptr, layout().dtype, shape)},
          {"exp_avg_sq." + slot.name, slot.name, Tensor(nullptr, layout().dtype, shape)}};
}

std::vector<StateTensor> AdamW::state_tensors() {
  std::vector<StateTensor> out;
  const FlatLayout& flat = layout();
  out.reserve(2 * flat.params.size());
  const std::size_t element = dtype_size(flat.dtype);
  for (std::size_t i = 0; i < flat.params.size(); ++i) {
    const ParamSlot& p = flat.params[i];
    const std::size_t at = static_cast<std::size_t>(state_offsets_[i]) * element;
    const Shape shape(p.shape);
    out.push_back({"exp_avg." + p.name, p.name,
                   Tensor(static_cast<char*>(exp_avg_.data()) + at, flat.dtype, shape)});
    out.push_back({"exp_avg_sq." + p.name, p.name,
                   Tensor(static_cast<char*>(exp_avg_sq_.data()) + at, flat.dtype, shape)});
  }
  return out;
}

void AdamW::update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                   const StepInfo& info) {
  const DType dtype = layout().dtype;
  const Tensor m = packed_state(exp_avg_, dtype);
  const Tensor v = packed_state(exp_avg_sq_, dtype);
  for_each_param_slice(layout(), begin, end, [&](std::size_t i, std::int64_t lo, std::int64_t hi) {
    const ParamSlot& p = layout().params[i];
    const std::int64_t state = state_offsets_[i] + (lo - p.offset);
    const double decay = p.weight_decay ? hyper_.weight_decay : 0.0;
    const kernels::AdamWStep step{info.lr, hyper_.beta1, hyper_.beta2, hyper_.eps, decay,
                                  info.step};
    kernels::adamw_update(params.view(lo, {hi - lo}), grads.view(lo, {hi - lo}),
                          m.view(state, {hi - lo}), v.view(state, {hi - lo}), step);
  });
}

}  // namespace oases::optim
