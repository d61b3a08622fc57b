// cpu::for_each_index: every index once; across the OpenMP team only when asked and worth it,
// in order on the calling thread otherwise (the 16-bit kernels' pieces rely on the latter to
// stay out of nested parallel regions).
#include "kernels/cpu/threads.h"

#include "kernels/thread_count.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <vector>

namespace oases::kernels::cpu {
namespace {

TEST(ForEachIndex, TheTeamVisitsEveryIndexOnceInParallel) {
  const oases::testing::ScopedThreadCount threads(3);
  const std::int64_t n = 1000;
  std::vector<int> visits(n, 0), team_size(n, 0);
  for_each_index(n, Threads::team, true, [&](std::int64_t i) {
    ++visits[static_cast<std::size_t>(i)];
    team_size[static_cast<std::size_t>(i)] = omp_get_num_threads();
  });
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(visits[static_cast<std::size_t>(i)], 1) << i;
    EXPECT_EQ(team_size[static_cast<std::size_t>(i)], 3) << i;
  }
}

TEST(ForEachIndex, TheCallingThreadVisitsInOrderOutsideAnyParallelRegion) {
  const oases::testing::ScopedThreadCount threads(3);
  for (const bool worth_a_team : {true, false}) {
    for (const Threads who : {Threads::calling_thread, Threads::team}) {
      if (who == Threads::team && worth_a_team) continue;  // the case above
      std::vector<std::int64_t> order;
      bool parallel = false;
      for_each_index(37, who, worth_a_team, [&](std::int64_t i) {
        order.push_back(i);
        parallel = parallel || omp_in_parallel() != 0;
      });
      ASSERT_EQ(order.size(), 37u);
      for (std::int64_t i = 0; i < 37; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
      EXPECT_FALSE(parallel);
    }
  }
}

TEST(ForEachIndex, NothingForAnEmptyRange) {
  int calls = 0;
  for_each_index(0, Threads::team, true, [&](std::int64_t) { ++calls; });
  for_each_index(0, Threads::calling_thread, false, [&](std::int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace oases::kernels::cpu
