// The segments of a GPT-2 model. Segment boundaries sit at the tensor-parallel collectives
// (DESIGN.md, "a model is a Program of segments and collectives"):
//
//   EmbeddingSegment      tokens -> E = wte[tokens] + wpe                       | AR(E)
//   AttentionSegment(l)   r_l = h_{l-1} + drop(Q_{l-1} + b)   (r_0 = drop(E))
//                         -> LN1 -> QKV -> causal attention -> out-proj P_l     | AR(P_l)
//   MlpSegment(l)         h_l = r_l + drop(P_l + b_proj) -> LN2 -> FC1 -> GeLU
//                         -> FC2 Q_l                                           | AR(Q_l)
//   HeadSegment           r_L = h_{L-1} + drop(Q_{L-1} + b) -> LN_f -> logits -> loss
//
// Where layer l - 1 and layer l (or the embedding and layer 0, or the last layer and the
// head) run at different degrees, a ReshardSegment between them takes over the epilogue:
//
//   ReshardSegment(l)     r_l = h_{l-1} + drop(Q_{l-1} + b) on layer l-1's rows  | AG(r_l)
//                         (degree rises: gather the groups' rows; falls: keep this group's
//                         rows, and gather the gradient in backward)
//
// and the next segment's epilogue is a copy of r_l.
//
// Backward collectives (between stage 0 and stage 1) reduce the gradient of LN1's and LN2's
// outputs: AttentionSegment and MlpSegment have two backward stages. Each segment's epilogue
// (the bias + dropout + residual add that follows the previous collective) is the first thing
// it computes, so the residual values r_l, h_l it saves are exactly the fine-grained
// recomputation checkpoints.
//
// Shapes: n = micro_batch * seq tokens, C = hidden, F = ffn_hidden, V = vocab.
#pragma once

#include "comm/communicator.h"
#include "core/buffer.h"
#include "model/gpt_config.h"
#include "model/param_layout.h"
#include "ops/activation_store.h"
#include "ops/segment.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

namespace oases::ops {

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

// Sub-groups of the tensor-parallel group by (span, stride): see comm::Mesh::tp_subgroup.
using TpSubgroups = std::function<comm::Communicator&(int span, int stride)>;

// Buffers and parameters every GPT segment of one model instance shares.
//
// Under tensor parallelism (tp->size() = T > 1) a layer at degree k holds heads/k attention
// heads and ffn_hidden/k MLP columns; the embedding and the head always run at T (this rank
// holds padded_vocab/T rows of wte). Activations between segments ([n, C]) are whole within
// each group of k ranks of the segment's placement.
struct GptState {
  model::GptConfig config;
  std::int64_t rows = 0;         // sequences per sub-batch (micro_batch / sub_batches)
  int sub_batches = 1;
  comm::Communicator* tp = nullptr;  // the tensor-parallel group (a group of one: no TP)
  // Degree of each transformer layer (empty: every layer at T). Degrees below T need
  // tp_subgroup.
  std::vector<int> layer_degrees;
  TpSubgroups tp_subgroup;
  const model::ParamLayout* layout = nullptr;
  float* params = nullptr;  // flat, laid out by *layout
  float* grads = nullptr;   // flat, same layout; accumulated by backward
  std::uint64_t seed = 0;
  ActivationStore* store = nullptr;

  // Boundary buffers between segments, one [n, C] each per sub-batch (n: the tokens of a
  // whole sub-batch; a segment at a lower degree uses the first rows).
  struct Ports {
    float* partial = nullptr;     // output of the last forward segment, before its epilogue
    float* d_partial = nullptr;   // gradient with respect to `partial`
    float* d_residual = nullptr;  // gradient flowing along the residual stream
    float* d_ln = nullptr;        // partial gradient of a LayerNorm output (backward collective)
    float* reshard = nullptr;     // rows being gathered by a reshard (null without one)
  };
  std::vector<Ports> ports;
  // Backward scratch shared by every segment and sub-batch (one action runs at a time).
  float* scratch_narrow = nullptr;  // [n, C]
  float* scratch_wide = nullptr;    // [n, max over layers of (3 * local attention width, local ffn)]

  std::int64_t tokens() const { return rows * config.seq_len; }
  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
  // Degree of layer `layer`; the embedding (-1) and the head (layers) run at T.
  int degree_of(std::int64_t layer) const;
  Placement placement(std::int64_t layer) const;
  std::int64_t local_vocab_rows() const { return config.padded_vocab(tp_size()) / tp_size(); }
  std::int64_t vocab_begin() const { return tp_rank() * local_vocab_rows(); }
  // Rows of this rank's wte slice that are real tokens (the last ranks may hold padding).
  std::int64_t local_vocab_valid() const {
    return std::clamp<std::int64_t>(config.vocab_size - vocab_begin(), 0, local_vocab_rows());
  }
  float* param(const std::string& name) const { return layout->view(params, name).data<float>(); }
  float* grad(const std::string& name) const { return layout->view(grads, name).data<float>(); }
};

// Result of the head segment for the current step.
struct LossAccumulator {
  double sum = 0;           // sum of per-token losses seen since reset
  std::int64_t count = 0;   // tokens seen since reset
  void reset() { sum = 0; count = 0; }
};

// Builds the segments of a GPT model: boundary buffers and scratch come from `arena`, kept
// activations from *state.store. The returned segments reference `state` and `loss`, which
// must outlive them.
std::vector<std::unique_ptr<Segment>> build_gpt_segments(GptState& state, LossAccumulator& loss,
                                                         Arena& arena);

// Dropout site numbering within a layer (part of the mask key; fixed forever so that
// checkpoints and tests stay reproducible).
inline constexpr std::uint32_t kDropoutSiteEmbedding = 0;
inline constexpr std::uint32_t kDropoutSiteAttention = 1;
inline constexpr std::uint32_t kDropoutSiteMlp = 2;

}  // namespace oases::ops
