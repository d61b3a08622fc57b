// Model: one model instance (or one pipeline stage of it) on one rank. Owns the flat parameter
// and gradient arrays of its element type, the activation memory (slots and scratch in an
// arena, kept activations in an ActivationStore) and the Program: the ordered segments with
// their collectives, built from ops/ building blocks by the architecture (model/gpt,
// model/llama, model/bert).
//
// The builder places every layer (its tensor-parallel degree and rows), inserts a reshard
// segment wherever consecutive degrees differ, and at a pipeline-chunk boundary ends the chunk
// with a StageOutputSegment and starts the next with a segment whose input arrives from the
// peer. An instance may hold several chunks (an interleaved pipeline: layer ranges with gaps
// between them); their segments follow one another in model order in one Program, each chunk
// cut off from the next by such a boundary. Each parameter group (embedding, layer l, head) is
// a gradient bucket, final once the backward pass of the first segment that uses it has run on
// every instance.
#pragma once

#include "comm/communicator.h"
#include "core/buffer.h"
#include "kernels/kernels.h"
#include "model/architecture.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "ops/activation_store.h"
#include "ops/context.h"
#include "core/pageable_buffer.h"
#include "ops/program.h"
#include "ops/segment.h"

#include <memory>
#include <optional>
#include <vector>

namespace oases::model {

// Transformer layers [begin, end) of one model chunk.
struct LayerRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  bool operator==(const LayerRange&) const = default;
};

struct ModelOptions {
  DType dtype = DType::f32;         // parameters, gradients and activations (f32 or f64)
  // Mixed precision (bf16 or f16, over dtype f32): activations, their gradients, kept sets and
  // the copy of the parameters that forward and backward read are in this type, statistics in
  // f32; params() stays the f32 master copy and grads() f32 accumulators. Empty: all in dtype.
  std::optional<DType> mixed_precision;
  // How 16-bit linear layers multiply (kernels::choose_gemm16_paths, or pinned by a checkpoint).
  kernels::Gemm16Paths gemm16;
  std::int64_t micro_batch = 1;     // sequences per micro-batch
  int sub_batches = 1;              // equal parts of a micro-batch (dividing it)
  // Micro-batches that may be in flight at once with their own slots (ops::ModelContext::
  // slot_lanes; schedule::slot_lanes gives what a schedule needs).
  int slot_lanes = 1;
  std::uint64_t seed = 0;           // initialisation and dropout masks
  // The tensor-parallel group this rank belongs to (a group of one: the whole model here); it
  // must outlive the model.
  comm::Communicator* tp = nullptr;
  // The expert-parallel group (null: a group of one, every expert here); it must outlive the
  // model.
  comm::Communicator* ep = nullptr;
  // The context-parallel group (null: a group of one): its ranks split every sequence
  // (ops::ModelContext::cp), and attention sees the whole sequence by cp_kind. REQUIRES under
  // more than one rank: seq_len divisible by 2 x its size; with all_to_all, the heads and kv
  // heads of each tensor-parallel rank divisible by it; no MoE layer, no sequence parallelism,
  // every layer at tp's degree.
  comm::Communicator* cp = nullptr;
  ops::ContextParallelKind cp_kind = ops::ContextParallelKind::all_to_all;
  // One degree per layer (each dividing tp's size; empty: all at tp's size); degrees below it
  // take their groups from tp_subgroup.
  std::vector<int> layer_degrees;
  ops::TpSubgroups tp_subgroup;
  // Sequence parallelism (ops/layer_segments.h, make_sequence_shard_segment): norms, dropout
  // and residuals run on each rank's block of the tokens between tensor-parallel regions.
  // REQUIRES: seq_len divisible by tp's size, no MoE layer.
  bool sequence_parallel = false;
  // The layers [first_layer, end_layer) this instance holds (end_layer -1: to the last); the
  // instance holding layer 0 has the embedding, the one holding the last layer the head.
  std::int64_t first_layer = 0;
  std::int64_t end_layer = -1;
  // The chunks this instance holds, in model order, each non-empty and after the one before
  // (gaps allowed): replaces first_layer and end_layer when not empty.
  std::vector<LayerRange> layer_ranges;
  // The gradients in pages the operating system can take back (core/pageable_buffer.h):
  // release_grads() gives ranges back, zero_grads() leaves them given back (ZeRO-2).
  bool pageable_grads = false;
  // The parameters (the master copy, unless allocate_params places it, and the 16-bit copy
  // under mixed precision) in pages the operating system can take back as well:
  // release_params() gives ranges back (ZeRO-3).
  bool pageable_params = false;
  // Where the parameters (the master copy) live: a zeroed buffer of the given size; empty: the
  // heap. Under mixed precision parallel.offload = "optimizer+params" passes an OffloadStore's.
  std::function<Buffer(std::size_t bytes)> allocate_params;
  // Built only to read its program (shapes, collectives, work; a simulated rank): the
  // parameters are left uninitialised zeros, so their pages are never touched (core/buffer.h).
  // Such a model computes nothing meaningful and is not run.
  bool shape_only = false;
};

class Model {
 public:
  Model(const ModelConfig& config, ModelOptions options);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return options_.dtype; }  // parameters and gradients
  // Activations and the parameters' working copy: dtype(), or the mixed-precision type.
  DType activation_dtype() const { return context_.dtype; }
  // What the segments share (sizes, groups, the context-parallel token split).
  const ops::ModelContext& context() const { return context_; }
  bool mixed_precision() const { return options_.mixed_precision.has_value(); }
  const kernels::Gemm16Paths& gemm16_paths() const { return options_.gemm16; }
  std::int64_t micro_batch() const { return options_.micro_batch; }
  int sub_batches() const { return options_.sub_batches; }
  // The first layer of the first chunk and the end of the last.
  std::int64_t first_layer() const { return options_.layer_ranges.front().begin; }
  std::int64_t end_layer() const { return options_.layer_ranges.back().end; }
  // The layers of each chunk this instance holds, in model order (one range without chunks).
  const std::vector<LayerRange>& layer_ranges() const { return options_.layer_ranges; }
  bool has_embedding() const { return first_layer() == 0; }
  bool has_head() const { return end_layer() == config_.layers; }
  // Tensor-parallel degree of layer l (the embedding and head: the group size).
  int layer_degree(std::int64_t layer) const;

  const ParamLayout& layout() const { return layout_; }
  const Tensor& params() const { return params_; }  // [param_count()]
  const Tensor& grads() const { return grads_; }    // [param_count()]
  // The parameters forward and backward read [param_count()]: params() itself, or under mixed
  // precision its copy rounded to activation_dtype(), which refresh_compute_params() renews.
  const Tensor& compute_params() const { return mixed_precision() ? compute_params_ : params_; }
  // Rounds params() into compute_params() (nothing to do without mixed precision). Whoever
  // changes params() (an optimizer step, a checkpoint load, a weight-version swap) calls it
  // before the next forward.
  void refresh_compute_params();
  // The same for elements [begin, end) alone (ZeRO-3: the blocks a rank owns).
  void refresh_compute_params(std::int64_t begin, std::int64_t end);
  // ZeRO-3 (pageable_params): gives back the pages of parameter elements [begin, end) of the
  // copy forward and backward read (compute_params(); params() itself without mixed
  // precision), or of the master copy params() (mixed precision only; nothing when
  // allocate_params placed it). Released elements read as zeros until written.
  void release_compute_params(std::int64_t begin, std::int64_t end);
  void release_master_params(std::int64_t begin, std::int64_t end);
  // Bytes of parameter pages resident now: the master copy and the 16-bit copy (every byte
  // of them without pageable_params).
  std::size_t resident_param_bytes() const;
  std::int64_t param_count() const { return layout_.total_numel(); }  // incl. alignment padding

  // Gradients := 0 (with pageable_grads: writing only the resident pages).
  void zero_grads();
  // Gradients of elements [begin, end) := 0; with pageable_grads their whole pages are given
  // back to the operating system. The bytes of gradient pages resident now (every byte without
  // pageable_grads).
  void release_grads(std::int64_t begin, std::int64_t end);
  std::size_t resident_grad_bytes() const;
  // Layout-invariant Philox initialisation (compute_params() refreshed).
  void initialize(std::uint64_t seed);

  std::vector<std::unique_ptr<ops::Segment>>& segments() { return segments_; }
  const ops::Program& program() const { return program_; }

  // A gradient bucket: the contiguous range of one parameter group.
  struct Bucket {
    int id = 0;          // the group: 0 embedding, 1 + l layer l, layers + 1 head, experts
    std::int64_t begin = 0, end = 0;
    int layer = -1;      // the transformer layer, or -1
    bool experts = false;  // an MoE layer's experts (ParamLayout: expert_group_of)
  };
  const std::vector<Bucket>& grad_buckets() const { return buckets_; }
  const Bucket& bucket(int id) const;
  // Under sequence parallelism the gradients of the parameters a shard segment applies to this
  // rank's tokens alone (its norm, and the bias and post-norm of its epilogue) are partial sums
  // over the layer's group: `ranges` of bucket `bucket`'s flat gradients (element offsets
  // [begin, end)) that `group` sums before the bucket's own reduction. Empty otherwise.
  struct TokenShardGradients {
    int bucket = 0;
    comm::Communicator* group = nullptr;
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  };
  const std::vector<TokenShardGradients>& token_shard_gradients() const {
    return token_shard_gradients_;
  }

  ops::LossAccumulator& loss() { return loss_; }
  // Per layer (indexed by layer; used where ModelConfig::is_moe_layer and this instance holds
  // the layer): what the MoE segments report over the runs since reset_moe_stats().
  const std::vector<ops::MoeLayerStats>& moe_stats() const { return moe_stats_; }
  void reset_moe_stats();
  // Slots, scratch and tables, allocated once.
  std::size_t static_activation_bytes() const { return arena_.bytes_in_use(); }
  ops::ActivationStore& activations() { return store_; }
  const ops::ActivationStore& activations() const { return store_; }

 private:
  class Builder;

  ModelConfig config_;
  ModelOptions options_;
  std::unique_ptr<Architecture> architecture_;
  ParamLayout layout_;
  Buffer param_buffer_, grad_buffer_, compute_param_buffer_;
  PageableBuffer pageable_grad_buffer_;  // instead of grad_buffer_ with pageable_grads
  // Instead of param_buffer_ and compute_param_buffer_ with pageable_params.
  PageableBuffer pageable_param_buffer_, pageable_compute_param_buffer_;
  Tensor params_, grads_, compute_params_;
  Arena arena_;
  ops::ActivationStore store_;
  ops::ModelContext context_;
  ops::LossAccumulator loss_;
  comm::SelfCommunicator self_ep_{"ep"};
  comm::SelfCommunicator self_cp_{"cp"};
  std::vector<ops::MoeLayerStats> moe_stats_;  // sized once: segments hold pointers into it
  std::vector<std::unique_ptr<ops::Segment>> segments_;
  ops::Program program_;
  std::vector<Bucket> buckets_;
  std::vector<TokenShardGradients> token_shard_gradients_;
};

// The parameters of layers [first_layer, end_layer) of `config` (end_layer -1: to the last;
// with the embedding group when first_layer is 0 and the head group when end_layer is the
// last) held by rank `tp_rank` of a tensor-parallel group of `tp_size`, layer l split over
// layer_degrees[l] ranks (empty: tp_size). What a Model allocates, without building it.
// ep_rank of ep_size expert-parallel ranks holds its share of every MoE layer's experts.
ParamLayout model_param_layout(const ModelConfig& config, int tp_rank = 0, int tp_size = 1,
                               const std::vector<int>& layer_degrees = {},
                               std::int64_t first_layer = 0, std::int64_t end_layer = -1,
                               int ep_rank = 0, int ep_size = 1);
// The same for the layers of several chunks (ranges in model order, as
// ModelOptions::layer_ranges): the embedding group when the first range starts at layer 0, each
// range's layer groups in order, the head group when the last range ends at the last layer.
ParamLayout model_param_layout(const ModelConfig& config, int tp_rank, int tp_size,
                               const std::vector<int>& layer_degrees,
                               const std::vector<LayerRange>& layer_ranges, int ep_rank = 0,
                               int ep_size = 1);

// The first and last rows of the vocabulary this rank of `tp` ranks holds, and how many of
// them are real tokens.
struct VocabShard {
  std::int64_t begin = 0, rows = 0, valid = 0;
};
VocabShard vocab_shard(const ModelConfig& config, int tp_rank, int tp_size);

}  // namespace oases::model
