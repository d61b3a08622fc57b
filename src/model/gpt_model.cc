#include "model/gpt_model.h"

#include "core/error.h"

#include <cstring>

namespace oases::model {
namespace {

// Checked before the parameter layout is built from them (which only asserts).
int check_degrees(const GptConfig& config, int tp, const std::vector<int>& degrees) {
  if (degrees.empty()) return 0;
  OASES_CHECK(static_cast<std::int64_t>(degrees.size()) == config.layers,
              "parallel.plan gives {} layer degrees; the model has model.layers = {}",
              degrees.size(), config.layers);
  for (std::size_t l = 0; l < degrees.size(); ++l)
    OASES_CHECK(degrees[l] >= 1 && tp % degrees[l] == 0,
                "parallel.plan gives layer {} degree {}; valid degrees divide parallel.tp = {}", l,
                degrees[l], tp);
  return 0;
}

}  // namespace

GptModel::GptModel(const GptConfig& config, std::int64_t micro_batch, std::uint64_t seed,
                   comm::Communicator& tp, int sub_batches, std::vector<int> layer_degrees,
                   ops::TpSubgroups tp_subgroup)
    : layout_((config.validate(), config.validate_tensor_parallel(tp.size()),
               check_degrees(config, tp.size(), layer_degrees),
               gpt_param_layout(config, tp.rank(), tp.size(), layer_degrees))),
      params_(static_cast<std::size_t>(layout_.total_numel()) * sizeof(float)),
      grads_(static_cast<std::size_t>(layout_.total_numel()) * sizeof(float)) {
  OASES_CHECK(sub_batches >= 1 && micro_batch % sub_batches == 0,
              "parallel.sub_batches = {} must divide train.micro_batch = {}", sub_batches,
              micro_batch);
  state_.config = config;
  state_.rows = micro_batch / sub_batches;
  state_.sub_batches = sub_batches;
  state_.store = &store_;
  state_.tp = &tp;
  state_.layer_degrees = std::move(layer_degrees);
  state_.tp_subgroup = std::move(tp_subgroup);
  state_.layout = &layout_;
  state_.params = params_.as<float>();
  state_.grads = grads_.as<float>();
  state_.seed = seed;
  segments_ = ops::build_gpt_segments(state_, loss_, arena_);
  initialize(seed);
  // Bucket 0: embeddings; 1 + l: layer l; layers + 1: ln_f.
  buckets_.emplace_back(0, layout_.find("h.0.ln_1.weight").offset);
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::int64_t end = l + 1 < config.layers
                                 ? layout_.find("h." + std::to_string(l + 1) + ".ln_1.weight").offset
                                 : layout_.find("ln_f.weight").offset;
    buckets_.emplace_back(buckets_.back().second, end);
  }
  buckets_.emplace_back(buckets_.back().second, layout_.total_numel());

  // Segments are embedding, (reshard), attention, mlp per layer, (reshard), head. A layer's
  // gradients are final after its attention segment's backward (the epilogues of later
  // segments update its output-projection biases earlier in the backward pass); the
  // embeddings' after the embedding segment (wte also gets the head's gradient, formed before);
  // ln_f's after the head.
  const int num_segments = static_cast<int>(segments_.size());
  for (int i = 0; i < num_segments; ++i) {
    ops::SegmentShape shape = segments_[static_cast<std::size_t>(i)]->shape();
    if (i == 0) shape.ready_bucket = 0;
    else if (i == num_segments - 1) shape.ready_bucket = static_cast<int>(buckets_.size()) - 1;
    else if (shape.layer >= 0 && program_.segments.back().layer != shape.layer)
      shape.ready_bucket = 1 + shape.layer;
    program_.segments.push_back(std::move(shape));
  }
}

void GptModel::zero_grads() {
  std::memset(grads_.data(), 0, static_cast<std::size_t>(layout_.total_numel()) * sizeof(float));
}

void GptModel::initialize(std::uint64_t seed) {
  initialize_parameters(layout_, state_.config, seed, params_.as<float>());
}

}  // namespace oases::model
