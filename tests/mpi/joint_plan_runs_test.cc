// Training with a joint plan (`oases plan --output plan.json`, then `parallel.plan=plan.json`)
// equals training with the plan's settings given by hand, bit for bit in fp64: the plan the
// search chooses for two ranks, and a plan file of per-layer recomputation under cross-pass at
// tp 2 written as the search writes them.
#include "planner/planner.h"
#include "support/command.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::quoted;
using oases::testing::RunLayout;

constexpr int kLayers = 4;
constexpr int kSteps = 2;

class JointPlanRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("joint_plan_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir_ / "gpt.toml")
        << oases::testing::tiny_fp64_config("gpt", kLayers, dir_ / "data", "", kSteps);
    oases::testing::write_random_init(dir_ / "gpt.toml", dir_ / "init.safetensors", 41);
  }

  static std::string setting(const std::vector<std::pair<std::string, std::string>>& settings,
                             const std::string& key) {
    for (const auto& [k, v] : settings)
      if (k == key) return v;
    return "";
  }

  // Trains with the plan file, then with its settings by hand, and compares the two.
  void expect_plan_equals_by_hand(const fs::path& plan, const std::string& what) {
    const auto settings = oases::planner::read_plan_settings(plan.string());
    ASSERT_FALSE(settings.empty()) << what;
    ASSERT_EQ(setting(settings, "parallel.cp"), "1") << what;
    RunLayout layout;
    layout.tp = std::stoi(setting(settings, "parallel.tp"));
    layout.dp = std::stoi(setting(settings, "parallel.dp"));
    layout.pp = std::stoi(setting(settings, "parallel.pp"));
    std::string by_hand;
    for (const auto& [key, value] : settings) by_hand += " " + key + "=" + value;
    const fs::path named = oases::testing::train_run(
        OASES_BINARY, dir_ / "gpt.toml", dir_ / "init.safetensors", layout,
        dir_ / (what + "_named"), "parallel.plan=" + quoted(plan.string()));
    const fs::path given =
        oases::testing::train_run(OASES_BINARY, dir_ / "gpt.toml", dir_ / "init.safetensors",
                                  layout, dir_ / (what + "_by_hand"), by_hand);
    const std::vector<double> a = oases::testing::metric_values(named / "metrics.jsonl", "loss");
    const std::vector<double> b = oases::testing::metric_values(given / "metrics.jsonl", "loss");
    ASSERT_EQ(a.size(), static_cast<std::size_t>(kSteps)) << what;
    EXPECT_EQ(a, b) << what;  // bit for bit
    const std::string checkpoint = "ckpt/step_" + std::to_string(kSteps);
    oases::testing::expect_same_tensors(named / checkpoint / "model.safetensors",
                                        given / checkpoint / "model.safetensors", what, 0.0);
    oases::testing::expect_same_tensors(named / checkpoint / "optimizer.safetensors",
                                        given / checkpoint / "optimizer.safetensors",
                                        what + " optimizer", 0.0);
  }

  fs::path dir_;
};

TEST_F(JointPlanRuns, SearchedPlanEqualsItsSettingsByHand) {
  const std::string command = std::string(OASES_BINARY) + " plan --config " +
                              (dir_ / "gpt.toml").string() + " --set parallel.tp=2 --cluster " +
                              OASES_SOURCE_DIR + "/clusters/dgx-a100.toml" +
                              " --fix parallel.cp --output " + (dir_ / "plan.json").string();
  const oases::testing::CommandResult r = oases::testing::run_command(command);
  ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  for (const char* fragment :
       {"chosen layout:", "predicted step", "memory per rank (pred.)", "the ten best alternatives",
        "the best of each schedule family", "wrote "})
    EXPECT_NE(r.output.find(fragment), std::string::npos) << fragment << " in " << r.output;
  expect_plan_equals_by_hand(dir_ / "plan.json", "searched");
}

TEST_F(JointPlanRuns, PerLayerRecomputationPlanEqualsItsSettingsByHand) {
  oases::planner::Plan plan;
  plan.degrees.assign(kLayers, 2);
  plan.settings = {{"parallel.tp", "2"},
                   {"parallel.cp", "1"},
                   {"parallel.dp", "1"},
                   {"parallel.pp", "1"},
                   {"parallel.schedule", "cross-pass"},
                   {"parallel.sub_batches", "2"},
                   {"train.micro_batch", "2"},
                   {"parallel.sequence_parallel", "false"},
                   {"parallel.zero", "0"},
                   {"parallel.offload", "none"},
                   {"parallel.recompute", "full,none,selective,none"},
                   {"parallel.activation_compression", "none"}};
  oases::planner::write_plan(plan, 2, (dir_ / "layers.json").string());
  expect_plan_equals_by_hand(dir_ / "layers.json", "per_layer");
}

}  // namespace
