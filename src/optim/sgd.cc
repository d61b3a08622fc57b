#include "optim/sgd.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <utility>

namespace oases::optim {

Sgd::Sgd(FlatLayout layout, const SgdHyperParams& hyper, StateAllocator allocate)
    : Optimizer(std::move(layout), nullptr, std::move(allocate)), hyper_(hyper) {
  OASES_ASSERT(hyper.momentum >= 0 && hyper.momentum < 1 && hyper.weight_decay >= 0,
               "SGD momentum = {} must be in [0, 1) and weight_decay = {} >= 0", hyper.momentum,
               hyper.weight_decay);
  OASES_ASSERT(!hyper.nesterov || hyper.momentum > 0, "SGD nesterov needs momentum > 0");
  std::int64_t packed = 0;
  for (const ParamSlot& p : this->layout().params) {
    state_offsets_.push_back(packed);
    packed += p.numel();
  }
  if (hyper_.momentum > 0)
    momentum_buffer_ =
        allocate_state(static_cast<std::size_t>(packed) * dtype_size(this->layout().dtype));
}

std::vector<StateTensor> Sgd::state_layout(const ParamSlot& slot) const {
  if (hyper_.momentum == 0) return {};
  return {{"momentum_buffer." + slot.name, slot.name,
           Tensor(nullptr, layout().dtype, Shape(slot.shape))}};
}

std::vector<StateTensor> Sgd::state_tensors() {
  std::vector<StateTensor> out;
  if (hyper_.momentum == 0) return out;
  const FlatLayout& flat = layout();
  const std::size_t element = dtype_size(flat.dtype);
  for (std::size_t i = 0; i < flat.params.size(); ++i) {
    const ParamSlot& p = flat.params[i];
    char* at = static_cast<char*>(momentum_buffer_.data()) +
               static_cast<std::size_t>(state_offsets_[i]) * element;
    out.push_back({"momentum_buffer." + p.name, p.name, Tensor(at, flat.dtype, Shape(p.shape))});
  }
  return out;
}

void Sgd::update(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                 const StepInfo& info) {
  const DType dtype = layout().dtype;
  const Tensor buffer = hyper_.momentum > 0
                            ? momentum_buffer_.tensor(dtype, {static_cast<std::int64_t>(
                                                                 momentum_buffer_.bytes() /
                                                                 dtype_size(dtype))})
                            : Tensor();
  for_each_param_slice(layout(), begin, end, [&](std::size_t i, std::int64_t lo, std::int64_t hi) {
    const ParamSlot& p = layout().params[i];
    const kernels::SgdStep step{info.lr, hyper_.momentum, hyper_.nesterov,
                                p.weight_decay ? hyper_.weight_decay : 0.0};
    const Tensor state =
        buffer.empty() ? Tensor() : buffer.view(state_offsets_[i] + (lo - p.offset), {hi - lo});
    kernels::sgd_update(params.view(lo, {hi - lo}), grads.view(lo, {hi - lo}), state, step);
  });
}

}  // namespace oases::optim
