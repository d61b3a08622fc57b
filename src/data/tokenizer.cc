#include "data/tokenizer.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "data/bpe_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer_files.h"
#include "data/tokenizer_text.h"
#include "data/wordpiece_tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <span>

namespace oases::data {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  std::int64_t vocab_size() const override { return 256; }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> tokens(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
  }

  std::string decode(std::span<const std::int32_t> tokens) const override {
    std::string text(tokens.size(), '\0');
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      OASES_CHECK(tokens[i] >= 0 && tokens[i] < 256,
                  "token {} at position {} is outside the byte tokenizer's vocabulary [0, 256)",
                  tokens[i], i);
      text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
    }
    return text;
  }

  std::int32_t end_of_document() const override { return '\n'; }
};

}  // namespace

std::vector<std::string> tokenizer_names() {
  return value_names<TokenizerKind>(kTokenizerNames);
}

std::string_view name(TokenizerKind kind) {
  return value_name<TokenizerKind>(kTokenizerNames, kind);
}

std::optional<TokenizerKind> tokenizer_kind(std::string_view name) {
  const TokenizerKind* kind = find_named_value<TokenizerKind>(kTokenizerNames, name);
  return kind ? std::optional(*kind) : std::nullopt;
}

std::optional<std::int64_t> known_vocab_size(std::string_view name) {
  switch (tokenizer_kind(name).value_or(TokenizerKind::sentencepiece)) {
    case TokenizerKind::byte:
      return 256;
    case TokenizerKind::gpt2:
      return kGpt2VocabSize;
    case TokenizerKind::sentencepiece:
    case TokenizerKind::bpe:
    case TokenizerKind::wordpiece:
      break;
  }
  return std::nullopt;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& model_path) {
  const std::optional<TokenizerKind> kind = tokenizer_kind(name);
  OASES_CHECK(kind.has_value(), "unknown tokenizer '{}'; valid tokenizers: {}", name,
              fmt::join(tokenizer_names(), ", "));
  return make_tokenizer(*kind, model_path);
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& model_path) {
  switch (kind) {
    case TokenizerKind::byte:
      OASES_CHECK(model_path.empty(),
                  "the byte tokenizer reads no model file, but '{}' was given as its tokenizer "
                  "model; leave the tokenizer model unset, or pick the tokenizer it belongs to "
                  "(gpt2, bpe, wordpiece or sentencepiece)",
                  model_path);
      return std::make_unique<ByteTokenizer>();
    case TokenizerKind::gpt2:
      return load_gpt2_tokenizer(model_path);
    case TokenizerKind::bpe:
      return load_bpe_tokenizer(model_path);
    case TokenizerKind::wordpiece:
      return load_wordpiece_tokenizer(model_path);
    case TokenizerKind::sentencepiece:
      return load_sentencepiece_tokenizer(model_path);
  }
  OASES_ASSERT(false, "unhandled tokenizer kind {}", static_cast<int>(kind));
  return nullptr;
}

namespace {

namespace fs = std::filesystem;

// What folder_tokenizer_kind looks for, for messages.
constexpr std::string_view kFolderFilesLookedFor =
    "tokenizer.json, tokenizer.model, vocab.txt, encoder.json + vocab.bpe, vocab.json + "
    "merges.txt";

bool folder_has(const fs::path& dir, std::string_view name) {
  std::error_code ec;
  return fs::is_regular_file(dir / name, ec);
}

}  // namespace

std::optional<TokenizerKind> folder_tokenizer_kind(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  if (std::optional<TokenizerFile> json = read_folder_file(dir, kTokenizerJsonFile)) {
    const std::optional<TokenizerKind> kind = tokenizer_json_kind(parse_tokenizer_json(
        json->contents, fmt::format("tokenizer file '{}'", (fs::path(dir) / json->name).string())));
    if (kind) return kind;
  }
  if (folder_has(dir, kSentencePieceModelFile)) return TokenizerKind::sentencepiece;
  if (folder_has(dir, kWordPieceVocabFile)) return TokenizerKind::wordpiece;
  if ((folder_has(dir, kGpt2EncoderFile) && folder_has(dir, kGpt2MergesFile)) ||
      (folder_has(dir, kHfVocabFile) && folder_has(dir, kHfMergesFile)))
    return TokenizerKind::gpt2;
  return std::nullopt;
}

std::unique_ptr<Tokenizer> load_tokenizer_folder(const std::string& dir) {
  std::error_code ec;
  OASES_CHECK(fs::is_directory(dir, ec),
              "tokenizer folder '{}' is not a folder (it is {}); give a Hugging Face model folder "
              "holding one of: {}",
              dir, file_kind(dir).value_or("missing"), kFolderFilesLookedFor);
  const std::optional<TokenizerKind> kind = folder_tokenizer_kind(dir);
  OASES_CHECK(kind.has_value(),
              "folder '{}' holds no tokenizer oases reads; looked for {} (a tokenizer.json counts "
              "when its model is byte-level BPE or WordPiece)",
              dir, kFolderFilesLookedFor);
  return make_tokenizer(*kind, dir);
}

std::unique_ptr<Tokenizer> tokenizer_from_files(TokenizerKind kind,
                                                const std::vector<TokenizerFile>& files,
                                                const std::string& source) {
  switch (kind) {
    case TokenizerKind::byte:
      return make_tokenizer(TokenizerKind::byte);
    case TokenizerKind::gpt2:
      return gpt2_tokenizer_from_files(files, source);
    case TokenizerKind::bpe:
      return bpe_tokenizer_from_files(files, source);
    case TokenizerKind::wordpiece:
      return wordpiece_tokenizer_from_files(files, source);
    case TokenizerKind::sentencepiece:
      return sentencepiece_tokenizer_from_files(files, source);
  }
  OASES_ASSERT(false, "unhandled tokenizer kind {}", static_cast<int>(kind));
  return nullptr;
}

std::string oases_cache_dir() {
  if (const char* c = std::getenv("OASES_CACHE"); c && *c) return c;
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "oases").string();
  return (fs::path(".cache") / "oases").string();
}

// ---------------------------------------------------------------------------------------
// SpecialTokenSplitter

void SpecialTokenSplitter::add(Token token) {
  OASES_ASSERT(!token.text.empty(), "a special token needs text");
  const auto same = std::find_if(tokens_.begin(), tokens_.end(),
                                 [&](const Token& t) { return t.text == token.text; });
  if (same != tokens_.end()) tokens_.erase(same);
  starts_[static_cast<unsigned char>(token.text[0])] = true;
  // Longest first, so that the first match at a position is the longest.
  const auto at = std::find_if(tokens_.begin(), tokens_.end(),
                               [&](const Token& t) { return t.text.size() < token.text.size(); });
  tokens_.insert(at, std::move(token));
}

std::optional<std::int32_t> SpecialTokenSplitter::id(std::string_view text) const {
  for (const Token& token : tokens_)
    if (token.text == text) return token.id;
  return std::nullopt;
}

const SpecialTokenSplitter::Token* SpecialTokenSplitter::match(std::string_view text,
                                                               std::size_t at) const {
  if (!starts_[static_cast<unsigned char>(text[at])]) return nullptr;
  const std::string_view rest = text.substr(at);
  for (const Token& token : tokens_)
    if (rest.starts_with(token.text)) return &token;
  return nullptr;
}

std::size_t SpecialTokenSplitter::strip_back(std::string_view text, std::size_t floor,
                                             std::size_t at) {
  // Whitespace is found by decoding forward from `floor`, the start of the text before.
  std::size_t keep = at;
  bool in_space = false;
  for (std::size_t i = floor; i < at;) {
    const DecodedChar c = decode_char(text, i);
    if (is_white_space(c.value)) {
      if (!in_space) keep = i;
      in_space = true;
    } else {
      in_space = false;
      keep = at;
    }
    i += c.bytes;
  }
  return in_space ? keep : at;
}

std::size_t SpecialTokenSplitter::strip_forward(std::string_view text, std::size_t at) {
  while (at < text.size()) {
    const DecodedChar c = decode_char(text, at);
    if (!is_white_space(c.value)) break;
    at += c.bytes;
  }
  return at;
}

std::string tokenizer_model_beside_shards(const std::string& prefix) {
  return prefix + "_tokenizer.model";
}

std::string tokenizer_folder_beside_shards(const std::string& prefix) {
  return prefix + "_tokenizer";
}

}  // namespace oases::data
