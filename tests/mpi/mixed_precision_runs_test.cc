// Mixed precision through `oases train` on several ranks: bf16 and fp16 under tensor
// parallelism with the oases schedule (16-bit slots and tensor-parallel collectives; bf16 with
// sequence parallelism too), and bf16
// with data-parallel gradients reduced in bf16 (train.grad_reduce_dtype), each 300 steps on real
// text ending within 3% of the single-process fp32 run's validation loss; fp16's metrics carry
// the loss scale and skipped steps; run.json names the 16-bit product path measured at start-up.
#include "support/command.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::quoted;
using oases::testing::RunLayout;

class MixedPrecisionRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("mixed_precision_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir_ / "gpt.toml") << R"([model]
layers = 2
hidden = 96
heads = 4
ffn_hidden = 384
vocab_size = 256
seq_len = 64
[train]
micro_batch = 8
global_batch = 16
steps = 300
lr = 3e-3
min_lr = 3e-4
warmup_steps = 20
eval_every = 300
eval_steps = 8
[data]
path = ")" + (dir_ / "data").string() + R"("
[log]
peak_tflops = 1.0
)";
    oases::testing::write_random_init(dir_ / "gpt.toml", dir_ / "init.safetensors", 17);
  }
  fs::path train(RunLayout layout, const std::string& name, const std::string& settings) const {
    return oases::testing::train_run(OASES_BINARY, dir_ / "gpt.toml", dir_ / "init.safetensors",
                                     layout, dir_ / name, settings);
  }
  static double final_val_loss(const fs::path& run) {
    const auto values = oases::testing::recorded_values(run / "metrics.jsonl", "val_loss");
    EXPECT_FALSE(values.empty()) << run;
    return values.empty() ? 0.0 : values.back();
  }
  fs::path dir_;
};

TEST_F(MixedPrecisionRuns, TensorAndDataParallel16BitRunsEndWithin3PercentOfFp32) {
  const double fp32 = final_val_loss(train({}, "fp32", ""));
  struct Case {
    RunLayout layout;
    std::string name, settings;
  };
  const std::vector<Case> cases{
      {{2, 1, 1},
       "tp2_oases_bf16",
       "train.precision=" + quoted("bf16") + " parallel.schedule=" + quoted("oases")},
      {{2, 1, 1},
       "tp2_oases_fp16",
       "train.precision=" + quoted("fp16") + " parallel.schedule=" + quoted("oases")},
      // Sequence parallelism: 16-bit shards, gathers and reduce-scatters.
      {{2, 1, 1},
       "tp2_oases_bf16_sequence_parallel",
       "train.precision=" + quoted("bf16") + " parallel.schedule=" + quoted("oases") +
           " parallel.sequence_parallel=true"},
      // Context parallelism: 16-bit all-to-alls of q|k|v and attention outputs (two ranks,
      // counted as the layout's dp = 2, set to cp = 2 x dp = 1).
      {{1, 1, 2},
       "cp2_bf16_all_to_all",
       "train.precision=" + quoted("bf16") + " parallel.dp=1 parallel.cp=2"},
      // The ring kind: 16-bit k|v blocks and their gradients shifted, partial attention
      // merged by log-sum-exp in f32 and rounded once per merge.
      {{1, 1, 2},
       "cp2_bf16_ring",
       "train.precision=" + quoted("bf16") +
           " parallel.dp=1 parallel.cp=2 parallel.cp_kind=" + quoted("ring")},
      {{1, 1, 2},
       "dp2_bf16_reduce_bf16",
       "train.precision=" + quoted("bf16") + " train.grad_reduce_dtype=" + quoted("bf16")},
  };
  for (const Case& c : cases) {
    const fs::path run = train(c.layout, c.name, c.settings);
    const double loss = final_val_loss(run);
    std::printf("val_loss after 300 steps: fp32 %.4f, %s %.4f (%+.2f%%)\n", fp32, c.name.c_str(),
                loss, 100 * (loss / fp32 - 1));
    EXPECT_NEAR(loss, fp32, 0.03 * fp32) << c.name;
    std::ifstream in(run / "run.json");
    const auto description = nlohmann::json::parse(in);
    const std::string config = description.at("config").get<std::string>();
    EXPECT_EQ(config.find("gemm16_path = \"auto\""), std::string::npos)
        << c.name << ": run.json should name the measured path\n" << config;
  }
  const auto scales = oases::testing::recorded_values(dir_ / "tp2_oases_fp16" / "metrics.jsonl",
                                                      "loss_scale");
  const auto skipped = oases::testing::recorded_values(dir_ / "tp2_oases_fp16" / "metrics.jsonl",
                                                       "skipped_steps");
  ASSERT_EQ(scales.size(), 300u);
  ASSERT_EQ(skipped.size(), 300u);
  EXPECT_EQ(scales.front(), 65536);
  EXPECT_EQ(skipped.back(), 0);
  EXPECT_TRUE(oases::testing::recorded_values(dir_ / "tp2_oases_bf16" / "metrics.jsonl",
                                              "loss_scale").empty())
      << "bf16 does not scale its loss";
}

}  // namespace
