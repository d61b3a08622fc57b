// Layout invariance of the memory-saving optimizers, end to end: `oases train` with
// train.optimizer = adafactor, sm3 or sgd under tp = 2 (Megatron sharding, a vocabulary padded
// to an even row count), dp = 2, pp = 2 and a mixed per-layer plan gives the single-process run's
// losses, parameters and optimizer state (fp64, relative 1e-10); a checkpoint resumes bitwise
// under the same layout and at 1e-10 under another, and not under settings that keep other
// state.
//
// Adafactor's row and column statistics and update RMS, and SM3's row and column maxima, are
// statistics of whole parameters: under tensor parallelism every rank holds a part, and the
// engine's shard reducer combines them (optim/shard_reducer.h). These runs are what shows it
// does so for every sharding the models use (rows with padding, columns, qkv columns, split
// biases, replicated norms) and for layers at a degree below tp.
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;
using oases::testing::quoted;
using oases::testing::run_command;

struct OptimizerCase {
  std::string label;
  std::string settings;     // --set values
  std::string other_state;  // settings under which the optimizer keeps other state
};

void PrintTo(const OptimizerCase& c, std::ostream* out) {
  *out << c.label;
}

class OptimizerLayouts : public ::testing::TestWithParam<OptimizerCase> {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("optimizer_layout_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    write_config(dir_, "gpt");
    fs::create_directories(dir_ / "llama");
    write_config(dir_ / "llama", "llama");
  }

  // A tiny model of architecture `arch` in `folder`/tiny.toml and its random start,
  // init.safetensors.
  void write_config(const fs::path& folder, const std::string& arch) const {
    std::ofstream(folder / "tiny.toml") << "[model]\narch = \"" << arch << "\"\n"
                                        << (arch == "llama" ? "kv_heads = 2\n" : "") << R"(
layers = 2
hidden = 64
heads = 4
ffn_hidden = 128
vocab_size = 257    # odd: tp = 2 pads the word embedding with a zero row
seq_len = 16
dropout = 0.1
[train]
precision = "fp64"  # the verification precision: every layout agrees to 1e-10
micro_batch = 4   # sub-batches of 2: a layer at degree 1 splits them over its 2 replicas
global_batch = 8
steps = 3
lr = 3e-3
min_lr = 3e-4
threads = 1
[data]
path = ")" << (dir_ / "data").string() << "\"\n";
    oases::testing::write_random_init(folder / "tiny.toml", folder / "init.safetensors", 31);
  }

  fs::path train(int tp, int dp, const std::string& name, const std::string& extra,
                 const std::string& arch = "gpt") const {
    const fs::path folder = arch == "gpt" ? dir_ : dir_ / arch;
    const fs::path out = folder / name;
    const std::string command = oases::testing::train_command(OASES_BINARY, folder, tp, dp, out,
                                                              GetParam().settings + " " + extra);
    const auto r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    return out;
  }

  // Two pipeline stages of one layer each (tp = dp = 1).
  fs::path train_pipeline(const std::string& name) const {
    const fs::path out = dir_ / name;
    const std::string command =
        oases::testing::mpirun_prefix(2) +
        oases::testing::train_command(OASES_BINARY, dir_, 1, 1, out,
                                      GetParam().settings + " parallel.pp=2");
    const auto r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    return out;
  }

  static void expect_same_run(const fs::path& run, const fs::path& reference, int step,
                              const std::string& label) {
    expect_same_losses(oases::testing::metric_values(run / "metrics.jsonl", "loss"),
                       oases::testing::metric_values(reference / "metrics.jsonl", "loss"), label);
    const fs::path last = fs::path("ckpt") / ("step_" + std::to_string(step));
    expect_same_tensors(run / last / "model.safetensors", reference / last / "model.safetensors",
                        label + " model");
    expect_same_tensors(run / last / "optimizer.safetensors",
                        reference / last / "optimizer.safetensors", label + " optimizer");
  }

  fs::path dir_;
};

TEST_P(OptimizerLayouts, EveryLayoutMatchesTheSingleProcessRun) {
  const fs::path reference = train(1, 1, "reference", "");
  ASSERT_EQ(oases::testing::metric_values(reference / "metrics.jsonl", "loss").size(), 3u);
  expect_same_run(train(2, 1, "tp2", ""), reference, 3, "tp2");
  expect_same_run(train(1, 2, "dp2", ""), reference, 3, "dp2");
  // Layer 0 at degree 1 (two replicas), layer 1 at degree 2.
  expect_same_run(train(2, 1, "plan_1_2", "parallel.plan=" + quoted("1,2")), reference, 3,
                  "plan 1,2");
  // Each stage steps its own parameters; the checkpoint gathers every stage's state.
  expect_same_run(train_pipeline("pp2"), reference, 3, "pp2");
}

// LLaMA's [out, in] weights shard the other way round (rows for q, k, v, gate and up; columns
// for o and down), and its untied LM head is split by padded rows.
TEST_P(OptimizerLayouts, LlamaUnderTensorParallelismMatchesTheSingleProcessRun) {
  const fs::path reference = train(1, 1, "reference", "", "llama");
  expect_same_run(train(2, 1, "tp2", "", "llama"), reference, 3, "llama tp2");
}

TEST_P(OptimizerLayouts, ACheckpointResumesBitwiseAndUnderAnotherLayout) {
  const std::string every = "train.steps=4 checkpoint.every=2 checkpoint.keep=0";
  const fs::path source = train(2, 1, "source", every);
  const auto source_losses = oases::testing::metric_values(source / "metrics.jsonl", "loss");
  ASSERT_EQ(source_losses.size(), 4u);
  // Factored state passes the checker: each "_row"/"_col" tensor shaped like its parameter
  // without the dimension it reduces.
  const auto verified = run_command(std::string(OASES_BINARY) + " verify-checkpoint " +
                                    (source / "ckpt/step_2").string());
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_NE(verified.output.find(": ok, step 2"), std::string::npos) << verified.output;
  // The same optimizer with settings that keep other state cannot resume from it.
  fs::create_directories(dir_ / "other_state" / "ckpt");
  fs::copy(source / "ckpt/step_2", dir_ / "other_state" / "ckpt/step_2",
           fs::copy_options::recursive);
  const std::string other = oases::testing::train_command(
      OASES_BINARY, dir_, 1, 1, dir_ / "other_state",
      GetParam().settings + " train.steps=4 checkpoint.resume=true " + GetParam().other_state);
  const auto refused = run_command(other);
  EXPECT_NE(refused.exit_code, 0) << other;
  EXPECT_NE(refused.output.find("saved with other settings of train.optimizer"), std::string::npos)
      << refused.output;
  for (const int tp : {2, 1}) {
    const std::string name = "resume_tp" + std::to_string(tp);
    fs::create_directories(dir_ / name / "ckpt");
    fs::copy(source / "ckpt/step_2", dir_ / name / "ckpt/step_2", fs::copy_options::recursive);
    const fs::path resumed = train(tp, 1, name, "train.steps=4 checkpoint.resume=true");
    const double tolerance = tp == 2 ? 0.0 : oases::testing::kFp64Tolerance;
    expect_same_losses(oases::testing::metric_values(resumed / "metrics.jsonl", "loss"),
                       {source_losses.begin() + 2, source_losses.end()}, name, tolerance);
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      expect_same_tensors(resumed / "ckpt/step_4" / file, source / "ckpt/step_4" / file,
                          name + " " + file, tolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(
    , OptimizerLayouts,
    ::testing::Values(OptimizerCase{"adafactor", "train.optimizer=" + quoted("adafactor"),
                                    "train.adafactor_beta1=0.5"},
                      OptimizerCase{"adafactor_relative_step_beta1",
                                    "train.optimizer=" + quoted("adafactor") +
                                        " train.lr=0 train.adafactor_beta1=0.9",
                                    "train.adafactor_beta1=0"},
                      OptimizerCase{"sm3_momentum",
                                    "train.optimizer=" + quoted("sm3") +
                                        " train.lr=0.02 train.min_lr=0.002 train.momentum=0.9",
                                    "train.momentum=0"},
                      OptimizerCase{"sgd_nesterov",
                                    "train.optimizer=" + quoted("sgd") +
                                        " train.lr=0.05 train.min_lr=0.005 train.momentum=0.9 "
                                        "train.nesterov=true",
                                    "train.momentum=0 train.nesterov=false"}),
    [](const ::testing::TestParamInfo<OptimizerCase>& param_info) {
      return param_info.param.label;
    });

}  // namespace
