// What the segments of one model instance share, fixed when the model is built: the element
// type, the sizes of a sub-batch, the tensor-parallel group, the activation store, the slots
// through which consecutive segments pass tensors, and backward scratch. Segments hold a
// const reference to it; nothing in it changes during a step.
#pragma once

#include "comm/communicator.h"
#include "core/named_values.h"
#include "core/tensor.h"
#include "kernels/kernels.h"
#include "ops/activation_store.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace oases::ops {

// The tensors that pass between consecutive segments of one sub-batch, by name. Each is
// [tokens of a sub-batch, hidden]; a segment at a lower tensor-parallel degree uses the first
// rows (its share of the sub-batch).
enum class Slot : std::uint8_t {
  output,         // what the last segment run forward produced, before the next epilogue:
                  // the partial sums its forward collective reduces
  output_grad,    // gradient with respect to `output` (whole on every rank of its group)
  residual_grad,  // gradient flowing along the residual stream
  input_grad,     // partial gradient of a block's input (the backward collective's buffer);
                  // also the gradient rows a reshard gathers in backward
  reshard,        // rows a reshard gathers in forward (present only where the degree changes)
  // Mixture-of-experts layers only ([MoE rows, hidden + moe_header_elements]: a token's row and
  // its global sample and position; routing [MoE rows, moe_routing_elements]): what the
  // dispatch and combine all-to-alls send and receive in forward, the same for the gradients in
  // backward, and the routing (token, weight) of every slot the dispatch hands the combine, and
  // the residual-stream value h it
  // hands the combine ([tokens, hidden]), which keeps it for the next epilogue. moe_grad_recv
  // also holds what an MoE layer at degree > 1 sums over its group in backward ([tokens, hidden]
  // input gradients, then one per slot weight), so it has at least that many elements.
  moe_send,
  moe_recv,
  moe_grad_send,
  moe_grad_recv,
  moe_routing,
  moe_residual,
  // Context parallelism of the all-to-all kind ([cp_elements] each, present only then): what
  // the attention's all-to-alls send and receive in forward (q|k|v rows, then the core's
  // output), and the same for the gradients in backward.
  cp_send,
  cp_recv,
  cp_grad_send,
  cp_grad_recv,
  // Context parallelism of the ring kind also keeps, between the segments of a layer's
  // backward, one step's share of a block's dk|dv, the queries' gradient and the attention
  // output's gradient ([cp_elements] each, present only then; ops/ring_attention.cc).
  cp_kv_grad,
  cp_query_grad,
  cp_out_grad,
};
inline constexpr int kSlotCount = 18;

// An MoE row ends in a header of 8 bytes, held as raw bits whatever the element type (a 16-bit
// float cannot hold a position): the token's global sample and position as int32 (sample -1:
// an empty slot). A routing row is 16 raw bytes: the token within the segment instance as
// int64 (-1: empty) and the slot's weight as a double. In elements of `dtype`:
inline constexpr std::int64_t moe_header_elements(DType dtype) {
  return static_cast<std::int64_t>(8 / dtype_size(dtype));
}
inline constexpr std::int64_t moe_routing_elements(DType dtype) {
  return static_cast<std::int64_t>(16 / dtype_size(dtype));
}

class Slots {
 public:
  // Allocates every slot (reshard only when `with_reshard`, the MoE slots only when moe_rows
  // > 0, the context-parallel ones only when cp_elements > 0, those of the ring kind only with
  // `ring`) for `lanes` x `sub_batches`
  // (micro-batch lane, sub-batch) pairs of `tokens` x `hidden` elements of `dtype` from
  // `arena`.
  void allocate(Arena& arena, DType dtype, int lanes, int sub_batches, std::int64_t tokens,
                std::int64_t hidden, bool with_reshard, std::int64_t moe_rows = 0,
                std::int64_t cp_elements = 0, bool ring = false);
  // [tokens, hidden]: the slot of micro-batch `micro_batch` (lane micro_batch % lanes) and
  // sub-batch `sub_batch`.
  const Tensor& at(Slot slot, int micro_batch, int sub_batch) const;

 private:
  int lanes_ = 1, sub_batches_ = 1;
  std::vector<std::array<Tensor, kSlotCount>> per_lane_;  // [lane * sub_batches + sub_batch]
};

// How attention sees the whole sequence under context parallelism (parallel.cp_kind).
enum class ContextParallelKind : std::uint8_t {
  all_to_all,  // DeepSpeed-Ulysses: sequence shards traded for head shards around core attention
  ring,        // key/value blocks passed around the context-parallel group
};
inline constexpr std::array<NamedValue<ContextParallelKind>, 2> kContextParallelKindNames{
    {{ContextParallelKind::all_to_all, "all-to-all"}, {ContextParallelKind::ring, "ring"}}};

// Sub-groups of the tensor-parallel group by (span, stride): see comm::Mesh::tp_subgroup.
using TpSubgroups = std::function<comm::Communicator&(int span, int stride)>;

// Where a segment runs within a tensor-parallel group of T ranks. At degree k (dividing T) its
// parameters are split k ways and this rank holds shard tp_rank % k; the T / k groups of k
// neighbouring ranks (tp_rank / k) each process their own block of every sub-batch's rows, so
// activations are whole within a group of k and differ between groups.
struct Placement {
  int degree = 1;
  int shard = 0;                        // tp_rank % degree
  std::int64_t rows = 0;                // sequences of each sub-batch this group processes
  std::int64_t first_row = 0;           // their first row within the sub-batch
  comm::Communicator* group = nullptr;  // the `degree` ranks that sum partial results
};

struct ModelContext {
  // Activations, their gradients, slots, scratch and kept sets (f32 or f64; bf16 or f16 under
  // mixed precision, where statistics are f32: statistics_dtype).
  DType dtype = DType::f32;
  // The matrix-product paths of 16-bit linear layers (ignored in f32 and f64).
  kernels::Gemm16Paths gemm16;
  std::int64_t seq_len = 0;  // tokens of each sequence on this rank (see cp below)
  std::int64_t hidden = 0;
  std::int64_t rows = 0;        // sequences per sub-batch
  int sub_batches = 1;
  // Micro-batches whose segments may run at once with their own slots (micro-batch mb uses lane
  // mb % slot_lanes): 2 where the schedule interleaves two micro-batches' forwards
  // (schedule::slot_lanes), else 1.
  int slot_lanes = 1;
  comm::Communicator* tp = nullptr;  // the tensor-parallel group (a group of one: no TP)
  // Sequence parallelism: between tensor-parallel regions each rank of a layer's group holds
  // its block of the tokens (ops/layer_segments.h, make_sequence_shard_segment); the embedding
  // reduce-scatters its output.
  bool sequence_parallel = false;
  // The expert-parallel group: the ranks among which MoE layers dispatch tokens (a group of one:
  // every expert on this rank).
  comm::Communicator* ep = nullptr;
  // Context parallelism: the cp group (a group of one: none) splits every sequence of
  // full_seq_len tokens into 2 x cp equal chunks; this rank holds chunks cp_rank and
  // 2 cp - 1 - cp_rank of each sequence, in that order, so seq_len = full_seq_len / cp is the
  // tokens per sequence here and position() maps them to their place in the sequence.
  comm::Communicator* cp = nullptr;
  ContextParallelKind cp_kind = ContextParallelKind::all_to_all;
  std::int64_t full_seq_len = 0;
  std::uint64_t seed = 0;            // keys dropout masks
  double dropout = 0;                // probability at every residual-stream dropout site
  double attention_dropout = 0;      // probability of dropping an attention probability
  ActivationStore* store = nullptr;
  Slots slots;
  // Backward scratch shared by every segment and sub-batch (one action runs at a time):
  // [tokens, hidden] and [tokens, widest layer activation].
  Tensor scratch_narrow, scratch_wide;

  std::int64_t tokens() const { return rows * seq_len; }
  int cp_size() const { return cp ? cp->size() : 1; }
  int cp_rank() const { return cp ? cp->rank() : 0; }
  // Tokens of one context-parallel chunk (the whole sequence without context parallelism).
  std::int64_t chunk_len() const {
    return cp_size() > 1 ? full_seq_len / (2 * cp_size()) : seq_len;
  }
  // The chunk of the sequence that context-parallel rank `rank` holds `half`-th (0 or 1).
  std::int64_t chunk_of(int rank, int half) const {
    return half == 0 ? rank : 2 * cp_size() - 1 - rank;
  }
  // Position within its sequence of this rank's local position `local` (in [0, seq_len)).
  std::int64_t position(std::int64_t local) const { return position_of(cp_rank(), local); }
  // The same for context-parallel rank `rank`.
  std::int64_t position_of(int rank, std::int64_t local) const {
    if (cp_size() == 1) return local;
    const std::int64_t chunk = chunk_len();
    return chunk_of(rank, static_cast<int>(local / chunk)) * chunk + local % chunk;
  }
  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
  const Tensor& slot(Slot s, int micro_batch, int sub_batch) const {
    return slots.at(s, micro_batch, sub_batch);
  }
  // The first `rows` sequences of a slot.
  Tensor slot_rows(Slot s, int micro_batch, int sub_batch, std::int64_t sequences) const {
    return slots.at(s, micro_batch, sub_batch).rows(0, sequences * seq_len);
  }
};

// A parameter resolved once at construction: its values and its gradient, views into the
// model's flat arrays. Empty for an absent parameter (e.g. no bias).
struct ParamRef {
  Tensor value;
  Tensor grad;
  bool present() const { return !value.empty(); }
};

// The type of the statistics kept beside activations of type `activations` (norm means and
// reciprocal deviations, attention log-sum-exps, head maxima, sums and losses): f32 under mixed
// precision, else the activations' own type.
constexpr DType statistics_dtype(DType activations) {
  return activations == DType::bf16 || activations == DType::f16 ? DType::f32 : activations;
}

// `elements` elements of `dtype` rounded up to whole 64-byte lines, in elements.
inline std::int64_t aligned_elements(DType dtype, std::int64_t elements) {
  const auto align = static_cast<std::int64_t>(64 / dtype_size(dtype));
  return (elements + align - 1) / align * align;
}

// Elements of a block of `block` type that hold `count` statistics (statistics_dtype), whole
// 64-byte lines.
inline std::int64_t statistics_footprint(DType block, std::int64_t count) {
  const auto bytes = static_cast<std::int64_t>(dtype_size(statistics_dtype(block))) * count;
  const auto element = static_cast<std::int64_t>(dtype_size(block));
  return aligned_elements(block, (bytes + element - 1) / element);
}

// The `count` statistics that start `offset` elements into `block` (a 64-byte aligned offset,
// as SetLayout::statistics_offset gives), seen in statistics_dtype.
Tensor statistics_view(const Tensor& block, std::int64_t offset, std::int64_t count);

// A tensor set laid out as pieces of one block, so that one acquisition keeps all of it: the
// activation pieces first, then the statistics pieces, each starting 64-byte aligned. An
// encoding of the block (ActivationStore::encode) rounds the activations and keeps the
// statistics as they are: encodable_elements() ends where the statistics begin.
class SetLayout {
 public:
  explicit SetLayout(DType dtype = DType::f32) : dtype_(dtype) {}
  // Adds an activation piece of `elements` elements and returns its offset (in elements) in
  // the block.
  std::int64_t add(std::int64_t elements) {
    const std::int64_t offset = activations_;
    activations_ += aligned_elements(dtype_, elements);
    return offset;
  }
  // Adds a piece of `count` statistics (statistics_dtype) and returns its number, for
  // statistics_offset once every piece has been added.
  int add_statistics(std::int64_t count) {
    statistic_offsets_.push_back(statistics_);
    statistics_ += statistics_footprint(dtype_, count);
    return static_cast<int>(statistic_offsets_.size()) - 1;
  }
  // Where statistics piece `piece` starts in the block, in elements (view it with
  // statistics_view).
  std::int64_t statistics_offset(int piece) const {
    return activations_ + statistic_offsets_[static_cast<std::size_t>(piece)];
  }
  DType dtype() const { return dtype_; }
  std::int64_t elements() const { return std::max<std::int64_t>(activations_ + statistics_, 1); }
  std::int64_t encodable_elements() const { return activations_; }
  std::size_t bytes() const { return static_cast<std::size_t>(elements()) * dtype_size(dtype_); }
  std::size_t statistics_bytes() const {
    return static_cast<std::size_t>(statistics_) * dtype_size(dtype_);
  }

 private:
  DType dtype_;
  std::int64_t activations_ = 0, statistics_ = 0;
  std::vector<std::int64_t> statistic_offsets_;
};

}  // namespace oases::ops
