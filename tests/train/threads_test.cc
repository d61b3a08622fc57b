// The thread count of each rank (train.threads, automatic or explicit) and the warning when a
// host's ranks oversubscribe its cores.
#include "train/threads.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace oases::train {
namespace {

comm::HostPlacement host(int ranks, int cores, int cores_of_rank) {
  return comm::HostPlacement{"node7", ranks, cores, cores_of_rank};
}

void expect_mentions(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& part : parts)
    EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' missing in: " << text;
}

TEST(Threads, AutomaticSharesTheHostsCoresAmongItsRanks) {
  // Ranks unbound (each may use every core) and bound (each its own cores): the same share.
  for (const int own : {16, 4}) {
    const auto h = host(4, 16, own);
    const ThreadChoice c = choose_threads(0, std::nullopt, h, h);
    EXPECT_EQ(c.threads, 4);
    EXPECT_TRUE(c.warning.empty()) << c.warning;
  }
  // Cores that do not divide: the share rounds down.
  const auto h = host(3, 8, 8);
  EXPECT_EQ(choose_threads(0, std::nullopt, h, h).threads, 2);
  // A rank bound to fewer cores than its share gets its own cores.
  const auto bound = host(2, 16, 3);
  EXPECT_EQ(choose_threads(0, std::nullopt, bound, bound).threads, 3);
  // One process alone uses every core it may.
  const auto alone = host(1, 6, 6);
  EXPECT_EQ(choose_threads(0, std::nullopt, alone, alone).threads, 6);
}

TEST(Threads, MoreRanksThanCoresGiveOneThreadEachAndAWarningWithTheNumbers) {
  const auto h = host(4, 2, 2);
  const ThreadChoice c = choose_threads(0, std::nullopt, h, h);
  EXPECT_EQ(c.threads, 1);
  expect_mentions(c.warning, {"4 ranks", "node7", "2 cores", "at most 2 ranks", "slower"});
}

TEST(Threads, TheMostCrowdedHostDecidesTheWarning) {
  const auto roomy = host(2, 16, 16);
  const auto crowded = comm::HostPlacement{"node9", 8, 4, 4};
  const ThreadChoice c = choose_threads(0, std::nullopt, roomy, crowded);
  EXPECT_EQ(c.threads, 8);  // this rank's own host has room
  expect_mentions(c.warning, {"8 ranks", "node9", "4 cores"});
}

TEST(Threads, ExplicitCountIsKeptAndWarnedAboutWhenItOversubscribes) {
  const auto h = host(2, 8, 8);
  const ThreadChoice fits = choose_threads(4, std::nullopt, h, h);
  EXPECT_EQ(fits.threads, 4);
  EXPECT_TRUE(fits.warning.empty()) << fits.warning;
  const ThreadChoice over = choose_threads(8, std::nullopt, h, h);
  EXPECT_EQ(over.threads, 8);
  expect_mentions(over.warning, {"train.threads = 8", "2 ranks", "16 threads for 8 cores",
                                 "train.threads = 0", "at most 4"});
  // More threads than the rank's own cores, though the host has enough.
  const auto bound = host(2, 8, 2);
  expect_mentions(choose_threads(3, std::nullopt, bound, bound).warning, {"may use 2"});
}

TEST(Threads, OmpNumThreadsIsUsedWhenTrainThreadsIsAutomatic) {
  const auto h = host(2, 8, 8);
  const ThreadChoice c = choose_threads(0, 3, h, h);
  EXPECT_EQ(c.threads, 3);
  EXPECT_EQ(c.reason, "OMP_NUM_THREADS");
  EXPECT_TRUE(c.warning.empty());
  expect_mentions(choose_threads(0, 8, h, h).warning,
                  {"OMP_NUM_THREADS = 8", "Unset OMP_NUM_THREADS"});
  // train.threads wins over the environment.
  EXPECT_EQ(choose_threads(2, 3, h, h).threads, 2);
}

TEST(Threads, OmpNumThreadsIsReadAsOpenMpReadsIt) {
  ::setenv("OMP_NUM_THREADS", "5", 1);
  EXPECT_EQ(omp_num_threads_from_environment(), 5);
  ::setenv("OMP_NUM_THREADS", "4,2", 1);
  EXPECT_EQ(omp_num_threads_from_environment(), 4);
  ::setenv("OMP_NUM_THREADS", "many", 1);
  EXPECT_EQ(omp_num_threads_from_environment(), std::nullopt);
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(omp_num_threads_from_environment(), std::nullopt);
}

// train.threads = 100000 used to crash inside OpenMP: a count no host can run is a UserError
// naming the setting, the value, the host and the valid range, before any thread starts.
TEST(Threads, ACountTheHostCannotRunIsAClearError) {
  const auto h = host(1, 2, 2);
  EXPECT_EQ(choose_threads(16, std::nullopt, h, h).threads, 16);  // 8 per core: allowed
  for (const std::int64_t count : {17LL, 100000LL, 10000000000LL}) {
    try {
      choose_threads(count, std::nullopt, h, h);
      ADD_FAILURE() << "train.threads = " << count << " was accepted";
    } catch (const UserError& e) {
      expect_mentions(e.what(), {"train.threads = " + std::to_string(count), "node7", "2 cores",
                                 "1 to 16", "train.threads = 0"});
    }
  }
  try {
    choose_threads(0, 40000, h, h);
    ADD_FAILURE() << "OMP_NUM_THREADS = 40000 was accepted";
  } catch (const UserError& e) {
    expect_mentions(e.what(), {"OMP_NUM_THREADS = 40000", "1 to 16", "OMP_NUM_THREADS unset"});
  }
}

}  // namespace
}  // namespace oases::train
