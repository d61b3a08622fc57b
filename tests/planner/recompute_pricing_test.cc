// The cost model prices recomputation in groups of k layers (recompute = sqrt) from the
// schedule it generates: one forward more for every layer segment (as full recomputation),
// whatever k, and the activation peak of that schedule; on a synthetic profile whose numbers
// follow by hand.
#include "planner/cost_model.h"

#include <gtest/gtest.h>

namespace oases::planner {
namespace {

// `layers` layers at degree 1; every segment action takes 1 ms per row, no collectives, the
// optimizer 10 ms. Checkpoints are small beside the internals, as in a transformer.
Profile synthetic(int layers) {
  Profile p;
  p.model.layers = layers;
  p.tp = 1;
  p.micro_batch = 2;
  p.sub_batches = 1;
  DegreeProfile d;
  d.degree = 1;
  d.rows = 1;
  for (const char* kind : {"embedding", "attention", "mlp", "head"})
    d.segments[kind] = {1e-3, 0.5e-3, 1e-3, 1e-3};
  d.optimizer_s = 0.01;
  d.parameter_bytes = 1000;
  d.parameter_bytes_per_layer = 100;
  d.activation_bytes["attention"] = {{"checkpoint", 64}, {"internals", 256}, {"core", 64}};
  d.activation_bytes["mlp"] = {{"checkpoint", 64}, {"internals", 512}, {"core", 0}};
  d.activation_bytes["head"] = {{"internals", 128}};
  d.static_activation_bytes = 1024;
  p.degrees.push_back(d);
  return p;
}

schedule::ScheduleSpec spec_of(schedule::Recompute policy, int k = 0) {
  schedule::ScheduleSpec spec{schedule::ScheduleKind::megatron, policy, 1, 1, true};
  spec.recompute_every = k;
  return spec;
}

TEST(RecomputePricing, SqrtCostsOneMoreForwardPerLayerSegmentAndItsSchedulesPeak) {
  const int layers = 9;
  const Profile p = synthetic(layers);
  const Prediction none = predict_uniform(p, 1, spec_of(schedule::Recompute::none), 2);
  const Prediction full = predict_uniform(p, 1, spec_of(schedule::Recompute::full), 2);
  // A micro-batch of 2 rows: every action 2 ms; 2 x 9 layer segments recompute a forward.
  const double extra = 2 * layers * 2e-3;
  EXPECT_NEAR(full.step_seconds - none.step_seconds, extra, 1e-12);
  for (int k = 1; k <= layers; ++k) {
    const schedule::ScheduleSpec spec = spec_of(schedule::Recompute::sqrt, k);
    const Prediction grouped = predict_uniform(p, 1, spec, 2);
    EXPECT_NEAR(grouped.step_seconds - none.step_seconds, extra, 1e-12) << "k=" << k;
    EXPECT_NEAR(grouped.compute_seconds, full.compute_seconds, 1e-12) << "k=" << k;
    // The activations are the static buffers plus the peak of the very schedule priced.
    const ops::Program program = program_at(p, 1, 2.0);
    EXPECT_EQ(grouped.memory.activations,
              2 * 1024 + static_cast<std::int64_t>(schedule::peak_activation_bytes(
                             program, schedule::generate(program, spec))))
        << "k=" << k;
    EXPECT_LT(grouped.memory.activations, none.memory.activations) << "k=" << k;
    EXPECT_EQ(grouped.memory.state(), none.memory.state());
  }
  EXPECT_EQ(predict_uniform(p, 1, spec_of(schedule::Recompute::sqrt, 1), 2).memory.activations,
            full.memory.activations);
}

}  // namespace
}  // namespace oases::planner
