// Pipeline plans on a synthetic profile whose costs follow by hand: the stage costs that
// parallel.pipeline_layers = "auto" balances, its split, and the predicted step and bubble of
// each pipeline schedule against the closed forms of sim/pipeline_sim.h.
#include "planner/pipeline_plan.h"

#include "core/error.h"
#include "support/files.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace oases::planner {
namespace {

using schedule::PipelineKind;

// One degree (tp = 1), `layers` layers, sequences of one row per sub-batch. Every action of an
// attention or MLP segment takes 1 ms, of the embedding `embedding_ms` and of the head
// `head_ms`; nothing is on the wire and the optimizer is free.
Profile synthetic(int layers, double embedding_ms, double head_ms) {
  Profile p;
  p.model.layers = layers;
  p.model.hidden = 8;
  p.model.seq_len = 4;
  p.tp = 1;
  p.micro_batch = 1;
  p.sub_batches = 1;
  DegreeProfile d;
  d.degree = 1;
  d.rows = 1;
  d.segments["attention"] = {1e-3, 1e-3, 1e-3, 1e-3};
  d.segments["mlp"] = {1e-3, 1e-3, 1e-3, 1e-3};
  d.segments["embedding"] = {embedding_ms * 1e-3, embedding_ms * 1e-3, embedding_ms * 1e-3,
                             embedding_ms * 1e-3};
  d.segments["head"] = {head_ms * 1e-3, head_ms * 1e-3, head_ms * 1e-3, head_ms * 1e-3};
  d.parameter_bytes = 1000 + 400 * layers;
  d.parameter_bytes_per_layer = 400;
  d.activation_bytes["attention"] = {{"checkpoint", 64}, {"internals", 256}, {"core", 64}};
  d.activation_bytes["mlp"] = {{"checkpoint", 64}, {"internals", 512}, {"core", 0}};
  d.activation_bytes["head"] = {{"internals", 128}};
  d.static_activation_bytes = 1024;
  p.degrees.push_back(d);
  return p;
}

// Megatron's within-stage schedule, no recomputation, one sub-batch.
schedule::ScheduleSpec within(int micro_batches) {
  return {schedule::ScheduleKind::megatron, schedule::Recompute::none, micro_batches, 1, true};
}

TEST(PipelinePlan, StageCostsAreEachPartsForwardAndBackward) {
  const StageCosts costs = pipeline_stage_costs(synthetic(3, 2, 5), within(4), 1, 1, 0);
  // A layer: attention and MLP, each a forward and two backward stages of 1 ms.
  ASSERT_EQ(costs.layer_seconds.size(), 3u);
  for (double s : costs.layer_seconds) EXPECT_NEAR(s, 6e-3, 1e-12);
  // The embedding: a forward and one backward stage; the head (tp = 1: one segment): a
  // forward and two backward stages.
  EXPECT_NEAR(costs.embedding_seconds, 2 * 2e-3, 1e-12);
  EXPECT_NEAR(costs.head_seconds, 3 * 5e-3, 1e-12);
  EXPECT_TRUE(costs.layer_bytes.empty());  // no memory limit, no bound
}

TEST(PipelinePlan, AutoSplitMovesLayersAwayFromTheHead) {
  // Six layers of 6 ms, embedding 4 ms on stage 0, head 12 ms on stage 1: stage 0 takes
  // 4 + 6a, stage 1 12 + 6 (6 - a); a = 4 gives 28 and 24, a = 3 gives 22 and 30.
  const Profile profile = synthetic(6, 2, 4);
  const schedule::PipelineSpec pipeline{PipelineKind::one_f_one_b, 2, 1, 4};
  EXPECT_EQ(auto_pipeline_layers(profile, within(4), pipeline, 1, 0), (std::vector<int>{4, 2}));
  // Free embedding and head: the uniform split.
  EXPECT_EQ(auto_pipeline_layers(synthetic(6, 0, 0), within(4), pipeline, 1, 0),
            (std::vector<int>{3, 3}));
  // Four chunks (as P = 2 stages with v = 2 would give) split the same costs four ways.
  const StageCosts costs = pipeline_stage_costs(profile, within(4), 1, 1, 0);
  EXPECT_EQ(balance_stages(costs, 4).size(), 4u);
}

TEST(PipelinePlan, AutoSplitHonoursTheMemoryLimit) {
  const Profile profile = synthetic(6, 2, 4);
  const schedule::PipelineSpec pipeline{PipelineKind::one_f_one_b, 2, 1, 4};
  // 1F1B keeps min(P, m) = 2 micro-batches on stage 0: the bound prices every layer at two.
  const StageCosts costs = pipeline_stage_costs(profile, within(4), 1, 2, 1 << 30);
  ASSERT_EQ(costs.layer_bytes.size(), 6u);
  // State: parameters, gradients and two AdamW moments of 400 bytes each.
  EXPECT_GE(costs.layer_bytes[0], 4 * 400);
  // A limit that holds the three layers of either stage but not four: 3 and 3 instead of 4 and 2.
  const std::int64_t rest = costs.embedding_bytes;
  const std::int64_t limit = rest + 3 * costs.layer_bytes[0];
  EXPECT_EQ(auto_pipeline_layers(profile, within(4), pipeline, 1, limit), (std::vector<int>{3, 3}));
  testing::expect_user_error(
      [&] { auto_pipeline_layers(profile, within(4), pipeline, 1, rest); },
      {"parallel.memory_limit"});
}

TEST(PipelinePlan, StageMemoryCountsTheProfilesStateRatios) {
  Profile profile = synthetic(6, 2, 4);
  const StageCosts whole = pipeline_stage_costs(profile, within(4), 1, 2, 1 << 30);
  // A quarter of each kind per rank (ZeRO-3 over 4 ranks): a layer's 400 parameter bytes hold
  // 400 bytes of state instead of 1600, the rest of the model's 1000 bytes 1000 instead of 4000.
  profile.param_bytes_ratio = profile.grad_bytes_ratio = 0.25;
  profile.optimizer_bytes_ratio = 0.5;
  const StageCosts sharded = pipeline_stage_costs(profile, within(4), 1, 2, 1 << 30);
  EXPECT_EQ(whole.layer_bytes[0] - sharded.layer_bytes[0], 1600 - 400);
  EXPECT_EQ(whole.embedding_bytes - sharded.embedding_bytes, 4000 - 1000);
}

TEST(PipelinePlan, GPipeAnd1F1BPredictTheSameStepAndBubble) {
  // Two stages of two layers, free embedding and head: each stage's forward F = 2 layers x 2
  // segments x 1 ms and backward B = 2 x 2 x 2 ms. GPipe and 1F1B both take (m + P - 1)(F + B)
  // (sim/pipeline_sim.h) and idle alike.
  const int m = 4, P = 2;
  const double F = 4e-3, B = 8e-3;
  PipelinePredictionOptions options;
  options.stages = P;
  options.micro_batches = m;
  options.layers_per_stage = {2, 2};
  const std::vector<PipelineOption> predicted =
      predict_pipelines(synthetic(4, 0, 0), within(m), 1, options);
  const auto find = [&](PipelineKind kind) {
    const auto it = std::find_if(predicted.begin(), predicted.end(),
                                 [&](const PipelineOption& o) { return o.kind == kind; });
    EXPECT_NE(it, predicted.end());
    return *it;
  };
  const PipelineOption gpipe = find(PipelineKind::gpipe), one_f_one_b = find(PipelineKind::one_f_one_b);
  for (const PipelineOption& o : {gpipe, one_f_one_b}) {
    ASSERT_TRUE(o.unavailable.empty()) << o.unavailable;
    EXPECT_NEAR(o.step_seconds, (m + P - 1) * (F + B), 1e-9) << schedule::name(o.kind);
    ASSERT_EQ(o.bubble_seconds.size(), 2u);
    // The first stage finishes last in both, so it idled the whole difference.
    EXPECT_NEAR(o.bubble_seconds[0], (P - 1) * (F + B), 1e-9) << schedule::name(o.kind);
    EXPECT_NEAR(o.compute_seconds[0], m * (F + B), 1e-9);
  }
  EXPECT_NEAR(gpipe.mean_bubble_seconds(), one_f_one_b.mean_bubble_seconds(), 1e-9);
  // Every kind is listed, with a prediction or the reason there is none.
  EXPECT_EQ(predicted.size(), 5u);
  for (const PipelineOption& o : predicted)
    EXPECT_TRUE(o.unavailable.empty() ? o.step_seconds > 0 : true) << schedule::name(o.kind);
  EXPECT_FALSE(find(PipelineKind::two_bw).unavailable.empty());
  const std::string text = format_pipeline_options(predicted, options);
  EXPECT_NE(text.find("gpipe"), std::string::npos) << text;
  EXPECT_NE(text.find("1f1b"), std::string::npos) << text;
  EXPECT_NE(text.find("zero-bubble"), std::string::npos) << text;
}

TEST(PipelinePlan, LinksDelayTheStepByTheirTransfers) {
  // A priced link adds each message's transfer to the critical path: the step grows.
  PipelinePredictionOptions options;
  options.stages = 2;
  options.micro_batches = 2;
  options.layers_per_stage = {1, 1};
  const Profile profile = synthetic(2, 0, 0);
  const double free = predict_pipelines(profile, within(2), 1, options)[1].step_seconds;
  options.link_bytes_per_second = 128e3;  // a message of 4 x 8 x 4 bytes takes 1 ms
  const double priced = predict_pipelines(profile, within(2), 1, options)[1].step_seconds;
  EXPECT_GT(priced, free + 1e-3);
}

TEST(PipelinePlan, BadSplitsAreUserErrors) {
  PipelinePredictionOptions options;
  options.stages = 2;
  options.micro_batches = 2;
  options.layers_per_stage = {1, 2};
  testing::expect_user_error(
      [&] { predict_pipelines(synthetic(2, 0, 0), within(2), 1, options); },
      {"parallel.pipeline_layers", "sums to 3"});
}

}  // namespace
}  // namespace oases::planner
