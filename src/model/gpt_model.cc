#include "model/gpt_model.h"

#include <cstring>

namespace oases::model {

GptModel::GptModel(const GptConfig& config, std::int64_t micro_batch, std::uint64_t seed,
                   comm::Communicator& tp)
    : layout_((config.validate(), config.validate_tensor_parallel(tp.size()),
               gpt_param_layout(config, tp.rank(), tp.size()))),
      params_(static_cast<std::size_t>(layout_.total_numel()) * sizeof(float)),
      grads_(static_cast<std::size_t>(layout_.total_numel()) * sizeof(float)) {
  state_.config = config;
  state_.micro_batch = micro_batch;
  state_.tp = &tp;
  state_.layout = &layout_;
  state_.params = params_.as<float>();
  state_.grads = grads_.as<float>();
  state_.seed = seed;
  segments_ = ops::build_gpt_segments(state_, loss_, arena_);
  initialize(seed);
}

void GptModel::zero_grads() {
  std::memset(grads_.data(), 0, static_cast<std::size_t>(layout_.total_numel()) * sizeof(float));
}

void GptModel::initialize(std::uint64_t seed) {
  initialize_parameters(layout_, state_.config, seed, params_.as<float>());
}

schedule::ProgramShape GptModel::program_shape() const {
  schedule::ProgramShape shape;
  for (const auto& segment : segments_) {
    shape.segments.push_back({!segment->forward_collective_buffer().empty(),
                              !segment->backward_collective_buffer().empty(),
                              segment->backward_stages()});
  }
  return shape;
}

}  // namespace oases::model
