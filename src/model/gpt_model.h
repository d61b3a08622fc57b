// GptModel: one model instance on one rank. Owns the flat parameter and gradient arrays, the
// activation memory (boundary buffers in an arena, kept activations in an ActivationStore),
// and the Program: the ordered segments with their collectives.
#pragma once

#include "comm/communicator.h"
#include "core/buffer.h"
#include "model/gpt_config.h"
#include "model/param_layout.h"
#include "ops/gpt_segments.h"
#include "ops/activation_store.h"
#include "ops/program.h"

#include <memory>
#include <vector>

namespace oases::model {

class GptModel {
 public:
  // Activations are sized for micro-batches of `micro_batch` sequences of config.seq_len
  // tokens, processed as `sub_batches` equal parts (which must divide micro_batch). `tp` is
  // the tensor-parallel group this rank belongs to (a group of one: the whole model here); it
  // must outlive the model. `layer_degrees` (one per layer; empty: all tp.size()) runs layer l
  // at that tensor-parallel degree (ops::Placement); degrees below tp.size() take their groups
  // from `tp_subgroup`.
  GptModel(const GptConfig& config, std::int64_t micro_batch, std::uint64_t seed,
           comm::Communicator& tp, int sub_batches = 1, std::vector<int> layer_degrees = {},
           ops::TpSubgroups tp_subgroup = {});
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptConfig& config() const { return state_.config; }
  std::int64_t micro_batch() const { return state_.rows * state_.sub_batches; }
  int sub_batches() const { return state_.sub_batches; }
  // Tensor-parallel degree of layer l (the embedding and head: the group size).
  int layer_degree(std::int64_t layer) const { return state_.degree_of(layer); }
  const ParamLayout& layout() const { return layout_; }
  float* params() { return params_.as<float>(); }
  const float* params() const { return params_.as<float>(); }
  float* grads() { return grads_.as<float>(); }
  std::int64_t param_count() const { return layout_.total_numel(); }  // incl. alignment padding

  void zero_grads();
  void initialize(std::uint64_t seed);  // layout-invariant Philox initialisation

  std::vector<std::unique_ptr<ops::Segment>>& segments() { return segments_; }
  const ops::Program& program() const { return program_; }

  // Contiguous ranges [begin, end) of the flat gradient array that partition it: the
  // embeddings (wte, wpe), each layer's parameters (bucket 1 + l), and the final LayerNorm. Each becomes final
  // at a known point of the backward pass (SegmentShape::ready_bucket).
  const std::vector<std::pair<std::int64_t, std::int64_t>>& grad_buckets() const { return buckets_; }
  ops::LossAccumulator& loss() { return loss_; }

  // Boundary buffers and scratch, allocated once.
  std::size_t static_activation_bytes() const { return arena_.bytes_in_use(); }
  ops::ActivationStore& activations() { return store_; }
  const ops::ActivationStore& activations() const { return store_; }

 private:
  ParamLayout layout_;
  Buffer params_;
  Buffer grads_;
  Arena arena_;
  ops::ActivationStore store_;
  ops::GptState state_;
  ops::LossAccumulator loss_;
  std::vector<std::unique_ptr<ops::Segment>> segments_;
  ops::Program program_;
  std::vector<std::pair<std::int64_t, std::int64_t>> buckets_;
};

}  // namespace oases::model
