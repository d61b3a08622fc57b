// The pipeline timing of every generated order on unit costs, against the closed forms of the
// schedules' papers: GPipe and 1F1B idle (P - 1) / m of the work, interleaved (P - 1) / (v m),
// ZB-H1 (P - 1) / (3 m) with equal F, I and W.
#include "sim/pipeline_sim.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <utility>

namespace oases::sim {
namespace {

using schedule::PipelineKind;
using schedule::PipelineSpec;

PipelineTiming timing_of(const PipelineSpec& spec, const PipelineCosts& costs) {
  const schedule::PipelineOrders orders = schedule::pipeline_orders(spec);
  schedule::verify_pipeline_orders(spec, orders);
  return simulate_pipeline(spec, orders, costs);
}

std::string describe(const PipelineSpec& s) {
  return fmt::format("{} P={} v={} m={}", schedule::name(s.kind), s.stages, s.virtual_stages,
                     s.micro_batches);
}

// F = 1, B = 2 (B holds the weight gradient too): each rank works 3 m. The last micro-batch's
// forward reaches rank P - 1 after P - 1 forwards and its backward returns to rank 0 after
// P - 1 backwards, so a step is 3 (m + P - 1) and each rank idles 3 (P - 1): (P - 1) / m of
// its work.
TEST(PipelineTiming, GPipeAndOneFOneBIdleThePMinusOneOverMOfTheirWork) {
  for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
    for (int p : {2, 3, 4, 8}) {
      for (int m : {p, 2 * p, 4 * p + 1}) {
        const PipelineSpec spec{kind, p, 1, m};
        const PipelineTiming t = timing_of(spec, {.forward = 1, .backward = 2});
        EXPECT_DOUBLE_EQ(t.makespan, 3.0 * (m + p - 1)) << describe(spec);
        ASSERT_EQ(t.idle.size(), static_cast<std::size_t>(p));
        for (int r = 0; r < p; ++r) {
          const auto at = static_cast<std::size_t>(r);
          EXPECT_DOUBLE_EQ(t.busy[at], 3.0 * m) << describe(spec);
          EXPECT_DOUBLE_EQ(t.idle[at] / t.busy[at], static_cast<double>(p - 1) / m)
              << describe(spec) << " rank " << r;
        }
      }
    }
  }
}

// A chunk holds 1/v of a rank's layers: F = 1/v, B = 2/v keeps each rank's work at 3 m, and
// the bubble shrinks v-fold (Narayanan et al., 2021).
TEST(PipelineTiming, InterleavedIdlesThePMinusOneOverVMOfItsWork) {
  for (int p : {2, 3, 4, 8}) {
    for (int v : {2, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        const PipelineSpec spec{PipelineKind::interleaved, p, v, m};
        const PipelineTiming t = timing_of(spec, {.forward = 1.0 / v, .backward = 2.0 / v});
        for (int r = 0; r < p; ++r) {
          const auto at = static_cast<std::size_t>(r);
          EXPECT_NEAR(t.busy[at], 3.0 * m, 1e-9) << describe(spec);
          EXPECT_NEAR(t.idle[at] / t.busy[at], static_cast<double>(p - 1) / (v * m), 1e-12)
              << describe(spec) << " rank " << r;
        }
      }
    }
  }
}

// ZB-H1 with F = I = W = 1: the paper's bubble is (P - 1)(T_F + T_B - T_W) = P - 1 per rank,
// (P - 1) / (3 m) of the work and a third of 1F1B's with B = I + W = 2. The test asserts the
// issue's bound idle <= (P - 1) / (3 m) of the work on every rank, and that the generated
// order meets the paper's value exactly.
TEST(PipelineTiming, ZeroBubbleIdlesAtMostPMinusOneOverThreeMOfItsWork) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p + 1}) {
      const PipelineSpec spec{PipelineKind::zero_bubble, p, 1, m};
      const PipelineTiming zb =
          timing_of(spec, {.forward = 1, .backward_input = 1, .backward_weight = 1});
      const PipelineTiming plain =
          timing_of({PipelineKind::one_f_one_b, p, 1, m}, {.forward = 1, .backward = 2});
      for (int r = 0; r < p; ++r) {
        const auto at = static_cast<std::size_t>(r);
        EXPECT_DOUBLE_EQ(zb.busy[at], 3.0 * m);
        EXPECT_LE(zb.idle[at] / zb.busy[at], static_cast<double>(p - 1) / (3 * m) + 1e-12)
            << describe(spec) << " rank " << r;
        EXPECT_DOUBLE_EQ(zb.idle[at], p - 1.0) << describe(spec) << " rank " << r;
        EXPECT_DOUBLE_EQ(plain.idle[at], 3 * zb.idle[at]) << describe(spec);
      }
    }
  }
}

// Two ranks, 1F1B, m = 2, F = 1, B = 2, worked by hand:
//   rank 0: F(0) 0-1, F(1) 1-2, B(0) 4-6 (after rank 1's B(0) 2-4), B(1) 7-9
//   rank 1: F(0) 1-2, B(0) 2-4, F(1) 4-5, B(1) 5-7
TEST(PipelineTiming, StartTimesOfATwoRankStep) {
  const PipelineSpec spec{PipelineKind::one_f_one_b, 2, 1, 2};
  const PipelineTiming t = timing_of(spec, {.forward = 1, .backward = 2});
  EXPECT_EQ(t.start[0], (std::vector<double>{0, 1, 4, 7}));
  EXPECT_EQ(t.start[1], (std::vector<double>{1, 2, 4, 5}));
  EXPECT_DOUBLE_EQ(t.makespan, 9);
  EXPECT_EQ(t.idle, (std::vector<double>{3, 3}));
}

// GPipe with a transfer latency d: each of the P - 1 hops of the last forward and of the first
// backward's way back pays d, and the other micro-batches follow back to back:
// 3 (m + P - 1) + 2 (P - 1) d.
TEST(PipelineTiming, TransfersBetweenRanksAddTheirLatencyAlongTheCriticalPath) {
  for (int p : {2, 4}) {
    for (int m : {p, 3 * p}) {
      const PipelineSpec spec{PipelineKind::gpipe, p, 1, m};
      const PipelineTiming t = timing_of(spec, {.forward = 1, .backward = 2, .p2p = 0.25});
      EXPECT_DOUBLE_EQ(t.makespan, 3.0 * (m + p - 1) + 2 * (p - 1) * 0.25) << describe(spec);
    }
  }
  // On one rank every dependency is local: the step is the sum of the work whatever d is.
  const PipelineSpec one_rank{PipelineKind::interleaved, 1, 2, 3};
  const PipelineTiming t = timing_of(one_rank, {.forward = 1, .backward = 2, .p2p = 5});
  EXPECT_DOUBLE_EQ(t.makespan, 3.0 * 3 * 2);
  EXPECT_DOUBLE_EQ(t.idle[0], 0.0);
}

TEST(PipelineTiming, CyclicOrdersAreAnInternalError) {
  const PipelineSpec spec{PipelineKind::gpipe, 2, 1, 2};
  schedule::PipelineOrders orders = schedule::pipeline_orders(spec);
  std::swap(orders[0][1], orders[0][2]);
  EXPECT_THROW(simulate_pipeline(spec, orders, {}), InternalError);
}

}  // namespace
}  // namespace oases::sim
