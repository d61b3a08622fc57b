// Text <-> token ids. The tokenizer's name is recorded in token shards and checkpoints so that
// data, training and generation agree on it.
#pragma once

#include <cstdint>
#include <memory>
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
  // The token that ends a document, which generation from an empty prompt starts after.
  virtual std::int32_t end_of_document() const = 0;
};

// The names make_tokenizer accepts, for help texts and error messages.
std::vector<std::string> tokenizer_names();

// "byte": token = byte value, vocab 256. It has no token of its own between documents
// (prepare-data concatenates its inputs as they are); its end_of_document() is the newline,
// which ends the last line of every text file. Any other name is a UserError listing valid names.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name);

}  // namespace oases::data
