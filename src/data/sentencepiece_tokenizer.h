// SentencePiece tokenizers (`--tokenizer sentencepiece`, `data.tokenizer = "sentencepiece"`)
// through Google's SentencePiece library, and their training (`oases train-tokenizer`).
//
// A SentencePiece model file (P.model, a serialized ModelProto) holds the whole tokenizer:
// pieces, scores, normalization and special pieces. Its vocabulary is its piece count, and the
// end-of-sentence piece (`</s>`) separates documents; encode never produces it (the text
// "</s>" is encoded as ordinary pieces).
//
// Models trained by train_sentencepiece are lossless: decode(encode(x)) == x for every valid
// UTF-8 text x, because they
//  - normalize nothing (the "identity" rule: no NFKC, no whitespace folding or trimming),
//  - add no dummy space before the text,
//  - keep every space as the meta symbol U+2581 (runs of spaces may be pieces of their own),
//  - fall back to one piece per UTF-8 byte (`<0x00>` .. `<0xFF>`) for characters the pieces
//    do not cover, so characters never seen in training (and newlines, tabs, control
//    characters) survive.
// Models from elsewhere (e.g. trained with NFKC) load and work, but need not be lossless. Text
// that is not valid UTF-8 is refused by encode (a UserError with the byte offset): SentencePiece
// would replace it, and the data would not decode back to the input.
//
// LLaMA 2's model (a BPE model with identity normalization, a dummy prefix and byte fallback)
// encodes as SentencePiece does: a dummy space before the text (which decode drops), each space
// as U+2581, and the byte pieces (<0x0A> for a newline) for characters without a piece; so it
// is lossless too. The one difference from SentencePiece, in every model with byte fallback: a
// U+2581 of the text itself is written in its three byte pieces (SentencePiece would read it as
// a space), and the dummy space still comes once, before the whole text.
//
// Special tokens: the control and unknown pieces (<s>, </s>, <unk>) and those
// tokenizer_config.json marks special (which must be pieces of the model). The text between them
// is encoded as a text of its own, dummy space included, as Meta's LLaMA 2 chat format encodes
// each turn (Hugging Face's "legacy" behaviour). begin_of_sequence() is the bos_token (<s>) when
// tokenizer_config.json sets add_bos_token, or leaves it unset with a LlamaTokenizer
// tokenizer_class (whose default is to add it); none otherwise (a bare model file, models
// trained by oases). files(): tokenizer.model, and tokenizer_config.json when read.
#pragma once

#include "data/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

inline constexpr std::string_view kSentencePieceName = "sentencepiece";
// Hugging Face's name of a model folder's SentencePiece model.
inline constexpr std::string_view kSentencePieceModelFile = "tokenizer.model";

// Loads the model file at `model_path`, or the tokenizer.model of the folder `model_path`; the
// tokenizer_config.json beside it is read too when there is one and the model file is called
// tokenizer.model (a Hugging Face model folder's). UserError when the path is empty (naming
// --tokenizer-model and data.tokenizer_model), the file is missing or unreadable, it is not a
// SentencePiece model, or the model has no end-of-sentence piece.
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_path);
// The same from files: tokenizer.model (required) and tokenizer_config.json (optional).
std::unique_ptr<Tokenizer> sentencepiece_tokenizer_from_files(
    const std::vector<TokenizerFile>& files, const std::string& source);

// The same from the bytes of a model file; `source` names where they came from in messages
// ("checkpoint 'runs/x/step_10' tokenizer.model").
std::unique_ptr<Tokenizer> sentencepiece_tokenizer_from_bytes(std::string model_bytes,
                                                              const std::string& source);

struct SentencePieceTrainingOptions {
  std::vector<std::string> inputs;  // text files; each line is one training sentence
  std::string model_prefix;         // writes <model_prefix>.model and <model_prefix>.vocab
  std::int64_t vocab_size = 8000;   // pieces, byte pieces and <unk> <s> </s> included
  std::string type = "unigram";     // "unigram" or "bpe"
  // Lines sampled (uniformly, with a fixed seed) when the inputs hold more; they bound
  // training's memory (roughly a few hundred bytes per line).
  std::int64_t max_sentences = 2'000'000;
  // Longer lines are cut into pieces of at most this many bytes (at character boundaries)
  // for training, rather than skipped.
  std::int64_t max_sentence_bytes = 16384;
  int threads = 0;  // 0: the machine's hardware threads
};

struct SentencePieceTrainingSummary {
  std::string model_path;  // <model_prefix>.model
  std::string vocab_path;  // <model_prefix>.vocab: "piece<TAB>score" per line, in id order
  std::int64_t vocab_size = 0;
  std::int64_t sentences = 0;    // lines read (after cutting long ones), before sampling
  std::int64_t input_bytes = 0;  // total size of the inputs
};

// Trains a lossless model (see above) and writes both files atomically (each to a temporary
// name, then renamed: a reader sees the old file or the whole new one); parent folders of the
// prefix are created. UserError for: no input, an input that is missing, not a regular file or
// empty; a prefix that is empty or a folder; a type other than unigram or bpe; vocab_size
// outside [260, 2^31) (byte fallback alone takes 259 pieces); a vocab_size the text cannot
// fill or needs more than (SentencePiece's own message, naming --vocab-size); max_sentences or
// max_sentence_bytes below 1; threads < 0.
SentencePieceTrainingSummary train_sentencepiece(const SentencePieceTrainingOptions& options);

}  // namespace oases::data
