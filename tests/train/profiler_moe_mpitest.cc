// `oases profile` of a mixture-of-experts model with its experts split over ep = 2
// data-parallel ranks (tp 1, dp = ep = 2): every rank measures the MoE segments with all
// experts local, the two ranks measure the link between them, and the profile prices the
// model's all-to-alls over that link by their per-peer volume; its prediction is a step.
#include "comm/mesh.h"
#include "mpi_test_support.h"
#include "planner/cost_model.h"
#include "planner/profile.h"
#include "sim/schedule_sim.h"
#include "support/tiny_run.h"
#include "train/engine.h"
#include "train/profiler.h"

#include <gtest/gtest.h>

namespace oases::train {
namespace {

namespace mpitest = comm::mpitest;

TEST(ProfileMoeExpertParallel, MeasuresTheExpertLinkAndPricesTheAllToAllsOverIt) {
  if (mpitest::runtime().world_size() != 2) GTEST_SKIP() << "runs at 2 ranks (dp = ep = 2)";
  plan::RunConfig c = oases::testing::tiny_run(oases::testing::tiny_moe_model(2));
  c.train.micro_batch = 2;
  c.train.global_batch = 4;
  c.parallel.dp = 2;
  c.parallel.ep = 2;
  ProfileOptions options;
  options.warmup_steps = 0;
  options.steps = 2;
  options.progress = false;
  const auto world = mpitest::runtime().world_size();
  const planner::Profile profile = run_profile(c, options, [&](int tp, int dp) {
    return comm::Mesh::create(mpitest::runtime(), tp, dp, world / (tp * dp),
                              mpitest::test_options());
  });
  EXPECT_EQ(profile.ep, 2);
  EXPECT_GT(profile.expert_link.bytes_per_second, 0.0);
  EXPECT_GE(profile.expert_link.latency_s, 0.0);
  const planner::DegreeProfile& d = profile.degrees.at(0);
  EXPECT_TRUE(d.segments.contains("experts"));
  const std::int64_t dispatch = d.collective_elements.at("moe_dispatch.fwd");
  ASSERT_GT(dispatch, 0);

  // The dispatch all-to-all of the MoE layer (layer 1) as the cost model prices it.
  const double rows = static_cast<double>(d.rows);
  const ops::Program program = planner::program_at(profile, 1, rows);
  const sim::CostModel costs = planner::costs_at(profile, 1, rows, program);
  int segment = -1;
  for (std::size_t i = 0; i < program.segments.size(); ++i)
    if (program.segments[i].name == "moe_dispatch.1") segment = static_cast<int>(i);
  ASSERT_GE(segment, 0);
  schedule::Instruction start{schedule::Op::start};
  start.segment = segment;
  const double bytes = static_cast<double>(dispatch * profile.element_bytes);
  EXPECT_DOUBLE_EQ(costs.collective(start),
                   sim::all_to_all_seconds(bytes, 2,
                                           {profile.expert_link.bytes_per_second,
                                            profile.expert_link.latency_s}));
  const planner::Prediction p =
      planner::predict_plan(profile, {1, 1}, plan::make_run_plan(c).schedule, c.train.micro_batch);
  EXPECT_GT(p.step_seconds, 0.0);
  // The link survives the profile file.
  EXPECT_EQ(planner::profile_from_json(planner::to_json(profile), "p.json").expert_link,
            profile.expert_link);
}

}  // namespace
}  // namespace oases::train
