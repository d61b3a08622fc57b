// prepare_data: plain-text and JSONL inputs, weighted blends, bad inputs and the progress line.
// References are built here from the texts themselves: the tokenizer applied to each document
// directly, and each source's documents recognised in the output by their bytes.
#include "data/prepare_data.h"

#include "data/gpt2_tokenizer.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/command.h"
#include "support/files.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_prepare_data_test") {}
};

using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

std::string text_of_length(std::size_t n, unsigned salt) {
  std::string text(n, '\0');
  for (std::size_t i = 0; i < n; ++i) text[i] = static_cast<char>((i * 131 + salt) % 256);
  return text;
}

std::vector<std::int32_t> as_tokens(const std::string& text) {
  std::vector<std::int32_t> tokens;
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

// Train and validation shards joined: the whole stream prepare_data produced.
std::vector<std::int32_t> stream_of(const PrepareDataSummary& s) {
  std::vector<std::int32_t> all = load_token_shard(s.train_path).tokens;
  const std::vector<std::int32_t> val = load_token_shard(s.val_path).tokens;
  all.insert(all.end(), val.begin(), val.end());
  return all;
}

// A JSONL file with one object per text, the text under `field` among other keys.
std::string jsonl_of(const std::vector<std::string>& texts, const std::string& field = "text") {
  std::string out;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    nlohmann::json line = {{"id", i}, {field, texts[i]}, {"meta", {{"source", "test"}}}};
    out += line.dump() + "\n";
  }
  return out;
}

// Runs its scope with `threads` OpenMP threads, so that parallel tokenization is exercised
// with several threads whatever the machine.
class OmpThreads {
 public:
  explicit OmpThreads(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

bool have_gpt2_files() {
  const fs::path dir = default_gpt2_tokenizer_dir();
  return fs::exists(dir / kGpt2EncoderFile) && fs::exists(dir / kGpt2MergesFile);
}

#define SKIP_WITHOUT_GPT2_FILES()                                                          \
  do {                                                                                     \
    if (!have_gpt2_files())                                                                \
      GTEST_SKIP() << "no gpt2 files in " << default_gpt2_tokenizer_dir()                  \
                   << "; bash scripts/install-deps.sh installs them";                      \
  } while (0)

const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer("gpt2");
  return *tokenizer;
}

std::vector<std::string> fortune_files() {
  std::vector<std::string> files;
  for (const char* name : {"computers", "science", "linux", "wisdom", "people"}) {
    const std::string path = std::string("/usr/share/games/fortunes/") + name;
    if (fs::exists(path)) files.push_back(path);
  }
  return files;
}

// ---------------------------------------------------------------------------------------
// Plain text, unweighted (moved from token_data_test, plus the byte-for-byte check)

TEST(PrepareData, SplitsTheConcatenatedInputsWithTheLastFractionForValidation) {
  TempDir dir;
  const std::string a = text_of_length(600, 7), b = text_of_length(400, 91);
  write_bytes(dir.file("a.txt"), a);
  write_bytes(dir.file("b.txt"), b);
  const std::string prefix = dir.file("out/corpus");  // parent directory does not exist yet
  const PrepareDataSummary summary =
      prepare_data({dir.file("a.txt"), dir.file("b.txt")}, prefix, 0.123, "byte");

  EXPECT_EQ(summary.tokenizer, "byte");
  EXPECT_EQ(summary.vocab_size, 256);
  EXPECT_EQ(summary.input_bytes, 1000);
  EXPECT_EQ(summary.total_tokens, 1000);
  EXPECT_EQ(summary.val_tokens, 123);
  EXPECT_EQ(summary.train_tokens, 877);
  EXPECT_EQ(summary.train_path, prefix + "_train.bin");
  EXPECT_EQ(summary.val_path, prefix + "_val.bin");
  EXPECT_FALSE(summary.weighted);

  const std::vector<std::int32_t> all = as_tokens(a + b);
  const TokenShard train = load_token_shard(summary.train_path);
  const TokenShard val = load_token_shard(summary.val_path);
  EXPECT_EQ(train.tokens, std::vector<std::int32_t>(all.begin(), all.begin() + 877));
  EXPECT_EQ(val.tokens, std::vector<std::int32_t>(all.begin() + 877, all.end()));
  EXPECT_EQ(train.tokenizer, "byte");
  EXPECT_EQ(train.vocab_size, 256);
  EXPECT_EQ(train.token_width, 2u);
  EXPECT_EQ(fs::file_size(summary.train_path), kTokenShardHeaderBytes + 2 * 877);

  // Nothing is left under a temporary name.
  for (const auto& entry : fs::directory_iterator(dir.path() / "out"))
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path();
}

TEST(PrepareData, ValidationSizeIsTheRoundedFraction) {
  TempDir dir;
  write_bytes(dir.file("in.txt"), text_of_length(1000, 3));
  for (const auto& [fraction, expected_val] : std::vector<std::pair<double, std::int64_t>>{
           {0.1, 100}, {0.29, 290}, {0.0015, 2}, {0.5, 500}, {0.999, 999}}) {
    const PrepareDataSummary s =
        prepare_data({dir.file("in.txt")}, dir.file("c"), fraction, "byte");
    EXPECT_EQ(s.val_tokens, expected_val) << fraction;
    EXPECT_EQ(load_token_shard(s.val_path).size(), expected_val) << fraction;
    EXPECT_EQ(load_token_shard(s.train_path).size(), 1000 - expected_val) << fraction;
  }
}

TEST(PrepareData, ZeroFractionKeepsEverythingForTraining) {
  TempDir dir;
  const std::string text = "hello, world";
  write_bytes(dir.file("in.txt"), text);
  const PrepareDataSummary s = prepare_data({dir.file("in.txt")}, dir.file("c"), 0.0, "byte");
  EXPECT_EQ(s.train_tokens, 12);
  EXPECT_EQ(s.val_tokens, 0);
  EXPECT_EQ(load_token_shard(s.train_path).tokens, as_tokens(text));
  EXPECT_TRUE(load_token_shard(s.val_path).tokens.empty());
}

// Many plain files, tokenized on 4 threads: the shards are, byte for byte, those written from
// each file encoded on its own and joined with the separator, in the order given.
TEST(PrepareData, UnweightedPlainTextIsEachFileEncodedInOrderByteForByte) {
  SKIP_WITHOUT_GPT2_FILES();
  const std::vector<std::string> fortunes = fortune_files();
  ASSERT_FALSE(fortunes.empty()) << "no fortunes in /usr/share/games/fortunes";
  TempDir dir;
  // The fortune files cut into pieces of various sizes: many documents for the threads.
  std::vector<std::string> inputs;
  std::vector<std::string> texts;
  for (const std::string& path : fortunes) {
    const std::string text = read_bytes(path).substr(0, 40000);
    for (std::size_t begin = 0, n = 0; begin < text.size(); begin += 1000 + 700 * (n % 5), ++n) {
      texts.push_back(text.substr(begin, 1000 + 700 * (n % 5)));
      inputs.push_back(dir.file("doc" + std::to_string(inputs.size()) + ".txt"));
      write_bytes(inputs.back(), texts.back());
    }
  }
  std::vector<std::int32_t> expected;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    if (i > 0) expected.push_back(kGpt2EndOfText);
    const std::vector<std::int32_t> part = gpt2().encode(texts[i]);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  PrepareDataOptions options;
  options.inputs = inputs;
  options.output_prefix = dir.file("c");
  options.val_fraction = 0.1;
  options.tokenizer = "gpt2";
  const OmpThreads threads(4);
  const PrepareDataSummary s = prepare_data(options);
  ASSERT_EQ(s.total_tokens, static_cast<std::int64_t>(expected.size()));
  const auto train = std::span<const std::int32_t>(expected).first(
      static_cast<std::size_t>(s.train_tokens));
  const auto val = std::span<const std::int32_t>(expected).last(
      static_cast<std::size_t>(s.val_tokens));
  write_token_shard(dir.file("want_train.bin"), "gpt2", kGpt2VocabSize, train);
  write_token_shard(dir.file("want_val.bin"), "gpt2", kGpt2VocabSize, val);
  EXPECT_EQ(read_bytes(s.train_path), read_bytes(dir.file("want_train.bin")));
  EXPECT_EQ(read_bytes(s.val_path), read_bytes(dir.file("want_val.bin")));
  ASSERT_EQ(s.sources.size(), inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(s.sources[i].documents, 1);
    EXPECT_EQ(s.sources[i].tokens, static_cast<std::int64_t>(gpt2().encode(texts[i]).size()));
    EXPECT_EQ(s.sources[i].tokens_taken, s.sources[i].tokens);
  }
}

// ---------------------------------------------------------------------------------------
// JSONL

TEST(PrepareData, JsonlLinesAreDocumentsSeparatedByEndOfText) {
  SKIP_WITHOUT_GPT2_FILES();
  TempDir dir;
  const std::vector<std::string> texts = {
      "The quick brown fox.", "", "Line one\nline two\twith \"quotes\" and \\ slashes",
      "café 漢字 — ünïcödé", "   leading spaces", "x"};
  // Blank lines (also with spaces and a carriage return) between the documents are skipped.
  std::string file = jsonl_of(texts);
  file.insert(0, "\n  \t\r\n");
  file += "\n\n";
  write_bytes(dir.file("docs.jsonl"), file);
  write_bytes(dir.file("plain.txt"), "A plain file after the JSON lines.\n");
  const PrepareDataSummary s =
      prepare_data({dir.file("docs.jsonl"), dir.file("plain.txt")}, dir.file("c"), 0.0, "gpt2");

  // The empty text is no document; every other one is encoded on its own.
  std::vector<std::int32_t> expected;
  std::int64_t documents = 0;
  for (const std::string& text : texts) {
    if (text.empty()) continue;
    if (!expected.empty()) expected.push_back(kGpt2EndOfText);
    const std::vector<std::int32_t> part = gpt2().encode(text);
    expected.insert(expected.end(), part.begin(), part.end());
    ++documents;
  }
  expected.push_back(kGpt2EndOfText);
  const std::vector<std::int32_t> plain = gpt2().encode("A plain file after the JSON lines.\n");
  expected.insert(expected.end(), plain.begin(), plain.end());

  EXPECT_EQ(load_token_shard(s.train_path).tokens, expected);
  ASSERT_EQ(s.sources.size(), 2u);
  EXPECT_EQ(s.sources[0].documents, documents);
  EXPECT_EQ(s.sources[1].documents, 1);
  EXPECT_EQ(std::count(expected.begin(), expected.end(), kGpt2EndOfText), documents);
  EXPECT_EQ(s.sources[0].tokens + s.sources[1].tokens + documents, s.total_tokens);
}

TEST(PrepareData, JsonlWithByteTokensIsTheTextsJoinedAndTheFieldCanBeChosen) {
  TempDir dir;
  std::vector<std::string> texts;
  for (unsigned i = 0; i < 300; ++i) texts.push_back("document " + std::to_string(i) + "\n");
  write_bytes(dir.file("a.jsonl"), jsonl_of(texts, "body"));
  PrepareDataOptions options;
  options.inputs = {dir.file("a.jsonl")};
  options.output_prefix = dir.file("c");
  options.jsonl_field = "body";
  const OmpThreads threads(3);
  const PrepareDataSummary s = prepare_data(options);
  std::string joined;
  for (const std::string& text : texts) joined += text;
  EXPECT_EQ(stream_of(s), as_tokens(joined));
  EXPECT_EQ(s.sources[0].documents, 300);
  EXPECT_EQ(s.sources[0].tokens, static_cast<std::int64_t>(joined.size()));
  EXPECT_EQ(s.input_bytes, static_cast<std::int64_t>(fs::file_size(dir.file("a.jsonl"))));
}

TEST(PrepareData, BadJsonlLinesAreErrorsNamingTheFileLineAndField) {
  TempDir dir;
  const std::string good = R"({"text": "fine", "body": "fine"})";
  const auto fails_with = [&](const std::string& bad_line, const std::vector<std::string>& parts,
                              const std::string& field = "text") {
    const std::string path = dir.file("bad.jsonl");
    write_bytes(path, good + "\n\n" + good + "\n" + bad_line + "\n" + good + "\n");
    PrepareDataOptions options;
    options.inputs = {path};
    options.output_prefix = dir.file("c");
    options.jsonl_field = field;
    std::vector<std::string> expected = {path, "line 4"};
    expected.insert(expected.end(), parts.begin(), parts.end());
    expect_user_error([&] { prepare_data(options); }, expected);
  };
  fails_with(R"({"title": "no text", "id": 3})",
             {"no field \"text\"", "\"title\"", "\"id\"", "--jsonl-field"});
  fails_with(R"({})", {"no field \"body\"", "empty"}, "body");
  fails_with(R"({"text": 42})", {"\"text\"", "number", "string"});
  fails_with(R"({"text": ["a", "b"]})", {"\"text\"", "array", "string"});
  fails_with(R"({"text": null})", {"\"text\"", "null", "string"});
  fails_with(R"({"text": "unterminated)", {"not valid JSON"});
  fails_with(R"({"text": "a"} trailing)", {"not valid JSON"});
  fails_with(R"(["text", "a list"])", {"array", "not an object", "\"text\""});
  EXPECT_FALSE(fs::exists(dir.file("c_train.bin")));

  write_bytes(dir.file("blank.jsonl"), "\n  \n" + std::string(R"({"text": ""})") + "\n");
  expect_user_error([&] { prepare_data({dir.file("blank.jsonl")}, dir.file("c"), 0.0, "byte"); },
                    {"blank.jsonl", "no document with text"});
  PrepareDataOptions no_field;
  no_field.inputs = {dir.file("blank.jsonl")};
  no_field.output_prefix = dir.file("c");
  no_field.jsonl_field = "";
  expect_user_error([&] { prepare_data(no_field); }, {"--jsonl-field", "empty"});
}

// ---------------------------------------------------------------------------------------
// Weighted blends, with byte tokens: each source's documents are written in letters of its
// own (source 0: 'a'-'h', source 1: 'i'-'p', source 2: 'q'-'x'), so every output token names
// its source, and a source's documents each end in 'z' (one per document, nowhere else).

std::string source_document(int source, int index, int length) {
  std::string document;
  for (int i = 0; i + 1 < length; ++i)
    document += static_cast<char>('a' + 8 * source + (i * 3 + index) % 8);
  return document + "z";
}

struct BlendSource {
  std::vector<std::string> documents;
  std::string path;
  int longest() const {
    int n = 0;
    for (const auto& d : documents) n = std::max(n, static_cast<int>(d.size()));
    return n;
  }
  std::int64_t tokens() const {
    std::int64_t n = 0;
    for (const auto& d : documents) n += static_cast<std::int64_t>(d.size());
    return n;
  }
};

// `count` documents of lengths 5..(5 + spread) in a JSONL file.
BlendSource make_source(const TempDir& dir, int source, int count, int spread) {
  BlendSource s;
  for (int i = 0; i < count; ++i) s.documents.push_back(source_document(source, i, 5 + (i * 7) % (spread + 1)));
  s.path = dir.file("source" + std::to_string(source) + ".jsonl");
  write_bytes(s.path, jsonl_of(s.documents));
  return s;
}

int source_of(std::int32_t token) {
  return token == 'z' ? -1 : (token - 'a') / 8;
}

// The tokens of each source in the output, in output order, with each document's 'z' kept
// (the 'z' that ends a document goes to the source of the letters before it; one that starts
// the stream, a split cut just before it, is left out).
std::vector<std::string> split_by_source(const std::vector<std::int32_t>& stream, int sources) {
  std::vector<std::string> parts(static_cast<std::size_t>(sources));
  int current = -1;
  for (const std::int32_t token : stream) {
    const int s = source_of(token);
    if (s >= 0) current = s;
    if (current >= 0) parts[static_cast<std::size_t>(current)] += static_cast<char>(token);
  }
  return parts;
}

// The concatenation of a source's documents taken in order, cycling, `count` of them.
std::string cycled(const BlendSource& source, std::int64_t count) {
  std::string out;
  for (std::int64_t k = 0; k < count; ++k)
    out += source.documents[static_cast<std::size_t>(k) % source.documents.size()];
  return out;
}

TEST(PrepareDataBlend, SharesFollowTheWeightsWithRepeatsAndCutsAtDocumentBoundaries) {
  TempDir dir;
  // Source 0 is small and weighted high (repeated), source 1 is large and weighted low (cut),
  // source 2 sits in between.
  const std::vector<BlendSource> sources = {make_source(dir, 0, 40, 20),
                                            make_source(dir, 1, 400, 30),
                                            make_source(dir, 2, 100, 10)};
  const std::vector<double> weights = {0.5, 0.2, 0.3};
  std::vector<std::string> inputs;
  for (std::size_t i = 0; i < sources.size(); ++i)
    inputs.push_back(sources[i].path + ":" + fmt::format("{}", weights[i]));
  const PrepareDataSummary s = prepare_data(inputs, dir.file("blend"), 0.2, "byte");
  ASSERT_TRUE(s.weighted);
  const std::vector<std::int32_t> stream = stream_of(s);

  std::int64_t all_tokens = 0;
  for (const auto& source : sources) all_tokens += source.tokens();
  const std::vector<std::string> parts = split_by_source(stream, 3);
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const double target = weights[i] * static_cast<double>(all_tokens);
    const auto taken = static_cast<double>(parts[i].size());
    // Whole documents in file order, cycled: the source's part is its documents repeated.
    const std::int64_t documents = std::count(parts[i].begin(), parts[i].end(), 'z');
    EXPECT_EQ(parts[i], cycled(sources[i], documents)) << "source " << i;
    // Cut at the document boundary nearest the target.
    EXPECT_LE(std::abs(taken - target), sources[i].longest() / 2.0) << "source " << i;
    EXPECT_EQ(s.sources[i].documents, static_cast<std::int64_t>(sources[i].documents.size()));
    EXPECT_EQ(s.sources[i].tokens, sources[i].tokens());
    EXPECT_EQ(s.sources[i].documents_taken, documents);
    EXPECT_EQ(s.sources[i].tokens_taken, static_cast<std::int64_t>(parts[i].size()));
    EXPECT_DOUBLE_EQ(s.sources[i].epochs(), taken / static_cast<double>(sources[i].tokens()));
    EXPECT_EQ(s.sources[i].weight, weights[i]);
  }
  EXPECT_GT(s.sources[0].epochs(), 1.5);  // repeated
  EXPECT_LT(s.sources[1].epochs(), 0.5);  // cut
  EXPECT_EQ(s.total_tokens, static_cast<std::int64_t>(stream.size()));

  // Every prefix has the blend's shares, each source within its own longest document and
  // the others' (the bound of "furthest behind goes next": see prepare_data.h); the
  // validation split is checked alike.
  int slack = 0;
  for (const auto& source : sources) slack += source.longest();
  std::vector<std::int64_t> counts(3, 0);
  int current = -1;
  for (std::size_t p = 0; p < stream.size(); ++p) {
    const int source = source_of(stream[p]);
    current = source >= 0 ? source : current;
    ++counts[static_cast<std::size_t>(current)];
    for (std::size_t i = 0; i < 3; ++i)
      ASSERT_LE(std::abs(static_cast<double>(counts[i]) - weights[i] * static_cast<double>(p + 1)),
                slack)
          << "source " << i << " after " << p + 1 << " tokens";
  }
  const std::vector<std::int32_t> val = load_token_shard(s.val_path).tokens;
  const std::vector<std::string> val_parts = split_by_source(val, 3);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_LE(std::abs(static_cast<double>(val_parts[i].size()) -
                       weights[i] * static_cast<double>(val.size())),
              2 * slack)
        << "source " << i;
}

TEST(PrepareDataBlend, IsDeterministicAndWeightsInProportionToSizeTakeEachDocumentOnce) {
  TempDir dir;
  const BlendSource a = make_source(dir, 0, 50, 12), b = make_source(dir, 1, 70, 25);
  const std::vector<std::string> inputs = {
      a.path + ":" + std::to_string(a.tokens()), b.path + ":" + std::to_string(b.tokens())};
  std::string first_train;
  for (const int threads : {1, 4}) {
    const OmpThreads scope(threads);
    const PrepareDataSummary s = prepare_data(inputs, dir.file("blend"), 0.1, "byte");
    const std::string train = read_bytes(s.train_path);
    if (first_train.empty()) first_train = train;
    EXPECT_EQ(train, first_train) << threads << " threads";
    const std::vector<std::string> parts = split_by_source(stream_of(s), 2);
    EXPECT_EQ(parts[0], cycled(a, 50));
    EXPECT_EQ(parts[1], cycled(b, 70));
    EXPECT_EQ(s.sources[0].tokens_taken, a.tokens());
    EXPECT_EQ(s.sources[1].tokens_taken, b.tokens());
    EXPECT_EQ(s.total_tokens, a.tokens() + b.tokens());
  }
  // One weighted input is that input, as without a weight.
  const PrepareDataSummary one = prepare_data({a.path + ":3"}, dir.file("one"), 0.1, "byte");
  const PrepareDataSummary plain = prepare_data({a.path}, dir.file("plain"), 0.1, "byte");
  EXPECT_EQ(read_bytes(one.train_path), read_bytes(plain.train_path));
  EXPECT_EQ(read_bytes(one.val_path), read_bytes(plain.val_path));
}

TEST(PrepareDataBlend, Gpt2BlendSeparatesEveryDocument) {
  SKIP_WITHOUT_GPT2_FILES();
  TempDir dir;
  write_bytes(dir.file("a.jsonl"), jsonl_of({"alpha one", "alpha two", "alpha three"}));
  write_bytes(dir.file("b.txt"), "The whole of b, one document.\n");
  const PrepareDataSummary s =
      prepare_data({dir.file("a.jsonl") + ":1", dir.file("b.txt") + ":1"}, dir.file("c"), 0.0,
                   "gpt2");
  const std::vector<std::int32_t> stream = stream_of(s);
  const std::int64_t documents = s.sources[0].documents_taken + s.sources[1].documents_taken;
  EXPECT_EQ(std::count(stream.begin(), stream.end(), kGpt2EndOfText), documents - 1);
  EXPECT_EQ(static_cast<std::int64_t>(stream.size()),
            s.sources[0].tokens_taken + s.sources[1].tokens_taken + documents - 1);
  // Equal weights: a, repeated, ends within half of its longest document of half of all the
  // tokens; b, one document larger than that half, gives it once.
  std::size_t a_longest = 0;
  for (const char* text : {"alpha one", "alpha two", "alpha three"})
    a_longest = std::max(a_longest, gpt2().encode(text).size());
  EXPECT_LE(std::abs(static_cast<double>(s.sources[0].tokens_taken) -
                     static_cast<double>(s.sources[0].tokens + s.sources[1].tokens) / 2.0),
            static_cast<double>(a_longest) / 2.0);
  EXPECT_GT(s.sources[0].documents_taken, s.sources[0].documents);
  EXPECT_EQ(s.sources[1].documents_taken, 1);
  // Each piece between separators is one of the documents, encoded on its own.
  std::vector<std::vector<std::int32_t>> known = {
      gpt2().encode("alpha one"), gpt2().encode("alpha two"), gpt2().encode("alpha three"),
      gpt2().encode("The whole of b, one document.\n")};
  std::vector<std::int32_t> piece;
  for (std::size_t i = 0; i <= stream.size(); ++i) {
    if (i == stream.size() || stream[i] == kGpt2EndOfText) {
      EXPECT_NE(std::find(known.begin(), known.end(), piece), known.end()) << "piece at " << i;
      piece.clear();
    } else {
      piece.push_back(stream[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// --input values and bad inputs

TEST(PrepareData, InputSpecsSplitATrailingWeightUnlessThePathExists) {
  TempDir dir;
  const InputSpec weighted = parse_input_spec("a.txt:0.7");
  EXPECT_EQ(weighted.path, "a.txt");
  EXPECT_EQ(weighted.weight, 0.7);
  EXPECT_EQ(parse_input_spec("a.txt").weight, std::nullopt);
  EXPECT_EQ(parse_input_spec("dir/x:y.txt:+2e-1").weight, 0.2);
  EXPECT_EQ(parse_input_spec("dir/x:y.txt:+2e-1").path, "dir/x:y.txt");
  // Not a number after the colon: all of it is a path.
  EXPECT_EQ(parse_input_spec("notes:draft").path, "notes:draft");
  EXPECT_EQ(parse_input_spec("notes:draft").weight, std::nullopt);
  // A file whose name ends in ':number' is that file.
  write_bytes(dir.file("odd:0.5"), "text of the odd file");
  EXPECT_EQ(parse_input_spec(dir.file("odd:0.5")).path, dir.file("odd:0.5"));
  EXPECT_EQ(parse_input_spec(dir.file("odd:0.5")).weight, std::nullopt);
  EXPECT_EQ(parse_input_spec(dir.file("odd:0.5") + ":3").path, dir.file("odd:0.5"));
  EXPECT_EQ(parse_input_spec(dir.file("odd:0.5") + ":3").weight, 3.0);
  const PrepareDataSummary s = prepare_data({dir.file("odd:0.5")}, dir.file("c"), 0.0, "byte");
  EXPECT_EQ(stream_of(s), as_tokens("text of the odd file"));
}

TEST(PrepareData, RejectsBadSettingsNamingThem) {
  TempDir dir;
  write_bytes(dir.file("in.txt"), text_of_length(100, 1));
  write_bytes(dir.file("empty.txt"), "");
  const std::string in = dir.file("in.txt"), prefix = dir.file("c");
  expect_user_error([&] { prepare_data({in}, prefix, 1.0, "byte"); },
                    {"--val-fraction", "1", "[0, 1)"});
  expect_user_error([&] { prepare_data({in}, prefix, -0.1, "byte"); }, {"--val-fraction", "-0.1"});
  expect_user_error([&] { prepare_data({in}, prefix, std::nan(""), "byte"); }, {"--val-fraction"});
  expect_user_error([&] { prepare_data({in}, prefix, 0.001, "byte"); },
                    {"--val-fraction", "0.001", "100 tokens", "0 validation"});
  expect_user_error(
      [&] {
        prepare_data({in, dir.file("missing.txt")}, prefix, 0.1, "byte");
      },
      {"missing.txt", "does not exist"});
  expect_user_error([&] { prepare_data({dir.file("empty.txt")}, prefix, 0.1, "byte"); },
                    {"empty.txt", "empty"});
  expect_user_error([&] { prepare_data({dir.path().string()}, prefix, 0.1, "byte"); },
                    {"not a regular file"});
  expect_user_error([&] { prepare_data({}, prefix, 0.1, "byte"); }, {"--input"});
  expect_user_error([&] { prepare_data({in}, prefix, 0.1, "no-such-tokenizer"); },
                    {"no-such-tokenizer", "byte"});
  EXPECT_FALSE(fs::exists(prefix + "_train.bin"));
}

TEST(PrepareData, BadWeightsAndMissingFilesAreErrorsNamingThem) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "some text");
  write_bytes(dir.file("b.txt"), "more text");
  const std::string a = dir.file("a.txt"), b = dir.file("b.txt"), prefix = dir.file("c");
  for (const std::string weight : {"0", "-1", "nan", "inf", "-0.0"})
    expect_user_error([&] { prepare_data({a + ":" + weight, b + ":1"}, prefix, 0.1, "byte"); },
                      {a + ":" + weight, weight, "positive finite"});
  expect_user_error([&] { prepare_data({a + ":1e999", b + ":1"}, prefix, 0.1, "byte"); },
                    {"1e999", "representable"});
  expect_user_error([&] { prepare_data({a + ":0.5.1", b + ":1"}, prefix, 0.1, "byte"); },
                    {"0.5.1", "not a number"});
  expect_user_error([&] { prepare_data({a + ":", b + ":1"}, prefix, 0.1, "byte"); },
                    {a + ":", "no weight"});
  expect_user_error([&] { prepare_data({a + ":0.7", b}, prefix, 0.1, "byte"); },
                    {"1 of the 2 inputs", "'" + b + "' has none", "weight on every input"});
  expect_user_error([&] { prepare_data({a + ":0.7", dir.file("gone.txt") + ":0.3"}, prefix, 0.1,
                                       "byte"); },
                    {"'" + dir.file("gone.txt") + "'", "gone.txt:0.3", "does not exist"});
  expect_user_error([&] { prepare_data({dir.file("gone.jsonl")}, prefix, 0.1, "byte"); },
                    {"gone.jsonl", "does not exist"});
  EXPECT_FALSE(fs::exists(prefix + "_train.bin"));
}

// ---------------------------------------------------------------------------------------
// Progress

TEST(PrepareDataProgress, QuietForASecondThenLinesEveryFiveSeconds) {
  ProgressMeter meter(100'000'000, ProgressMeter::Style::lines);
  EXPECT_EQ(meter.update(10'000'000, 1000, 0.9), "");
  const std::string first = meter.update(25'000'000, 2'500'000, 10.0);
  // 25 of 100 MB in 10 s: 2.5 MB/s, 75 MB left take 30 s.
  EXPECT_NE(first.find("25.0 / 100.0 MB (25%)"), std::string::npos) << first;
  EXPECT_NE(first.find("2.5 MB/s"), std::string::npos) << first;
  EXPECT_NE(first.find("2.5M tokens"), std::string::npos) << first;
  EXPECT_NE(first.find("ETA 30 s"), std::string::npos) << first;
  EXPECT_EQ(first.back(), '\n');
  EXPECT_EQ(first.find('\r'), std::string::npos);
  EXPECT_EQ(meter.update(30'000'000, 3'000'000, 14.9), "");
  EXPECT_NE(meter.update(50'000'000, 5'000'000, 15.0), "");
  const std::string last = meter.finish(100'000'000, 9'000'000, 130.0);
  EXPECT_NE(last.find("100.0 / 100.0 MB (100%)"), std::string::npos) << last;
  EXPECT_NE(last.find("2 min 10 s"), std::string::npos) << last;
  EXPECT_EQ(last.find("ETA"), std::string::npos) << last;
}

TEST(PrepareDataProgress, ATerminalLineIsRedrawnInPlaceAndAShortRunShowsNothing) {
  ProgressMeter quick(1000, ProgressMeter::Style::redraw);
  EXPECT_EQ(quick.update(500, 500, 0.5), "");
  EXPECT_EQ(quick.finish(1000, 1000, 0.8), "");

  ProgressMeter meter(3'000'000'000, ProgressMeter::Style::redraw);
  const std::string first = meter.update(1'000'000'000, 123'456'789, 100.0);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first.front(), '\r');
  EXPECT_EQ(first.find('\n'), std::string::npos);
  EXPECT_NE(first.find("ETA 3 min 20 s"), std::string::npos) << first;
  EXPECT_EQ(meter.update(1'000'000'001, 123'456'789, 100.1), "");  // within 0.25 s
  const std::string second = meter.update(1'100'000'000, 130'000'000, 110.0);
  EXPECT_EQ(second.front(), '\r');
  // The final line covers the longer one before it, and ends the line.
  const std::string last = meter.finish(3'000'000'000, 400'000'000, 7300.0);
  EXPECT_EQ(last.front(), '\r');
  EXPECT_EQ(last.back(), '\n');
  EXPECT_GE(last.size(), second.size() + 1);
  EXPECT_NE(last.find("2 h 01 min"), std::string::npos) << last;
}

// ---------------------------------------------------------------------------------------
// The verb

TEST(PrepareDataCli, BlendPrintsEachSourceAndAShortRunNoProgress) {
  TempDir dir;
  const BlendSource a = make_source(dir, 0, 10, 5), b = make_source(dir, 1, 60, 5);
  const auto result = oases::testing::run_command(
      fmt::format("{} prepare-data --input {}:0.5 {}:0.5 --output {} --val-fraction 0.1",
                  OASES_BINARY, a.path, b.path, dir.file("blend")));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("prepared "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(a.path + ": weight 0.5 (50.0% wanted"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("10 documents, " + std::to_string(a.tokens()) + " tokens"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find(b.path + ": weight 0.5"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("MB/s"), std::string::npos) << result.output;

  const auto bad = oases::testing::run_command(
      fmt::format("{} prepare-data --input {}:-2 --output {} --no-progress", OASES_BINARY,
                  a.path, dir.file("bad")));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("positive finite"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace oases::data
