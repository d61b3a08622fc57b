// SentencePiece: training (`oases train-tokenizer`), the lossless round trip on text with
// characters training never saw, prepare-data's shards and model copy, and the errors.
#include "data/prepare_data.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/files.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

using oases::testing::expect_user_error;
using oases::testing::leftover_temporaries;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_sentencepiece_test") {}
};

// English text from Debian's fortunes package (installed by install-deps.sh), about 120 KB.
const std::vector<std::string> kCorpus = {"/usr/share/games/fortunes/wisdom",
                                          "/usr/share/games/fortunes/linux"};

#define SKIP_WITHOUT_CORPUS()                                                   \
  do {                                                                          \
    for (const std::string& file : kCorpus)                                     \
      if (!fs::exists(file)) GTEST_SKIP() << "no " << file << "; install fortunes"; \
  } while (0)

SentencePieceTrainingSummary train(const std::string& prefix, const std::string& type,
                                   std::int64_t vocab_size) {
  SentencePieceTrainingOptions options;
  options.inputs = kCorpus;
  options.model_prefix = prefix;
  options.type = type;
  options.vocab_size = vocab_size;
  options.threads = 2;
  return train_sentencepiece(options);
}

// Text unlike the training text: scripts and symbols it never saw, control characters, NUL,
// runs of spaces at both ends, tabs, CRLF, the special pieces' names written as text.
std::string unseen_text() {
  std::string text = "  Hello,  world!\tnaïve café — 漢字とかな, Москва, Ελλάδα, 한국어 😀👍🏽 ";
  text += std::string("\0\x01\x1f\x7f", 4);
  text += "\r\n\n\n    indented\n</s> <s> <unk> <0x41> ▁ ▁▁ \u2581x\u00A0\u3000  ";
  return text;
}

TEST(SentencePiece, TrainsBothTypesAndEveryTextDecodesBackToItself) {
  SKIP_WITHOUT_CORPUS();
  TempDir dir;
  std::string english;
  for (const std::string& file : kCorpus) english += read_bytes(file);
  for (const std::string type : {"unigram", "bpe"}) {
    SCOPED_TRACE(type);
    const std::string prefix = dir.file("sub/folder/" + type);
    const SentencePieceTrainingSummary s = train(prefix, type, 1000);
    EXPECT_EQ(s.model_path, prefix + ".model");
    EXPECT_EQ(s.vocab_path, prefix + ".vocab");
    EXPECT_EQ(s.vocab_size, 1000);
    EXPECT_GT(s.sentences, 1000);
    EXPECT_EQ(s.input_bytes, static_cast<std::int64_t>(english.size()));
    EXPECT_TRUE(leftover_temporaries(fs::path(s.model_path).parent_path()).empty());

    const auto tokenizer = make_tokenizer("sentencepiece", s.model_path);
    EXPECT_EQ(tokenizer->name(), "sentencepiece");
    EXPECT_EQ(tokenizer->vocab_size(), 1000);
    EXPECT_EQ(tokenizer->document_separator(), std::optional<std::int32_t>(2));
    EXPECT_EQ(tokenizer->end_of_document(), 2);
    EXPECT_EQ(tokenizer->model_file_contents(), read_bytes(s.model_path));

    // The .vocab file: one "piece<TAB>score" line per id, byte pieces and specials included.
    std::istringstream vocab(read_bytes(s.vocab_path));
    std::vector<std::string> pieces;
    for (std::string line; std::getline(vocab, line);) {
      const std::size_t tab = line.find('\t');
      ASSERT_NE(tab, std::string::npos) << line;
      std::size_t used = 0;
      std::stod(line.substr(tab + 1), &used);
      EXPECT_EQ(used, line.size() - tab - 1) << line;
      pieces.push_back(line.substr(0, tab));
    }
    ASSERT_EQ(pieces.size(), 1000u);
    EXPECT_EQ(pieces[0], "<unk>");
    EXPECT_EQ(pieces[2], "</s>");
    EXPECT_NE(std::find(pieces.begin(), pieces.end(), "<0x0A>"), pieces.end());
    EXPECT_NE(std::find(pieces.begin(), pieces.end(), "<0xFF>"), pieces.end());

    // Lossless on the training text, on text it never saw, and on random valid UTF-8.
    for (const std::string& text : {english, unseen_text(), std::string(), std::string("\u2581"),
                                    std::string("\u2581\u2581 x\u2581")}) {
      const std::vector<std::int32_t> tokens = tokenizer->encode(text);
      ASSERT_EQ(tokenizer->decode(tokens), text);
      for (const std::int32_t t : tokens) {
        ASSERT_TRUE(t >= 0 && t < 1000) << t;
        ASSERT_NE(t, 2) << "encode produced the end-of-document token";
      }
    }
    std::mt19937 rng(5);
    const std::vector<std::string> pieces_of_text = {"a", "the ", " ", "  ", "\n", "\t", "é",
                                                     "漢", "😀", "\x01", "Z", "'", "\u2581"};
    for (int trial = 0; trial < 50; ++trial) {
      std::string text;
      while (text.size() < 500) text += pieces_of_text[rng() % pieces_of_text.size()];
      ASSERT_EQ(tokenizer->decode(tokenizer->encode(text)), text) << "trial " << trial;
    }
    // Training learned the language: English takes well under one token per byte, and
    // far fewer than text it never saw.
    const double english_rate =
        static_cast<double>(tokenizer->encode(english).size()) / static_cast<double>(english.size());
    EXPECT_LT(english_rate, 0.5);
    const std::string foreign = "漢字とかなのテキストです";  // bytes only: ~1 token per byte
    const double foreign_rate =
        static_cast<double>(tokenizer->encode(foreign).size()) / static_cast<double>(foreign.size());
    EXPECT_GT(foreign_rate, 0.9);
  }
}

TEST(SentencePiece, EncodeRefusesInvalidUtf8AndDecodeRefusesUnknownTokens) {
  SKIP_WITHOUT_CORPUS();
  TempDir dir;
  const auto tokenizer = make_tokenizer("sentencepiece", train(dir.file("t"), "bpe", 400).model_path);
  for (const std::string bad : {"ok \xC3", "\x80", "ab\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"})
    expect_user_error([&] { tokenizer->encode(bad); }, {"not", "UTF-8", "byte"});
  expect_user_error([&] { tokenizer->encode("caf\xC3\xA9 \xFF"); }, {"byte 6", "0xff", "UTF-8"});
  const std::vector<std::int32_t> outside = {5, 400};
  expect_user_error([&] { tokenizer->decode(outside); }, {"token 400", "position 1", "[0, 400)"});
  const std::vector<std::int32_t> negative = {-1};
  expect_user_error([&] { tokenizer->decode(negative); }, {"token -1", "position 0"});
}

TEST(SentencePiece, TrainingErrorsNameTheSetting) {
  SKIP_WITHOUT_CORPUS();
  TempDir dir;
  const std::string prefix = dir.file("tok");
  // The text needs more pieces than this (its characters plus byte fallback's 259).
  expect_user_error([&] { train(prefix, "unigram", 262); },
                    {"--vocab-size = 262 is too small", "at least 347 pieces", "120119 bytes"});
  // More pieces than the text can make.
  expect_user_error([&] { train(prefix, "unigram", 100000); },
                    {"--vocab-size = 100000 is too large", "at most", "Vocabulary size too high"});
  expect_user_error([&] { train(prefix, "bpe", 100); }, {"--vocab-size = 100", "[260, 2^31)"});
  expect_user_error([&] { train(prefix, "word", 400); }, {"--type = 'word'", "unigram, bpe"});
  EXPECT_FALSE(fs::exists(prefix + ".model"));
  EXPECT_FALSE(fs::exists(prefix + ".vocab"));

  // A failed training leaves the files of an earlier one as they were.
  train(prefix, "bpe", 400);
  const std::string model = read_bytes(prefix + ".model");
  expect_user_error([&] { train(prefix, "bpe", 100000); }, {"--vocab-size = 100000"});
  EXPECT_EQ(read_bytes(prefix + ".model"), model);

  SentencePieceTrainingOptions o;
  o.model_prefix = prefix;
  expect_user_error([&] { train_sentencepiece(o); }, {"at least one --input"});
  o.inputs = {dir.file("missing.txt")};
  expect_user_error([&] { train_sentencepiece(o); }, {"missing.txt", "does not exist"});
  write_bytes(dir.file("empty.txt"), "");
  o.inputs = {dir.file("empty.txt")};
  expect_user_error([&] { train_sentencepiece(o); }, {"empty.txt", "empty"});
  o.inputs = kCorpus;
  o.model_prefix = dir.file("folder/");
  expect_user_error([&] { train_sentencepiece(o); }, {"--model-prefix", "folder/"});
}

TEST(SentencePiece, LongLinesAreCutForTrainingNotSkipped) {
  TempDir dir;
  // One line of 60 KB: above the limit it would be dropped whole and teach nothing, leaving
  // too few characters for the vocabulary; cut, it trains.
  std::string line;
  std::mt19937 rng(3);
  const std::vector<std::string> words = {"alpha ", "beta ", "gamma ", "delta ", "épsilon ",
                                          "ζήτα ", "eta ", "theta "};
  while (line.size() < 60'000) line += words[rng() % words.size()];
  write_bytes(dir.file("long.txt"), line + "\n");
  SentencePieceTrainingOptions o;
  o.inputs = {dir.file("long.txt")};
  o.model_prefix = dir.file("tok");
  o.vocab_size = 300;
  o.type = "bpe";
  o.max_sentence_bytes = 1000;
  const SentencePieceTrainingSummary s = train_sentencepiece(o);
  EXPECT_GE(s.sentences, 60);  // at least 60 pieces of at most 1000 bytes
  const auto tokenizer = make_tokenizer("sentencepiece", s.model_path);
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(line)), line);
  EXPECT_LT(tokenizer->encode(line).size(), line.size() / 2);
}

TEST(SentencePiece, PrepareDataCopiesTheModelAndItsShardsDecodeToTheInput) {
  SKIP_WITHOUT_CORPUS();
  TempDir dir;
  const SentencePieceTrainingSummary model = train(dir.file("tok"), "unigram", 400);
  const std::string a = read_bytes(kCorpus[0]);
  const std::string b = "A second document, with characters training never saw: 漢字 😀\n";
  write_bytes(dir.file("b.txt"), b);
  const PrepareDataSummary s =
      prepare_data({kCorpus[0], dir.file("b.txt")}, dir.file("out/c"), 0.1, "sentencepiece",
                   model.model_path);
  EXPECT_EQ(s.tokenizer, "sentencepiece");
  EXPECT_EQ(s.vocab_size, 400);
  EXPECT_EQ(s.tokenizer_model_path, dir.file("out/c_tokenizer.model"));
  EXPECT_EQ(s.tokenizer_model_path, tokenizer_model_beside_shards(dir.file("out/c")));
  EXPECT_EQ(read_bytes(s.tokenizer_model_path), read_bytes(model.model_path));
  EXPECT_TRUE(leftover_temporaries(fs::path(s.tokenizer_model_path).parent_path()).empty());

  const TokenShard train_shard = load_token_shard(s.train_path);
  const TokenShard val_shard = load_token_shard(s.val_path);
  EXPECT_EQ(train_shard.tokenizer, "sentencepiece");
  EXPECT_EQ(train_shard.vocab_size, 400);
  EXPECT_GT(val_shard.size(), 0);
  std::vector<std::int32_t> tokens = train_shard.tokens;
  tokens.insert(tokens.end(), val_shard.tokens.begin(), val_shard.tokens.end());
  // The documents are separated by exactly one </s>, and each decodes to its file; the
  // tokenizer is loaded from the copy, as training would.
  ASSERT_EQ(std::count(tokens.begin(), tokens.end(), 2), 1);
  const auto eos = std::find(tokens.begin(), tokens.end(), 2);
  const auto copy = make_tokenizer("sentencepiece", s.tokenizer_model_path);
  EXPECT_EQ(copy->decode(std::vector<std::int32_t>(tokens.begin(), eos)), a);
  EXPECT_EQ(copy->decode(std::vector<std::int32_t>(eos + 1, tokens.end())), b);

  // The byte tokenizer leaves no model copy.
  EXPECT_TRUE(prepare_data({dir.file("b.txt")}, dir.file("byte"), 0.0, "byte").tokenizer_model_path.empty());
  EXPECT_FALSE(fs::exists(dir.file("byte_tokenizer.model")));
}

TEST(SentencePiece, MissingOrWrongModelFilesAreClearErrors) {
  TempDir dir;
  write_bytes(dir.file("text.txt"), "some text\n");
  expect_user_error([&] { make_tokenizer("sentencepiece"); },
                    {"needs its model file", "--tokenizer-model", "data.tokenizer_model",
                     "train-tokenizer"});
  expect_user_error([&] { make_tokenizer("sentencepiece", dir.file("none.model")); },
                    {dir.file("none.model"), "does not exist", "train-tokenizer"});
  expect_user_error(
      [&] {
        prepare_data({dir.file("text.txt")}, dir.file("c"), 0.0, "sentencepiece",
                     dir.file("none.model"));
      },
      {dir.file("none.model"), "does not exist"});
  EXPECT_FALSE(fs::exists(dir.file("c_train.bin")));
  write_bytes(dir.file("junk.model"), "this is not a protocol buffer \xff\xff\xff");
  expect_user_error([&] { make_tokenizer("sentencepiece", dir.file("junk.model")); },
                    {dir.file("junk.model"), "is not a SentencePiece model"});
  expect_user_error([&] { make_tokenizer("sentencepiece", dir.path().string()); },
                    {dir.path().string(), "not a regular file"});
  expect_user_error([&] { make_tokenizer("byte", dir.file("junk.model")); },
                    {"byte tokenizer reads no model file", "junk.model"});
  expect_user_error([&] { make_tokenizer("wordpiece"); }, {"wordpiece", "sentencepiece"});
  EXPECT_EQ(known_vocab_size("sentencepiece"), std::nullopt);
}

}  // namespace
}  // namespace oases::data
