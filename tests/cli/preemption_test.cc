// Save on preemption (train.save_on_signal): a stop signal at a random moment of a run makes it
// finish its step, save and exit with 128 + the signal; resumed, the run ends bitwise where the
// uninterrupted run ends. A second signal exits at once and damages nothing already written.
// Under mpirun the signal may reach one rank, every rank, or mpirun itself.
#include "support/background.h"
#include "support/command.h"
#include "support/files.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace oases::testing {
namespace {

namespace fs = std::filesystem;





constexpr int kSteps = 300;

class Preemption : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_folder("preemption_runs");
    const CommandResult data = prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(data.exit_code, 0) << data.output;
    // Dropout on, so that a resumed run must continue its random stream exactly; checkpoints
    // every 40 steps, so that some signals land during a save.
    write_bytes((dir_ / "tiny.toml").string(), R"(
[model]
layers = 2
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 256
seq_len = 16
dropout = 0.1
[train]
micro_batch = 2
global_batch = 4
steps = )" + std::to_string(kSteps) + R"(
lr = 3e-3
min_lr = 3e-4
warmup_steps = 5
eval_every = 0
threads = 1
[data]
path = ")" + (dir_ / "data").string() + R"("
[checkpoint]
dir = "ckpt"
every = 40
keep = 2
resume = true
[log]
metrics = "metrics.jsonl"
peak_tflops = 1.0
)");
  }

  std::string train(const std::string& launcher = "", const std::string& settings = "") const {
    return launcher + OASES_BINARY + " train --quiet --config " + (dir_ / "tiny.toml").string() +
           (settings.empty() ? "" : " --set " + settings);
  }
  std::string train_in(const fs::path& run_dir, const std::string& launcher = "",
                       const std::string& settings = "") const {
    return "cd " + run_dir.string() + " && " + train(launcher, settings);
  }

  // The uninterrupted run, in `name`; its final checkpoint's files and its losses.
  void run_reference(const std::string& name, const std::string& launcher = "") {
    reference_ = dir_ / name;
    fs::create_directories(reference_);
    const CommandResult r = run_command(train_in(reference_, launcher));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    reference_losses_ = losses_by_step(reference_ / "metrics.jsonl");
    ASSERT_EQ(reference_losses_.size(), static_cast<std::size_t>(kSteps));
  }

  // Checks that every checkpoint of `run` verifies, resumes it to the end with `launcher`,
  // and compares the final checkpoint and losses with the reference, bitwise.
  void expect_resumes_to_the_reference(const fs::path& run, const std::string& launcher = "",
                                       const std::string& settings = "") {
    bool any_complete = false;  // a second signal early in a run may leave none
    for (const auto& entry : fs::directory_iterator(run / "ckpt"))
      any_complete = any_complete || fs::exists(entry.path() / "COMPLETE");
    CommandResult r;
    if (any_complete) {
      r = run_command(std::string(OASES_BINARY) + " verify-checkpoint " + (run / "ckpt").string());
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    r = run_command(train_in(run, launcher, settings));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string final_step = "ckpt/step_" + std::to_string(kSteps);
    for (const char* file : {"model.safetensors", "optimizer.safetensors", "COMPLETE"})
      EXPECT_EQ(read_bytes((run / final_step / file).string()),
                read_bytes((reference_ / final_step / file).string()))
          << file << " of the resumed run differs from the uninterrupted run's";
    EXPECT_EQ(losses_by_step(run / "metrics.jsonl"), reference_losses_);
  }

  fs::path dir_;
  fs::path reference_;
  std::map<int, double> reference_losses_;
};

// 24 runs, each stopped by a signal of the default set at a random step (and a random moment
// within it); every fourth gets a second signal right after the first.
TEST_F(Preemption, ASignalAtARandomMomentSavesAndTheRunResumesBitwise) {
  run_reference("reference");
  std::mt19937 random(20261206);
  const int signals[] = {SIGTERM, SIGUSR1, SIGINT, SIGHUP};
  int stopped = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int signal_number = signals[trial % 4];
    const bool twice = trial % 4 == 3;
    const int at_line = std::uniform_int_distribution<int>(1, kSteps - 120)(random);
    const int extra_us = std::uniform_int_distribution<int>(0, 3000)(random);
    SCOPED_TRACE(fmt::format("trial {}: signal {}{} after {} metrics lines + {} us", trial,
                             signal_number, twice ? " twice" : "", at_line, extra_us));
    const fs::path run = dir_ / fmt::format("trial_{}", trial);
    fs::create_directories(run);
    Background process(run, train() + " > output.txt 2>&1");
    ASSERT_TRUE(process.spawned());
    ASSERT_TRUE(wait_until(process, [&] { return line_count(run / "metrics.jsonl") >= at_line; }))
        << read_bytes((run / "output.txt").string());
    std::this_thread::sleep_for(std::chrono::microseconds(extra_us));
    kill(process.pid(), signal_number);
    if (twice) kill(process.pid(), SIGTERM);
    const int status = process.wait();
    const std::string output = read_bytes((run / "output.txt").string());
    if (twice) {
      // The second signal usually lands before the save ends: the process ends at once.
      EXPECT_TRUE(status == 128 + SIGTERM || status == 128 + signal_number) << status << output;
    } else {
      ASSERT_EQ(status, 128 + signal_number) << output;
      EXPECT_NE(output.find("stopped by SIG"), std::string::npos) << output;
      EXPECT_NE(output.find("saved checkpoint ckpt/step_"), std::string::npos) << output;
      ++stopped;
    }
    expect_resumes_to_the_reference(run);
  }
  EXPECT_EQ(stopped, 18);
}

// train.save_on_signal = false: the signal's default action, no save.
TEST_F(Preemption, WithSaveOnSignalOffTheSignalEndsTheRunAsBefore) {
  const fs::path run = dir_ / "off";
  fs::create_directories(run);
  Background process(run, train("", "train.save_on_signal=false checkpoint.every=0") +
                              " > output.txt 2>&1");
  ASSERT_TRUE(wait_until(process, [&] { return line_count(run / "metrics.jsonl") >= 20; }));
  kill(process.pid(), SIGTERM);
  EXPECT_EQ(process.wait(), 128 + SIGTERM);
  EXPECT_TRUE(process.ended_by_signal());
  EXPECT_EQ(read_bytes((run / "output.txt").string()).find("stopped by"), std::string::npos);
  EXPECT_FALSE(fs::exists(run / "ckpt" / "step_20"));
}

TEST_F(Preemption, AnUnknownSignalNameIsAClearError) {
  const CommandResult r = run_command(train_in(dir_, "", "train.save_signals=TERM,KILL"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* part : {"train.save_signals", "\"KILL\"", "\"USR1\""})
    EXPECT_NE(r.output.find(part), std::string::npos) << r.output;
}

// Under mpirun (dp 2): the signal reaches rank 1 only, every rank, or mpirun, which forwards
// SIGUSR1 and, given time before its SIGKILL (odls_base_sigkill_timeout), SIGTERM.
TEST_F(Preemption, UnderMpirunOneRankOrEveryRankOrMpirunItselfMayBeSignalled) {
  const std::string mpirun = mpirun_prefix(2);
  // Every rank writes its pid, then becomes oases. mpirun, terminated, sends SIGTERM to the
  // ranks and SIGKILL odls_base_sigkill_timeout seconds later (1 by default; it waits that
  // long even when they are done, hence not more here).
  const auto launcher = [&](int sigkill_timeout_s) {
    return mpirun + fmt::format("--mca odls_base_sigkill_timeout {} ", sigkill_timeout_s) +
           "sh -c 'echo $$ > rank_$OMPI_COMM_WORLD_RANK.pid; exec \"$0\" \"$@\"' ";
  };
  const std::string dp2 = "parallel.dp=2";
  reference_ = dir_ / "mpi_reference";
  fs::create_directories(reference_);
  CommandResult r = run_command(train_in(reference_, mpirun, dp2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  reference_losses_ = losses_by_step(reference_ / "metrics.jsonl");

  enum class Target { rank1, every_rank, mpirun_usr1, mpirun_term };
  for (const Target target :
       {Target::rank1, Target::every_rank, Target::mpirun_usr1, Target::mpirun_term}) {
    const int index = static_cast<int>(target);
    SCOPED_TRACE(fmt::format("target {}", index));
    const fs::path run = dir_ / fmt::format("mpi_{}", index);
    fs::create_directories(run);
    Background process(
        run, train(launcher(target == Target::mpirun_term ? 5 : 1), dp2) + " > output.txt 2>&1");
    int signalled_at_step = 0;
    ASSERT_TRUE(wait_until(process, [&] {
      signalled_at_step = line_count(run / "metrics.jsonl") - 1;  // the first line is step 0
      return fs::exists(run / "rank_1.pid") && signalled_at_step >= 30 + index;
    })) << read_bytes((run / "output.txt").string());
    const auto rank_pid = [&](int rank) {
      return static_cast<pid_t>(
          std::stol(read_bytes((run / fmt::format("rank_{}.pid", rank)).string())));
    };
    int expected = 128 + SIGTERM;
    switch (target) {
      case Target::rank1: kill(rank_pid(1), SIGTERM); break;
      case Target::every_rank:
        kill(rank_pid(0), SIGTERM);
        kill(rank_pid(1), SIGTERM);
        break;
      case Target::mpirun_usr1:
        kill(process.pid(), SIGUSR1);
        expected = 128 + SIGUSR1;
        break;
      case Target::mpirun_term: kill(process.pid(), SIGTERM); break;
    }
    const int status = process.wait();
    const std::string output = read_bytes((run / "output.txt").string());
    // The save of the step the signal found, or a later one (the checkpoints of every 40
    // steps are all before it).
    std::vector<int> saved;
    for (const auto& entry : fs::directory_iterator(run / "ckpt"))
      if (entry.path().filename().string().rfind("step_", 0) == 0)
        saved.push_back(std::stoi(entry.path().filename().string().substr(5)));
    ASSERT_FALSE(saved.empty()) << output;
    EXPECT_GE(*std::max_element(saved.begin(), saved.end()), signalled_at_step) << output;
    // mpirun passes on the ranks' status and output, except that, itself terminated, it
    // reports its own end and may drop the ranks' last lines.
    if (target != Target::mpirun_term) {
      EXPECT_EQ(status, expected) << output;
      EXPECT_NE(output.find(std::string("stopped by ") +
                            (expected == 128 + SIGUSR1 ? "SIGUSR1" : "SIGTERM")),
                std::string::npos)
          << output;
    }
    expect_resumes_to_the_reference(run, mpirun_prefix(2), dp2);
  }
}

}  // namespace
}  // namespace oases::testing
