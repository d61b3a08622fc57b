// The straggler figures of a window: per-step means, the slowest rank and its ratio to the
// median rank; a single rank sees no straggler and is never warned about.
#include "train/stragglers.h"

#include "comm/communicator.h"
#include "comm/mesh.h"

#include <gtest/gtest.h>

namespace oases::train {
namespace {

TEST(Stragglers, TheSlowestRankAndItsRatioToTheMedian) {
  // Sums over 4 steps: rank 2 computes 8 s, the median rank (of 1, 1.2, 2, 8 per step: the
  // lower middle one, 1.2) 4.8 s.
  const StragglerWindow w = straggler_window({4.0, 4.8, 32.0, 8.0}, {2.0, 2.0, 0.4, 1.0}, 4);
  EXPECT_EQ(w.steps, 4);
  EXPECT_EQ(w.slowest_rank, 2);
  EXPECT_DOUBLE_EQ(w.compute_s[2], 8.0);
  EXPECT_DOUBLE_EQ(w.exposed_comm_s[0], 0.5);
  EXPECT_DOUBLE_EQ(w.median_compute_s, 1.2);
  EXPECT_DOUBLE_EQ(w.straggler_ratio, 8.0 / 1.2);
  // Two ranks: the slower over the faster.
  const StragglerWindow two = straggler_window({3.0, 2.0}, {0.0, 1.0}, 1);
  EXPECT_EQ(two.slowest_rank, 0);
  EXPECT_DOUBLE_EQ(two.straggler_ratio, 1.5);
  // Equal ranks: the lowest one, ratio 1.
  const StragglerWindow even = straggler_window({1.0, 1.0, 1.0}, {0.0, 0.0, 0.0}, 2);
  EXPECT_EQ(even.slowest_rank, 0);
  EXPECT_DOUBLE_EQ(even.straggler_ratio, 1.0);
}

TEST(Stragglers, OneRankHasWindowsButNoWarnings) {
  comm::Mesh mesh = comm::Mesh::single_process();
  StragglerMonitor monitor(mesh.world(), "here", 1.2);
  EXPECT_EQ(monitor.hosts(), std::vector<std::string>{"here"});
  for (int window = 0; window < 5; ++window) {
    EXPECT_FALSE(monitor.after_step(1.0, 0.0, false).has_value());
    const auto w = monitor.after_step(3.0, 1.0, true);
    ASSERT_TRUE(w.has_value());
    EXPECT_EQ(w->steps, 2);
    EXPECT_DOUBLE_EQ(w->compute_s[0], 2.0);
    EXPECT_DOUBLE_EQ(w->exposed_comm_s[0], 0.5);
    EXPECT_TRUE(w->warnings.empty());
  }
}

}  // namespace
}  // namespace oases::train
