// Recomputation in groups of k layers (parallel.recompute = "sqrt", Chen et al. 2016), end to
// end through `oases train`: under the megatron and cross-pass schedules, with the default
// k = round(sqrt(L)) and explicit k (1, 2, 3, L), in one process and under tensor, data and
// pipeline parallelism, GPT and LLaMA give the losses, parameters and AdamW moments of the
// single-process run without recomputation (fp64, relative 1e-10, dropout 0.1: the replayed
// forward regenerates the same masks). The measured activation peak equals the schedule's
// prediction, run.json and the start-up log name k, tensor parallelism replays every layer's
// forward collectives once (as full recomputation does), and bad settings are rejected naming
// the setting, the value and what is valid.
#include "support/command.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::expect_same_run;
using oases::testing::quoted;
using oases::testing::RunLayout;
using oases::testing::run_command;

constexpr int kSteps = 2;
constexpr int kMicroBatches = 4;  // global_batch 8 / micro_batch 2 (tiny_fp64_config)
// GPT of 5 layers: default k = round(sqrt(5)) = 2, groups {0, 1}, {2, 3}, {4}. LLaMA of 7:
// k = 3, groups {0, 1, 2}, {3, 4, 5}, {6}. Neither L is a multiple of its k.
const std::map<std::string, int> kLayers{{"gpt", 5}, {"llama", 7}};

// The --set overrides of a schedule with sqrt recomputation; k = 0 leaves the default.
std::string sqrt_settings(const std::string& schedule, int k) {
  std::string settings = "parallel.schedule=" + quoted(schedule) + " parallel.recompute=" +
                         quoted("sqrt");
  if (k > 0) settings += " parallel.recompute_every=" + std::to_string(k);
  return settings;
}

nlohmann::json run_description(const fs::path& run) {
  std::ifstream in(run / "run.json");
  EXPECT_TRUE(in.good()) << "no run.json in " << run;
  if (!in.good()) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

class SqrtRecompute : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("sqrt_recompute_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& [arch, layers] : kLayers) {
      std::ofstream(config(arch)) << oases::testing::tiny_fp64_config(arch, layers, dir_ / "data",
                                                                      "", kSteps);
      oases::testing::write_random_init(config(arch), init(arch), 77);
    }
  }

  fs::path config(const std::string& arch) const { return dir_ / (arch + ".toml"); }
  fs::path init(const std::string& arch) const { return dir_ / (arch + "_init.safetensors"); }

  fs::path train(const std::string& arch, RunLayout layout, const std::string& name,
                 const std::string& settings) const {
    return oases::testing::train_run(OASES_BINARY, config(arch), init(arch), layout,
                                     dir_ / (arch + "_" + name), settings);
  }
  // The single-process run without recomputation every other run must equal.
  fs::path reference(const std::string& arch) const {
    return train(arch, {}, "reference",
                 "parallel.schedule=" + quoted("megatron") + " parallel.recompute=" +
                     quoted("none"));
  }

  // The run equals the reference; its measured activation peak (every step) is the one its
  // schedule predicts (run.json); run.json names the policy and k. Returns the peak.
  double expect_equivalent(const fs::path& run, const fs::path& want, int k,
                           const std::string& what) const {
    expect_same_run(run, want, what, kSteps);
    const nlohmann::json description = run_description(run);
    if (!description.contains("schedule")) {
      ADD_FAILURE() << what << ": run.json names no schedule";
      return 0;
    }
    EXPECT_EQ(description["schedule"].value("recompute", ""), "sqrt") << what;
    EXPECT_EQ(description["schedule"].value("recompute_every", -1), k) << what;
    const std::vector<double> peaks =
        oases::testing::metric_values(run / "metrics.jsonl", "peak_activation_bytes");
    EXPECT_EQ(peaks.size(), static_cast<std::size_t>(kSteps)) << what;
    const double predicted = description["memory_bytes"].value("activations", -1.0);
    for (double peak : peaks) EXPECT_EQ(peak, predicted) << what;
    return peaks.empty() ? 0 : peaks.front();
  }

  fs::path dir_;
};

TEST_F(SqrtRecompute, GptInOneProcessEqualsNoRecomputationForEveryGroupSize) {
  const fs::path want = reference("gpt");
  const double none =
      oases::testing::metric_values(want / "metrics.jsonl", "peak_activation_bytes").front();
  std::map<int, double> peak;
  for (int k : {0, 1, 3, 5}) {
    const std::string what = "megatron sqrt k=" + std::to_string(k);
    const fs::path run = train("gpt", {}, "megatron_k" + std::to_string(k),
                               sqrt_settings("megatron", k));
    peak[k == 0 ? 2 : k] = expect_equivalent(run, want, k == 0 ? 2 : k, what);
  }
  // The setting took effect: groups of 2 keep less than no recomputation, one group of all 5
  // layers more than groups of 2.
  EXPECT_LT(peak[2], none);
  EXPECT_GT(peak[5], peak[2]);
  for (int k : {0, 2}) {
    const fs::path run = train("gpt", {}, "cross_pass_k" + std::to_string(k),
                               sqrt_settings("cross-pass", k));
    expect_equivalent(run, want, 2, "cross-pass sqrt k=" + std::to_string(k));
  }
}

// The start-up log names k (the run above checks run.json).
TEST_F(SqrtRecompute, StartUpLogNamesTheGroupSize) {
  const std::string command = std::string(OASES_BINARY) + " train --config " +
                              config("gpt").string() + " --set train.steps=1 " +
                              sqrt_settings("megatron", 0) + " checkpoint.dir=" +
                              quoted((dir_ / "log_run" / "ckpt").string());
  const Result r = run_command(command);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  EXPECT_NE(r.output.find("schedule: megatron, recompute sqrt (groups of 2 layers)"),
            std::string::npos)
      << r.output;
}

// Under tp = 2 the replayed forward repeats each layer segment's collective once per instance,
// as whole-layer recomputation does, and every layer segment is recomputed once.
TEST_F(SqrtRecompute, GptUnderTensorParallelismEqualsTheSingleProcessRun) {
  const fs::path want = reference("gpt");
  const fs::path trace_file = dir_ / "gpt_trace.json";
  const fs::path megatron = train("gpt", {.tp = 2}, "tp2_megatron",
                                  sqrt_settings("megatron", 0) +
                                      " log.trace=" + quoted(trace_file.string()));
  expect_equivalent(megatron, want, 2, "tp2 megatron sqrt");
  std::ifstream in(trace_file);
  ASSERT_TRUE(in.good()) << "no trace at " << trace_file;
  const nlohmann::json trace = nlohmann::json::parse(in);
  const int per_rank = 2 * kLayers.at("gpt") * kMicroBatches;  // first step only
  for (int rank = 0; rank < 2; ++rank) {
    int replays = 0, recomputes = 0;
    for (const auto& e : trace.at("traceEvents")) {
      if (e.value("ph", "") != "X" || e.value("pid", -1) != rank) continue;
      const std::string name = e.value("name", "");
      if (e.value("tid", -1) == 1 && name.rfind("AR fwd replay ", 0) == 0) ++replays;
      if (e.value("tid", -1) == 0 && name.rfind("R ", 0) == 0) ++recomputes;
    }
    EXPECT_EQ(replays, per_rank) << "rank " << rank;
    EXPECT_EQ(recomputes, per_rank) << "rank " << rank;
  }
  const fs::path cross_pass = train("gpt", {.tp = 2}, "tp2_cross_pass",
                                    sqrt_settings("cross-pass", 3));
  expect_equivalent(cross_pass, want, 3, "tp2 cross-pass sqrt k=3");
}

// Data parallelism, and pipelines (GPipe, 1F1B, zero-bubble, interleaved, 2bw) whose stages replay
// the parts of groups they hold (stage 0 holds layers 0-1, stage 1 layers 2-4 of the 5).
TEST_F(SqrtRecompute, GptUnderDataAndPipelineParallelismEqualsTheSingleProcessRun) {
  const fs::path want = reference("gpt");
  expect_equivalent(train("gpt", {.dp = 2}, "dp2", sqrt_settings("megatron", 0)), want, 2,
                    "dp2 megatron sqrt");
  // Under a pipeline the metrics and run.json both come from world rank 0: the first stage.
  expect_equivalent(train("gpt", {.pp = 2}, "pp2_1f1b",
                          sqrt_settings("megatron", 0) + " parallel.pipeline=" + quoted("1f1b")),
                    want, 2, "pp2 1f1b megatron sqrt");
  expect_equivalent(train("gpt", {.pp = 2}, "pp2_gpipe",
                          sqrt_settings("cross-pass", 5) + " parallel.pipeline=" + quoted("gpipe")),
                    want, 5, "pp2 gpipe cross-pass sqrt k=5");
  expect_equivalent(train("gpt", {.pp = 2}, "pp2_zero_bubble",
                          sqrt_settings("megatron", 0) + " parallel.pipeline=" +
                              quoted("zero-bubble")),
                    want, 2, "pp2 zero-bubble megatron sqrt");
  // Two chunks per rank: layers 0 | 1 | 2 | 3-4, groups of 3 cut at every chunk boundary.
  expect_equivalent(train("gpt", {.pp = 2}, "pp2_interleaved",
                          sqrt_settings("megatron", 3) + " parallel.pipeline=" +
                              quoted("interleaved") + " parallel.virtual_stages=2"),
                    want, 3, "pp2 interleaved megatron sqrt k=3");
  // 2bw trains on weights one version stale, so its reference is 2bw without recomputation.
  const std::string two_bw = " parallel.pipeline=" + quoted("2bw");
  const fs::path two_bw_reference =
      train("gpt", {.pp = 2}, "pp2_2bw_none",
            "parallel.schedule=" + quoted("megatron") + " parallel.recompute=" + quoted("none") +
                two_bw);
  expect_equivalent(train("gpt", {.pp = 2}, "pp2_2bw", sqrt_settings("cross-pass", 0) + two_bw),
                    two_bw_reference, 2, "pp2 2bw cross-pass sqrt");
}

TEST_F(SqrtRecompute, LlamaEqualsNoRecomputation) {
  const fs::path want = reference("llama");
  expect_equivalent(train("llama", {}, "megatron_default", sqrt_settings("megatron", 0)), want, 3,
                    "llama megatron sqrt");
  expect_equivalent(train("llama", {}, "megatron_k7", sqrt_settings("megatron", 7)), want, 7,
                    "llama megatron sqrt k=7");
  expect_equivalent(train("llama", {.tp = 2}, "tp2_cross_pass", sqrt_settings("cross-pass", 2)),
                    want, 2, "llama tp2 cross-pass sqrt k=2");
}

class SqrtRecomputeRejected : public SqrtRecompute {
 protected:
  // Single-process training with `settings` fails before a step and prints every phrase.
  void expect_rejected(const std::string& settings, const std::vector<std::string>& phrases) {
    const fs::path metrics = dir_ / "rejected.jsonl";
    const std::string command = std::string(OASES_BINARY) + " train --quiet --config " +
                                config("gpt").string() + " --set " + settings +
                                " log.metrics=" + quoted(metrics.string()) + " checkpoint.dir=" +
                                quoted((dir_ / "ckpt").string());
    const Result r = run_command(command);
    EXPECT_NE(r.exit_code, 0) << command << "\n" << r.output;
    for (const std::string& phrase : phrases)
      EXPECT_NE(r.output.find(phrase), std::string::npos)
          << command << "\nexpected \"" << phrase << "\" in:\n" << r.output;
    EXPECT_FALSE(fs::exists(metrics)) << command << ": a step ran";
  }
};

TEST_F(SqrtRecomputeRejected, BadSettingsNameTheSettingTheValueAndWhatIsValid) {
  for (int k : {6, -1})
    expect_rejected(sqrt_settings("megatron", 0) + " parallel.recompute_every=" + std::to_string(k),
                    {"parallel.recompute_every = " + std::to_string(k),
                     "out of range for model.layers = 5", "valid: 1 to 5",
                     "0 for round(sqrt(model.layers)) = 2"});
  for (const std::string schedule : {"oases", "fine-grained", "oases-interleaved"})
    expect_rejected(sqrt_settings(schedule, 0),
                    {"parallel.recompute = \"sqrt\"", "parallel.schedule = \"" + schedule + "\"",
                     "valid: recompute = \"sqrt\" with schedule = \"megatron\" or "
                     "\"cross-pass\""});
  expect_rejected("parallel.schedule=" + quoted("megatron") + " parallel.recompute=" +
                      quoted("full") + " parallel.recompute_every=2",
                  {"parallel.recompute_every = 2", "parallel.recompute resolves to \"full\"",
                   "valid: parallel.recompute = \"sqrt\""});
  expect_rejected("parallel.recompute=" + quoted("sqrt2"),
                  {"parallel.recompute = \"sqrt2\"",
                   "valid: \"none\", \"full\", \"selective\", \"fine-grained\", \"sqrt\""});
}

}  // namespace
