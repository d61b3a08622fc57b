// ZeRO through `oases train` at dp = 2 in fp64: stages 1 to 3 train exactly what stage 0
// trains (losses, and the whole tensors of the checkpoints: model and optimizer state), a run
// resumes from a ZeRO-3 checkpoint under ZeRO-0 and another under ZeRO-3 at tp 2 x dp 2 and
// continues the straight run, and the metrics and run.json report each stage's bytes per rank.
// ZeRO-R likewise: partitioned activation checkpoints at tp 2 and transport calls bounded by
// parallel.bucket_bytes train what the plain run trains, and the activation peak falls.
#include "support/command.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::quoted;
using oases::testing::RunLayout;

class ZeroRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("zero_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Two micro-batches per rank: the gradient accumulates before its reduction.
    std::ofstream(dir_ / "gpt.toml")
        << oases::testing::tiny_fp64_config("gpt", 2, dir_ / "data", "", 4);
    oases::testing::write_random_init(dir_ / "gpt.toml", dir_ / "init.safetensors", 29);
  }
  fs::path train(RunLayout layout, const std::string& name, const std::string& settings) const {
    return oases::testing::train_run(OASES_BINARY, dir_ / "gpt.toml", dir_ / "init.safetensors",
                                     layout, dir_ / name, settings);
  }
  static nlohmann::json last_record(const fs::path& run) {
    std::ifstream in(run / "metrics.jsonl");
    nlohmann::json last;
    for (std::string line; std::getline(in, line);) last = nlohmann::json::parse(line);
    return last;
  }
  fs::path dir_;
};

TEST_F(ZeroRuns, StagesOneToThreeTrainWhatStageZeroTrains) {
  const fs::path reference = train({.dp = 2}, "zero0", "checkpoint.every=4");
  const nlohmann::json whole = last_record(reference);
  for (const int stage : {1, 2, 3}) {
    const std::string name = "zero" + std::to_string(stage);
    const fs::path run = train({.dp = 2}, name, "checkpoint.every=4 parallel.zero=" + std::to_string(stage));
    oases::testing::expect_same_run(run, reference, name, 4);
    const nlohmann::json record = last_record(run);
    // The optimizer state halves; stage 2 also the gradients; stage 3 the parameters too
    // (what a step holds gathered at once comes on top).
    if (stage == 3) {
      EXPECT_LT(record.at("param_bytes").get<double>(), whole.at("param_bytes").get<double>())
          << name;
    } else {
      EXPECT_EQ(record.at("param_bytes"), whole.at("param_bytes")) << name;
    }
    EXPECT_LT(record.at("optimizer_bytes").get<double>(),
              0.55 * whole.at("optimizer_bytes").get<double>())
        << name;
    if (stage >= 2) {
      EXPECT_LT(record.at("grad_bytes").get<double>(), 0.55 * whole.at("grad_bytes").get<double>());
    } else {
      EXPECT_EQ(record.at("grad_bytes"), whole.at("grad_bytes"));
    }
    const auto description = nlohmann::json::parse(std::ifstream(run / "run.json"));
    EXPECT_EQ(description.at("zero"), stage);
    EXPECT_EQ(description.at("memory_bytes").at("optimizer"), record.at("optimizer_bytes"));
  }
}

TEST_F(ZeroRuns, CheckpointsResumeUnderOtherStagesAndLayouts) {
  // The learning rate decays over 6 steps in all three runs, however many each trains.
  const std::string schedule = "train.lr_decay_steps=6 ";
  const fs::path straight = train({.dp = 2}, "straight", schedule + "train.steps=6 checkpoint.every=6");
  // Four steps at ZeRO-3, dp 2; then two more from its checkpoint at ZeRO-0 (dp 2) and at
  // ZeRO-3 under tp 2 x dp 2.
  const fs::path first = train({.dp = 2}, "first", schedule + "train.steps=4 parallel.zero=3");
  struct Case {
    RunLayout layout;
    std::string name, settings;
  };
  for (const Case& c : {Case{{.dp = 2}, "resumed_zero0", ""},
                        Case{{.tp = 2, .dp = 2}, "resumed_tp2_zero3", "parallel.zero=3"}}) {
    const fs::path run = dir_ / c.name;
    fs::create_directories(run / "ckpt");
    fs::copy(first / "ckpt", run / "ckpt", fs::copy_options::recursive);
    train(c.layout, c.name,
          schedule + "train.steps=6 checkpoint.every=6 checkpoint.resume=true " + c.settings);
    const std::vector<double> losses = oases::testing::metric_values(run / "metrics.jsonl", "loss");
    const std::vector<double> want = oases::testing::metric_values(straight / "metrics.jsonl", "loss");
    ASSERT_EQ(losses.size(), 2u) << c.name;
    oases::testing::expect_same_losses(losses, {want[4], want[5]}, c.name);
    oases::testing::expect_same_tensors(run / "ckpt/step_6/model.safetensors",
                                        straight / "ckpt/step_6/model.safetensors", c.name);
    oases::testing::expect_same_tensors(run / "ckpt/step_6/optimizer.safetensors",
                                        straight / "ckpt/step_6/optimizer.safetensors",
                                        c.name + " optimizer");
  }
}

TEST_F(ZeroRuns, ZeroRTrainsWhatThePlainRunTrains) {
  const std::string settings = "checkpoint.every=4 parallel.schedule=megatron parallel.recompute=full ";
  const fs::path plain = train({.tp = 2}, "tp2", settings);
  const fs::path partitioned =
      train({.tp = 2}, "tp2_partitioned", settings + "parallel.partition_activations=true");
  oases::testing::expect_same_run(partitioned, plain, "partition_activations", 4);
  EXPECT_LT(last_record(partitioned).at("peak_activation_bytes").get<double>(),
            last_record(plain).at("peak_activation_bytes").get<double>());
  const auto description = nlohmann::json::parse(std::ifstream(partitioned / "run.json"));
  EXPECT_EQ(description.at("partition_activations"), true);
  // 4 KiB per transport call: every reduction and gather of the runs goes in pieces.
  const fs::path bounded =
      train({.tp = 2}, "tp2_bounded", settings + "parallel.bucket_bytes=4096");
  oases::testing::expect_same_run(bounded, plain, "bucket_bytes at tp 2", 4);
  const fs::path zero2 = train({.dp = 2}, "zero2", "checkpoint.every=4 parallel.zero=2");
  const fs::path zero2_bounded =
      train({.dp = 2}, "zero2_bounded", "checkpoint.every=4 parallel.zero=2 parallel.bucket_bytes=4096");
  oases::testing::expect_same_run(zero2_bounded, zero2, "bucket_bytes at zero 2", 4);
}

}  // namespace
