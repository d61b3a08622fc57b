// What composes inside pipeline stages, end to end through `mpirun oases train`: every
// within-stage schedule (megatron with full and selective recomputation, fine-grained,
// cross-pass, oases, oases-interleaved) at tp = 2 x pp = 2 under GPipe and 1F1B; per-layer
// tensor-parallel degrees (parallel.plan) that change inside a stage and at the cut between two
// stages, in both directions; four stages; each gives the losses, validation losses, parameters
// and optimizer state of the single-process run. A checkpoint written over two stages resumes
// in one process and over four with the same next losses and parameters. `oases eval` over
// pipeline stages (forward-only pipeline steps) gives the loss of the single-process
// evaluation, and by default runs in the checkpoint's layout where the job's ranks allow it.
//
// In fp64 with dropout 0.1, from random weights with nonzero biases and norm parameters
// (tests/support/runs.h): every run agrees with the single process to relative 1e-10.
#include "support/command.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
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

std::vector<double> metric(const fs::path& run, const std::string& key) {
  return oases::testing::metric_values(run / "metrics.jsonl", key);
}

// Validation after every step: under pp > 1 its loss comes from forward-only pipeline steps.
const std::string kValidation = " train.eval_every=1 train.eval_steps=1";

class PipelineComposition : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("pipeline_composition_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Four layers: two per stage at pp = 2 (room for a degree change inside each), one per
    // stage at pp = 4. Four micro-batches of 2 per step unless a run says otherwise.
    std::ofstream(dir_ / "gpt.toml") << R"(
[model]
arch = "gpt"
layers = 4
hidden = 32
heads = 4
ffn_hidden = 48
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
threads = 0
[data]
path = ")" + (dir_ / "data").string() + R"("
[log]
peak_tflops = 1.0
)";
    oases::testing::write_random_init(dir_ / "gpt.toml", dir_ / "init.safetensors", 57);
  }

  // Trains over tp x pp x dp ranks (one process when all are 1) with `extra` settings; returns
  // the run's folder (metrics.jsonl, ckpt/). `model` names the config and initial weights:
  // "gpt" (gpt.toml, init.safetensors) or one a test wrote (<model>.toml, init_<model>...).
  static fs::path train(const std::string& name, int tp, int pp, const std::string& extra,
                        int dp = 1, const std::string& model = "gpt") {
    const std::string init = model == "gpt" ? "init" : "init_" + model;
    return oases::testing::train_run(OASES_BINARY, dir_ / (model + ".toml"),
                                     dir_ / (init + ".safetensors"), {tp, pp, dp}, dir_ / name,
                                     extra);
  }

  static void expect_same_run(const fs::path& got, const fs::path& want, const std::string& what,
                              int step = 3) {
    oases::testing::expect_same_run(got, want, what, step);
  }

  static void expect_same_validation(const fs::path& got, const fs::path& want,
                                     const std::string& what) {
    const std::vector<double> losses = metric(want, "val_loss");
    ASSERT_EQ(losses.size(), 3u) << what;
    expect_same_losses(metric(got, "val_loss"), losses, what + " validation");
  }

  // `oases eval --json` of `checkpoint` over `ranks` processes (one: no launcher) with `flags`:
  // the command's result and its JSON record (null when it printed none).
  static std::pair<Result, nlohmann::json> eval(const fs::path& checkpoint, int ranks,
                                                const std::string& flags) {
    const std::string command =
        (ranks > 1 ? oases::testing::mpirun_prefix(ranks) : std::string()) + OASES_BINARY +
        " eval --json --checkpoint " + checkpoint.string() + " --data " +
        (dir_ / "data").string() + " --batches 3 --batch-size 4 " + flags;
    const Result r = run_command(command);
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && line.front() == '{') return {r, nlohmann::json::parse(line)};
    return {r, nullptr};
  }

  static inline fs::path dir_;
};

TEST_F(PipelineComposition, EveryWithinStageScheduleUnderGPipeAnd1F1BMatchesTheSingleProcessRun) {
  const fs::path reference = train("reference", 1, 1, kValidation);
  ASSERT_EQ(metric(reference, "loss").size(), 3u);
  struct Case {
    std::string name, settings;
    bool validation;
  };
  // Each schedule once, each pipeline kind three times; two sub-batches of one sequence where
  // the schedule overlaps.
  const std::vector<Case> cases = {
      {"oases_1f1b", "parallel.schedule=" + quoted("oases") + " parallel.sub_batches=2 "
                     "parallel.pipeline=" + quoted("1f1b"), true},
      {"cross_pass_gpipe", "parallel.schedule=" + quoted("cross-pass") + " parallel.sub_batches=2 "
                           "parallel.pipeline=" + quoted("gpipe"), false},
      {"megatron_full_1f1b", "parallel.schedule=" + quoted("megatron") + " parallel.recompute=" +
                             quoted("full") + " parallel.pipeline=" + quoted("1f1b"), false},
      {"megatron_selective_gpipe", "parallel.schedule=" + quoted("megatron") +
                                   " parallel.recompute=" + quoted("selective") +
                                   " parallel.pipeline=" + quoted("gpipe"), false},
      {"fine_grained_1f1b", "parallel.schedule=" + quoted("fine-grained") +
                            " parallel.pipeline=" + quoted("1f1b"), false},
      // The pipeline places micro-batches itself, so each runs in oases' order.
      {"oases_interleaved_gpipe", "parallel.schedule=" + quoted("oases-interleaved") +
                                  " parallel.sub_batches=2 parallel.pipeline=" + quoted("gpipe"),
       true},
  };
  for (const Case& c : cases) {
    const fs::path run =
        train(c.name, 2, 2, c.settings + (c.validation ? kValidation : std::string()));
    expect_same_run(run, reference, c.name);
    if (c.validation) expect_same_validation(run, reference, c.name);
  }
}

TEST_F(PipelineComposition, PerLayerDegreesInsideAStageAndAcrossTheCutMatchTheSingleProcessRun) {
  const fs::path reference = train("reference", 1, 1, kValidation);
  struct Case {
    std::string name, settings;
    int tp = 2, dp = 1;
  };
  // Two layers per stage unless split otherwise. 1,2,2,1: a reshard inside each stage, the same
  // degree on both sides of the cut. 1,2,1,2: the degree falls at the cut; 2,1,2,1: it rises
  // there. A layer at degree k < tp splits each sub-batch over its tp / k replicas, hence
  // micro-batches of 4 with two sub-batches. With dp = 2 a layer's replicas sum gradients over
  // both data-parallel replicas of their stage; at tp = 4 the cut joins degrees 2 and 4.
  const std::vector<Case> cases = {
      {"plan_1221_oases_1f1b", "parallel.plan=1,2,2,1 parallel.schedule=" + quoted("oases") +
                               " parallel.sub_batches=2 train.micro_batch=4 parallel.pipeline=" +
                               quoted("1f1b")},
      {"plan_1212_megatron_gpipe", "parallel.plan=1,2,1,2 parallel.schedule=" +
                                   quoted("megatron") + " parallel.pipeline=" + quoted("gpipe")},
      {"plan_2121_cross_pass_1f1b", "parallel.plan=2,1,2,1 parallel.schedule=" +
                                    quoted("cross-pass") +
                                    " parallel.sub_batches=2 train.micro_batch=4 "
                                    "parallel.pipeline=" + quoted("1f1b")},
      {"plan_2112_dp2_layers_1_3", "parallel.plan=2,1,1,2 parallel.pipeline_layers=1,3 "
                                   "parallel.schedule=" + quoted("megatron") +
                                   " parallel.pipeline=" + quoted("1f1b"), 2, 2},
      {"plan_1242_tp4_gpipe", "parallel.plan=1,2,4,2 parallel.schedule=" + quoted("megatron") +
                              " train.micro_batch=4 parallel.pipeline=" + quoted("gpipe"), 4, 1},
  };
  for (const Case& c : cases) {
    const fs::path run = train(c.name, c.tp, 2, c.settings + kValidation, c.dp);
    expect_same_run(run, reference, c.name);
    expect_same_validation(run, reference, c.name);
  }
}

TEST_F(PipelineComposition, FourStagesUnderGPipeAnd1F1BMatchTheSingleProcessRun) {
  const fs::path reference = train("reference", 1, 1, kValidation);
  for (const std::string pipeline : {"gpipe", "1f1b"}) {
    const std::string name = "pp4_" + pipeline;
    const fs::path run = train(name, 1, 4, "parallel.pipeline=" + quoted(pipeline) + kValidation);
    expect_same_run(run, reference, name);
    expect_same_validation(run, reference, name);
  }
}

TEST_F(PipelineComposition, InterleavedAndZeroBubbleOverFourStagesAndAroundOasesStagesMatchTheSingleProcessRun) {
  const fs::path reference = train("reference", 1, 1, kValidation);
  // Zero-bubble over four stages of one layer each.
  const fs::path zero_bubble =
      train("pp4_zero_bubble", 1, 4, "parallel.pipeline=" + quoted("zero-bubble") + kValidation);
  expect_same_run(zero_bubble, reference, "pp4 zero-bubble");
  expect_same_validation(zero_bubble, reference, "pp4 zero-bubble");
  // Interleaved and zero-bubble around the oases schedule (two sub-batches, fine-grained
  // recomputation) inside tensor-parallel stages.
  for (const std::string pipeline : {"interleaved", "zero-bubble"}) {
    const std::string name = "tp2_pp2_oases_" + pipeline;
    const std::string chunks = pipeline == "interleaved" ? " parallel.virtual_stages=2" : "";
    const fs::path run = train(name, 2, 2,
                               "parallel.schedule=" + quoted("oases") +
                                   " parallel.sub_batches=2 parallel.pipeline=" + quoted(pipeline) +
                                   chunks + kValidation);
    expect_same_run(run, reference, name);
    expect_same_validation(run, reference, name);
  }
  // Interleaved with data parallelism: two micro-batches per replica and step.
  const fs::path data_parallel =
      train("dp2_pp2_interleaved", 1, 2,
            "parallel.pipeline=" + quoted("interleaved") + " parallel.virtual_stages=2", 2);
  expect_same_run(data_parallel, reference, "dp2 pp2 v2 interleaved");
  // Interleaved over four stages needs eight chunks, so eight layers of one each.
  {
    std::ifstream four(dir_ / "gpt.toml");
    std::string text((std::istreambuf_iterator<char>(four)), std::istreambuf_iterator<char>());
    const std::string layers = "layers = 4";
    text.replace(text.find(layers), layers.size(), "layers = 8");
    std::ofstream(dir_ / "gpt8.toml") << text;
  }
  oases::testing::write_random_init(dir_ / "gpt8.toml", dir_ / "init_gpt8.safetensors", 58);
  const fs::path reference8 = train("reference8", 1, 1, kValidation, 1, "gpt8");
  const fs::path interleaved =
      train("pp4_interleaved", 1, 4,
            "parallel.pipeline=" + quoted("interleaved") + " parallel.virtual_stages=2" +
                kValidation,
            1, "gpt8");
  expect_same_run(interleaved, reference8, "pp4 v2 interleaved");
  expect_same_validation(interleaved, reference8, "pp4 v2 interleaved");
}

TEST_F(PipelineComposition, CheckpointFromTwoStagesResumesInOneProcessAndOverFourStages) {
  const fs::path source =
      train("source", 1, 2, "train.steps=6 checkpoint.every=3 checkpoint.keep=0");
  const std::vector<double> source_losses = metric(source, "loss");
  ASSERT_EQ(source_losses.size(), 6u);
  for (const int pp : {1, 4}) {
    const std::string name = "resumed_pp" + std::to_string(pp);
    fs::create_directories(dir_ / name / "ckpt");
    fs::copy(source / "ckpt/step_3", dir_ / name / "ckpt/step_3", fs::copy_options::recursive);
    const fs::path resumed = train(name, 1, pp, "train.steps=6 checkpoint.resume=true");
    expect_same_losses(metric(resumed, "loss"), {source_losses.begin() + 3, source_losses.end()},
                       name);
    expect_same_tensors(resumed / "ckpt/step_6/model.safetensors",
                        source / "ckpt/step_6/model.safetensors", name);
    expect_same_tensors(resumed / "ckpt/step_6/optimizer.safetensors",
                        source / "ckpt/step_6/optimizer.safetensors", name + " optimizer");
  }
}

TEST_F(PipelineComposition, EvalOverPipelineStagesGivesTheSingleProcessLoss) {
  // A checkpoint trained at tp = 2 x pp = 2 with per-layer degrees: its stored layout is the
  // default of a launch with enough ranks.
  const fs::path run =
      train("trained", 2, 2, "train.steps=1 train.micro_batch=4 parallel.plan=1,2,2,1");
  const fs::path checkpoint = run / "ckpt/step_1";
  const auto [one, expected] = eval(checkpoint, 1, "");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_FALSE(expected.is_null()) << one.output;
  EXPECT_EQ(expected.at("tokens").get<std::int64_t>(), 3 * 4 * 16);
  const double loss = expected.at("loss").get<double>();

  struct Case {
    int ranks;
    std::string flags, layout;
  };
  const std::vector<Case> cases = {
      {2, "--pp 2", "tp 1 x dp 1 x pp 2"},
      {4, "--tp 1 --pp 4", "tp 1 x dp 1 x pp 4"},
      {4, "", "tp 2 x dp 1 x pp 2"},  // the checkpoint's layout
      {2, "", "tp 2 x dp 1 x pp 1"},  // its tp; its pp would need 4 ranks
  };
  for (const Case& c : cases) {
    const std::string what = std::to_string(c.ranks) + " ranks, flags '" + c.flags + "'";
    const auto [result, record] = eval(checkpoint, c.ranks, c.flags);
    ASSERT_EQ(result.exit_code, 0) << what << "\n" << result.output;
    EXPECT_NE(result.output.find("evaluating on " + std::to_string(c.ranks) + " ranks = " +
                                 c.layout),
              std::string::npos)
        << what << "\n" << result.output;
    ASSERT_FALSE(record.is_null()) << what << "\n" << result.output;
    EXPECT_EQ(record.at("tokens"), expected.at("tokens")) << what;
    EXPECT_NEAR(record.at("loss").get<double>(), loss, oases::testing::kFp64Tolerance * loss)
        << what;
  }

  // Stages need processes.
  const Result alone = eval(checkpoint, 1, "--pp 2").first;
  EXPECT_NE(alone.exit_code, 0) << alone.output;
  EXPECT_NE(alone.output.find("--tp = 1 x --pp = 2 = 2 ranks per model replica must divide the 1 "
                              "ranks of the job"),
            std::string::npos)
      << alone.output;
  EXPECT_NE(alone.output.find("mpirun -np 2"), std::string::npos) << alone.output;
}

}  // namespace
