// Pipeline parallelism, end to end: `mpirun -np N oases train` with parallel.pp = 2 under the
// GPipe, 1F1B and interleaved 1F1B (two chunks per rank) schedules gives the losses,
// validation losses (forward-only pipeline steps), parameters and optimizer state of the
// single-process run, for GPT (whose word embedding, tied to the head, lives on both the first
// and the last stage) and LLaMA, alone and together with tensor or data parallelism; a
// checkpoint written by a pipeline run resumes in one process and under another split of the
// layers with the same next losses; bad pipeline settings are errors that name the setting, the
// value and what is valid.
//
// In fp64 with dropout, from random weights with nonzero biases and norm parameters (see
// tests/mpi/layouts_test.cc): every run agrees with the single process to relative 1e-10.
#include "support/command.h"
#include "support/pipeline_runs.h"
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
using oases::testing::expect_same_run;
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
      write_config(arch, arch, 3);
      // Four layers: one per chunk of an interleaved pipeline of two ranks with two chunks each.
      write_config(arch + "4", arch, 4);
    }
  }

  // <name>.toml, the run config of `layers` layers of `arch`, and <name>_init.safetensors.
  static void write_config(const std::string& name, const std::string& arch, int layers) {
    std::ofstream(dir_ / (name + ".toml")) << oases::testing::tiny_fp64_config(arch, layers, dir_ / "data");
    oases::testing::write_random_init(dir_ / (name + ".toml"), dir_ / (name + "_init.safetensors"), 91);
  }

  // Runs the config `arch` (gpt, llama, or gpt4, llama4 of four layers) over tp x pp x dp ranks
  // (pp = 1: the plain engine) with `extra` settings; returns the run's folder (metrics.jsonl,
  // ckpt/).
  static fs::path train(const std::string& arch, int tp, int pp, const std::string& name,
                        const std::string& extra = "", int dp = 1) {
    return oases::testing::train_run(OASES_BINARY, dir_ / (arch + ".toml"),
                                     dir_ / (arch + "_init.safetensors"), {tp, pp, dp},
                                     dir_ / name, extra);
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
  expect_same_run(train("gpt", 1, 2, "gpt_dp2_pp2", "parallel.pipeline=" + quoted("gpipe") + validation, 2),
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

// Two chunks per rank: rank 0 holds layers 0 and 2 (with the embedding), rank 1 layers 1 and 3
// (with the head); activations go round the ring from rank 1 back to rank 0 between them.
TEST_F(PipelineTraining, InterleavedMatchesTheSingleProcessRun) {
  const std::string interleaved = "parallel.pipeline=" + quoted("interleaved") +
                                  " parallel.virtual_stages=2 train.eval_every=1 train.eval_steps=2";
  for (const std::string arch : {"gpt4", "llama4"}) {
    const fs::path reference = train(arch, 1, 1, arch + "_pp1", "train.eval_every=1 train.eval_steps=2");
    ASSERT_EQ(losses(reference).size(), 3u) << arch;
    const std::string name = arch + "_pp2_v2";
    const fs::path run = train(arch, 1, 2, name, interleaved);
    expect_same_run(run, reference, name);
    if (arch != "gpt4") continue;
    // With tensor parallelism inside every chunk (the oases schedule, two sub-batches).
    const fs::path tp = train(arch, 2, 2, "gpt4_tp2_pp2_v2", interleaved);
    expect_same_run(tp, reference, "tp=2 pp=2 v=2");
  }
}

// A checkpoint of an interleaved run resumes in one process, and one of a single process
// resumes interleaved, each with the next losses and final state of the run it came from.
TEST_F(PipelineTraining, CheckpointFromInterleavedRunResumesInOneProcessAndTheReverse) {
  const std::string interleaved =
      "parallel.pipeline=" + quoted("interleaved") + " parallel.virtual_stages=2 ";
  const std::string six_steps = "train.steps=6 checkpoint.every=3 checkpoint.keep=0";
  struct Resume {
    std::string name;
    int source_pp, resumed_pp;
  };
  for (const Resume& r : {Resume{"pp2_v2_to_pp1", 2, 1}, Resume{"pp1_to_pp2_v2", 1, 2}}) {
    const fs::path source = train("gpt4", 1, r.source_pp, r.name + "_source",
                                  (r.source_pp > 1 ? interleaved : "") + six_steps);
    const auto source_losses = losses(source);
    ASSERT_EQ(source_losses.size(), 6u) << r.name;
    const fs::path resumed = dir_ / r.name;
    fs::create_directories(resumed / "ckpt");
    fs::copy(source / "ckpt/step_3", resumed / "ckpt/step_3", fs::copy_options::recursive);
    train("gpt4", 1, r.resumed_pp, r.name,
          (r.resumed_pp > 1 ? interleaved : "") + "train.steps=6 checkpoint.resume=true");
    expect_same_losses(losses(resumed), {source_losses.begin() + 3, source_losses.end()}, r.name);
    expect_same_tensors(resumed / "ckpt/step_6/model.safetensors",
                        source / "ckpt/step_6/model.safetensors", r.name);
    expect_same_tensors(resumed / "ckpt/step_6/optimizer.safetensors",
                        source / "ckpt/step_6/optimizer.safetensors", r.name + " optimizer");
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

  // Three stages on two processes.
  out = failing("parallel.pp=3");
  EXPECT_NE(out.find("parallel.tp * parallel.dp * parallel.pp = 1 * 1 * 3 = 3 must equal the "
                     "number of processes, 2"),
            std::string::npos) << out;

  out = failing("parallel.pipeline=" + quoted("zigzag"));
  EXPECT_NE(out.find("parallel.pipeline"), std::string::npos) << out;
  EXPECT_NE(out.find("zigzag"), std::string::npos) << out;
  EXPECT_NE(out.find("1f1b"), std::string::npos) << out;

  // 2bw with k = 2 micro-batches per step (4 / 2), not more than the two stages.
  out = failing("parallel.pipeline=" + quoted("2bw") + " train.global_batch=4");
  EXPECT_NE(out.find("parallel.pipeline = \"2bw\" needs more micro-batches per step than "
                     "pipeline stages, but train.global_batch = 4 / (train.micro_batch x "
                     "parallel.dp = 2 x 1) = 2 micro-batches with parallel.pp = 2; valid: "
                     "train.global_batch = 6, 8, ..."),
            std::string::npos) << out;

  // Interleaved: the 4 micro-batches of a step (8 / 2) are no multiple of pp = 3.
  out = failing("parallel.pp=3 parallel.pipeline=" + quoted("interleaved") +
                " parallel.virtual_stages=2 model.layers=6");
  EXPECT_NE(out.find("train.global_batch / (train.micro_batch x parallel.dp) = 8 / (2 x 1) = 4, to "
                     "be a multiple of parallel.pp = 3; valid: train.global_batch = 6 or 12"),
            std::string::npos) << out;

  out = failing("parallel.virtual_stages=2");
  EXPECT_NE(out.find("parallel.virtual_stages = 2 needs parallel.pipeline = \"interleaved\""),
            std::string::npos) << out;

  // Two counts where the interleaved pipeline cuts 2 x 2 chunks.
  out = failing("parallel.pipeline=" + quoted("interleaved") +
                " parallel.virtual_stages=2 model.layers=4 parallel.pipeline_layers=" + quoted("1,3"));
  EXPECT_NE(out.find("parallel.pipeline_layers = \"1,3\" has 2 counts but parallel.pp x "
                     "parallel.virtual_stages = 4 chunks"),
            std::string::npos) << out;
  EXPECT_NE(out.find("1,1,1,1"), std::string::npos) << out;

}

}  // namespace
