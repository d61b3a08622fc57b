// Layout invariance, end to end: `mpirun -np N oases train` under every (tp, dp) layout gives
// the losses and parameters of the single-process run, and a checkpoint written under one
// layout resumes under another with the same next losses.
//
// The runs are in fp64, the verification precision: every layout agrees with the single
// process to relative 1e-10 per tensor (||a - b|| / ||b||) and per loss, on any CPU and BLAS.
// They start from random weights with nonzero biases and LayerNorm parameters (as the PyTorch
// parity test does): from GPT-2's zero biases, a bias after three steps is nothing but three
// AdamW updates, and AdamW normalises away the size of gradients that nearly cancel (the query
// bias's), so their last bits would be compared at full scale.
#include "core/philox.h"
#include "support/command.h"
#include "support/runs.h"
#include "model/param_layout.h"
#include "plan/run_config.h"
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <sys/wait.h>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::run_command;

std::string mpirun(int ranks) { return oases::testing::mpirun_prefix(ranks); }

std::vector<double> losses(const fs::path& metrics) {
  return oases::testing::metric_values(metrics, "loss");
}

class Layouts : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("layouts_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir_ / "tiny.toml") << R"(
[model]
layers = 2
hidden = 64
heads = 4
ffn_hidden = 128
vocab_size = 257    # not a multiple of 2 or 4: the vocab-parallel padding is exercised
seq_len = 24
dropout = 0.1
[train]
precision = "fp64"  # the verification precision: every layout agrees to 1e-10
micro_batch = 2
global_batch = 8
steps = 3
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 1
[data]
path = ")" + (dir_ / "data").string() + R"("
[log]
peak_tflops = 1.0
)";
    write_random_init(dir_ / "init.safetensors");
  }

  static void write_random_init(const fs::path& path) {
    oases::testing::write_random_init(dir_ / "tiny.toml", path, 77);
  }

  // Trains under (tp, dp) for `steps` steps; returns the run's folder.
  static fs::path train(int tp, int dp, const std::string& name, const std::string& extra = "") {
    const fs::path out = dir_ / name;
    const std::string command =
        (tp * dp > 1 ? mpirun(tp * dp) : std::string()) + OASES_BINARY + " train --quiet --config " +
        (dir_ / "tiny.toml").string() + " --init-from " + (dir_ / "init.safetensors").string() +
        " --set parallel.tp=" + std::to_string(tp) + " parallel.dp=" + std::to_string(dp) +
        " log.metrics=\\\"" + (out / "metrics.jsonl").string() + "\\\" checkpoint.dir=\\\"" +
        (out / "ckpt").string() + "\\\" " + extra;
    const Result r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    return out;
  }

  static void expect_same_parameters(const fs::path& a_file, const fs::path& b_file,
                                     const std::string& what) {
    oases::testing::expect_same_tensors(a_file, b_file, what);
  }

  static inline fs::path dir_;  // the current test's folder
};

using oases::testing::expect_same_losses;

TEST_F(Layouts, EveryLayoutMatchesTheSingleProcessRun) {
  const fs::path reference = train(1, 1, "tp1_dp1");
  const auto reference_losses = losses(reference / "metrics.jsonl");
  ASSERT_EQ(reference_losses.size(), 3u);
  for (const auto& [tp, dp] : std::vector<std::pair<int, int>>{{2, 1}, {4, 1}, {1, 2}, {2, 2}, {1, 4}}) {
    const std::string name = "tp" + std::to_string(tp) + "_dp" + std::to_string(dp);
    const fs::path run_dir = train(tp, dp, name);
    expect_same_losses(losses(run_dir / "metrics.jsonl"), reference_losses, name);
    expect_same_parameters(run_dir / "ckpt/step_3/model.safetensors",
                           reference / "ckpt/step_3/model.safetensors", name);
    expect_same_parameters(run_dir / "ckpt/step_3/optimizer.safetensors",
                           reference / "ckpt/step_3/optimizer.safetensors", name + " optimizer");
  }
}

TEST_F(Layouts, CheckpointFromTensorParallelRunResumesUnderOtherLayouts) {
  const fs::path source = train(2, 1, "resume_source", "train.steps=6 checkpoint.every=3 checkpoint.keep=0");
  const auto source_losses = losses(source / "metrics.jsonl");
  ASSERT_EQ(source_losses.size(), 6u);
  for (int tp : {1, 4}) {
    const std::string name = "resume_tp" + std::to_string(tp);
    fs::create_directories(dir_ / name / "ckpt");
    fs::copy(source / "ckpt/step_3", dir_ / name / "ckpt/step_3", fs::copy_options::recursive);
    train(tp, 1, name, "train.steps=6 checkpoint.resume=true");
    const auto resumed = losses(dir_ / name / "metrics.jsonl");
    expect_same_losses(resumed, {source_losses.begin() + 3, source_losses.end()}, name);
  }
}

TEST_F(Layouts, EveryRankReportsItsErrorAndTheJobStops) {
  // Three processes cannot form tp = 2.
  Result r = run_command(mpirun(3) + OASES_BINARY + " train --config " + (dir_ / "tiny.toml").string() +
                 " --set parallel.tp=2");
  EXPECT_NE(r.exit_code, 0);
  // Whichever rank fails first aborts the job: the others may not get to print.
  EXPECT_NE(r.output.find(" of 3: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("must equal the number of processes, 3"), std::string::npos) << r.output;
  // tp must divide the heads: a rank reports it with its rank.
  r = run_command(mpirun(2) + OASES_BINARY + " train --config " + (dir_ / "tiny.toml").string() +
          " --set parallel.tp=2 model.heads=3 model.hidden=63");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("parallel.tp = 2 must divide model.heads = 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error: rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("valid tp for this model: 1\n"), std::string::npos) << r.output;
  // ffn_hidden must split too; the valid degrees are listed.
  r = run_command(mpirun(4) + OASES_BINARY + " train --config " + (dir_ / "tiny.toml").string() +
          " --set parallel.tp=4 model.ffn_hidden=130");
  EXPECT_NE(r.exit_code, 0);
  // The first rank to fail aborts the job, so which other ranks print before it ends varies.
  EXPECT_NE(r.output.find(": parallel.tp = 4 must divide model.ffn_hidden = 130"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error: rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("valid tp for this model: 1, 2"), std::string::npos) << r.output;
  // The global batch must split over data-parallel ranks and micro-batches.
  r = run_command(mpirun(3) + OASES_BINARY + " train --config " + (dir_ / "tiny.toml").string() +
          " --set parallel.dp=3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("train.global_batch = 8 must be a multiple of train.micro_batch x parallel.dp = 2 x 3 = 6"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dp in {1, 2, 4}"), std::string::npos) << r.output;
}

TEST_F(Layouts, ParallelConfigWithoutMpirunSaysHowToLaunch) {
  const Result r = run_command(std::string(OASES_BINARY) + " train --config " + (dir_ / "tiny.toml").string() +
                       " --set parallel.tp=2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("mpirun -np 2"), std::string::npos) << r.output;
}

}  // namespace
