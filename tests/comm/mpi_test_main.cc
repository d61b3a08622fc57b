// main() of the comm *_mpitest binaries: initialises MPI before GoogleTest, prints only
// failures on ranks other than 0 (so N ranks do not print N reports), and makes the exit
// status the same on every rank: non-zero if any rank failed, so mpirun fails the run.
#include "mpi_test_support.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

namespace oases::comm::mpitest {

const MpiRuntime& runtime() {
  static const MpiRuntime mpi;
  return mpi;
}

MpiCommunicatorOptions test_options() {
  MpiCommunicatorOptions options;
  options.timeout_seconds = 30;
  return options;
}

std::vector<std::array<int, 3>> layouts(int world_size) {
  std::vector<std::array<int, 3>> all;
  for (int tp = 1; tp <= world_size; ++tp) {
    for (int dp = 1; dp <= world_size / tp; ++dp) {
      if (world_size % (tp * dp) == 0) all.push_back({tp, dp, world_size / (tp * dp)});
    }
  }
  return all;
}

namespace {

class FailurePrinter final : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // The name is taken when the test starts: asking UnitTest for the current test from inside
  // OnTestPartResult would take the lock GoogleTest already holds there.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_name_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s failed at %s:%d\n%s\n", rank_, test_name_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  std::string test_name_ = "?";
};

}  // namespace
}  // namespace oases::comm::mpitest

int main(int argc, char** argv) {
  const auto& mpi = oases::comm::mpitest::runtime();
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new oases::comm::mpitest::FailurePrinter(mpi.world_rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int failed_ranks = 0;
  MPI_Allreduce(&failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (mpi.world_rank() == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "%d of %d ranks had failures (see [rank N] lines above)\n", failed_ranks,
                 mpi.world_size());
  }
  return failed_ranks > 0 ? 1 : 0;
}
