// BERT's WordPiece tokenizer (`--tokenizer wordpiece`, `data.tokenizer = "wordpiece"`).
//
// Read from a Hugging Face model folder: vocab.txt (one token per line; the line number, from 0,
// is its id) with tokenizer_config.json's do_lower_case (default true, as BertTokenizer's),
// strip_accents (default: as do_lower_case) and tokenize_chinese_chars (default true); or a
// tokenizer.json whose model is "WordPiece" (vocab, unk_token, continuing_subword_prefix,
// max_input_chars_per_word) with a "BertNormalizer" (clean_text, handle_chinese_chars,
// strip_accents, lowercase) or none, and a "BertPreTokenizer". vocab.txt is taken when both
// are present.
//
// Text goes through BERT's basic tokenization, then WordPiece:
//  1. clean-up: U+0000, U+FFFD and the characters of category C* other than \t \n \r are
//     removed; \t \n \r and the characters of category Zs become spaces;
//  2. CJK ideographs (the blocks BERT lists: U+4E00-9FFF, U+3400-4DBF, U+20000-2A6DF,
//     U+2A700-2B73F, U+2B740-2B81F, U+2B820-2CEAF, U+F900-FAFF, U+2F800-2FA1F) are words of
//     their own (with tokenize_chinese_chars);
//  3. lower-casing (each code point's lowercase mapping alone: a final capital sigma becomes
//     σ, as in Hugging Face's Rust tokenizers) and accent stripping (canonical decomposition,
//     then nonspacing marks removed), as set;
//  4. words are cut at Unicode White_Space, and every punctuation character (category P*, or
//     ASCII ! to /, : to @, [ to `, { to ~) is a word of its own;
//  5. each word of more than max_input_chars_per_word (100) code points is [UNK]; the others
//     are cut greedily, longest match first, into tokens of the vocabulary, pieces after the
//     first written with the "##" prefix; a word that cannot be cut so is one [UNK].
// Unicode data is Unicode 17.0's, from committed tables (data/tokenizer_text.h).
// Text that is not valid UTF-8 is refused by encode (a UserError with the byte offset).
//
// Special tokens: [PAD] [UNK] [CLS] [SEP] [MASK] (or the tokens tokenizer_config.json names for
// them, and tokenizer.json's special added tokens), looked up in the vocabulary, never added to
// it; a missing [UNK], [CLS] or [SEP] is a UserError. begin_of_sequence() is [CLS] and the
// document separator [SEP], as BERT frames a sequence.
// decode joins the tokens' text with spaces, a "##" piece to the one before it without; it is
// not the inverse of encode (lower-casing, accents and spacing are lost).
#pragma once

#include "data/tokenizer.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

inline constexpr std::string_view kWordPieceName = "wordpiece";
inline constexpr std::string_view kWordPieceVocabFile = "vocab.txt";

// Loads the tokenizer from `path`: a folder holding vocab.txt or tokenizer.json (with
// tokenizer_config.json beside), or one of those files itself. UserError when the path is
// empty (naming --tokenizer-model and data.tokenizer_model), missing, or the files are wrong.
std::unique_ptr<Tokenizer> load_wordpiece_tokenizer(const std::string& path);
// The same from files (vocab.txt or tokenizer.json; tokenizer_config.json optional).
std::unique_ptr<Tokenizer> wordpiece_tokenizer_from_files(const std::vector<TokenizerFile>& files,
                                                          const std::string& source);

}  // namespace oases::data
