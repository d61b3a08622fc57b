// The language-model head: the epilogue that forms the last residual-stream value r_L, the
// features the vocabulary projection reads (a final norm, or BERT's prediction transform:
// dense + GeLU + LayerNorm), the vocab-parallel projection (tied to the word embedding, or its
// own weight; with a bias for BERT) and the cross-entropy loss (mean over the counted targets
// of the global batch; a negative target is ignored).
//
// In a tensor-parallel group of one, one segment does it all, in row chunks: each chunk's
// logits are formed, turned into their gradient in place and used at once for the features'
// and the weight's gradients, so the whole [n, V] logits never exist.
//
// Under tensor parallelism (vocab-parallel cross-entropy, Megatron-LM) each rank holds a block
// of the vocabulary and the loss needs three reductions over the group. They are collectives of
// the Program like any other, so overlapped schedules hide them behind the other sub-batch's
// compute, the verifier checks them and the simulator prices them:
//
//   head          r_L -> features -> logits [n, V / T] -> row maxima        | AR max (maxima)
//   head_softmax  sums of exponentials, target logits                       | AR sum (sums)
//   head_loss     per-token losses; the logits' gradient in place (training)
//                 backward: d(features) = d(logits) @ W (partial), d(W)
//   head (back)   stage 0: nothing; | AR sum d(features) |; stage 1: features and epilogue
//
// The logits, maxima and sums are kept in the head's internals until head_loss's backward:
// [n, V / T] per sub-batch instance, as Megatron-LM keeps them.
#pragma once

#include "ops/context.h"
#include "ops/epilogue.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/segment.h"

#include <memory>
#include <vector>

namespace oases::ops {

struct HeadSpec {
  ResidualEpilogue epilogue;
  // BERT's prediction transform, replicated on every rank (absent: none).
  ColumnParallelLinear transform;
  bool has_transform = false;
  Norm transform_norm;
  Norm final_norm;       // absent when the transform's norm is the last one
  ParamRef vocab_weight;  // [local vocabulary rows, hidden] ([out, in] layout)
  ParamRef vocab_bias;    // [local vocabulary rows], or absent
  std::int64_t vocab_begin = 0;  // first token of this rank's rows
  std::int64_t vocab_valid = 0;  // rows that are real tokens (the last ranks may hold padding)
  // Sequence parallelism: r_L arrives all-gathered in Slot::output (the epilogue copies it; a
  // shard segment before ran the real epilogue on each rank's tokens); backward leaves d(r_L)
  // in Slot::residual_grad as always, whole and the same on every rank.
  bool gathered_input = false;
};

// One segment (tensor-parallel group of one), or the three vocab-parallel segments; the
// segments are appended to `segments` with consecutive ids starting at `first_id`.
void append_head_segments(int first_id, const ModelContext& model, HeadSpec spec,
                          LossAccumulator& loss, Arena& arena,
                          std::vector<std::unique_ptr<Segment>>& segments);

// Backward scratch the head needs beyond [tokens, hidden] (elements).
std::int64_t head_scratch_wide_elements(const ModelContext& model);

}  // namespace oases::ops
