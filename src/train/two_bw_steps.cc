#include "train/two_bw_steps.h"

#include "core/error.h"
#include "plan/rank_schedule.h"

namespace oases::train {

TwoBwSteps::TwoBwSteps(const plan::RunPlan& plan, model::Model& model, ZeroSharding& zero,
                       int stage, int stages)
    : plan_(plan), model_(model), zero_(zero), stage_(stage), stages_(stages) {}

void TwoBwSteps::set_stashed_weights(const Tensor& values, std::int64_t steps_done) {
  OASES_ASSERT(plan_.pipeline.two_bw() && !in_flight_step_,
               "stashed weights set outside a 2bw run or mid-stream");
  versions_ = make_weight_versions(steps_done);
  versions_->set_older(values);
  zero_.refresh_held_compute_params();
}

void TwoBwSteps::release_others() {
  if (versions_) versions_->release_others();
}

std::unique_ptr<WeightVersions> TwoBwSteps::make_weight_versions(std::int64_t newest) const {
  std::vector<WeightVersions::Range> held;
  if (zero_.params_sharded())
    zero_.for_each_owned_range([&](std::int64_t begin, std::int64_t end) { held.emplace_back(begin, end); });
  return std::make_unique<WeightVersions>(model_.params(), newest, std::move(held));
}

bool TwoBwSteps::begin(std::int64_t step) {
  OASES_ASSERT(!in_flight_step_ || *in_flight_step_ + 1 == step,
               "2bw step {} follows step {}, whose last backwards are still in flight", step,
               *in_flight_step_);
  const bool carries_in = in_flight_step_.has_value();
  // Both versions start as the loaded weights (W(-1) = W(0); after a resume without stashed
  // weights, W(step - 1) = W(step)).
  if (!versions_) versions_ = make_weight_versions(step);
  OASES_ASSERT(versions_->newest() == (carries_in ? step - 1 : step),
               "2bw step {} with W({}) the newest weights", step, versions_->newest());
  return carries_in;
}

TwoBwSteps::Batches TwoBwSteps::stage_batch(std::int64_t step, const std::int32_t* inputs,
                                            const std::int32_t* targets,
                                            std::int64_t first_sample, double gradient_scale,
                                            bool carries_in) {
  const std::int64_t seq = plan_.config.model.seq_len, rows = plan_.local_batch();
  const std::int64_t local_tokens = rows * seq;
  // The batch's tokens stay here until its last backward has run (the next call, at most).
  BatchInFlight& own = batches_[static_cast<std::size_t>(step % 2)];
  own.step = step;
  own.inputs.assign(inputs, inputs + local_tokens);
  own.targets.assign(targets, targets + local_tokens);
  own.context = {};
  own.context.step = step;
  own.context.head_mode = ops::HeadMode::train;
  own.context.dropout_enabled = true;
  own.context.loss_gradient_scale = gradient_scale;
  const std::int64_t mb = model_.micro_batch();
  for (std::int64_t row = 0; row < rows; row += mb)
    own.context.micro_batches.push_back(
        {own.inputs.data() + row * seq, own.targets.data() + row * seq, first_sample + row});
  const ops::StepContext& previous =
      carries_in ? batches_[static_cast<std::size_t>((step - 1) % 2)].context : own.context;
  return {&own.context, &previous};
}

const schedule::LoweredRun& TwoBwSteps::run(schedule::TwoBwRun run) {
  const auto key = std::pair{run.carries_in, run.drains};
  if (auto it = runs_.find(key); it != runs_.end()) return it->second;
  schedule::ScheduleSpec spec = plan_.schedule;
  spec.micro_batches = static_cast<int>(plan_.local_batch() / model_.micro_batch());
  spec.training = true;
  return runs_.emplace(key, plan::two_bw_schedule(model_.program(), spec, stages_, stage_, run))
      .first->second;
}

void TwoBwSteps::use_weights(std::int64_t version) {
  versions_->use(version);
  // ZeRO-3: the other ranks' blocks are released here (the schedule's windows end at every
  // UseWeights) and gathered again from the version now in place.
  zero_.refresh_held_compute_params();
}

void TwoBwSteps::end(std::int64_t step, bool drain) {
  use_weights(versions_->newest());  // between calls the model holds the newest weights
  in_flight_step_ = drain ? std::nullopt : std::optional<std::int64_t>(step);
}

}  // namespace oases::train
