// TwoBwSteps: the training engine's part for parallel.pipeline = "2bw" (PipeDream-2BW,
// schedule/pipeline_2bw.h): what carries from one engine call to the next.
//
// Batch t computes on the weights W(t - 1) while its update goes to the newest, W(t); the two
// versions are kept by WeightVersions (train/weight_versions.h), whose first copy is made on
// the first call (W(-1) = W(0), or W(step - 1) = W(step) after a resume without stashed
// weights). A call that does not drain leaves its batch's last backwards to the next call,
// which must be step + 1: the batch's tokens and the context its instructions run in stay
// here until then (one slot per step parity: a call reads its own batch and the previous one).
// The lowered runs are cached by (carries_in, drains).
//
// One engine call (TrainingEngine::train_step with the 2bw pipeline) goes:
//   begin(step)                 checks the order, makes the versions on the first call
//   stage_batch(...)            keeps the batch's tokens; the contexts the run reads
//   run({carries_in, drain})    the lowered instructions
//   the executor runs them: UseWeights(b) -> use_weights(step + b - 1); each OptimizerStep ->
//   newest() is the batch stepped, begin_update() before the optimizer writes W(newest() + 1)
//   end(step, drain)            the newest weights back in the model; what is in flight
// Under ZeRO-3 only this rank's blocks of each version are kept, and the compute copy of the
// held blocks is refreshed whenever the version in the model changes (ZeroSharding).
#pragma once

#include "model/model.h"
#include "ops/segment.h"
#include "plan/run_plan.h"
#include "schedule/pipeline_2bw.h"
#include "train/weight_versions.h"
#include "train/zero_sharding.h"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace oases::train {

class TwoBwSteps {
 public:
  // The contexts one call's run reads: its own batch's, and the batch whose last backwards it
  // finishes (its own when it carries nothing in). Valid until the call after next.
  struct Batches {
    const ops::StepContext* own = nullptr;
    const ops::StepContext* previous = nullptr;
  };

  // `plan`, `model` and `zero` must outlive the part; `stage` of `stages` is this rank's
  // pipeline stage.
  TwoBwSteps(const plan::RunPlan& plan, model::Model& model, ZeroSharding& zero, int stage,
             int stages);

  // The weights W(n - 1) the next batch computes on, n the optimizer steps done (null before
  // the first call). The model's parameters hold W(n) between calls.
  const Tensor* stashed_weights() const { return versions_ ? &versions_->older() : nullptr; }
  // Sets the stashed weights after a resume and restarts the version count at `steps_done`.
  // REQUIRES: no batch is in flight, and the model holds W(steps_done).
  void set_stashed_weights(const Tensor& values, std::int64_t steps_done);
  // After a checkpoint gathered the stashed version whole (ZeRO-3): gives back the pages
  // outside this rank's blocks.
  void release_others();

  // Starts call `step`; returns whether it carries in the previous call's batch.
  // InternalError when a batch is in flight and `step` is not the next one.
  bool begin(std::int64_t step);
  // Keeps batch `step`'s local tokens ([local_batch, seq] each; first global sample index
  // `first_sample`) and makes its context, whose loss gradient is scaled by `gradient_scale`.
  Batches stage_batch(std::int64_t step, const std::int32_t* inputs, const std::int32_t* targets,
                      std::int64_t first_sample, double gradient_scale, bool carries_in);
  // The lowered run of this stage for `run`, verified (cached).
  const schedule::LoweredRun& run(schedule::TwoBwRun run);
  // UseWeights: the model's parameters (and the compute copy held) made W(version).
  void use_weights(std::int64_t version);
  // The batch an update in this call steps: the newest version's number.
  std::int64_t newest() const { return versions_->newest(); }
  // Before the optimizer updates W(newest()) in place into W(newest() + 1).
  void begin_update() { versions_->begin_update(); }
  // Ends call `step`: the model holds the newest weights; with `drain` false its batch stays
  // in flight.
  void end(std::int64_t step, bool drain);

 private:
  // The batch whose last backwards a call left for the next one: its step, tokens, and the
  // context its instructions run in.
  struct BatchInFlight {
    std::int64_t step = 0;
    std::vector<std::int32_t> inputs, targets;
    ops::StepContext context;
  };
  // The two weight versions, W(newest) in the model (under ZeRO-3 of this rank's blocks alone).
  std::unique_ptr<WeightVersions> make_weight_versions(std::int64_t newest) const;

  const plan::RunPlan& plan_;
  model::Model& model_;
  ZeroSharding& zero_;
  int stage_, stages_;
  std::unique_ptr<WeightVersions> versions_;
  std::array<BatchInFlight, 2> batches_;  // by step parity
  std::optional<std::int64_t> in_flight_step_;
  std::map<std::pair<bool, bool>, schedule::LoweredRun> runs_;
};

}  // namespace oases::train
