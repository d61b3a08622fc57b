// Whole jobs (tp 2 under mpirun, the oases schedule) that hang or break, and `oases flight`
// naming the cause from the records the ranks wrote: a rank stopped mid-step, a rank that
// skips a collective and a rank that disagrees on a size (the OASES_TEST_COMM_FAULT seam),
// and SIGUSR2, which writes the records of a healthy job without stopping it.
#include "support/background.h"
#include "support/command.h"
#include "support/files.h"
#include "support/runs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace oases::testing {
namespace {

namespace fs = std::filesystem;

// The model's numbers the sizes below follow from.
constexpr int kMicroBatch = 2, kSeqLen = 16, kHidden = 32;

class FlightRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_folder("flight_runs");
    const CommandResult data = prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(data.exit_code, 0) << data.output;
    std::ofstream(dir_ / "tiny.toml") << fmt::format(R"(
[model]
layers = 2
hidden = {}
heads = 2
ffn_hidden = 64
vocab_size = 256
seq_len = {}
[train]
micro_batch = {}
global_batch = {}
steps = 40
threads = 1
[data]
path = "{}"
[parallel]
tp = 2
schedule = "oases"
comm_timeout_s = 3
[log]
every = 1
peak_tflops = 1.0
)",
                                                     kHidden, kSeqLen, kMicroBatch, kMicroBatch,
                                                     (dir_ / "data").string());
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    host_ = host;
  }

  // `oases train` of tiny.toml under mpirun, its run folder `run` (metrics, so flight/ beside
  // them); every rank first writes its pid to run/rank_<R>.pid.
  std::string train(const fs::path& run, const std::string& environment = "",
                    const std::string& overrides = "") const {
    return environment + mpirun_prefix(2) + "--mca odls_base_sigkill_timeout 2 " +
           (environment.empty() ? "" : "-x OASES_TEST_COMM_FAULT ") +
           "sh -c 'echo $$ > rank_$OMPI_COMM_WORLD_RANK.pid; exec \"$0\" \"$@\"' " +
           OASES_BINARY + " train --quiet --config " + (dir_ / "tiny.toml").string() +
           " --set log.metrics=" + quoted((run / "metrics.jsonl").string()) + overrides;
  }

  std::string flight(const fs::path& run) const {
    const CommandResult r = run_command(std::string(OASES_BINARY) + " flight " + run.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  }

  // `oases flight` of a run in dir_/`name` that the seam OASES_TEST_COMM_FAULT=`fault` breaks
  // (the job must fail).
  std::string flight_of_a_failing_run(const std::string& name, const std::string& fault) const {
    const fs::path run = dir_ / name;
    fs::create_directories(run);
    const CommandResult r = run_command("cd " + run.string() + " && " +
                                        train(run, "OASES_TEST_COMM_FAULT=" + fault + " "));
    EXPECT_NE(r.exit_code, 0) << r.output;
    return flight(run);
  }

  // The findings (lines "- ...") of `oases flight`'s output, in order.
  static std::vector<std::string> findings(const std::string& output) {
    std::vector<std::string> out;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("- ", 0) == 0) out.push_back(line.substr(2));
    return out;
  }

  static pid_t rank_pid(const fs::path& run, int rank) {
    return static_cast<pid_t>(std::stol(read_bytes((run / fmt::format("rank_{}.pid", rank)).string())));
  }

  fs::path dir_;
  std::string host_;
};

TEST_F(FlightRuns, ARankStoppedMidStepIsTheOneTheOthersWaitFor) {
  const fs::path run = dir_ / "stopped";
  fs::create_directories(run);
  Background job(run, train(run, "", " --set train.steps=100000") + " > output.txt 2>&1");
  ASSERT_TRUE(wait_until(job, [&] {
    return fs::exists(run / "rank_1.pid") && line_count(run / "metrics.jsonl") >= 5;
  })) << read_bytes((run / "output.txt").string());
  const pid_t stopped = rank_pid(run, 1);
  ASSERT_EQ(kill(stopped, SIGSTOP), 0);
  EXPECT_NE(job.wait(), 0);
  kill(stopped, SIGKILL);  // in case the launcher left it stopped
  const std::string output = read_bytes((run / "output.txt").string());
  EXPECT_NE(output.find("has not completed after 3 s"), std::string::npos) << output;
  EXPECT_NE(output.find("flight record written to"), std::string::npos) << output;

  const std::string diagnosis = flight(run);
  const auto found = findings(diagnosis);
  ASSERT_FALSE(found.empty()) << diagnosis;
  // Rank 1 left no record (still stopped when killed), or wrote one once the launcher's
  // SIGCONT and SIGTERM reached it: either way it is the one named first.
  EXPECT_EQ(found[0].rfind("rank 1", 0), 0u) << diagnosis;
  // Stopped inside a step (tp group) or at its end (the world group's stop agreement).
  EXPECT_TRUE(found[0].find("of tp group [0,1]") != std::string::npos ||
              found[0].find("of world group [0,1]") != std::string::npos)
      << diagnosis;
  EXPECT_NE(found[0].find(fmt::format("rank 0 (host {}) wait", host_)), std::string::npos)
      << diagnosis;
  EXPECT_NE(diagnosis.find(fmt::format("rank 0 (host {}) wrote at ", host_)), std::string::npos)
      << diagnosis;
  EXPECT_NE(diagnosis.find("collective timeout: oases: all_reduce"), std::string::npos)
      << diagnosis;
}

TEST_F(FlightRuns, ARankThatSkipsACollectiveIsNamedByWhatEachRankIssuedThere) {
  const std::string diagnosis = flight_of_a_failing_run("skipped", "skip:1:tp:7");
  const auto found = findings(diagnosis);
  ASSERT_FALSE(found.empty()) << diagnosis;
  EXPECT_EQ(found[0].rfind("the ranks of tp group [0,1] disagree on what collective #7", 0), 0u)
      << diagnosis;
  for (int rank : {0, 1})
    EXPECT_NE(found[0].find(fmt::format("rank {} (host {}) for ", rank, host_)), std::string::npos)
        << diagnosis;
  EXPECT_NE(found[0].find("a rank skipped or reordered a collective"), std::string::npos)
      << diagnosis;
}

TEST_F(FlightRuns, RanksThatDisagreeOnASizeAreNamedWithBoth) {
  const std::string diagnosis = flight_of_a_failing_run("shrunk", "shrink:1:tp:9");
  const auto found = findings(diagnosis);
  ASSERT_FALSE(found.empty()) << diagnosis;
  // The oases schedule's forward all-reduce carries one sub-batch (half the micro-batch) of
  // activations; the seam halves it once more on rank 1.
  const int elements = kMicroBatch / 2 * kSeqLen * kHidden;
  EXPECT_EQ(found[0].rfind("the ranks of tp group [0,1] disagree on collective #9", 0), 0u)
      << diagnosis;
  EXPECT_NE(found[0].find(fmt::format("rank 0 (host {}) issued all_reduce of {} bytes ({} f32)",
                                      host_, elements * 4, elements)),
            std::string::npos)
      << diagnosis;
  EXPECT_NE(found[0].find(fmt::format("rank 1 (host {}) issued all_reduce of {} bytes ({} f32)",
                                      host_, elements * 2, elements / 2)),
            std::string::npos)
      << diagnosis;
}

TEST_F(FlightRuns, Usr2WritesEveryRanksRecordAndTheJobGoesOn) {
  const fs::path run = dir_ / "usr2";
  fs::create_directories(run);
  Background job(run, train(run, "", " --set train.steps=60") + " > output.txt 2>&1");
  ASSERT_TRUE(wait_until(job, [&] {
    return fs::exists(run / "rank_1.pid") && line_count(run / "metrics.jsonl") >= 10;
  })) << read_bytes((run / "output.txt").string());
  for (int rank : {0, 1}) ASSERT_EQ(kill(rank_pid(run, rank), SIGUSR2), 0);
  ASSERT_TRUE(wait_until(job, [&] {
    return fs::exists(run / "flight" / "rank_0.json") && fs::exists(run / "flight" / "rank_1.json");
  })) << read_bytes((run / "output.txt").string());
  EXPECT_EQ(job.wait(), 0) << read_bytes((run / "output.txt").string());
  EXPECT_EQ(losses_by_step(run / "metrics.jsonl").size(), 60u);
  const std::string diagnosis = flight(run);
  EXPECT_TRUE(findings(diagnosis).empty()) << diagnosis;
  EXPECT_NE(diagnosis.find("no rank waits for another"), std::string::npos) << diagnosis;
  EXPECT_NE(diagnosis.find(fmt::format("ranks 0, 1 (host {}) wrote at", host_)), std::string::npos)
      << diagnosis;
  EXPECT_NE(diagnosis.find("SIGUSR2"), std::string::npos) << diagnosis;
  // The records hold the job's collectives, labelled by the instructions that issued them.
  std::ifstream in(run / "flight" / "rank_0.json");
  const nlohmann::json record = nlohmann::json::parse(in);
  bool labelled = false;
  for (const auto& group : record["groups"])
    for (const auto& op : group["operations"])
      labelled = labelled || op["issuer"].get<std::string>().rfind("Start(", 0) == 0;
  EXPECT_TRUE(labelled) << record.dump(1).substr(0, 2000);
}

}  // namespace
}  // namespace oases::testing
