// Text <-> token ids. The tokenizer's name is recorded in token shards and checkpoints so that
// data, training and generation agree on it.
#pragma once

#include "core/named_values.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

// Text <-> token ids. Implementations are stateless after construction and thread-safe.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;         // as stored in shard headers, <= 16 chars
  virtual std::int64_t vocab_size() const = 0;  // tokens are in [0, vocab_size)
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Throws UserError for a token outside [0, vocab_size).
  virtual std::string decode(std::span<const std::int32_t> tokens) const = 0;
  // The token that separates documents (prepare-data puts it between input files), if the
  // vocabulary has one. encode never produces it.
  virtual std::optional<std::int32_t> document_separator() const { return std::nullopt; }
  // The token generation from an empty prompt starts after: the document separator where
  // there is one, else a token that ends documents in practice.
  virtual std::int32_t end_of_document() const = 0;
  // The bytes of the model file this tokenizer was loaded from, when its name alone does not
  // determine it (sentencepiece: the trained .model, which prepare-data copies beside the
  // shards and every checkpoint carries); empty when the name suffices (byte, gpt2).
  virtual std::string model_file_contents() const { return {}; }
};

enum class TokenizerKind : std::uint8_t { byte, gpt2, sentencepiece };
// data.tokenizer's words, also the names shards and checkpoints record.
inline constexpr std::array<NamedValue<TokenizerKind>, 3> kTokenizerNames{{
    {TokenizerKind::byte, "byte"},
    {TokenizerKind::gpt2, "gpt2"},
    {TokenizerKind::sentencepiece, "sentencepiece"}}};
std::string_view name(TokenizerKind kind);
// The kind a recorded name gives; nothing for a name that is not one.
std::optional<TokenizerKind> tokenizer_kind(std::string_view name);

// The names make_tokenizer accepts, for help texts and error messages.
std::vector<std::string> tokenizer_names();

// The vocabulary size of the tokenizer called `name` when the name alone determines it (byte,
// gpt2); nullopt for sentencepiece (its vocabulary is its model file's) and for a name that is
// not in tokenizer_names().
std::optional<std::int64_t> known_vocab_size(std::string_view name);

// "byte": token = byte value, vocab 256. It has no document separator (prepare-data
// concatenates its inputs as they are); its end_of_document() is the newline, which ends the
// last line of every text file; it reads no file (model_path must be empty).
// "gpt2": GPT-2's byte-level BPE, vocab 50257, with <|endoftext|> (50256) between documents,
// read from `model_path`: a Hugging Face tokenizer.json, or a folder holding it or encoder.json
// and vocab.bpe (empty: default_gpt2_tokenizer_dir(); see data/gpt2_tokenizer.h).
// "sentencepiece": the SentencePiece model file `model_path` (required), vocab = its piece
// count, its end-of-sentence piece between documents (data/sentencepiece_tokenizer.h).
// Any other name is a UserError listing valid names.
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& model_path = "");
// The same for a tokenizer's name; UserError listing the valid names for any other.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& model_path = "");

// Where prepare-data keeps the copy of the tokenizer's model file for the shards at `prefix`
// (`<prefix>_tokenizer.model`), and where training looks for it when data.tokenizer_model is
// not set.
std::string tokenizer_model_beside_shards(const std::string& prefix);

}  // namespace oases::data
