// Program: what a schedule generator knows about a model. A model is an ordered chain of
// segments; each segment may be followed by a forward collective (reducing its output) and may
// have a backward collective between its two backward stages. The activations a segment keeps
// for its backward pass come in named sets, which a schedule keeps, frees and recomputes:
//
//   checkpoint  the residual-stream value the segment computes first from its input (its
//               epilogue: bias + dropout + residual add, and a post-norm where the
//               architecture has one, after the previous collective). The next segment's
//               epilogue reads it as its residual. Recomputing it needs the previous segment's
//               reduced output, so it replays a collective.
//   internals   what the segment's body computes from its checkpoint up to (not including) its
//               final row-parallel GEMM: norm outputs and statistics, QKV, MLP activations.
//               Recomputing it from a live checkpoint needs no collective.
//   core        core attention's output and row log-sum-exps; recomputed from `internals`
//               (selective recomputation).
//
// Where consecutive layers run at different tensor-parallel degrees a reshard segment sits
// between them: it finishes the first layer's output (the epilogue) on that layer's rows and
// moves the result to the next layer's rows (an all-gather along the batch when the degree
// rises; a slice when it falls, whose backward gathers the gradient).
//
// A Recompute action may also regenerate the segment's `output` (the partial sums its forward
// collective reduces) so that a whole-layer recomputation can replay the collectives.
#pragma once

#include "core/named_values.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace oases::ops {

enum TensorSet : std::uint8_t {
  kCheckpoint = 1,
  kInternals = 2,
  kCore = 4,
  kOutput = 8,  // only in a Recompute's mask: also write the partial sums of the output
};
using TensorSets = std::uint8_t;

// What a segment's collective does with its buffer.
enum class CollectiveKind : std::uint8_t {
  all_reduce,  // combines the partial results of the ranks that share the segment's parameters
  all_gather,  // concatenates row blocks: a reshard between layers of different degrees
  all_to_all,  // exchanges equal blocks: MoE dispatch and combine over the expert-parallel group
  // Sums the partial results of the group and leaves each rank its block of the sum: the exit
  // of a tensor-parallel region under sequence parallelism (and, in backward, its entry).
  reduce_scatter,
  // One step of a ring: each rank sends a block to a neighbour in the group and receives one
  // from its other neighbour (ring attention's key/value blocks over the context-parallel
  // group; Segment::CollectiveCall::shift says which way).
  shift,
};

// How a tensor-parallel region's exit completes its partial sums (and its entry, in backward,
// the input gradient's): whole on every rank, or under sequence parallelism each rank's block
// of the tokens.
inline CollectiveKind partial_sum_collective(bool sequence_parallel) {
  return sequence_parallel ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce;
}

// How an all-reduce combines: sums of partial products, or the maximum (the vocab-parallel
// loss's row maxima).
enum class ReduceKind : std::uint8_t { sum, max };

// What a point-to-point transfer between pipeline stages carries.
enum class Payload : std::uint8_t { activation, gradient };

std::string tensor_sets_name(TensorSets sets);

// How a kept set is held between its producer's last forward use and the backward that reads
// it, when activations are compressed (ActivationStore::encode, schedule::compress_kept_sets).
enum class ActivationEncoding : std::uint8_t {
  bf16,      // bfloat16: 8 exponent bits like f32, 8 significant bits; rounded to nearest even
  fp8_e4m3,  // OCP 8-bit e4m3: 4 significant bits, saturating at +-448; rounded to nearest even
};
inline std::size_t encoded_element_bytes(ActivationEncoding encoding) {
  switch (encoding) {
    case ActivationEncoding::bf16: return 2;
    case ActivationEncoding::fp8_e4m3: return 1;
  }
  return 0;
}
// parallel.activation_compression's words for the encodings.
inline constexpr std::array<NamedValue<ActivationEncoding>, 2> kActivationEncodingNames{{
    {ActivationEncoding::bf16, "bf16"}, {ActivationEncoding::fp8_e4m3, "fp8"}}};
inline const char* encoding_name(ActivationEncoding encoding) {
  return value_name<ActivationEncoding>(kActivationEncodingNames, encoding).data();
}  // "checkpoint|internals", "-" for none

// A matrix product [m, k] x [k, n], `count` times (core attention: once per row and head):
// 2 m n k FLOPs each.
struct MatMul {
  std::int64_t m = 0, n = 0, k = 0, count = 1;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
           static_cast<double>(count);
  }
};

// What a part of a segment instance's computation costs on a device: its matrix products (each
// priced by a device's efficiency at its size) and the bytes its memory-bound kernels read and
// write (norms, activations, softmax, dropout, residual adds, copies).
struct Work {
  std::vector<MatMul> matmuls;
  double bytes = 0;
  double flops() const;
  Work& operator+=(const Work& other);
};

// A segment instance's work, for pricing its instructions on hardware this machine is not
// (sim/). Forward is split by what each part produces, so that a Recompute of some sets costs
// theirs: the checkpoint (the epilogue), the internals, the core, and the output (the partial
// sums the forward collective reduces). Backward is given stage by stage without the weight
// gradients, and the weight gradients apart: a whole stage 0 is backward_input[0] plus
// backward_weight; under zero-bubble the input-only stage 0 and BackwardWeight take the parts.
// Segments that do not describe their work leave `known` false (a profile's programs, whose
// instructions take measured times).
struct SegmentWork {
  bool known = false;
  Work checkpoint, internals, core, output;
  std::vector<Work> backward_input;  // one per backward stage
  Work backward_weight;
  Work forward() const;
  Work recompute(TensorSets sets) const;
  Work backward(int stage, bool input_only) const;
};

struct SegmentShape {
  std::string name;
  bool has_forward_collective = false;
  bool has_backward_collective = false;
  int backward_stages = 1;
  CollectiveKind forward_kind = CollectiveKind::all_reduce;
  CollectiveKind backward_kind = CollectiveKind::all_reduce;
  ReduceKind forward_reduce = ReduceKind::sum;
  // Ranks taking part in the segment's collectives (1: a group of one, nothing on the wire).
  int collective_ranks = 1;
  // Context parallelism: the segment's all-to-alls run over the context-parallel group of this
  // many ranks (rather than the expert-parallel group, or collective_ranks); 0: none.
  int context_parallel_ranks = 0;
  // Sequence parallelism: the segment's all-gathers and reduce-scatters run over its own
  // layer's group (degree ranks), along the tokens, rather than joining groups of two degrees
  // as a reshard's all-gather does.
  bool sequence_sharded = false;
  // A sequence-sharded segment whose backward collective runs over another degree's group than
  // `degree` (a shard segment after a change of degree gathers for the block before it); 0:
  // `degree`.
  int backward_degree = 0;
  // Tensor-parallel degree the segment runs at: its parameters are split this many ways and
  // it processes degree / T of every sub-batch's rows (T: the group size). A reshard segment
  // runs at the degree of the layer before it.
  int degree = 1;
  // The tensor sets this segment keeps between its Forward and its Backward, and their sizes.
  TensorSets sets = 0;
  std::size_t checkpoint_bytes = 0, internals_bytes = 0, core_bytes = 0;
  // Of those, the bytes of statistics (norm statistics, log-sum-exps, ...) at the end of each
  // block, which an encoding keeps as they are (ops::SetLayout).
  std::size_t checkpoint_statistics_bytes = 0, internals_statistics_bytes = 0,
              core_statistics_bytes = 0;
  // Elements of the forward and backward collective buffers (for pricing them).
  std::int64_t forward_collective_elements = 0, backward_collective_elements = 0;
  // Transformer layer the segment belongs to (-1: embedding, head). Whole-layer recomputation
  // (Megatron's "full") replays every segment of a layer from the layer's first checkpoint.
  int layer = -1;
  // Whether schedules may drop this segment's sets after Forward and recompute them.
  bool recomputable = false;
  // Sets the schedules never drop after Forward, even where the segment is recomputable: later
  // segments of the layer add to them in their Forwards (ring attention's running output), so
  // they cannot be regenerated by the segment alone.
  TensorSets never_dropped = 0;
  // The segment computes beside its neighbours' transfers: its Forward reads neither the
  // previous segment's forward collective nor Slot::output (the segment after it reads that
  // collective), and its backward reads nothing of the next segment's backward collective (the
  // segment before it does). Schedules wait for those collectives after this segment's Forward
  // and backward, so that they travel while it computes (ring attention's block in hand). Such
  // a segment has no collectives and one backward stage, keeps no sets of its own and has no
  // output: a Recompute has nothing to regenerate, so replays skip it.
  bool beside_transfers = false;
  // The checkpoint is identical on every rank of the segment's collective group (a layer's
  // residual-stream input under tensor parallelism), so each rank may keep a slice of it
  // between forward and backward and gather it back (schedule::partition_kept_checkpoints).
  bool checkpoint_replicated = false;
  // Earlier segments whose kept sets this segment's Forward and Backward read besides the
  // previous segment's checkpoint (the vocab-parallel loss segments read the logits the head
  // keeps): those sets must stay live until this segment has run.
  std::vector<int> reads_sets_of = {};
  // Which sets of each of those owners it reads, in the same order (empty: every set of each).
  // Ring attention's steps read only the projections' core (and a receive segment's
  // checkpoint): the projections' other sets may be dropped, partitioned or recomputed as
  // their own segment's policy says.
  std::vector<TensorSets> owner_sets_read = {};
  TensorSets sets_read_of(std::size_t owner_index) const {
    return owner_index < owner_sets_read.size() ? owner_sets_read[owner_index]
                                                : TensorSets{kCheckpoint | kInternals | kCore};
  }
  // The earlier segment whose checkpoint the epilogue reads as its residual, where that is not
  // the previous segment (-1: the previous one, as everywhere but under sequence parallelism,
  // where a shard segment's residual is the checkpoint of the shard segment before the body in
  // between). Forward, and a Recompute of the checkpoint, read it; schedules keep it live until
  // then.
  int residual_of = -1;
  // Gradient bucket whose gradients are all final once this segment's last backward stage has
  // run on every micro-batch and sub-batch (-1: none). Lets the data-parallel reduction of later
  // layers overlap the backward pass of earlier ones.
  int ready_bucket = -1;
  // Gradient buckets (parameter groups, model::Model::Bucket::id) whose parameters the
  // segment's Forward, Recompute, Backward and BackwardWeight read, ascending. Under ZeRO-3
  // (schedule::shard_parameters) each must be gathered (WaitParams) before any of them runs.
  std::vector<int> param_buckets = {};
  // Zero-bubble split of the backward pass (schedule/schedule.h: Backward with input_only,
  // BackwardWeight). With has_weight_part, the segment's backward stages can run as their input
  // part alone (everything the previous segment and a previous pipeline chunk wait for), leaving
  // weight gradients to one BackwardWeight per instance. BackwardWeight reads every kept set
  // of the segment and of its reads_sets_of owners, so those stay live until it has run; the
  // input part's stage 0 stashes deferred_gradient_bytes (the output gradients of the deferred
  // GEMMs) with the instance, and BackwardWeight releases them.
  bool has_weight_part = false;
  std::size_t deferred_gradient_bytes = 0;
  // Pipeline chunk boundaries (schedule/schedule.h). A rank's Program holds the segments of its
  // chunks; where consecutive segments belong to different chunks the first is output_to_peer
  // and the second input_from_peer.
  //
  // input_from_peer: the segment is the first of a model chunk that does not start the
  // model: its input activation arrives by Recv(activation) for the same (mb, sb) before its
  // Forward (instead of from the previous segment), and after its last backward stage the
  // gradient of that input is sent back by Send(gradient).
  bool input_from_peer = false;
  // output_to_peer: the segment is the last of a model chunk that does not end the model:
  // Send(activation) after its Forward carries its output to the next chunk, and its backward
  // stage 0 needs Recv(gradient) (the gradient of that output) first; there is no following
  // segment on this rank whose backward it waits for.
  bool output_to_peer = false;
  // Bytes of the buffer a receive of the segment fills (the input activation of an
  // input_from_peer segment, the output gradient of an output_to_peer one; 0 for others). It
  // is live in the activation store from the receive's RecvStart until the Forward or backward
  // stage 0 that reads it has run.
  std::size_t received_bytes = 0;
  // The arithmetic of one instance (ops/program.h SegmentWork).
  SegmentWork work = {};
};

struct Program {
  std::vector<SegmentShape> segments;
  // Bytes of one element of the kept sets (their dtype's size): an encoded set holds its
  // (bytes - statistics bytes) / set_element_bytes elements in the encoding, and its
  // statistics as they were.
  std::size_t set_element_bytes = 4;
  // Bytes of the parameters forward and backward read (the 16-bit copy under mixed precision)
  // of each gradient bucket on this rank, indexed by bucket id (0 for ids this rank does not
  // hold): what a ZeRO-3 gather brings in, for pricing it.
  std::vector<std::size_t> bucket_param_bytes = {};
  // Whether each gradient bucket holds a mixture-of-experts layer's experts (indexed like
  // bucket_param_bytes): their replicas are the expert-data-parallel ranks, not the
  // data-parallel ones.
  std::vector<bool> bucket_holds_experts = {};
};

inline std::size_t statistics_bytes_of(const SegmentShape& shape, TensorSet set) {
  switch (set) {
    case kCheckpoint: return shape.checkpoint_statistics_bytes;
    case kInternals: return shape.internals_statistics_bytes;
    case kCore: return shape.core_statistics_bytes;
    case kOutput: return 0;
  }
  return 0;
}

inline std::size_t bytes_of(const SegmentShape& shape, TensorSet set) {
  switch (set) {
    case kCheckpoint: return shape.checkpoint_bytes;
    case kInternals: return shape.internals_bytes;
    case kCore: return shape.core_bytes;
    case kOutput: return 0;
  }
  return 0;
}

// Elements of `sets` of one instance of `segment` that an activation encoding rounds: each
// set's bytes less its statistics (kept as they are), in elements of the program's sets.
inline double encodable_elements(const Program& program, int segment, TensorSets sets) {
  const SegmentShape& shape = program.segments[static_cast<std::size_t>(segment)];
  double elements = 0;
  for (TensorSet set : {kCheckpoint, kInternals, kCore})
    if (sets & set)
      elements += static_cast<double>(bytes_of(shape, set) - statistics_bytes_of(shape, set)) /
                  static_cast<double>(program.set_element_bytes);
  return elements;
}

}  // namespace oases::ops
