// Segment: a differentiable piece of a model between two collectives (see ops/program.h).
// The schedule drives each instance (micro-batch mb, sub-batch sb) of a segment through its
// actions; the activations kept between actions live in the ActivationStore under the
// segment's id, so the schedule decides what is kept, freed and recomputed:
//
//   forward(ctx, mb, sb)           epilogue, body, output: every set of the segment is live
//                                  afterwards and the output is in the sub-batch's `output`
//                                  slot (or the buffer of its forward collective)
//   recompute(ctx, mb, sb, sets)   regenerate `sets` (and the output with kOutput) from what is
//                                  live; never issues a collective
//   backward(ctx, mb, sb, stage)   stage 0 runs from the segment's output gradient back to the
//                                  backward collective (if any); stage 1 continues after it.
//                                  Needs every set live.
//   release(mb, sb, sets)          frees sets
//   encode / decode(mb, sb, sets)  holds sets encoded between forward and backward, and back
//   partition(mb, sb, sets)        keeps this rank's slice of sets that are identical across
//                                  the segment's replica group (SegmentShape::
//                                  checkpoint_replicated); gather_sets() makes them whole
//                                  again with an all-gather over that group
//
// Zero-bubble pipelines split the backward pass of segments with SegmentShape::has_weight_part:
//
//   backward_input(ctx, mb, sb, stage)   the stage without the weight gradients of the
//                                        segment's GEMMs (input gradients, and the gradients
//                                        of norm parameters and of biases added by epilogues,
//                                        which come out of the same kernels); stage 0 stashes
//                                        the GEMMs' output gradients under kDeferredGradients
//   backward_weight(ctx, mb, sb)         after the last input stage: those GEMMs' weight (and
//                                        bias) gradients from the stash and the kept sets,
//                                        which must still be live; releases the stash
//
// Run in that order they give the same gradients as backward(). Which segments defer what:
// attention (QKV and output projections), MLP (its input and output projections) and the
// vocab-parallel head_loss (the vocabulary projection, from the logits' gradient the head keeps
// anyway). The embedding's scatter-add, the head's features and the single-rank head (whose
// vocabulary gradient is formed in forward, chunk by chunk) have nothing to defer.
//
// A segment instance works on `rows` sequences: sub-batch sb of micro-batch mb is rows
// [sb * rows, (sb + 1) * rows) of that micro-batch. Collective buffers are per sub-batch (or
// kept with the instance), so the collective of one sub-batch can be in flight while another
// computes.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"
#include "ops/activation_store.h"
#include "ops/context.h"
#include "ops/program.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oases::ops {

// What the head does with its logits in forward().
enum class HeadMode {
  train,   // loss and its gradient
  eval,    // loss only; parameters' gradients untouched
  logits,  // write every logit to StepContext::logits_out; no loss
};

struct MicroBatchData {
  const std::int32_t* inputs = nullptr;   // [micro_batch, seq]
  const std::int32_t* targets = nullptr;  // [micro_batch, seq]; a negative target is ignored
  std::int64_t global_sample_offset = 0;  // index of row 0 within the step's global batch
};

struct StepContext {
  std::int64_t step = 0;          // optimizer step (keys the dropout masks)
  HeadMode head_mode = HeadMode::train;
  bool dropout_enabled = true;    // false in evaluation and generation
  // d(total loss)/d(per-token loss): 1 / (counted targets of the global batch).
  double loss_gradient_scale = 1;
  std::vector<MicroBatchData> micro_batches;
  Tensor logits_out;              // [micro_batch * seq, vocab] in HeadMode::logits
};

// The loss the head segments accumulate during a run.
struct LossAccumulator {
  double sum = 0;           // sum of per-token losses seen since reset
  std::int64_t count = 0;   // targets counted since reset (ignored ones excluded)
  void reset() { sum = 0; count = 0; }
};

class Segment {
 public:
  Segment(int id, ActivationStore& store) : id_(id), store_(store) {}
  virtual ~Segment() = default;
  virtual const std::string& name() const = 0;
  virtual SegmentShape shape() const = 0;

  virtual void forward(const StepContext& ctx, int mb, int sb) = 0;
  // Default: a segment without recomputable sets has nothing to regenerate.
  virtual void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets);
  virtual void backward(const StepContext& ctx, int mb, int sb, int stage) = 0;
  // Default (no weight part): backward_input is backward, backward_weight is an error.
  virtual void backward_input(const StepContext& ctx, int mb, int sb, int stage);
  virtual void backward_weight(const StepContext& ctx, int mb, int sb);
  void release(int mb, int sb, TensorSets sets);
  // Holds live `sets` encoded (ActivationStore::encode), and brings them back.
  void encode(int mb, int sb, TensorSets sets, ActivationEncoding encoding);
  void decode(int mb, int sb, TensorSets sets);

  // A collective of instance (mb, sb): what it does, over which group, on which buffer.
  struct CollectiveCall {
    CollectiveKind kind = CollectiveKind::all_reduce;
    comm::ReduceOp op = comm::ReduceOp::sum;
    comm::Communicator* group = nullptr;
    Tensor buffer;  // all_reduce: combined in place; all_gather: the whole gathered output;
                    // all_to_all: what arrives, block i from rank i
    Tensor block;   // all_gather: this rank's block of `buffer`, already in place;
                    // all_to_all: what leaves, block j to rank j (as large as `buffer`);
                    // shift: what leaves (as large as `buffer`)
    // shift: `block` goes to the rank this many places after this one in the group (modulo its
    // size) and `buffer` is filled by the rank as many places before it.
    int shift = 0;
  };

  // The ranks on which the segment's checkpoint is identical (SegmentShape::
  // checkpoint_replicated; nullptr: none).
  virtual comm::Communicator* replica_group() const { return nullptr; }
  // Keeps this rank's slice of live `sets` (the checkpoint alone) out of the replica group's.
  void partition(int mb, int sb, TensorSets sets);
  // Makes partitioned `sets` whole again: the all-gather over the replica group that fills
  // them; they may be read once it has completed.
  CollectiveCall gather_sets(int mb, int sb, TensorSets sets);
  // The collectives named by shape().has_forward_collective / has_backward_collective.
  virtual CollectiveCall forward_collective(int mb, int sb);
  virtual CollectiveCall backward_collective(int mb, int sb);

  // Pipeline boundaries (SegmentShape::input_from_peer / output_to_peer): the tensor a Send
  // transmits for instance (mb, sb) (valid once the producing action has run), and the one a
  // Recv fills (acquired by this call where it is kept).
  virtual Tensor send_buffer(Payload payload, int mb, int sb);
  virtual Tensor recv_buffer(Payload payload, int mb, int sb);

  int id() const { return id_; }

 protected:
  ActivationKey key(int mb, int sb, std::uint8_t set) const { return {id_, mb, sb, set}; }
  // Set `set` of instance (mb, sb): acquired anew (laid out as `layout`) when `parts` forms it,
  // else the live one.
  Tensor acquire_or_get(int mb, int sb, TensorSet set, TensorSets parts,
                        const SetLayout& layout) const {
    return (parts & set) ? store_.acquire(key(mb, sb, set), layout.dtype(), layout.elements(),
                                          layout.encodable_elements())
                         : store_.get(key(mb, sb, set));
  }
  ActivationStore& store() const { return store_; }

 private:
  int id_;
  ActivationStore& store_;
};

}  // namespace oases::ops
