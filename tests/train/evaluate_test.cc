// `oases eval`'s computation: the loss of a checkpoint on the non-overlapping windows of a shard
// equals the cross-entropy computed here from the model's logits of the same windows (fp64, to
// 1e-10), whatever the batch size and with a partial last batch; bits per byte of the byte
// tokenizer is exactly loss / ln 2; a shard of another tokenizer or shorter than one window is
// refused.
#include "train/evaluate.h"

#include "core/buffer.h"
#include "data/token_shard.h"
#include "io/checkpoint_dir.h"
#include "support/files.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using testing::expect_user_error;
using testing::TempDir;

constexpr std::int64_t kSeq = 16;

std::vector<std::int32_t> byte_tokens(const std::string& text) {
  return std::vector<std::int32_t>(text.begin(), text.end());
}

std::string sample_text(std::size_t bytes) {
  const std::string sentence =
      "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. ";
  std::string text;
  for (std::size_t i = 0; text.size() < bytes; ++i)
    text += sentence.substr(i % 7) + std::to_string(i * 37 % 101) + "\n";
  text.resize(bytes);
  return text;
}

// A checkpoint of a tiny fp64 GPT trained one step on `prefix`_train.bin.
std::string train_checkpoint(const TempDir& dir, const std::string& prefix) {
  plan::RunConfig config = plan::parse_run_config(
      R"(
[model]
layers = 1
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 256
seq_len = 16
dropout = 0.0
[train]
micro_batch = 2
global_batch = 2
steps = 1
lr = 1e-2
precision = "fp64"
[log]
peak_tflops = 1.0
)",
      "evaluate_test",
      {"data.path=\"" + prefix + "\"", "checkpoint.dir=\"" + dir.file("ckpt") + "\""});
  TrainOptions options;
  options.progress = false;
  return run_training(config, options).last_checkpoint;
}

// Mean cross-entropy of the first `windows` windows of `tokens`, from the model's logits of
// each window: log-sum-exp minus the target's logit, in double.
double reference_loss(const std::string& checkpoint, const std::vector<std::int32_t>& tokens,
                      std::int64_t windows) {
  plan::RunConfig config = config_from_checkpoint(checkpoint);
  config.train.micro_batch = 1;
  config.train.global_batch = 1;
  TrainingEngine engine(config);
  load_model_weights(io::resolve_model_file(checkpoint), engine.model().layout(),
                     engine.model().params());
  const std::int64_t vocab = config.model.vocab_size;
  Buffer buffer(static_cast<std::size_t>(kSeq * vocab) * sizeof(double));
  const Tensor logits = buffer.tensor(DType::f64, {kSeq, vocab});
  double sum = 0;
  for (std::int64_t w = 0; w < windows; ++w) {
    engine.logits(tokens.data() + w * kSeq, logits);
    for (std::int64_t p = 0; p < kSeq; ++p) {
      const double* row = logits.data<double>() + p * vocab;
      double max = row[0];
      for (std::int64_t v = 1; v < vocab; ++v) max = std::max(max, row[v]);
      double exp_sum = 0;
      for (std::int64_t v = 0; v < vocab; ++v) exp_sum += std::exp(row[v] - max);
      sum += max + std::log(exp_sum) - row[tokens[static_cast<std::size_t>(w * kSeq + p + 1)]];
    }
  }
  return sum / static_cast<double>(windows * kSeq);
}

class Evaluate : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_.file("data");
    data::write_token_shard(prefix_ + "_train.bin", "byte", 256, byte_tokens(sample_text(4000)));
    // 7 windows and 5 tokens left over, which no window covers.
    val_ = byte_tokens(sample_text(7 * kSeq + 1 + 4));
    data::write_token_shard(prefix_ + "_val.bin", "byte", 256, val_);
    checkpoint_ = train_checkpoint(dir_, prefix_);
    ASSERT_FALSE(checkpoint_.empty());
  }

  EvalResult evaluate(std::optional<std::int64_t> batch_size, std::int64_t batches) {
    EvalOptions options;
    options.checkpoint = dir_.file("ckpt");  // a checkpoint.dir: its newest checkpoint
    options.data = prefix_;
    options.batch_size = batch_size;
    options.batches = batches;
    comm::Mesh mesh = comm::Mesh::single_process();
    return evaluate_checkpoint(options, mesh);
  }

  TempDir dir_{"evaluate_test"};
  std::string prefix_, checkpoint_;
  std::vector<std::int32_t> val_;
};

TEST_F(Evaluate, LossIsTheCrossEntropyOfTheModelsLogitsOverEveryWindow) {
  const double want = reference_loss(checkpoint_, val_, 7);
  // Batch sizes that divide the windows, that leave a partial last batch, and one batch of all.
  for (const std::int64_t batch : {1, 3, 7, 8}) {
    const EvalResult r = evaluate(batch, 0);
    EXPECT_EQ(r.checkpoint, checkpoint_);
    EXPECT_EQ(r.windows, 7);
    EXPECT_EQ(r.tokens, 7 * kSeq);
    EXPECT_NEAR(r.loss, want, 1e-10 * want) << "batch size " << batch;
    EXPECT_EQ(r.perplexity, std::exp(r.loss));
    // The byte tokenizer: one byte per token, so bits per byte is the loss in bits.
    EXPECT_EQ(r.bytes, r.tokens);
    EXPECT_EQ(r.bits_per_byte, r.loss / std::log(2.0));
  }
}

TEST_F(Evaluate, BatchesLimitTheWindowsFromTheStart) {
  const EvalResult r = evaluate(2, 2);
  EXPECT_EQ(r.windows, 4);
  const double want = reference_loss(checkpoint_, val_, 4);
  EXPECT_NEAR(r.loss, want, 1e-10 * want);
  // More batches than the shard holds: every window, once.
  EXPECT_EQ(evaluate(2, 100).windows, 7);
}

// --batch-size 0 used to mean the default silently; left out it is the default, and any count
// below 1 is an error naming the option.
TEST_F(Evaluate, BatchSizeLeftOutIsTheTrainedOneAndBelowOneIsAnError) {
  EXPECT_EQ(evaluate(std::nullopt, 0).windows, 7);
  for (const std::int64_t bad : {0, -3})
    expect_user_error([&] { evaluate(bad, 0); },
                      {"--batch-size = " + std::to_string(bad), "at least 1", "leave it out"});
}

TEST_F(Evaluate, RefusesAShardOfAnotherTokenizerOrShorterThanOneWindow) {
  data::write_token_shard(prefix_ + "_val.bin", "gpt2", 50257, val_);
  expect_user_error([&] { evaluate(2, 0); }, {"data_val.bin", "\"gpt2\"", "\"byte\""});
  data::write_token_shard(prefix_ + "_val.bin", "byte", 256,
                          std::vector<std::int32_t>(val_.begin(), val_.begin() + kSeq));
  expect_user_error([&] { evaluate(2, 0); }, {"data_val.bin", "16 tokens", "17"});
  EvalOptions options;
  options.checkpoint = dir_.file("ckpt");
  options.data = prefix_;
  options.split = "test";
  comm::Mesh mesh = comm::Mesh::single_process();
  expect_user_error([&] { evaluate_checkpoint(options, mesh); },
                    {"--split", "test", "val", "train"});
  options.split = "val";
  options.checkpoint = dir_.file("nothing_here");
  expect_user_error([&] { evaluate_checkpoint(options, mesh); }, {"--checkpoint", "nothing_here"});
}

}  // namespace
}  // namespace oases::train
