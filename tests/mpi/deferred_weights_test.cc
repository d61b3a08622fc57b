// oases-deferred end to end: GPT and LLaMA trained under tensor parallelism (tp = 2, and
// tp = 2 x dp = 2) with every backward input-only and the weight parts moved into the windows
// of forward collectives give the losses, parameters and optimizer state of the
// single-process run without recomputation, in fp64 to relative 1e-10. Four micro-batches per
// step at tp = 2 (two per rank at dp = 2), so that the forwards of micro-batches 1-3 run beside
// earlier backwards and weight parts fill their windows (tests/schedule/schedule_test.cc checks
// where they go); the trace shows every weight part running once per instance on every rank.
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;
using oases::testing::quoted;

constexpr int kSteps = 2;

class DeferredWeights : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("deferred_weights_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const bool llama = GetParam() == "llama";
    std::ofstream(dir_ / "tiny.toml") << "[model]\narch = \"" << GetParam() << "\"\n"
                                      << (llama ? "kv_heads = 2\n" : "") << R"(layers = 2
hidden = 64
heads = 4
ffn_hidden = 96
vocab_size = 257    # padded under the vocab-parallel head
seq_len = 20
dropout = 0.1
[train]
precision = "fp64"  # the verification precision
micro_batch = 4     # two sub-batches of 2 sequences
global_batch = 16   # four micro-batches per step at dp = 1
steps = 2
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 1
[data]
path = ")" << (dir_ / "data").string()
                                      << "\"\n";
    oases::testing::write_random_init(dir_ / "tiny.toml", dir_ / "init.safetensors", 7);
  }

  std::optional<fs::path> train(int tp, int dp, const std::string& name,
                                const std::string& extra) const {
    const fs::path out = dir_ / name;
    const std::string command =
        oases::testing::train_command(OASES_BINARY, dir_, tp, dp, out, extra);
    const auto r = oases::testing::run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    if (r.exit_code != 0) return std::nullopt;
    return out;
  }

  fs::path dir_;
};

// Names of the compute-lane events of each rank in the trace of the first step.
std::map<int, std::vector<std::string>> compute_events(const fs::path& trace_file) {
  std::ifstream in(trace_file);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, std::vector<std::string>> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.value("ph", "") == "X" && e.value("tid", -1) == 0)
      out[e.at("pid").get<int>()].push_back(e.at("name").get<std::string>());
  return out;
}

TEST_P(DeferredWeights, MatchTheSingleProcessRunAtTp2AndTp2Dp2) {
  const auto reference =
      train(1, 1, "reference", "parallel.schedule=megatron parallel.recompute=none");
  ASSERT_TRUE(reference.has_value());
  const auto want = oases::testing::metric_values(*reference / "metrics.jsonl", "loss");
  ASSERT_EQ(want.size(), static_cast<std::size_t>(kSteps));
  const fs::path last = fs::path("ckpt") / ("step_" + std::to_string(kSteps));
  struct Run {
    std::string name;
    int tp, dp, sub_batches;
  };
  for (const Run& run : {Run{"tp2_sb2", 2, 1, 2}, Run{"tp2_sb1", 2, 1, 1},
                         Run{"tp2_dp2_sb2", 2, 2, 2}}) {
    const std::string what = GetParam() + " oases-deferred " + run.name;
    const fs::path trace = dir_ / (run.name + ".trace.json");
    const auto out = train(run.tp, run.dp, run.name,
                           "parallel.schedule=" + quoted("oases-deferred") +
                               " parallel.sub_batches=" + std::to_string(run.sub_batches) +
                               " log.trace=" + quoted(trace.string()));
    if (!out) continue;
    expect_same_losses(oases::testing::metric_values(*out / "metrics.jsonl", "loss"), want, what);
    expect_same_tensors(*out / last / "model.safetensors", *reference / last / "model.safetensors",
                        what + " model");
    expect_same_tensors(*out / last / "optimizer.safetensors",
                        *reference / last / "optimizer.safetensors", what + " optimizer");
    // The setting took effect: 2 layers x (attention, MLP) + head_loss weight parts per
    // instance, each once, on every rank.
    const int instances = 4 / run.dp * run.sub_batches;
    const auto events = compute_events(trace);
    EXPECT_EQ(events.size(), static_cast<std::size_t>(run.tp * run.dp)) << what;
    for (const auto& [rank, names] : events) {
      std::map<std::string, int> weight_parts;
      for (const std::string& name : names)
        if (name.rfind("W ", 0) == 0) ++weight_parts[name];
      EXPECT_EQ(weight_parts.size(), static_cast<std::size_t>(5 * instances))
          << what << " rank " << rank;
      for (const auto& [name, count] : weight_parts) EXPECT_EQ(count, 1) << what << " " << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GptAndLlama, DeferredWeights, ::testing::Values("gpt", "llama"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });

}  // namespace
