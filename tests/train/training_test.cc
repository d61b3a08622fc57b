// Training on real English text (Debian's fortunes) lowers the validation loss well below its
// starting value (ln 256 = 5.55 for an untrained byte-level model).
#include "plan/run_config.h"
#include "data/loader.h"
#include "data/prepare_data.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

namespace oases::train {
namespace {

TEST(Training, LowersValidationLossOnDemoCorpus) {
  const std::string corpus = "/usr/share/games/fortunes/fortunes";
  ASSERT_TRUE(std::filesystem::exists(corpus)) << "install Debian's fortunes package";
  const auto dir = std::filesystem::current_path() / "training_test_data";
  std::filesystem::create_directories(dir);
  data::prepare_data({corpus, "/usr/share/games/fortunes/computers"}, (dir / "data").string(), 0.05, "byte");

  plan::RunConfig config = plan::parse_run_config(R"(
[model]
layers = 2
hidden = 96
heads = 4
ffn_hidden = 384
vocab_size = 256
seq_len = 64
[train]
micro_batch = 8
global_batch = 16
steps = 120
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
eval_every = 120
eval_steps = 4
[log]
peak_tflops = 1.0
)", "training_test", {"data.path=\"" + (dir / "data").string() + "\""});
  TrainOptions options;
  options.progress = false;
  const TrainSummary summary = run_training(config, options);
  ASSERT_TRUE(summary.initial_val_loss && summary.final_val_loss);
  std::printf("validation loss %.4f -> %.4f\n", *summary.initial_val_loss, *summary.final_val_loss);
  EXPECT_GT(*summary.initial_val_loss, 5.0);
  // Unigram byte statistics alone reach about 3.3 nats; the model must learn more than that.
  EXPECT_LT(*summary.final_val_loss, 3.0) << "from " << *summary.initial_val_loss;
}

}  // namespace
}  // namespace oases::train
