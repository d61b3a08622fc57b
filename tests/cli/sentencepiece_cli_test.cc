// A SentencePiece tokenizer end to end through the `oases` binary, as a user runs it: train
// the tokenizer, tokenize a corpus with it, train a tiny GPT on the shards, and generate from
// the checkpoint after the tokenizer files next to the data are gone.
#include "support/command.h"
#include "support/files.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;

Result run(const std::string& args) {
  return oases::testing::run_command(std::string(OASES_BINARY) + " " + args);
}

void expect_error(const Result& r, const std::vector<std::string>& fragments) {
  EXPECT_EQ(r.exit_code, 2) << r.output;  // bad input
  for (const auto& f : fragments)
    EXPECT_NE(r.output.find(f), std::string::npos) << "expected '" << f << "' in:\n" << r.output;
}

const std::string kCorpus = "/usr/share/games/fortunes/wisdom";

class SentencePieceCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kCorpus)) GTEST_SKIP() << "no " << kCorpus << "; install fortunes";
    dir_ = fs::current_path() / "sentencepiece_cli" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(SentencePieceCli, TrainTokenizerPrepareDataTrainAndGenerate) {
  Result r = run("train-tokenizer --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--vocab-size"), std::string::npos) << r.output;

  r = run("train-tokenizer --input " + kCorpus + " --model-prefix " + path("tok/spm") +
          " --vocab-size 400 --type bpe --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bpe tokenizer of 400 pieces"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(path("tok/spm.model")));
  ASSERT_TRUE(fs::exists(path("tok/spm.vocab")));

  r = run("prepare-data --tokenizer sentencepiece --tokenizer-model " + path("tok/spm.model") +
          " --input " + kCorpus + " --output " + path("data/wisdom") + " --val-fraction 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sentencepiece tokenizer, vocab 400"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("copied to " + path("data/wisdom_tokenizer.model")), std::string::npos)
      << r.output;
  EXPECT_EQ(oases::testing::read_bytes(path("data/wisdom_tokenizer.model")),
            oases::testing::read_bytes(path("tok/spm.model")));

  // The config names neither model file: training finds the copy beside the shards.
  oases::testing::write_bytes(path("tiny.toml"), R"(
[model]
layers = 1
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 400
seq_len = 16
[train]
micro_batch = 2
global_batch = 4
steps = 3
lr = 3e-3
eval_every = 3
eval_steps = 1
threads = 2
[data]
tokenizer = "sentencepiece"
path = ")" + path("data/wisdom") + R"("
[checkpoint]
dir = ")" + path("ck") + R"("
[log]
peak_tflops = 1.0
)");
  r = run("train --quiet --config " + path("tiny.toml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(path("ck/step_3/tokenizer.model")));
  expect_error(run("train --quiet --config " + path("tiny.toml") + " --set model.vocab_size=256"),
               {"model.vocab_size = 256", "400 tokens", "at least 400"});

  // Every tokenizer file outside the checkpoint is gone; generation uses the checkpoint's.
  fs::remove_all(path("tok"));
  fs::remove(path("data/wisdom_tokenizer.model"));
  r = run("verify-checkpoint " + path("ck/step_3"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run("generate --checkpoint " + path("ck") +
          " --prompt 'The wise ' --max-new-tokens 12 --seed 1 --top-k 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("The wise ", 0), 0u) << r.output;
  const Result empty = run("generate --checkpoint " + path("ck") + " --max-new-tokens 5 --seed 2");
  EXPECT_EQ(empty.exit_code, 0) << empty.output;
  // So does evaluation, which counts the bytes the tokens decode to with that model: bits per
  // byte = loss x tokens / (bytes x ln 2), as printed (6 significant digits).
  r = run("eval --checkpoint " + path("ck") + " --data " + path("data/wisdom"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  double loss = 0, perplexity = 0, bits_per_byte = 0;
  long long tokens = 0, bytes = 0;
  const std::size_t at = r.output.find("loss ");
  ASSERT_NE(at, std::string::npos) << r.output;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at,
                        "loss %lf nats/token | perplexity %lf | %lf bits/byte | %lld tokens (%lld "
                        "bytes)",
                        &loss, &perplexity, &bits_per_byte, &tokens, &bytes),
            5)
      << r.output;
  ASSERT_GT(tokens, 0);
  EXPECT_GT(bytes, tokens);  // sentencepiece pieces hold more than a byte on average
  EXPECT_NEAR(perplexity, std::exp(loss), 1e-5 * std::exp(loss));
  const double expected = loss * static_cast<double>(tokens) /
                          (static_cast<double>(bytes) * std::log(2.0));
  EXPECT_NEAR(bits_per_byte, expected, 1e-5 * expected);
  // Training again needs the model: the error says where it looked.
  expect_error(run("train --quiet --config " + path("tiny.toml")),
               {"data.tokenizer_model", path("data/wisdom_tokenizer.model")});
}

TEST_F(SentencePieceCli, BadTrainTokenizerSettingsAreErrorsNamingThem) {
  const std::string base = "train-tokenizer --input " + kCorpus + " --model-prefix " + path("t");
  expect_error(run(base + " --type word"), {"--type = 'word'", "unigram, bpe"});
  expect_error(run(base + " --vocab-size 100000 --type bpe"),
               {"--vocab-size = 100000 is too large", "Vocabulary size too high"});
  expect_error(run(base + " --vocab-size 12"), {"--vocab-size = 12", "259"});
  expect_error(run("train-tokenizer --input " + path("none.txt") + " --model-prefix " + path("t")),
               {path("none.txt"), "does not exist"});
  expect_error(run("prepare-data --tokenizer sentencepiece --input " + kCorpus + " --output " +
                   path("d")),
               {"needs its model file", "--tokenizer-model"});
  expect_error(run("prepare-data --tokenizer sentencepiece --tokenizer-model " +
                   path("none.model") + " --input " + kCorpus + " --output " + path("d")),
               {path("none.model"), "does not exist"});
  EXPECT_FALSE(fs::exists(path("t.model")));
  EXPECT_FALSE(fs::exists(path("d_train.bin")));
}

}  // namespace
