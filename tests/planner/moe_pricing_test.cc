// Mixture-of-experts models in the profile and the cost model: the MoE segment kinds and the
// expert-parallel link survive the profile's JSON, a version-3 (dense) profile still reads,
// the program of an MoE model has the three segments per MoE layer with their all-to-alls, the
// all-to-alls are priced from the link by their per-peer volume, and the planner prices and
// places MoE layers (at degree 1 under parallel.expert_tp = 1).
#include "core/error.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "planner/profile.h"
#include "sim/schedule_sim.h"

#include "support/errors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace oases::planner {
namespace {

constexpr std::int64_t kDispatchElements = 6000;  // at the profiled rows

// Four layers, MoE every other one (layers 1 and 3), four experts, tp 2, ep `ep`. Every
// segment action takes 1 ms per profiled row; each MoE kind's all-to-alls have elements
// proportional to the rows.
Profile moe_profile(int ep) {
  Profile p;
  p.model.layers = 4;
  p.model.hidden = 64;
  p.model.heads = 4;
  p.model.ffn_hidden = 256;
  p.model.vocab_size = 64;
  p.model.seq_len = 16;
  p.model.moe_every = 2;
  p.model.experts = 4;
  p.model.moe_gate = ops::MoeGate::gshard;
  p.model.capacity_factor = 1.25;
  p.tp = 2;
  p.micro_batch = 4;
  p.sub_batches = 2;
  p.ep = ep;
  if (ep > 1) p.expert_link = {1e8, 2e-5};
  for (int k : {1, 2}) {
    DegreeProfile d;
    d.degree = k;
    d.rows = k;
    for (const char* kind : {"embedding", "attention", "mlp", "head", "moe_dispatch", "experts",
                             "moe_combine"})
      d.segments[kind] = {1e-3 * k, 1e-3 * k, 1e-3 * k, 1e-3 * k};
    d.collectives["experts.fwd_s"] = 1e-6;  // a local copy at ep = 1
    d.collectives["experts.bwd_s"] = 1e-6;
    d.optimizer_s = 0.01;
    d.parameter_bytes = 10000 * (3 - k);
    d.parameter_bytes_per_layer = 1000 * (3 - k);
    d.activation_bytes["attention"] = {{"checkpoint", 64 * k}, {"internals", 256 * k}};
    d.activation_bytes["experts"] = {{"checkpoint", 96 * k}, {"internals", 512 * k}};
    d.static_activation_bytes = 1024 * k;
    for (const char* kind : {"moe_dispatch", "experts", "moe_combine"}) {
      d.collective_elements[std::string(kind) + ".fwd"] = kDispatchElements * k;
      d.collective_elements[std::string(kind) + ".bwd"] = kDispatchElements * k;
    }
    p.degrees.push_back(d);
  }
  p.reshards["1-2"] = 1e-4;
  return p;
}

schedule::ScheduleSpec oases_spec() {
  return {schedule::ScheduleKind::oases, schedule::Recompute::fine_grained, 1, 2, true};
}

using oases::testing::user_error_of;

TEST(MoeProfile, RoundTripsTheMoeKindsModelAndLink) {
  const Profile p = moe_profile(2);
  const Profile q = profile_from_json(to_json(p), "p.json");
  EXPECT_EQ(q.model.moe_every, 2);
  EXPECT_EQ(q.model.experts, 4);
  EXPECT_EQ(q.model.moe_gate, ops::MoeGate::gshard);
  EXPECT_DOUBLE_EQ(q.model.capacity_factor, 1.25);
  EXPECT_TRUE(q.model.is_moe_layer(3));
  EXPECT_EQ(q.ep, 2);
  EXPECT_EQ(q.expert_link, p.expert_link);
  ASSERT_EQ(q.degrees.size(), p.degrees.size());
  for (std::size_t i = 0; i < p.degrees.size(); ++i) {
    EXPECT_EQ(q.degrees[i], p.degrees[i]);
    EXPECT_TRUE(q.degrees[i].segments.contains("experts"));
    EXPECT_EQ(q.degrees[i].collective_elements.at("moe_dispatch.fwd"),
              kDispatchElements * p.degrees[i].degree);
  }
  EXPECT_EQ(to_json(q), to_json(p));
}

TEST(MoeProfile, AVersion3DenseProfileStillReads) {
  Profile dense = moe_profile(1);
  dense.model.moe_every = 0;
  dense.model.experts = 0;
  for (DegreeProfile& d : dense.degrees) d.collective_elements.clear();
  nlohmann::json j = nlohmann::json::parse(to_json(dense));
  EXPECT_FALSE(j.at("model").contains("moe_every"));  // dense models keep the old keys
  EXPECT_FALSE(j.contains("ep"));
  j["version"] = 3;
  const Profile q = profile_from_json(j.dump(), "old.json");
  EXPECT_FALSE(q.model.has_moe());
  EXPECT_EQ(q.ep, 1);
  EXPECT_EQ(q.degrees, dense.degrees);
}

TEST(MoeProfile, ADenseProfileOrAnotherEpIsRejectedForAnMoeRun) {
  const Profile moe = moe_profile(2);
  Profile dense = moe;
  dense.model.moe_every = 0;
  EXPECT_NE(user_error_of([&] {
              check_profile_matches(dense, moe.model, 4, 2, {1, 2}, "p.json", 2);
            }).find("p.json was measured for a dense model"),
            std::string::npos);
  model::ModelConfig more_experts = moe.model;
  more_experts.experts = 8;
  EXPECT_NE(user_error_of([&] {
              check_profile_matches(moe, more_experts, 4, 2, {1, 2}, "p.json", 2);
            }).find("model.experts = 4 there, 8 in this config"),
            std::string::npos);
  EXPECT_NO_THROW(check_profile_matches(moe, moe.model, 4, 2, {1, 2}, "p.json", 2));
  EXPECT_NE(user_error_of([&] {
              check_profile_matches(moe, moe.model, 4, 2, {1, 2}, "p.json", 4);
            }).find("no expert-parallel link measured over 4 ranks (it was profiled at "
                    "parallel.ep = 2)"),
            std::string::npos);
}

TEST(MoeCostModel, MoeLayersRunThreeSegmentsWithTheirAllToAlls) {
  const Profile p = moe_profile(2);
  const ops::Program program = program_at(p, 1, 2.0);
  std::vector<std::string> names;
  for (const ops::SegmentShape& s : program.segments) names.push_back(s.name);
  const std::vector<std::string> expected = {
      "embedding",      "attention.0", "mlp.0",          "attention.1", "moe_dispatch.1",
      "experts.1",      "moe_combine.1", "attention.2",  "mlp.2",       "attention.3",
      "moe_dispatch.3", "experts.3",   "moe_combine.3", "head"};
  EXPECT_EQ(names, expected);
  const auto& dispatch = program.segments[4];
  const auto& experts = program.segments[5];
  const auto& combine = program.segments[6];
  EXPECT_EQ(dispatch.forward_kind, ops::CollectiveKind::all_to_all);
  EXPECT_FALSE(dispatch.has_backward_collective);  // degree 1: nothing sums its input gradient
  EXPECT_EQ(experts.forward_kind, ops::CollectiveKind::all_to_all);
  EXPECT_EQ(experts.backward_kind, ops::CollectiveKind::all_to_all);
  EXPECT_EQ(combine.forward_kind, ops::CollectiveKind::all_reduce);
  EXPECT_EQ(combine.backward_kind, ops::CollectiveKind::all_to_all);
  for (const auto* s : {&dispatch, &experts, &combine}) {
    EXPECT_EQ(s->collective_ranks, 2) << s->name;
    EXPECT_EQ(s->layer, 1) << s->name;
    // Scaled from the profiled rows (1 at degree 1) to 2.
    EXPECT_EQ(s->forward_collective_elements, 2 * kDispatchElements) << s->name;
  }
  EXPECT_EQ(experts.checkpoint_bytes, 2u * 96);
  // At degree 2 the dispatch's backward all-reduce sums the partial input gradients.
  const ops::Program split = program_at(p, 2, 2.0);
  EXPECT_TRUE(split.segments[4].has_backward_collective);
  EXPECT_EQ(split.segments[4].backward_stages, 2);
  // The schedule generator takes the program as the engine's (every instance of the three).
  const schedule::Schedule schedule = schedule::generate(program, oases_spec());
  int all_to_all_starts = 0;
  for (const schedule::Instruction& ins : schedule)
      if (ins.op == schedule::Op::start && ins.segment >= 4 && ins.segment <= 6 &&
          (ins.direction == schedule::Direction::forward
               ? program.segments[static_cast<std::size_t>(ins.segment)].forward_kind
               : program.segments[static_cast<std::size_t>(ins.segment)].backward_kind) ==
              ops::CollectiveKind::all_to_all && !ins.replay)
        ++all_to_all_starts;
  // Dispatch forward, experts forward and backward, combine backward: 4 per instance, 2
  // sub-batches.
  EXPECT_EQ(all_to_all_starts, 4 * 2);
}

// The price of an experts.l forward all-to-all as costs_at gives it.
double experts_all_to_all_seconds(const Profile& p, double rows) {
  const ops::Program program = program_at(p, 1, rows);
  const sim::CostModel costs = costs_at(p, 1, rows, program);
  schedule::Instruction start{schedule::Op::start};
  start.segment = 5;  // experts.1
  start.direction = schedule::Direction::forward;
  return costs.collective(start);
}

TEST(MoeCostModel, AllToAllsArePricedFromTheLinkByTheirPerPeerVolume) {
  const Profile p = moe_profile(2);
  const double bytes_per_element = static_cast<double>(p.element_bytes);
  for (double rows : {1.0, 2.0, 8.0}) {
    const double bytes = rows * kDispatchElements * bytes_per_element;
    EXPECT_NEAR(experts_all_to_all_seconds(p, rows),
                sim::all_to_all_seconds(bytes, 2, {1e8, 2e-5}), 1e-12)
        << rows;
  }
  // Twice the rows: twice each peer's block; the latency stays.
  const double one = experts_all_to_all_seconds(p, 1.0), two = experts_all_to_all_seconds(p, 2.0);
  EXPECT_NEAR(two - one, kDispatchElements * bytes_per_element / 2 / 1e8, 1e-12);
  // Four ranks split the same buffer in smaller blocks, sent to three peers.
  Profile four = p;
  four.ep = 4;
  const double bytes = kDispatchElements * bytes_per_element;
  EXPECT_NEAR(experts_all_to_all_seconds(four, 1.0), 3 * (2e-5 + bytes / 4 / 1e8), 1e-12);
  // At ep = 1 nothing crosses a link: the profiled (local) time, scaled to the rows.
  EXPECT_NEAR(experts_all_to_all_seconds(moe_profile(1), 2.0), 2e-6, 1e-15);
}

TEST(MoeCostModel, ASlowerLinkSlowsTheStepOfAnMoePlan) {
  Profile fast = moe_profile(2), slow = moe_profile(2);
  slow.expert_link.bytes_per_second = 1e5;
  const std::vector<int> degrees = {2, 1, 2, 1};
  const Prediction a = predict_plan(fast, degrees, oases_spec(), 4);
  const Prediction b = predict_plan(slow, degrees, oases_spec(), 4);
  EXPECT_GT(a.step_seconds, 0.0);
  EXPECT_GT(b.step_seconds, a.step_seconds);
  EXPECT_GT(b.exposed_comm_seconds, a.exposed_comm_seconds);
  // The same plan priced as dense (no MoE layers) runs fewer segments.
  Profile dense = fast;
  dense.model.moe_every = 0;
  EXPECT_LT(predict_plan(dense, degrees, oases_spec(), 4).compute_seconds, a.compute_seconds);
}

// The busiest rank's load over the mean: four experts over two ranks (experts 0-1 and 2-3),
// over four (one each), and none routed.
TEST(MoeProfile, ExpertLoadImbalanceIsTheBusiestRanksShareOverTheMean) {
  EXPECT_DOUBLE_EQ(expert_load_imbalance({100, 300, 200, 200}, 2), 1.0);
  EXPECT_DOUBLE_EQ(expert_load_imbalance({300, 100, 50, 50}, 2), 400.0 / 250.0);
  EXPECT_DOUBLE_EQ(expert_load_imbalance({300, 100, 50, 50}, 4), 300.0 / 125.0);
  EXPECT_DOUBLE_EQ(expert_load_imbalance({300, 100, 50, 50}, 1), 1.0);
  EXPECT_DOUBLE_EQ(expert_load_imbalance({0, 0, 0, 0}, 2), 1.0);
  EXPECT_NE(user_error_of([] { expert_load_imbalance({1, 2, 3}, 2); })
                .find("parallel.ep = 2 does not divide the 3 experts"),
            std::string::npos);
}

// The imbalance survives the JSON; a ratio under 1 or a key that is no layer is rejected.
TEST(MoeProfile, RoundTripsTheExpertLoadImbalance) {
  Profile p = moe_profile(2);
  p.expert_load_imbalance = {{1, 1.25}, {3, 1.5}};
  const Profile q = profile_from_json(to_json(p), "p.json");
  EXPECT_EQ(q.expert_load_imbalance, p.expert_load_imbalance);
  nlohmann::json j = nlohmann::json::parse(to_json(p));
  j["expert_load_imbalance"]["1"] = 0.5;
  EXPECT_NE(user_error_of([&] { profile_from_json(j.dump(), "p.json"); })
                .find("expert_load_imbalance of layer 1 = 0.5"),
            std::string::npos);
  j = nlohmann::json::parse(to_json(p));
  j["expert_load_imbalance"]["x"] = 1.0;
  EXPECT_NE(user_error_of([&] { profile_from_json(j.dump(), "p.json"); })
                .find("expert_load_imbalance key \"x\""),
            std::string::npos);
}

// A layer's experts take its busiest rank's time: each experts instruction of layer 3 costs
// 1.5 times its balanced price, layer 1's and every other kind's stay.
TEST(MoeCostModel, ExpertsTakeTheBusiestRanksTime) {
  Profile balanced = moe_profile(2), skewed = moe_profile(2);
  skewed.expert_load_imbalance = {{3, 1.5}};
  const std::vector<int> degrees = {2, 1, 2, 1};
  const ops::Program program = program_at(balanced, 2, 2.0);
  const auto even = profiled_compute(balanced, program, 2.0, balanced.tp);
  const auto busiest = profiled_compute(skewed, program, 2.0, skewed.tp);
  int experts_seen = 0;
  for (std::size_t i = 0; i < program.segments.size(); ++i)
    for (const schedule::Op op : {schedule::Op::forward, schedule::Op::backward}) {
      schedule::Instruction ins{op};
      ins.segment = static_cast<int>(i);
      const ops::SegmentShape& shape = program.segments[i];
      const bool scaled = shape.name == "experts.3";
      experts_seen += scaled;
      if (scaled) {
        EXPECT_GT(even(ins), 0.0);
      }
      EXPECT_DOUBLE_EQ(busiest(ins), (scaled ? 1.5 : 1.0) * even(ins)) << shape.name;
    }
  EXPECT_EQ(experts_seen, 2);
  EXPECT_GT(predict_plan(skewed, degrees, oases_spec(), 4).step_seconds,
            predict_plan(balanced, degrees, oases_spec(), 4).step_seconds);
}

TEST(MoePlanner, PlansAnMoeModelAndKeepsMoeLayersAtDegreeOneUnderWholeExperts) {
  const Profile p = moe_profile(2);
  const PlanReport free = make_plan(p, oases_spec(), 4, 0);
  ASSERT_EQ(free.chosen.degrees.size(), 4u);
  EXPECT_GT(free.chosen.predicted_step_seconds, 0.0);
  const PlanReport whole = make_plan(p, oases_spec(), 4, 0, /*moe_at_degree_one=*/true);
  ASSERT_EQ(whole.chosen.degrees.size(), 4u);
  EXPECT_EQ(whole.chosen.degrees[1], 1);
  EXPECT_EQ(whole.chosen.degrees[3], 1);
  EXPECT_GT(whole.chosen.predicted_step_seconds, 0.0);
  // The uniform option at degree 2 keeps them at 1 too, so it is a plan with reshards.
  ASSERT_EQ(whole.uniform.size(), 2u);
  EXPECT_TRUE(whole.uniform[1].moe_at_degree_one);
  EXPECT_NE(format_plan_report(whole, oases_spec(), 0).find("dense at 2, MoE at 1"),
            std::string::npos);
  EXPECT_NEAR(whole.uniform[1].prediction.step_seconds,
              predict_plan(p, {2, 1, 2, 1}, oases_spec(), 4).step_seconds, 1e-12);
}

}  // namespace
}  // namespace oases::planner
