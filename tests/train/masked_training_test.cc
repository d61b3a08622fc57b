// Training and evaluation on a shard with a loss mask (data/token_shard.h), in fp64:
//  - the loss of a batch is the mean, over the targets the mask counts, of the cross-entropy
//    computed here from the model's logits, and its gradient is made of the gradients of
//    groups of those targets taken separately: masked tokens contribute nothing (relative
//    1e-10);
//  - a batch without a counted target has loss 0 and a zero gradient;
//  - `oases eval`'s loss, token and byte counts, and the trainer's validation loss, are those of
//    the counted targets only (the same reference);
//  - BERT, which chooses its own targets, refuses a masked shard.
// Data-parallel training with gradient accumulation is in loss_mask_mpitest.cc.
#include "core/buffer.h"
#include "core/philox.h"
#include "data/loader.h"
#include "data/token_shard.h"
#include "io/checkpoint_dir.h"
#include "kernels/kernels.h"
#include "support/files.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/batches.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/evaluate.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::expect_user_error;
using oases::testing::relative_difference;
using oases::testing::TempDir;
using oases::testing::values;

constexpr std::int64_t kSeq = 16, kBatch = 4, kVocab = 50;

plan::RunConfig fp64_gpt() {
  plan::RunConfig c = oases::testing::tiny_run();
  c.model.seq_len = kSeq;
  c.train.micro_batch = 2;
  c.train.global_batch = kBatch;
  c.train.precision = "fp64";
  return c;
}

// `count` tokens of a vocabulary of `vocab` and a mask counting about half of them (Philox).
data::TokenShard random_masked_shard(std::int64_t count, std::int64_t vocab, std::uint64_t seed) {
  data::TokenShard shard;
  shard.path = "memory_train.bin";
  shard.tokenizer = "test";
  shard.vocab_size = vocab;
  shard.token_width = 2;
  shard.version = 3;
  const PhiloxKey key = philox_key(seed, fnv1a64("masked_training_test"));
  for (std::int64_t i = 0; i < count; ++i) {
    const auto r = philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key);
    shard.tokens.push_back(static_cast<std::int32_t>(r[0] % static_cast<std::uint32_t>(vocab)));
    shard.loss_mask.push_back(static_cast<std::uint8_t>(r[1] & 1));
  }
  return shard;
}

// Cross-entropy of every position of `rows` rows of `inputs` against `targets` (-1: skipped),
// from the engine's logits in double: log-sum-exp minus the target's logit. Returns the sum
// and adds the number of counted targets to `counted`. The engine's micro-batch is one row.
double reference_loss_sum(TrainingEngine& engine, const std::int32_t* inputs,
                          const std::int32_t* targets, std::int64_t rows, std::int64_t* counted) {
  const std::int64_t vocab = engine.config().model.vocab_size;
  Buffer buffer(static_cast<std::size_t>(kSeq * vocab) * sizeof(double));
  const Tensor logits = buffer.tensor(DType::f64, {kSeq, vocab});
  double sum = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    engine.logits(inputs + r * kSeq, logits);
    for (std::int64_t p = 0; p < kSeq; ++p) {
      const std::int32_t target = targets[r * kSeq + p];
      if (target < 0) continue;
      const double* row = logits.data<double>() + p * vocab;
      const double max = *std::max_element(row, row + vocab);
      double exp_sum = 0;
      for (std::int64_t v = 0; v < vocab; ++v) exp_sum += std::exp(row[v] - max);
      sum += max + std::log(exp_sum) - row[target];
      ++*counted;
    }
  }
  return sum;
}

// One row per micro-batch, for engine.logits.
plan::RunConfig one_row(plan::RunConfig c) {
  c.train.micro_batch = 1;
  c.train.global_batch = 1;
  return c;
}

TEST(MaskedTraining, MaskedTargetsGetNoGradient) {
  const plan::RunConfig config = fp64_gpt();
  const data::TokenShard shard = random_masked_shard(40 * kSeq + 5, kVocab, 1);
  const data::DataLoader loader(shard, kSeq, kBatch, /*shuffle=*/true, 3);
  const BatchMaker batches(config, loader, kVocab);
  TrainingEngine engine(config);
  TrainingEngine logits_engine(one_row(config));  // the same initial weights (seeded by name)

  for (const std::int64_t step : {0, 7}) {
    Batch batch;
    batches.training(step, 0, kBatch, batch);
    const std::int64_t counted = std::count_if(batch.targets.begin(), batch.targets.end(),
                                               [](std::int32_t t) { return t >= 0; });
    ASSERT_GT(counted, 0);
    ASSERT_LT(counted, kBatch * kSeq);  // the mask left some out
    const double loss =
        engine.compute_gradients(step, batch.inputs.data(), batch.targets.data(), kBatch);
    const std::vector<double> gradient = values(engine.model().grads());

    // The loss: the mean over the counted targets of the cross-entropy from the logits.
    std::int64_t reference_count = 0;
    const double reference = reference_loss_sum(logits_engine, batch.inputs.data(),
                                                batch.targets.data(), kBatch, &reference_count);
    EXPECT_EQ(reference_count, counted);
    EXPECT_NEAR(loss, reference / static_cast<double>(counted), 1e-10 * loss) << "step " << step;

    // The gradient: the sum of the gradients of groups of the counted targets, each from a
    // batch that counts that group alone (mean over it, times its share), so the masked
    // targets, in no group, contribute nothing. Groups of 4 keep the test short.
    constexpr std::int64_t kGroups = 8;
    std::vector<double> mean(gradient.size(), 0.0);
    for (std::int64_t group = 0; group < kGroups; ++group) {
      std::vector<std::int32_t> alone(batch.targets.size(), -1);
      std::int64_t in_group = 0, seen = 0;
      for (std::size_t i = 0; i < batch.targets.size(); ++i) {
        if (batch.targets[i] < 0) continue;
        if (seen++ % kGroups != group) continue;
        alone[i] = batch.targets[i];
        ++in_group;
      }
      if (in_group == 0) continue;
      engine.compute_gradients(step, batch.inputs.data(), alone.data(), kBatch);
      const std::vector<double> part = values(engine.model().grads());
      const double share = static_cast<double>(in_group) / static_cast<double>(counted);
      for (std::size_t k = 0; k < mean.size(); ++k) mean[k] += share * part[k];
    }
    EXPECT_LT(relative_difference(gradient, mean), 1e-10) << "step " << step;

    // Without the mask the gradient is another one: the mask is what made the difference.
    std::vector<std::int32_t> every(batch.targets.size());
    for (std::int64_t r = 0; r < kBatch; ++r)
      for (std::int64_t t = 0; t < kSeq; ++t)
        every[static_cast<std::size_t>(r * kSeq + t)] = shard.tokens[static_cast<std::size_t>(
            (loader.window_start(step, r) + t + 1) % shard.size())];
    engine.compute_gradients(step, batch.inputs.data(), every.data(), kBatch);
    EXPECT_GT(relative_difference(values(engine.model().grads()), gradient), 1e-3);
  }
}

TEST(MaskedTraining, ABatchWithoutCountedTargetsHasNoLossAndNoGradient) {
  const plan::RunConfig config = fp64_gpt();
  // Unshuffled, step 0 reads tokens [0, 4 x 16]; its targets are tokens 1 to 64. Only the
  // shard's last token counts.
  data::TokenShard shard = random_masked_shard(10 * kSeq, kVocab, 2);
  std::fill(shard.loss_mask.begin(), shard.loss_mask.end(), 0);
  shard.loss_mask.back() = 1;
  const data::DataLoader loader(shard, kSeq, kBatch, /*shuffle=*/false, 0);
  const BatchMaker batches(config, loader, kVocab);
  Batch batch;
  batches.training(0, 0, kBatch, batch);
  for (const std::int32_t t : batch.targets) ASSERT_EQ(t, -1);
  EXPECT_EQ(batches.validation_targets(0), 0);
  TrainingEngine engine(config);
  EXPECT_EQ(engine.compute_gradients(0, batch.inputs.data(), batch.targets.data(), kBatch), 0.0);
  EXPECT_EQ(kernels::sum_of_squares(engine.model().grads()), 0.0);
  EXPECT_EQ(engine.evaluate(batch.inputs.data(), batch.targets.data(), kBatch), 0.0);
}

TEST(MaskedTraining, BertRefusesAMaskedShard) {
  plan::RunConfig config = fp64_gpt();
  config.model.arch = model::ArchitectureKind::bert;
  config.model.vocab_size = kVocab + 4;
  const data::TokenShard shard = random_masked_shard(10 * kSeq, kVocab, 3);
  const data::DataLoader loader(shard, kSeq, kBatch, false, 0);
  expect_user_error([&] { BatchMaker(config, loader, kVocab); },
                    {"memory_train.bin", "loss mask", "bert", "gpt"});
}

// ---------------------------------------------------------------------------------------
// `oases train`'s validation and `oases eval` on masked shards

std::vector<std::uint8_t> half_mask(std::size_t count, std::uint64_t seed) {
  std::vector<std::uint8_t> mask(count);
  const PhiloxKey key = philox_key(seed, fnv1a64("masked_training_test.mask"));
  for (std::size_t i = 0; i < count; ++i)
    mask[i] =
        static_cast<std::uint8_t>(philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key)[0] & 1);
  return mask;
}

std::vector<std::int32_t> text_tokens(std::size_t count) {
  const std::string sentence = "User: what is a fox? Assistant: a quick brown animal. ";
  std::vector<std::int32_t> tokens(count);
  for (std::size_t i = 0; i < count; ++i)
    tokens[i] = static_cast<unsigned char>(sentence[(i * 7 + i / 13) % sentence.size()]);
  return tokens;
}

TEST(MaskedTraining, EvaluationAndValidationCountOnlyMaskedTargets) {
  TempDir dir("masked_training_test");
  const std::string prefix = dir.file("chat");
  constexpr std::int64_t kEvalSteps = 3, kValWindows = kEvalSteps * 2;  // global batch 2
  const std::vector<std::int32_t> train = text_tokens(3000);
  data::write_token_shard(prefix + "_train.bin", "byte", 256, train, half_mask(train.size(), 1));
  // Validation batch i holds windows 2i and 2i + 1 (unshuffled), the windows `oases eval`
  // takes in batches of 2: both evaluate the same targets.
  const std::vector<std::int32_t> val = text_tokens(kValWindows * kSeq + 1);
  const std::vector<std::uint8_t> val_mask = half_mask(val.size(), 2);
  data::write_token_shard(prefix + "_val.bin", "byte", 256, val, val_mask);

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
micro_batch = 1
global_batch = 2
steps = 2
lr = 1e-2
precision = "fp64"
eval_every = 2
eval_steps = 3
[log]
peak_tflops = 1.0
)",
      "masked_training_test",
      {"data.path=\"" + prefix + "\"", "checkpoint.dir=\"" + dir.file("ckpt") + "\""});
  TrainOptions options;
  options.progress = false;
  const TrainSummary summary = run_training(config, options);
  ASSERT_FALSE(summary.last_checkpoint.empty());
  ASSERT_TRUE(summary.final_val_loss.has_value());

  // The reference: the checkpoint's model, the counted targets of every validation window.
  plan::RunConfig one = one_row(config_from_checkpoint(summary.last_checkpoint));
  TrainingEngine engine(one);
  load_model_weights(io::resolve_model_file(summary.last_checkpoint), engine.model().layout(),
                     engine.model().params());
  std::vector<std::int32_t> targets(val.begin() + 1, val.end());
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (val_mask[i + 1] == 0) targets[i] = -1;
  std::int64_t counted = 0;
  const double sum = reference_loss_sum(engine, val.data(), targets.data(), kValWindows, &counted);
  ASSERT_GT(counted, 0);
  ASSERT_LT(counted, kValWindows * kSeq);
  const double want = sum / static_cast<double>(counted);

  // The validation loss weighs each batch's mean by its counted targets.
  EXPECT_NEAR(*summary.final_val_loss, want, 1e-10 * want);

  EvalOptions eval;
  eval.checkpoint = summary.last_checkpoint;
  eval.data = prefix;
  for (const std::int64_t batch : {2, 4}) {  // 4: a partial last batch
    eval.batch_size = batch;
    comm::Mesh mesh = comm::Mesh::single_process();
    const EvalResult r = evaluate_checkpoint(eval, mesh);
    EXPECT_EQ(r.windows, kValWindows);
    EXPECT_EQ(r.tokens, counted);
    EXPECT_EQ(r.bytes, counted);  // the byte tokenizer: a byte per counted token
    EXPECT_NEAR(r.loss, want, 1e-10 * want) << "batch size " << batch;
    EXPECT_NEAR(r.bits_per_byte, r.loss / std::log(2.0), 1e-14 * r.loss);
  }
}

TEST(MaskedTraining, EvaluationRefusesWindowsWithoutCountedTargets) {
  TempDir dir("masked_training_test");
  const std::string prefix = dir.file("chat");
  data::write_token_shard(prefix + "_train.bin", "byte", 256, text_tokens(3000));
  // Only the last token counts; the first window (tokens 0 to 16) has no counted target.
  const std::vector<std::int32_t> val = text_tokens(4 * kSeq + 1);
  std::vector<std::uint8_t> mask(val.size(), 0);
  mask.back() = 1;
  data::write_token_shard(prefix + "_val.bin", "byte", 256, val, mask);
  plan::RunConfig config = fp64_gpt();
  config.model.vocab_size = 256;
  config.data.path = prefix;
  config.data.tokenizer = "byte";
  config.train.steps = 1;
  config.train.eval_every = 0;
  config.log.peak_tflops = 1.0;  // no measurement of this host's peak
  config.checkpoint.dir = dir.file("ckpt");
  TrainOptions options;
  options.progress = false;
  const TrainSummary summary = run_training(config, options);
  EvalOptions eval;
  eval.checkpoint = summary.last_checkpoint;
  eval.data = prefix;
  eval.batch_size = 1;
  eval.batches = 1;
  comm::Mesh mesh = comm::Mesh::single_process();
  expect_user_error([&] { evaluate_checkpoint(eval, mesh); },
                    {"chat_val.bin", "counts none of the 16 target tokens", "--batches"});
  eval.batches = 0;  // every window: the last one's last target counts
  const EvalResult r = evaluate_checkpoint(eval, mesh);
  EXPECT_EQ(r.tokens, 1);
  EXPECT_GT(r.loss, 0.0);
}

}  // namespace
}  // namespace oases::train
