// One writer per run directory: two runs started together on one checkpoint.dir or one
// metrics file (the same config, different seeds, either place shared alone) end with one run
// complete and intact and the other stopped at start-up naming the holder's host and pid,
// having written nothing; a lock whose holder was killed is taken over.
#include "support/background.h"
#include "support/command.h"
#include "support/files.h"
#include "support/runs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace oases::testing {
namespace {

namespace fs = std::filesystem;


// The "step" of every record of a metrics file, in file order.
std::vector<int> recorded_steps(const fs::path& path) {
  std::vector<int> steps;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    steps.push_back(nlohmann::json::parse(line)["step"].get<int>());
  return steps;
}

constexpr int kSteps = 500;

class RunDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_folder("run_directory_runs");
    const CommandResult data = prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(data.exit_code, 0) << data.output;
    std::ofstream(dir_ / "tiny.toml") << R"(
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
steps = )" + std::to_string(kSteps) + R"(
lr = 3e-3
threads = 1
[data]
path = ")" + (dir_ / "data").string() + R"("
[checkpoint]
every = 50
keep = 3
resume = true
[log]
peak_tflops = 1.0
)";
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    host_ = host;
  }

  std::string train(const std::string& settings) const {
    return std::string(OASES_BINARY) + " train --quiet --config " + (dir_ / "tiny.toml").string() +
           " --set " + settings;
  }

  fs::path dir_;
  std::string host_;
};

struct Sharing {
  std::string name;
  std::string first, second;  // each run's settings
  std::string refusal;        // the setting the second run's error names
};

TEST_F(RunDirectory, TwoRunsStartedTogetherLeaveOneCompleteRunAndAClearError) {
  const std::string ck = (dir_ / "shared" / "ckpt").string();
  const std::string metrics = (dir_ / "shared" / "metrics.jsonl").string();
  const std::string own_ck = (dir_ / "own" / "ckpt").string();
  const std::string own_metrics = (dir_ / "own" / "metrics.jsonl").string();
  const std::vector<Sharing> cases = {
      {"same config", fmt::format("checkpoint.dir={} log.metrics={}", ck, metrics),
       fmt::format("checkpoint.dir={} log.metrics={}", ck, metrics), "checkpoint.dir"},
      {"different seeds", fmt::format("checkpoint.dir={} log.metrics={}", ck, metrics),
       fmt::format("checkpoint.dir={} log.metrics={} train.seed=99", ck, metrics),
       "checkpoint.dir"},
      {"checkpoint.dir only", fmt::format("checkpoint.dir={} log.metrics={}", ck, metrics),
       fmt::format("checkpoint.dir={} log.metrics={}", ck, own_metrics), "checkpoint.dir"},
      {"metrics only", fmt::format("checkpoint.dir={} log.metrics={}", ck, metrics),
       fmt::format("checkpoint.dir={} log.metrics={}", own_ck, metrics), "log.metrics"},
  };
  for (const Sharing& c : cases) {
    SCOPED_TRACE(c.name);
    fs::remove_all(dir_ / "shared");
    fs::remove_all(dir_ / "own");
    fs::create_directories(dir_ / "shared");
    fs::create_directories(dir_ / "own");
    Background a(dir_, train(c.first) + " > a.txt 2>&1");
    Background b(dir_, train(c.second) + " > b.txt 2>&1");
    const int status_a = a.wait(), status_b = b.wait();
    const std::string out_a = read_bytes((dir_ / "a.txt").string());
    const std::string out_b = read_bytes((dir_ / "b.txt").string());
    ASSERT_TRUE((status_a == 0 && status_b == 2) || (status_a == 2 && status_b == 0))
        << "a: " << status_a << "\n" << out_a << "\nb: " << status_b << "\n" << out_b;
    const bool a_won = status_a == 0;
    const std::string& loser_output = a_won ? out_b : out_a;
    const pid_t winner = a_won ? a.pid() : b.pid();
    for (const std::string& part :
         {c.refusal, std::string("in use by another run"),
          fmt::format("host {} pid {}", host_, winner)})
      EXPECT_NE(loser_output.find(part), std::string::npos) << part << " in:\n" << loser_output;

    // The winner's run is whole: its checkpoints verify and the metrics hold its steps once,
    // in order.
    const std::string winner_ck = c.name == "metrics only" && !a_won ? own_ck : ck;
    const CommandResult verify =
        run_command(std::string(OASES_BINARY) + " verify-checkpoint " + winner_ck);
    EXPECT_EQ(verify.exit_code, 0) << verify.output;
    EXPECT_NE(verify.output.find(fmt::format("step_{}: ok", kSteps)), std::string::npos)
        << verify.output;
    const std::string winner_metrics =
        c.name == "checkpoint.dir only" && !a_won ? own_metrics : metrics;
    std::vector<int> expected(kSteps + 1);
    for (int s = 0; s <= kSteps; ++s) expected[static_cast<std::size_t>(s)] = s;
    EXPECT_EQ(recorded_steps(winner_metrics), expected);
    // The loser wrote nothing of its own.
    const std::string loser_metrics =
        c.name == "checkpoint.dir only" && a_won ? own_metrics : "";
    if (!loser_metrics.empty()) {
      EXPECT_FALSE(fs::exists(loser_metrics));
    }
  }
}

TEST_F(RunDirectory, ALockLeftByAKilledRunIsTakenOver) {
  const std::string settings = "checkpoint.dir=ckpt log.metrics=metrics.jsonl";
  Background killed(dir_, train(settings) + " > killed.txt 2>&1");
  ASSERT_TRUE(wait_until(killed, [&] { return line_count(dir_ / "metrics.jsonl") > 120; }));
  kill(killed.pid(), SIGKILL);
  killed.wait();
  const CommandResult r = run_command("cd " + dir_.string() + " && " + train(settings));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Resumed from step 100 (or 50): the metrics hold every step once, in order.
  std::vector<int> expected(kSteps + 1);
  for (int s = 0; s <= kSteps; ++s) expected[static_cast<std::size_t>(s)] = s;
  EXPECT_EQ(recorded_steps(dir_ / "metrics.jsonl"), expected);
}

}  // namespace
}  // namespace oases::testing
