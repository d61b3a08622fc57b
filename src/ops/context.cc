#include "ops/context.h"

#include "core/buffer.h"
#include "core/error.h"

namespace oases::ops {

void Slots::allocate(Arena& arena, DType dtype, int sub_batches, std::int64_t tokens,
                     std::int64_t hidden, bool with_reshard) {
  per_sub_batch_.assign(static_cast<std::size_t>(sub_batches), {});
  for (auto& slots : per_sub_batch_) {
    for (int s = 0; s < kSlotCount; ++s) {
      if (static_cast<Slot>(s) == Slot::reshard && !with_reshard) continue;
      slots[static_cast<std::size_t>(s)] = arena.allocate(dtype, {tokens, hidden});
    }
  }
}

const Tensor& Slots::at(Slot slot, int sub_batch) const {
  OASES_ASSERT(sub_batch >= 0 && sub_batch < static_cast<int>(per_sub_batch_.size()),
               "sub-batch {} of {}", sub_batch, per_sub_batch_.size());
  const Tensor& t = per_sub_batch_[static_cast<std::size_t>(sub_batch)][static_cast<std::size_t>(slot)];
  OASES_ASSERT(!t.empty(), "slot {} was not allocated", static_cast<int>(slot));
  return t;
}

}  // namespace oases::ops
