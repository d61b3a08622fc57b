// The two segments of a transformer layer, assembled from ops building blocks by a model
// builder (model/): each runs the epilogue that forms its residual-stream input, then its
// body up to a row-parallel GEMM whose partial sums the forward collective reduces.
//
//   AttentionSegment  r = epilogue(previous output)  [checkpoint]
//                     -> [pre-norm] -> QKV (column-parallel: fused, or q, k, v)  [internals]
//                     -> [rotary] -> core attention  [core]
//                     -> out-projection (row-parallel)                     | AR(output)
//   MlpSegment        h = epilogue(previous output)  [checkpoint]
//                     -> [pre-norm] -> FC1 (or gate and up) -> activation  [internals]
//                     -> FC2 (row-parallel)                                 | AR(output)
//
// Backward: stage 0 runs from the output's gradient to the partial gradient of the block's
// input (summed by the backward collective); stage 1 adds it (through the pre-norm where there
// is one) to the residual gradient and runs the epilogue's backward. Post-norm architectures
// (BERT) have no pre-norm: their norm is the next epilogue's. The kept sets are exactly the
// fine-grained recomputation checkpoints (r_l, h_l) and what the body recomputes from them.
#pragma once

#include "ops/attention.h"
#include "ops/context.h"
#include "ops/epilogue.h"
#include "ops/linear.h"
#include "ops/mlp.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/segment.h"

#include <memory>
#include <string>
#include <vector>

namespace oases::ops {

struct LayerSpec {
  std::string name;   // "attention.3", "mlp.3"
  int layer = 0;
  Placement at;
  ResidualEpilogue epilogue;
  // The input arrives from the previous pipeline stage (SegmentShape::input_from_peer); the
  // epilogue then copies it.
  bool input_from_peer = false;
  Norm pre_norm;  // absent in post-norm architectures
  // Sequence parallelism (make_sequence_shard_segment): in an attention or MLP segment, the
  // block's input arrives all-gathered along the tokens in Slot::output and is copied into the
  // checkpoint (the epilogue copies its input; the pre-norm ran on the shard before the
  // gather), the output's partial sums are reduce-scattered along the tokens, and backward is
  // stage 0 (the body, from the gathered output gradient) then a reduce-scatter of the input's
  // partial gradient, with an empty stage 1. In a shard segment, the spec's epilogue and
  // pre-norm run on this rank's tokens.
  bool sequence_parallel = false;
  // A shard segment whose next segment is the head (HeadSpec::gathered_input): the head leaves
  // d(r_L), whole, in Slot::residual_grad, so this rank's block of it is the residual gradient
  // and nothing is added to it.
  bool feeds_head = false;
  // A shard segment: the placement of the block before it (the embedding's, the previous
  // layer's, the last layer's before the head), whose reduce-scatter leaves this rank's tokens
  // in that block's rows, and whose backward all-gathers the output gradient this segment
  // forms there. A rank holds the same tokens at every degree (1/tp of the sub-batch), but a
  // layer at degree k keeps its group's rows first in the slots, so where degrees differ the
  // block moves within the slot. Unset (no group): `at`.
  Placement before;
};

struct AttentionSpec : LayerSpec {
  // One fused projection writing [n, q|k|v] (GPT-2's c_attn), or three writing the q, k and v
  // column blocks (LLaMA, BERT).
  std::vector<ColumnParallelLinear> qkv;
  CoreAttention attention;
  RowParallelLinear out_proj;
  // The key bias adds the same q.b_k to every score of a row, which softmax ignores: its
  // gradient is exactly zero. The rounding noise a backward pass sums there differs under every
  // layout and AdamW would turn it into lr-sized steps, so the exact value is kept in this view
  // of the gradient (empty: no key bias).
  Tensor key_bias_grad;
};

struct MlpSpec : LayerSpec {
  // One projection (FC1) or two (gate, then up) writing column blocks of the activation input.
  std::vector<ColumnParallelLinear> up;
  MlpActivation activation;
  RowParallelLinear down;
};

// A mixture-of-experts feed-forward block (ops/moe.h has the routing) in place of MlpSpec, as
// three segments with the expert-parallel all-to-alls between them. At degree k > 1 every rank
// of the layer's group routes the same rows (the router is replicated), each holds shard
// tp_rank % k of every expert (FC1 by columns, FC2 by rows, the FC2 bias added by shard 0), and
// its all-to-alls run in the ep group of its own tensor-parallel rank; the combine's output and
// (in backward) the slot weights' gradients are partial sums over the group:
//
//   moe_dispatch.l    h = epilogue(previous output)  [checkpoint]
//                     -> [pre-norm] -> router logits (and noise logits)  [internals]
//                     -> route each group; each slot's token row into the dispatch buffer
//                                                         | A2A(dispatch) over the ep group
//   experts.l         the rows that arrived  [checkpoint]
//                     -> per local expert: up -> activation [-> expert dropout]  [internals]
//                     -> down (with its bias) into the same rows  | A2A(combine)
//   moe_combine.l     the rows that came back, and the routing  [checkpoint]
//                     -> output = sum over a token's slots of weight x row  | AR (layer group)
//
// Backward runs the other way: the combine sends each row's gradient (weight x the output's
// gradient) back to its expert (A2A), the experts send their inputs' gradients back to the
// tokens (A2A), and the dispatch adds them to its tokens' gradients together with the router's
// (from the weights' gradients the combine formed; at degree k > 1 the dispatch's backward
// all-reduce first sums those and the input's gradient over the group). Every all-to-all
// exchanges whole buffers of
// experts x groups x capacity rows (empty slots included), so its blocks are equal and fixed.
struct ExpertSpec {
  std::vector<ColumnParallelLinear> up;  // FC1 (GPT), or gate and up (LLaMA)
  ColumnParallelLinear down;             // back to hidden, with the expert's bias where it has one
};

struct MoeSpec : LayerSpec {
  MoeRouterSpec router;
  ColumnParallelLinear router_linear;     // x [n, C] -> logits [n, E]
  ColumnParallelLinear noise_linear;      // x -> noise logits (noisy-topk with noise only)
  std::vector<ExpertSpec> experts;        // this rank's experts (experts / expert_ranks)
  int expert_ranks = 1;                   // the expert-parallel group's size
  MlpActivation activation;               // the experts' activation and hidden width
  std::int64_t group_tokens = 0;          // tokens per dispatch group
  double expert_dropout = 0;
  MoeLayerStats* stats = nullptr;         // forward passes in training add to it
};

// Sequence parallelism: what runs on this rank's 1/degree of the tokens between two
// tensor-parallel regions (the group's ranks hold consecutive blocks of the instance's rows x
// seq tokens, sample-major; rank shard holds block `shard`):
//
//   *_in.l            r = epilogue(previous output: this rank's block of the reduce-scatter)
//                     [checkpoint] -> [pre-norm, statistics: internals] -> this rank's block of
//                     Slot::output                                        | AG(output)
//
// Backward stage 0 takes this rank's block of the following block's input gradient (reduce-
// scattered), runs the pre-norm back, adds the residual gradient and runs the epilogue back
// into this rank's block of Slot::output_grad; the all-gather of output_grad gives the previous
// segment its whole output gradient; stage 1 is empty. `spec` carries the epilogue, the
// pre-norm, the placement, the layer and input_from_peer (then the shard arrives from the
// previous pipeline stage).
std::unique_ptr<Segment> make_sequence_shard_segment(int id, const ModelContext& model,
                                                     LayerSpec spec);

// Context parallelism of the all-to-all kind (DeepSpeed-Ulysses; ops/all_to_all_attention.cc
// has the shapes): an attention layer as three segments, so that both all-to-alls over the
// context-parallel group are schedule instructions:
//
//   attention.l        r = epilogue(previous output)  [checkpoint]
//                      -> [pre-norm]  [internals] -> QKV (not kept: attention_core keeps it)
//                      -> head group j's q|k|v columns of this rank's tokens to cp rank j
//                                                                        | A2A (cp)
//   attention_core.l   head group r's q|k|v of every token of the sequences, rotated
//                      [checkpoint] -> core attention  [core]
//                      -> each rank's tokens of the output to it         | A2A (cp)
//   attention_out.l    this rank's tokens of every group's output  [checkpoint]
//                      -> out-projection (row-parallel)                  | AR (layer group)
//
// Backward runs the other way: the out-projection's input gradient goes back to the head
// groups (A2A), attention runs back and each rank's q|k|v gradient goes home (A2A), the
// projections run back into the input's partial gradient (AR over the layer's group) and the
// layer's pre-norm and epilogue back. The MLP's residual is attention.l's checkpoint. The
// buffers are Slot::cp_send / cp_recv (forward) and cp_grad_send / cp_grad_recv (backward),
// each of at least tokens x (q|k|v width of this tensor-parallel rank) elements.
void append_all_to_all_attention_segments(int first_id, const ModelContext& model,
                                          AttentionSpec spec,
                                          std::vector<std::unique_ptr<Segment>>& segments);

// Context parallelism of the ring kind (ring attention; ops/ring_attention.cc has the shapes):
// an attention layer as 2 c segments, c = cp, so that every block transfer is a schedule
// instruction and travels while a step attends to the block in hand:
//
//   attention.l          r = epilogue(previous output)  [checkpoint] -> [pre-norm]  [internals]
//                        -> QKV, rotated at the chunks' positions, and the running attention
//                        [core, never dropped] -> this rank's k|v to the next cp rank | shift
//   attention_ring.l.0   attention to the local block (beside the shift)
//   attention_recv.l.t   the block of cp rank r - t  [checkpoint] -> on to the next | shift
//   attention_ring.l.t   attention to it (beside the shift)            (0 < t < c - 1)
//   attention_out.l      the block of cp rank r - c + 1  [checkpoint] -> attention to it
//                        -> out-projection of the merged output (row-parallel) | AR (group)
//
// Backward runs the other way: each step adds its block's share of dq and sends its share of
// the block's dk|dv on towards the block's owner, added to what came from the next rank
// (shifts the other way, again beside the steps' attention); the projections run back into
// the input's partial gradient (AR over the layer's group). The MLP's residual is
// attention.l's checkpoint. Buffers: Slot::cp_send / cp_recv / cp_grad_send / cp_grad_recv /
// cp_kv_grad ([tokens, 2 kv_heads head_dim] used) and cp_query_grad / cp_out_grad ([tokens,
// heads head_dim] used).
void append_ring_attention_segments(int first_id, const ModelContext& model, AttentionSpec spec,
                                    std::vector<std::unique_ptr<Segment>>& segments);
// Backward scratch (scratch_wide) of those segments, elements.
std::int64_t ring_attention_scratch_elements(const ModelContext& model, const AttentionSpec& spec);

// Backward scratch the segments of a spec need beyond [tokens, hidden] (elements).
std::int64_t scratch_wide_elements(const AttentionSpec& spec, std::int64_t seq_len);
std::int64_t scratch_wide_elements(const MlpSpec& spec, std::int64_t seq_len);
std::int64_t scratch_wide_elements(const MoeSpec& spec, std::int64_t seq_len);

std::unique_ptr<Segment> make_attention_segment(int id, const ModelContext& model,
                                                AttentionSpec spec);
std::unique_ptr<Segment> make_mlp_segment(int id, const ModelContext& model, MlpSpec spec);
// Appends the three segments of an MoE layer, ids first_id .. first_id + 2.
void append_moe_segments(int first_id, const ModelContext& model, const MoeSpec& spec,
                         std::vector<std::unique_ptr<Segment>>& segments);
// Rows of the MoE buffers of a segment instance of `tokens` tokens: experts x groups x the
// larger of the training and evaluation capacities.
std::int64_t moe_slot_rows(const MoeRouterSpec& router, std::int64_t group_tokens,
                           std::int64_t tokens);

}  // namespace oases::ops
