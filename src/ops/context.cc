#include "ops/context.h"

#include "core/buffer.h"
#include "core/error.h"

#include <algorithm>

namespace oases::ops {

void Slots::allocate(Arena& arena, DType dtype, int lanes, int sub_batches, std::int64_t tokens,
                     std::int64_t hidden, bool with_reshard, std::int64_t moe_rows,
                     std::int64_t cp_elements, bool ring) {
  OASES_ASSERT(lanes >= 1 && sub_batches >= 1, "{} lanes of {} sub-batches", lanes, sub_batches);
  lanes_ = lanes;
  sub_batches_ = sub_batches;
  per_lane_.assign(static_cast<std::size_t>(lanes * sub_batches), {});
  for (auto& slots : per_lane_) {
    for (int s = 0; s < kSlotCount; ++s) {
      const auto slot = static_cast<Slot>(s);
      if (slot == Slot::reshard && !with_reshard) continue;
      if (slot >= Slot::cp_send) {
        if (cp_elements > 0 && (ring || slot < Slot::cp_kv_grad))
          slots[static_cast<std::size_t>(s)] = arena.allocate(dtype, {cp_elements});
        continue;
      }
      if (slot >= Slot::moe_send) {
        if (moe_rows == 0) continue;
        if (slot == Slot::moe_residual) {
          slots[static_cast<std::size_t>(s)] = arena.allocate(dtype, {tokens, hidden});
          continue;
        }
        std::int64_t rows = moe_rows;
        const std::int64_t width = slot == Slot::moe_routing ? moe_routing_elements(dtype)
                                                              : hidden + moe_header_elements(dtype);
        // The received gradients' buffer doubles as the one an MoE layer at degree > 1 sums
        // over its tensor-parallel group: [tokens, hidden] input gradients, then a gradient per
        // slot weight.
        if (slot == Slot::moe_grad_recv)
          rows = std::max(rows, (tokens * hidden + moe_rows + width - 1) / width);
        slots[static_cast<std::size_t>(s)] = arena.allocate(dtype, {rows, width});
        continue;
      }
      slots[static_cast<std::size_t>(s)] = arena.allocate(dtype, {tokens, hidden});
    }
  }
}

Tensor statistics_view(const Tensor& block, std::int64_t offset, std::int64_t count) {
  OASES_ASSERT(block.is_contiguous() && offset >= 0 &&
                   (offset + statistics_footprint(block.dtype(), count)) <= block.numel(),
               "statistics [{}, +{}) outside a block of {} elements", offset, count, block.numel());
  const DType dtype = statistics_dtype(block.dtype());
  if (dtype == block.dtype()) return block.view(offset, {count});
  auto* start = static_cast<char*>(block.raw()) + offset * static_cast<std::int64_t>(block.element_size());
  return Tensor(start, dtype, {count}, block.device());
}

const Tensor& Slots::at(Slot slot, int micro_batch, int sub_batch) const {
  OASES_ASSERT(sub_batch >= 0 && sub_batch < sub_batches_ && micro_batch >= 0,
               "micro-batch {}, sub-batch {} of {}", micro_batch, sub_batch, sub_batches_);
  const int lane = micro_batch % lanes_;
  const Tensor& t = per_lane_[static_cast<std::size_t>(lane * sub_batches_ + sub_batch)]
                             [static_cast<std::size_t>(slot)];
  OASES_ASSERT(!t.empty(), "slot {} was not allocated", static_cast<int>(slot));
  return t;
}

}  // namespace oases::ops
