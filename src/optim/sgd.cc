#include "optim/sgd.h"

#include "core/error.h"
#include "kernels/cpu/optimizer.h"

#include <utility>

namespace oases::optim {
namespace k = oases::kernels::cpu;

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
  if (layout().dtype == DType::f64) return update_typed<double>(params, grads, begin, end, info);
  update_typed<float>(params, grads, begin, end, info);
}

template <class T>
void Sgd::update_typed(Tensor params, Tensor grads, std::int64_t begin, std::int64_t end,
                       const StepInfo& info) {
  T* param = params.data<T>();
  const T* grad = grads.data<T>();
  T* buffer = hyper_.momentum > 0 ? momentum_buffer_.as<T>() : nullptr;
  for_each_param_slice(layout(), begin, end, [&](std::size_t i, std::int64_t lo, std::int64_t hi) {
    const ParamSlot& p = layout().params[i];
    const k::SgdStep hp{info.lr, hyper_.momentum, hyper_.nesterov,
                        p.weight_decay ? hyper_.weight_decay : 0.0};
    T* state = buffer ? buffer + state_offsets_[i] + (lo - p.offset) : nullptr;
    k::sgd_update<T>(param + lo, grad + lo, state, hi - lo, hp);
  });
}

}  // namespace oases::optim
