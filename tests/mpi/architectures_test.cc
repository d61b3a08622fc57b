// LLaMA and BERT through everything GPT has: `mpirun -np N oases train` under tensor and data
// parallelism, the overlapped oases schedule with its fine-grained recomputation, per-layer
// plans and a resume under another layout give the losses, parameters and AdamW moments of the
// single-process run, in fp64 to relative 1e-10 (grouped-query attention's key/value heads and
// BERT's post-norms, masked-LM head and masks included: the masks are drawn from global sample
// indices, whichever rank draws them). LLaMA checkpoints generate text.
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;
using oases::testing::run_command;

using oases::testing::quoted;

class Architectures : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("architectures_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const bool llama = GetParam() == "llama";
    std::ofstream(dir_ / "tiny.toml") << "[model]\narch = \"" << GetParam() << "\"\n"
                                      << (llama ? "kv_heads = 2\n" : "") << R"(layers = 2
hidden = 64
heads = 4
ffn_hidden = 96
vocab_size = 263    # bytes + BERT's four special tokens + 3: padded under tp = 2 and 4
seq_len = 20
dropout = 0.1
[train]
precision = "fp64"  # the verification precision: every layout agrees to 1e-10
micro_batch = 4
global_batch = 8
steps = 3
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 1
[data]
path = ")" << (dir_ / "data").string()
                                      << "\"\n";
    oases::testing::write_random_init(dir_ / "tiny.toml", dir_ / "init.safetensors", 99);
  }

  std::optional<fs::path> train(int tp, int dp, const std::string& name,
                                const std::string& extra = "") const {
    const fs::path out = dir_ / name;
    const std::string command =
        oases::testing::train_command(OASES_BINARY, dir_, tp, dp, out, extra);
    const Result r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    if (r.exit_code != 0) return std::nullopt;
    return out;
  }

  void expect_matches(const fs::path& reference, const fs::path& run, const std::string& what,
                      int steps = 3) const {
    const auto want = oases::testing::metric_values(reference / "metrics.jsonl", "loss");
    expect_same_losses(oases::testing::metric_values(run / "metrics.jsonl", "loss"),
                       {want.end() - static_cast<std::ptrdiff_t>(steps), want.end()}, what);
    const fs::path last = fs::path("ckpt") / "step_3";
    expect_same_tensors(run / last / "model.safetensors", reference / last / "model.safetensors",
                        what);
    expect_same_tensors(run / last / "optimizer.safetensors",
                        reference / last / "optimizer.safetensors", what + " optimizer");
  }

  fs::path dir_;
};

TEST_P(Architectures, EveryLayoutScheduleAndPlanMatchesTheSingleProcessRun) {
  const auto reference = train(1, 1, "single", "checkpoint.every=1 checkpoint.keep=0");
  ASSERT_TRUE(reference.has_value());
  const std::vector<std::pair<std::string, std::pair<int, int>>> runs{
      {"tp2_megatron", {2, 1}}, {"dp2", {1, 2}}, {"tp2_dp2_oases", {2, 2}}, {"tp2_plan", {2, 1}}};
  for (const auto& [name, layout] : runs) {
    std::string settings = "parallel.schedule=megatron";
    if (name == "tp2_dp2_oases") settings = "parallel.schedule=oases";
    if (name == "tp2_plan") settings = "parallel.schedule=oases parallel.plan=" + quoted("1,2");
    const auto run = train(layout.first, layout.second, name, settings);
    if (run) expect_matches(*reference, *run, GetParam() + " " + name);
  }
  // A checkpoint of the single-process run resumes under tensor parallelism.
  fs::create_directories(dir_ / "resumed" / "ckpt");
  fs::copy(*reference / "ckpt" / "step_1", dir_ / "resumed" / "ckpt" / "step_1",
           fs::copy_options::recursive);
  const auto resumed = train(2, 1, "resumed", "checkpoint.resume=true");
  if (resumed) expect_matches(*reference, *resumed, GetParam() + " resumed at tp 2", 2);
}

TEST_P(Architectures, CausalCheckpointsGenerateAndMaskedOnesSayWhyNot) {
  const auto run = train(1, 1, "single", "train.steps=2");
  ASSERT_TRUE(run.has_value());
  const Result r = run_command(std::string(OASES_BINARY) + " generate --checkpoint " +
                               (*run / "ckpt").string() +
                               " --prompt Hello --max-new-tokens 8 --temperature 0");
  if (GetParam() == "llama") {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.rfind("Hello", 0), 0u) << r.output;
  } else {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("predicts masked tokens"), std::string::npos) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaAndBert, Architectures, ::testing::Values("llama", "bert"),
                         [](const ::testing::TestParamInfo<std::string>& test) { return test.param; });

}  // namespace
