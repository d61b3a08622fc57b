#include "data/tokenizer.h"

#include "core/error.h"
#include "data/gpt2_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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

std::vector<std::string> tokenizer_names() { return value_names<TokenizerKind>(kTokenizerNames); }

std::string_view name(TokenizerKind kind) { return value_name<TokenizerKind>(kTokenizerNames, kind); }

std::optional<TokenizerKind> tokenizer_kind(std::string_view name) {
  const TokenizerKind* kind = find_named_value<TokenizerKind>(kTokenizerNames, name);
  return kind ? std::optional(*kind) : std::nullopt;
}

std::optional<std::int64_t> known_vocab_size(std::string_view name) {
  switch (tokenizer_kind(name).value_or(TokenizerKind::sentencepiece)) {
    case TokenizerKind::byte: return 256;
    case TokenizerKind::gpt2: return kGpt2VocabSize;
    case TokenizerKind::sentencepiece: break;
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
  if (kind == TokenizerKind::byte) {
    OASES_CHECK(model_path.empty(),
                "the byte tokenizer reads no model file, but '{}' was given as its tokenizer "
                "model; leave the tokenizer model unset, or pick the tokenizer it belongs to "
                "(gpt2 or sentencepiece)",
                model_path);
    return std::make_unique<ByteTokenizer>();
  }
  if (kind == TokenizerKind::gpt2) return load_gpt2_tokenizer(model_path);
  return load_sentencepiece_tokenizer(model_path);
}

std::string tokenizer_model_beside_shards(const std::string& prefix) {
  return prefix + "_tokenizer.model";
}

}  // namespace oases::data
