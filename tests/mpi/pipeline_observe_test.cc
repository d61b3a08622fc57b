// What a pipeline run shows of itself, end to end under `mpirun -np 2 oases train` with
// parallel.pp = 2: parallel.pipeline_layers = "auto" resolves to counts (logged, and stored in
// run.json's config); every step record has bubble_s; the start-up lines list each stage's
// layers and predicted activations; the trace names each Send and Recv with its payload,
// micro-batch, sub-batch and peer, and each rank's process its stage. And `oases plan
// --degrees-only` with parallel.pp = 2 lists every pipeline schedule, predicted where the
// runtime can run it.
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::quoted;
using oases::testing::run_command;

class PipelineObservability : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("pipeline_observe_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir_ / "gpt.toml") << R"(
[model]
arch = "gpt"
layers = 4
hidden = 32
heads = 4
ffn_hidden = 48
vocab_size = 257
seq_len = 16
[train]
micro_batch = 2
global_batch = 8
steps = 2
threads = 1
[data]
path = ")" + (dir_ / "data").string() + R"("
[log]
peak_tflops = 1.0
)";
  }

  static inline fs::path dir_;
};

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return nlohmann::json::parse(in);
}

TEST_F(PipelineObservability, AutoSplitBubbleMetricsStartUpLinesAndTrace) {
  const fs::path out = dir_ / "run";
  const std::string command =
      oases::testing::mpirun_prefix(2) + OASES_BINARY + " train --config " +
      (dir_ / "gpt.toml").string() + " --set parallel.pp=2 parallel.pipeline=gpipe " +
      "parallel.pipeline_layers=auto log.metrics=" + quoted((out / "metrics.jsonl").string()) +
      " log.trace=" + quoted((out / "trace.json").string());
  const Result r = run_command(command);
  ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.output;

  // The split: logged, and in run.json as counts of every layer.
  EXPECT_NE(r.output.find("parallel.pipeline_layers = \"auto\": layers per chunk"),
            std::string::npos)
      << r.output;
  const nlohmann::json run = read_json(out / "run.json");
  const std::string config = run.at("config").get<std::string>();
  const auto at = config.find("pipeline_layers = \"");
  ASSERT_NE(at, std::string::npos) << config;
  const std::string counts =
      config.substr(at + 19, config.find('"', at + 19) - (at + 19));
  int first = 0, second = 0;
  ASSERT_EQ(std::sscanf(counts.c_str(), "%d,%d", &first, &second), 2) << counts;
  EXPECT_GE(first, 1);
  EXPECT_GE(second, 1);
  EXPECT_EQ(first + second, 4) << counts;
  // The start-up line names both stages with their layers and predicted activations.
  const std::string stage0 = first > 1 ? "stage 0: layers 0-" + std::to_string(first - 1)
                                       : std::string("stage 0: layer 0");
  EXPECT_NE(r.output.find("pipeline stages: " + stage0 + " + embedding, peak activations "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" | stage 1: layer"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| bubble "), std::string::npos) << r.output;  // the progress line

  // bubble_s in every step's record: a wait inside the step.
  std::ifstream metrics(out / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.at("step").get<int>() == 0) continue;
    ++steps;
    ASSERT_TRUE(record.contains("bubble_s")) << line;
    const double bubble = record.at("bubble_s").get<double>();
    EXPECT_GE(bubble, 0.0) << line;
    EXPECT_LT(bubble, record.at("step_time_s").get<double>()) << line;
  }
  EXPECT_EQ(steps, 2);

  // The trace: each rank's messages of the step, named, and its stage.
  const nlohmann::json trace = read_json(out / "trace.json");
  std::map<int, std::multiset<std::string>> messages;
  std::map<int, std::string> process;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string name = e.at("name").get<std::string>();
    const int pid = e.at("pid").get<int>();
    if (name == "process_name") process[pid] = e.at("args").at("name").get<std::string>();
    if (name.rfind("Send ", 0) == 0 || name.rfind("Recv ", 0) == 0) messages[pid].insert(name);
  }
  EXPECT_NE(process[0].find("stage 0"), std::string::npos) << process[0];
  EXPECT_NE(process[1].find("stage 1"), std::string::npos) << process[1];
  // Four micro-batches of one sub-batch (global batch 8, micro-batch 2), one step traced.
  std::multiset<std::string> want0, want1;
  for (int mb = 0; mb < 4; ++mb) {
    const std::string where = " mb" + std::to_string(mb) + " sb0 ";
    want0.insert("Send act" + where + "-> 1");
    want0.insert("Recv grad" + where + "<- 1");
    want1.insert("Recv act" + where + "<- 0");
    want1.insert("Send grad" + where + "-> 0");
  }
  EXPECT_EQ(messages[0], want0);
  EXPECT_EQ(messages[1], want1);
}

TEST_F(PipelineObservability, PlanListsEveryPipelineSchedule) {
  const fs::path profile = dir_ / "profile.json";
  Result r = run_command(std::string(OASES_BINARY) + " profile --config " +
                         (dir_ / "gpt.toml").string() + " --steps 1 --output " + profile.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string plan = std::string(OASES_BINARY) + " plan --degrees-only --config " +
                           (dir_ / "gpt.toml").string() + " --profile " + profile.string() +
                           " --set parallel.pp=2 parallel.pipeline_layers=";
  r = run_command(plan + "auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("parallel.pipeline_layers = \"auto\": layers per stage "),
            std::string::npos)
      << r.output;
  r = run_command(plan + "1,3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pp = 2, 4 micro-batches per step, layers per stage 1,3"),
            std::string::npos)
      << r.output;
  // Every kind that lowers to one step is predicted; 2bw, whose steps carry a batch into the
  // next, has a line saying why it is not.
  const auto line_of = [](const std::string& output, const std::string& kind) {
    const auto at = output.find("  " + kind + " ");
    return at == std::string::npos ? std::string()
                                   : output.substr(at, output.find('\n', at) - at);
  };
  for (const std::string kind : {"gpipe", "1f1b", "interleaved", "zero-bubble"})
    EXPECT_NE(line_of(r.output, kind).find(" ms, bubble "), std::string::npos) << r.output;
  EXPECT_NE(line_of(r.output, "2bw").find("not predicted"), std::string::npos) << r.output;
  // A config with interleaved chunks (its counts are per chunk) predicts every kind too.
  r = run_command(plan + "uniform parallel.pipeline=interleaved parallel.virtual_stages=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string kind : {"gpipe", "interleaved"})
    EXPECT_NE(line_of(r.output, kind).find(" ms, bubble "), std::string::npos) << r.output;
  // There is no plan file to write for a pipeline.
  r = run_command(plan + "auto --output " + (dir_ / "plan.json").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--output"), std::string::npos) << r.output;
}

}  // namespace
