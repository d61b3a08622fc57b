// `oases profile` on a mixture-of-experts model in one process: the profile measures the three
// MoE segment kinds (every action the schedule runs), records what their collectives move, and
// the cost model and planner turn it into a prediction of the same model, with the MoE layers'
// three segments in its program.
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "planner/profile.h"
#include "support/tiny_run.h"
#include "train/engine.h"
#include "train/profiler.h"

#include <gtest/gtest.h>

#include <string>

namespace oases::train {
namespace {

// Four layers, two of them MoE layers under the gshard gate, one micro-batch per step in two
// sub-batches under the oases schedule.
plan::RunConfig tiny_moe() {
  plan::RunConfig c = testing::tiny_run(testing::tiny_moe_model(4));
  c.model.moe_gate = ops::MoeGate::gshard;
  c.train.global_batch = 4;
  c.parallel.sub_batches = 2;
  c.parallel.schedule = "oases";
  return c;
}

TEST(ProfileMoe, MeasuresTheMoeKindsAndPredictsTheModel) {
  const plan::RunConfig c = tiny_moe();
  ProfileOptions options;
  options.warmup_steps = 0;
  options.steps = 1;
  options.progress = false;
  const planner::Profile profile = run_profile(
      c, options, [](int tp, int dp) { return comm::Mesh::single_process(tp, dp); });
  ASSERT_EQ(profile.degrees.size(), 1u);
  const planner::DegreeProfile& d = profile.degrees[0];
  for (const char* kind : planner::kMoeKinds) {
    ASSERT_TRUE(d.segments.contains(kind)) << kind;
    EXPECT_GT(d.segments.at(kind).forward_s, 0.0) << kind;
    EXPECT_GT(d.segments.at(kind).backward0_s, 0.0) << kind;
    // Fine-grained recomputation regenerates the internals (the combine keeps none).
    if (std::string(kind) != "moe_combine") {
      EXPECT_GT(d.segments.at(kind).recompute_s, 0.0) << kind;
    }
    EXPECT_TRUE(d.activation_bytes.contains(kind)) << kind;
  }
  // The dispatch sends every expert's slots (rows of hidden + 2 columns), at least one per token.
  const std::int64_t tokens = d.rows * c.model.seq_len;
  EXPECT_GE(d.collective_elements.at("moe_dispatch.fwd"), tokens * (c.model.hidden + 2));
  EXPECT_EQ(d.collective_elements.at("experts.fwd"), d.collective_elements.at("moe_dispatch.fwd"));
  EXPECT_TRUE(d.collectives.contains("experts.fwd_s"));
  EXPECT_EQ(profile.ep, 1);
  EXPECT_TRUE(profile.model.is_moe_layer(1));

  // What `oases plan` and `oases simulate` read back from the file.
  const planner::Profile read = planner::profile_from_json(planner::to_json(profile), "p.json");
  EXPECT_EQ(read.degrees, profile.degrees);
  planner::check_profile_matches(read, c.model, c.train.micro_batch, 2, {1}, "p.json", 1);

  const schedule::ScheduleSpec spec = plan::make_run_plan(c).schedule;
  const ops::Program program = planner::program_at(read, 1, 2.0);
  int experts_segments = 0;
  for (const ops::SegmentShape& s : program.segments)
    if (s.name.starts_with("experts.")) {
      ++experts_segments;
      EXPECT_EQ(s.forward_kind, ops::CollectiveKind::all_to_all);
    }
  EXPECT_EQ(experts_segments, 2);
  const planner::Prediction p =
      planner::predict_plan(read, {1, 1, 1, 1}, spec, c.train.micro_batch);
  EXPECT_GT(p.step_seconds, 0.0);
  EXPECT_GT(p.compute_seconds, 0.0);
  // Its compute holds the MoE segments' measured forward passes.
  EXPECT_GT(p.compute_seconds, 2 * d.segments.at("experts").forward_s);
  const planner::PlanReport report = planner::make_plan(read, spec, c.train.micro_batch, 0);
  EXPECT_EQ(report.chosen.degrees, std::vector<int>(4, 1));
  EXPECT_GT(report.chosen.predicted_step_seconds, 0.0);
}

}  // namespace
}  // namespace oases::train
