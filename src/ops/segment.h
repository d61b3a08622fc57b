// Segment: a differentiable piece of a model between two collectives. The schedule drives a
// segment through its actions; the segment owns the activations it saves between them.
//
//   forward(ctx, mb)          compute this segment for micro-batch mb, saving what backward needs
//   backward(ctx, mb, stage)  stage 0 runs from the segment's output gradient back to the
//                             backward collective (if any); stage 1 continues after it
//
// A segment may name one buffer reduced by a collective after forward() (e.g. the row-parallel
// partial sums) and one reduced between its backward stages (e.g. the input gradient of a
// column-parallel projection). With tensor parallelism off they are reduced over a group of
// one, which leaves them unchanged.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oases::ops {

// What the head segment does with its logits in forward().
enum class HeadMode {
  train,   // loss and its gradient (the gradient is formed during forward, chunk by chunk)
  eval,    // loss only; parameters' gradients untouched
  logits,  // write every logit to StepContext::logits_out; no loss
};

struct MicroBatchData {
  const std::int32_t* inputs = nullptr;   // [micro_batch, seq]
  const std::int32_t* targets = nullptr;  // [micro_batch, seq]; unused in HeadMode::logits
  std::int64_t global_sample_offset = 0;  // index of row 0 within the step's global batch
};

struct StepContext {
  std::int64_t step = 0;          // optimizer step (keys the dropout masks)
  HeadMode head_mode = HeadMode::train;
  bool dropout_enabled = true;    // false in evaluation and generation
  float loss_gradient_scale = 1;  // d(total loss)/d(per-token loss): 1 / tokens in global batch
  std::vector<MicroBatchData> micro_batches;
  float* logits_out = nullptr;    // [micro_batch, seq, vocab] in HeadMode::logits
};

class Segment {
 public:
  virtual ~Segment() = default;
  virtual const std::string& name() const = 0;
  virtual void forward(const StepContext& ctx, int micro_batch) = 0;
  virtual int backward_stages() const = 0;  // 1 or 2
  virtual void backward(const StepContext& ctx, int micro_batch, int stage) = 0;
  // Buffers reduced across the tensor-parallel group; an empty Tensor means no collective.
  virtual Tensor forward_collective_buffer() { return {}; }
  virtual Tensor backward_collective_buffer() { return {}; }
};

}  // namespace oases::ops
