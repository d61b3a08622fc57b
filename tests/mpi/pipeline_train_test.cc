// Pipeline parallelism, end to end: `mpirun -np N oases train` with parallel.pp = 2 under the
// GPipe and 1F1B schedules gives the losses, validation losses (forward-only pipeline steps),
// parameters and optimizer state of the single-process run, for GPT (whose word embedding,
// tied to the head, lives on both the first and the last stage) and LLaMA, alone and together
// with tensor or data parallelism; a checkpoint written by a pipeline run resumes in one
// process and under another split of the layers with the same next losses; bad pipeline
// settings are errors that name the setting, the value and what is valid.
//
// In fp64 with dropout, from random weights with nonzero biases and norm parameters (see
// tests/mpi/layouts_test.cc): every run agrees with the single process to relative 1e-10.
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;
using oases::testing::quoted;
using oases::testing::run_command;

std::vector<double> losses(const fs::path& run) {
  return oases::testing::metric_values(run / "metrics.jsonl", "loss");
}

class PipelineTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("pipeline_train_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const std::string arch : {"gpt", "llama"}) {
      // Three layers over two stages: uniform gives 1 and 2, so the stages differ.
      std::ofstream(dir_ / (arch + ".toml")) << R"(
[model]
arch = ")" + arch + R"("
layers = 3
hidden = 32
heads = 4
)" + (arch == "llama" ? "kv_heads = 2\n" : "") + R"(ffn_hidden = 48
vocab_size = 257
seq_len = 16
dropout = 0.1
[train]
precision = "fp64"
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
      oases::testing::write_random_init(dir_ / (arch + ".toml"), dir_ / (arch + "_init.safetensors"), 91);
    }
  }

  // Runs `arch` over tp x pp x dp ranks (pp = 1: the plain engine) with `extra` settings;
  // returns the run's folder (metrics.jsonl, ckpt/).
  static fs::path train(const std::string& arch, int tp, int pp, const std::string& name,
                        const std::string& extra = "", int dp = 1) {
    const fs::path out = dir_ / name;
    const int ranks = tp * pp * dp;
    const std::string command =
        (ranks > 1 ? oases::testing::mpirun_prefix(ranks) : std::string()) + OASES_BINARY +
        " train --quiet --config " + (dir_ / (arch + ".toml")).string() + " --init-from " +
        (dir_ / (arch + "_init.safetensors")).string() + " --set parallel.tp=" +
        std::to_string(tp) + " parallel.pp=" + std::to_string(pp) + " parallel.dp=" + std::to_string(dp) + " log.metrics=" +
        quoted((out / "metrics.jsonl").string()) + " checkpoint.dir=" +
        quoted((out / "ckpt").string()) + " " + extra;
    const Result r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    return out;
  }

  static void expect_same_run(const fs::path& got, const fs::path& want, const std::string& what) {
    expect_same_losses(losses(got), losses(want), what);
    expect_same_tensors(got / "ckpt/step_3/model.safetensors",
                        want / "ckpt/step_3/model.safetensors", what);
    expect_same_tensors(got / "ckpt/step_3/optimizer.safetensors",
                        want / "ckpt/step_3/optimizer.safetensors", what + " optimizer");
  }

  // Runs a two-stage job that must fail; returns its output.
  static std::string failing(const std::string& settings) {
    const Result r = run_command(oases::testing::mpirun_prefix(2) + OASES_BINARY +
                                 " train --config " + (dir_ / "gpt.toml").string() +
                                 " --set parallel.pp=2 " + settings);
    EXPECT_NE(r.exit_code, 0) << settings << "\n" << r.output;
    return r.output;
  }

  static inline fs::path dir_;
};

TEST_F(PipelineTraining, GPipeAnd1F1BMatchTheSingleProcessRun) {
  for (const std::string arch : {"gpt", "llama"}) {
    // Validation after every step too: its loss comes from the last stage's forward-only steps.
    const std::string validation = " train.eval_every=1 train.eval_steps=2";
    const fs::path reference = train(arch, 1, 1, arch + "_pp1", validation);
    ASSERT_EQ(losses(reference).size(), 3u) << arch;
    for (const std::string pipeline : {"gpipe", "1f1b"}) {
      const std::string name = arch + "_pp2_" + pipeline;
      const fs::path run = train(arch, 1, 2, name, "parallel.pipeline=" + quoted(pipeline) + validation);
      expect_same_run(run, reference, name);
      expect_same_losses(oases::testing::metric_values(run / "metrics.jsonl", "val_loss"),
                         oases::testing::metric_values(reference / "metrics.jsonl", "val_loss"),
                         name + " validation");
    }
    // An explicit split, the other way round from uniform's 1 and 2.
    const std::string name = arch + "_pp2_layers_2_1";
    expect_same_run(train(arch, 1, 2, name, "parallel.pipeline_layers=" + quoted("2,1") + validation),
                    reference, name);
  }
}

TEST_F(PipelineTraining, PipelineWithTensorOrDataParallelismMatchesTheSingleProcessRun) {
  const std::string validation = " train.eval_every=1 train.eval_steps=1";
  const fs::path reference = train("gpt", 1, 1, "gpt_pp1", validation);
  const fs::path run = train("gpt", 2, 2, "gpt_tp2_pp2", validation);
  expect_same_run(run, reference, "tp=2 pp=2");
  expect_same_losses(oases::testing::metric_values(run / "metrics.jsonl", "val_loss"),
                     oases::testing::metric_values(reference / "metrics.jsonl", "val_loss"),
                     "tp=2 pp=2 validation");
  expect_same_run(train("gpt", 1, 2, "gpt_dp2_pp2", "parallel.pipeline=" + quoted("gpipe"), 2),
                  reference, "dp=2 pp=2");
}

TEST_F(PipelineTraining, CheckpointFromPipelineRunResumesUnderAnotherSplit) {
  const fs::path source =
      train("gpt", 1, 2, "source", "train.steps=6 checkpoint.every=3 checkpoint.keep=0");
  const auto source_losses = losses(source);
  ASSERT_EQ(source_losses.size(), 6u);
  // In one process, and at pp = 2 with the layers split the other way.
  for (const auto& [pp, split] : std::vector<std::pair<int, std::string>>{{1, "uniform"}, {2, "2,1"}}) {
    const std::string name = "resumed_pp" + std::to_string(pp);
    const fs::path resumed = dir_ / name;
    fs::create_directories(resumed / "ckpt");
    fs::copy(source / "ckpt/step_3", resumed / "ckpt/step_3", fs::copy_options::recursive);
    train("gpt", 1, pp, name,
          "train.steps=6 checkpoint.resume=true parallel.pipeline_layers=" + quoted(split));
    expect_same_losses(losses(resumed), {source_losses.begin() + 3, source_losses.end()}, name);
    expect_same_tensors(resumed / "ckpt/step_6/model.safetensors",
                        source / "ckpt/step_6/model.safetensors", name);
  }
}

TEST_F(PipelineTraining, BadPipelineSettingsAreClearErrors) {
  std::string out = failing("parallel.pipeline_layers=" + quoted("1,1"));
  EXPECT_NE(out.find("parallel.pipeline_layers"), std::string::npos) << out;
  EXPECT_NE(out.find("1,1"), std::string::npos) << out;
  EXPECT_NE(out.find("1,2"), std::string::npos) << out;  // the valid uniform split

  out = failing("parallel.pipeline_layers=" + quoted("1,1,1"));
  EXPECT_NE(out.find("parallel.pipeline_layers"), std::string::npos) << out;
  EXPECT_NE(out.find("1,1,1"), std::string::npos) << out;

  out = failing("parallel.pipeline=" + quoted("zigzag"));
  EXPECT_NE(out.find("parallel.pipeline"), std::string::npos) << out;
  EXPECT_NE(out.find("zigzag"), std::string::npos) << out;
  EXPECT_NE(out.find("1f1b"), std::string::npos) << out;

  out = failing("parallel.pipeline=" + quoted("interleaved"));
  EXPECT_NE(out.find("parallel.pipeline = \"interleaved\" is not available yet; valid: "
                     "\"1f1b\", \"gpipe\""),
            std::string::npos) << out;

}

}  // namespace
