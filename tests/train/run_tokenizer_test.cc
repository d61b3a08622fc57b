// The tokenizer through a run: data.tokenizer_model and its default beside the shards, the
// vocabulary checks at training start, and the copy every checkpoint carries.
#include "data/prepare_data.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/token_shard.h"
#include "io/checkpoint_dir.h"
#include "train/checkpoint.h"
#include "plan/run_config.h"
#include "train/trainer.h"

#include "core/error.h"

#include "support/files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace oases::train {
namespace {

namespace fs = std::filesystem;

using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

const char* kCorpus = "/usr/share/games/fortunes/wisdom";

// A folder holding a 400-piece sentencepiece model (tok.model) and shards made with it
// (data_*.bin, with the copy data_tokenizer.model).
class RunTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kCorpus)) GTEST_SKIP() << "no " << kCorpus << "; install fortunes";
    model_ = train_model("tok", 400);
    data::prepare_data({kCorpus}, data_prefix(), 0.1, "sentencepiece", model_);
  }

  std::string train_model(const std::string& name, std::int64_t vocab_size) {
    data::SentencePieceTrainingOptions o;
    o.inputs = {kCorpus};
    o.model_prefix = dir_.file(name);
    o.type = "bpe";
    o.vocab_size = vocab_size;
    o.threads = 1;
    return data::train_sentencepiece(o).model_path;
  }

  std::string data_prefix() const { return dir_.file("data"); }

  plan::RunConfig config(const std::vector<std::string>& overrides = {}) const {
    std::vector<std::string> all = {"data.path=\"" + data_prefix() + "\""};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return plan::parse_run_config(R"(
[model]
layers = 1
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 420
seq_len = 16
[train]
micro_batch = 2
global_batch = 2
steps = 2
threads = 1
[data]
tokenizer = "sentencepiece"
[log]
peak_tflops = 1.0
)",
                            "run_tokenizer_test", all);
  }

  TrainSummary train(const plan::RunConfig& c) const {
    TrainOptions options;
    options.progress = false;
    return run_training(c, options);
  }

  oases::testing::TempDir dir_{"oases_run_tokenizer_test"};
  std::string model_;
};

TEST_F(RunTokenizer, TheModelIsFoundBesideTheShardsOrWhereTheConfigSays) {
  const plan::RunConfig c = config();
  EXPECT_EQ(tokenizer_model_path(c), data::tokenizer_model_beside_shards(data_prefix()));
  EXPECT_EQ(load_run_tokenizer(c)->vocab_size(), 400);
  const plan::RunConfig given = config({"data.tokenizer_model=\"" + model_ + "\""});
  EXPECT_EQ(tokenizer_model_path(given), model_);
  // The key survives the TOML a checkpoint stores.
  EXPECT_EQ(plan::parse_run_config(to_toml(given), "stored").data.tokenizer_model, model_);
  // byte and gpt2 from their defaults need no file at training start.
  EXPECT_EQ(plan::load_run_tokenizer(plan::parse_run_config("", "t")), nullptr);
  EXPECT_EQ(plan::load_run_tokenizer(plan::parse_run_config("[data]\ntokenizer = \"gpt2\"\n", "t")), nullptr);

  // Without the copy and without data.tokenizer_model, the error says where it looked.
  fs::remove(data::tokenizer_model_beside_shards(data_prefix()));
  EXPECT_EQ(tokenizer_model_path(c), "");
  expect_user_error([&] { train(c); },
                    {"data.tokenizer = \"sentencepiece\" needs its model file",
                     "data.tokenizer_model", data::tokenizer_model_beside_shards(data_prefix())});
  expect_user_error([&] { train(config({"data.tokenizer_model=\"" + dir_.file("no.model") + "\""})); },
                    {dir_.file("no.model"), "does not exist"});
  // A model file for the byte tokenizer is a mistake, not something to ignore.
  expect_user_error(
      [&] { config({"data.tokenizer=\"byte\"", "data.tokenizer_model=\"" + model_ + "\""}); },
      {"data.tokenizer_model", model_, "data.tokenizer = \"byte\""});
}

TEST_F(RunTokenizer, AVocabularyLargerThanTheModelsIsRefusedAtTrainingStart) {
  expect_user_error([&] { train(config({"model.vocab_size=399"})); },
                    {"model.vocab_size = 399", "sentencepiece tokenizer",
                     data::tokenizer_model_beside_shards(data_prefix()), "400 tokens",
                     "at least 400"});
  // Shards of one model with another: their vocabularies differ.
  const std::string other = train_model("other", 410);
  expect_user_error([&] { train(config({"data.tokenizer_model=\"" + other + "\""})); },
                    {"vocabulary of 400 tokens", other, "has 410", "another model"});
}

TEST_F(RunTokenizer, CheckpointsCarryTheModelAndGenerationUsesTheirCopy) {
  const std::string checkpoints = dir_.file("ck");
  const TrainSummary summary = train(config({"checkpoint.dir=\"" + checkpoints + "\""}));
  ASSERT_EQ(summary.steps.size(), 2u);
  const fs::path step = fs::path(checkpoints) / "step_2";
  ASSERT_EQ(summary.last_checkpoint, step.string());
  const std::string copy = (step / kTokenizerModelFile).string();
  EXPECT_EQ(read_bytes(copy), read_bytes(model_));
  EXPECT_NE(read_bytes((step / io::kCompleteMarker).string()).find("file tokenizer.model "),
            std::string::npos);
  EXPECT_EQ(verify_checkpoint(step.string()).step, 2);

  // The data folder's copy and the original may go: the checkpoint decodes on its own.
  fs::remove(data::tokenizer_model_beside_shards(data_prefix()));
  const std::vector<std::int32_t> tokens = data::load_token_shard(data_prefix() + "_val.bin").tokens;
  const std::string expected = data::make_tokenizer("sentencepiece", model_)->decode(tokens);
  fs::remove(model_);
  for (const std::string& where : {checkpoints, step.string(), (step / io::kModelFile).string()}) {
    const auto tokenizer = checkpoint_tokenizer(where);
    EXPECT_EQ(tokenizer->name(), "sentencepiece");
    EXPECT_EQ(tokenizer->decode(tokens), expected);
  }
  expect_user_error([&] { checkpoint_tokenizer(step.string(), dir_.file("gpt2")); },
                    {"carries", "tokenizer.model", "leave them out"});

  // A damaged copy fails verification (its CRC is in the marker); a missing one is named.
  std::string damaged = read_bytes(copy);
  damaged[damaged.size() / 2] ^= 0x20;
  write_bytes(copy, damaged);
  expect_user_error([&] { verify_checkpoint(step.string()); }, {"tokenizer.model", "CRC-32"});
  fs::remove(copy);
  expect_user_error([&] { checkpoint_tokenizer(step.string()); }, {"tokenizer.model", "missing"});
}

}  // namespace
}  // namespace oases::train
