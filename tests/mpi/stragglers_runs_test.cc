// A rank made slow (the OASES_TEST_SLOW_RANK seam sleeps in each of its compute instructions)
// is named: the metrics' window records give it as slowest_rank with a straggler_ratio above
// the warning ratio, and rank 0 warns naming the rank and its host.
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace oases::testing {
namespace {

namespace fs = std::filesystem;

TEST(StragglerRuns, ASlowedRankIsNamedWithItsHost) {
  const fs::path dir = fresh_test_folder("straggler_runs");
  const CommandResult data = prepare_fortunes_data(OASES_BINARY, dir);
  ASSERT_EQ(data.exit_code, 0) << data.output;
  std::ofstream(dir / "tiny.toml") << R"(
[model]
layers = 2
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 256
seq_len = 16
[train]
micro_batch = 2
global_batch = 4
steps = 32
threads = 1
[data]
path = ")" + (dir / "data").string() + R"("
[parallel]
dp = 2
[log]
every = 4
peak_tflops = 1.0
)";
  const std::string metrics = (dir / "metrics.jsonl").string();
  const CommandResult r = run_command(
      "OASES_TEST_SLOW_RANK=1:5 " + mpirun_prefix(2) + "-x OASES_TEST_SLOW_RANK " +
      OASES_BINARY + " train --quiet --config " + (dir / "tiny.toml").string() +
      " --set log.metrics=" + quoted(metrics));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_NE(r.output.find(std::string("straggler: rank 1 (host ") + host + ")"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("train.straggler_warn_ratio"), std::string::npos) << r.output;

  int windows = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (!record.contains("straggler_ratio")) continue;
    ++windows;
    EXPECT_EQ(record["step"].get<int>() % 4, 0) << line;
    EXPECT_EQ(record["slowest_rank"].get<int>(), 1) << line;
    EXPECT_GT(record["straggler_ratio"].get<double>(), 1.2) << line;
    ASSERT_EQ(record["rank_compute_s"].size(), 2u) << line;
    EXPECT_GT(record["rank_compute_s"][1].get<double>(), record["rank_compute_s"][0].get<double>());
  }
  EXPECT_EQ(windows, 8);
}

}  // namespace
}  // namespace oases::testing
