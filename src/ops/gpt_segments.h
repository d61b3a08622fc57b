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
#include <memory>
#include <vector>

namespace oases::ops {

// Buffers and parameters every GPT segment of one model instance shares.
//
// Under tensor parallelism (tp->size() = T > 1) this rank holds heads/T attention heads,
// ffn_hidden/T MLP columns and padded_vocab/T rows of wte (see model::Sharding); activations
// between segments ([n, C]) are whole on every rank of the group.
struct GptState {
  model::GptConfig config;
  std::int64_t rows = 0;         // sequences per segment instance (micro_batch / sub_batches)
  int sub_batches = 1;
  comm::Communicator* tp = nullptr;  // the tensor-parallel group (a group of one: no TP)
  const model::ParamLayout* layout = nullptr;
  float* params = nullptr;  // flat, laid out by *layout
  float* grads = nullptr;   // flat, same layout; accumulated by backward
  std::uint64_t seed = 0;
  ActivationStore* store = nullptr;

  // Boundary buffers between segments, one [n, C] each per sub-batch.
  struct Ports {
    float* partial = nullptr;     // output of the last forward segment, before its epilogue
    float* d_partial = nullptr;   // gradient with respect to `partial`
    float* d_residual = nullptr;  // gradient flowing along the residual stream
    float* d_ln = nullptr;        // partial gradient of a LayerNorm output (backward collective)
  };
  std::vector<Ports> ports;
  // Backward scratch shared by every segment and sub-batch (one action runs at a time).
  float* scratch_narrow = nullptr;  // [n, C]
  float* scratch_wide = nullptr;    // [n, max(3 * local attention width, local ffn)]

  std::int64_t tokens() const { return rows * config.seq_len; }
  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
  std::int64_t local_heads() const { return config.heads / tp_size(); }
  std::int64_t local_attention_width() const { return local_heads() * config.head_dim(); }
  std::int64_t local_ffn() const { return config.ffn_hidden / tp_size(); }
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
