// TwoBwSteps (train/two_bw_steps.h) alone, on one rank: the order of calls, the batch a call
// leaves in flight, the weight versions an update and UseWeights move between, resuming with
// stashed weights, and the lowered runs.
#include "train/two_bw_steps.h"

#include "comm/communicator.h"
#include "core/buffer.h"
#include "core/error.h"
#include "model/model.h"
#include "plan/run_plan.h"
#include "support/tiny_run.h"
#include "train/engine.h"
#include "train/zero_sharding.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace oases::train {
namespace {

std::vector<float> contents(const Tensor& t) {
  const float* p = t.data<float>();
  return {p, p + t.numel()};
}

// A 2bw run of the tiny model on one rank (weight stashing alone): batches of 8 sequences in
// micro-batches of 4.
class TwoBwStepsTest : public ::testing::Test {
 protected:
  TwoBwStepsTest() {
    plan::RunConfig c = oases::testing::tiny_run();
    c.parallel.pipeline = "2bw";
    plan_ = plan::make_run_plan(c);
    model::ModelOptions o = plan_.model_options(0);
    o.tp = &tp_;
    model_ = std::make_unique<model::Model>(plan_.config.model, o);
    zero_ = std::make_unique<ZeroSharding>(plan_, *model_,
                                           flat_layout(model_->layout(), model_->dtype()),
                                           [](const model::Model::Bucket&) { return nullptr; });
    steps_ = std::make_unique<TwoBwSteps>(plan_, *model_, *zero_, 0, 1);
  }

  // A batch's tokens: token i of the batch of `step` is step * 100 + i (mod the vocabulary).
  std::vector<std::int32_t> tokens(std::int64_t step) const {
    std::vector<std::int32_t> out(static_cast<std::size_t>(plan_.local_batch() * kSeq));
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = static_cast<std::int32_t>((step * 100 + static_cast<std::int64_t>(i)) % 50);
    return out;
  }

  static constexpr std::int64_t kSeq = 16;  // tiny_model's sequences
  comm::SelfCommunicator tp_{"tp"};
  plan::RunPlan plan_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<ZeroSharding> zero_;
  std::unique_ptr<TwoBwSteps> steps_;
};

TEST_F(TwoBwStepsTest, ABatchInFlightKeepsItsTokensUntilTheNextCallFinishesIt) {
  EXPECT_EQ(steps_->stashed_weights(), nullptr);
  std::vector<std::int32_t> inputs = tokens(0), targets = tokens(1);
  const std::vector<std::int32_t> first_inputs = inputs;
  EXPECT_FALSE(steps_->begin(0));
  const TwoBwSteps::Batches first = steps_->stage_batch(0, inputs.data(), targets.data(), 8, 0.5, false);
  EXPECT_EQ(first.own, first.previous);
  ASSERT_EQ(first.own->micro_batches.size(), 2u);
  EXPECT_EQ(first.own->step, 0);
  EXPECT_EQ(first.own->loss_gradient_scale, 0.5);
  EXPECT_EQ(first.own->micro_batches[0].global_sample_offset, 8);
  EXPECT_EQ(first.own->micro_batches[1].global_sample_offset, 12);
  // Both versions start as the loaded weights.
  ASSERT_NE(steps_->stashed_weights(), nullptr);
  EXPECT_EQ(contents(*steps_->stashed_weights()), contents(model_->params()));
  steps_->end(0, false);

  // The caller's arrays are free once the call returns: the batch in flight has its own copy.
  inputs = tokens(7);
  EXPECT_THROW(steps_->begin(2), InternalError);  // step 1 must finish batch 0 first
  EXPECT_THROW(steps_->set_stashed_weights(model_->params(), 1), InternalError);
  EXPECT_TRUE(steps_->begin(1));
  const TwoBwSteps::Batches second = steps_->stage_batch(1, inputs.data(), targets.data(), 8, 0.5, true);
  EXPECT_NE(second.own, second.previous);
  EXPECT_EQ(second.previous->step, 0);
  const std::int32_t* kept = second.previous->micro_batches[0].inputs;
  EXPECT_NE(kept, inputs.data());
  EXPECT_EQ(std::vector<std::int32_t>(kept, kept + plan_.local_batch() * kSeq), first_inputs);
}

// An update goes to the newest weights; UseWeights puts either version in the model, and a
// call ends with the newest there and the one before stashed.
TEST_F(TwoBwStepsTest, UpdatesMakeANewVersionAndUseWeightsSwitchesBetweenThem) {
  const std::vector<float> w0 = contents(model_->params());
  std::vector<std::int32_t> inputs = tokens(0), targets = tokens(1);
  ASSERT_FALSE(steps_->begin(0));
  steps_->stage_batch(0, inputs.data(), targets.data(), 0, 1.0, false);
  EXPECT_EQ(steps_->newest(), 0);
  steps_->begin_update();
  float* params = model_->params().data<float>();
  for (std::int64_t i = 0; i < model_->params().numel(); ++i) params[i] += 1;  // W(1)
  const std::vector<float> w1 = contents(model_->params());
  EXPECT_EQ(steps_->newest(), 1);
  steps_->use_weights(0);
  EXPECT_EQ(contents(model_->params()), w0);
  steps_->use_weights(1);
  EXPECT_EQ(contents(model_->params()), w1);
  steps_->use_weights(0);
  steps_->end(0, true);
  EXPECT_EQ(contents(model_->params()), w1);
  EXPECT_EQ(contents(*steps_->stashed_weights()), w0);
  EXPECT_THROW(steps_->use_weights(-1), InternalError);
  EXPECT_FALSE(steps_->begin(1));  // drained: nothing carried in, W(1) the newest
}

// Resuming: a checkpoint's stashed weights become W(n - 1) and the count restarts at n.
TEST_F(TwoBwStepsTest, StashedWeightsSetOnResumeRestartTheVersionCount) {
  Buffer storage(model_->params().nbytes());
  const Tensor stashed = storage.tensor(model_->params().dtype(), model_->params().shape());
  float* values = stashed.data<float>();
  for (std::int64_t i = 0; i < stashed.numel(); ++i) values[i] = static_cast<float>(i % 13);
  steps_->set_stashed_weights(stashed, 5);
  EXPECT_EQ(contents(*steps_->stashed_weights()), contents(stashed));
  EXPECT_EQ(steps_->newest(), 5);
  EXPECT_THROW(steps_->begin(4), InternalError);
  EXPECT_FALSE(steps_->begin(5));
}

TEST_F(TwoBwStepsTest, EachKindOfRunIsLoweredOnce) {
  const schedule::LoweredRun& drained = steps_->run({false, true});
  EXPECT_EQ(&steps_->run({false, true}), &drained);
  const schedule::LoweredRun& streaming = steps_->run({true, false});
  EXPECT_NE(&streaming, &drained);
  EXPECT_FALSE(drained.schedule.empty());
}

}  // namespace
}  // namespace oases::train
