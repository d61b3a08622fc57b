#include "data/sentencepiece_tokenizer.h"

#include "core/regular_file.h"
#include "core/atomic_file.h"
#include "core/error.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>
#include <unordered_map>
#include <utility>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

// Byte fallback's 256 pieces plus <unk>, <s> and </s>.
constexpr std::int64_t kReservedPieces = 259;

// SentencePiece's messages start with the source location and the failed condition
// ("./src/x.cc(580) [a <= b] Vocabulary size is ..."); the sentence after them is the news.
std::string library_message(const sentencepiece::util::Status& status) {
  const std::string message = status.message();
  const std::size_t bracket = message.find("] ");
  return bracket == std::string::npos ? message : message.substr(bracket + 2);
}

// The byte offset of the first byte that does not begin a shortest-form UTF-8 encoding of a
// Unicode scalar value, or npos.
std::size_t first_invalid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      n = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // beyond U+10FFFF
    } else {
      return i;
    }
    if (i + n > text.size()) return i;
    const auto b1 = static_cast<unsigned char>(text[i + 1]);
    if (b1 < lo || b1 > hi) return i;
    for (std::size_t k = 2; k < n; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string read_model_file(const std::string& path) {
  OASES_CHECK(!path.empty(),
              "the sentencepiece tokenizer needs its model file: pass --tokenizer-model P.model "
              "(prepare-data) or set data.tokenizer_model (training); `oases train-tokenizer "
              "--model-prefix P ...` makes P.model");
  std::error_code ec;
  OASES_CHECK(fs::exists(path, ec),
              "sentencepiece model file '{}' does not exist; `oases train-tokenizer "
              "--model-prefix P ...` makes P.model",
              path);
  return read_regular_file(path, "sentencepiece model file", kMaxTokenizerFileBytes);
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string model_bytes, const std::string& source)
      : model_bytes_(std::move(model_bytes)) {
    const sentencepiece::util::Status loaded = processor_.LoadFromSerializedProto(model_bytes_);
    OASES_CHECK(loaded.ok(), "{} is not a SentencePiece model: {}", source,
                library_message(loaded));
    vocab_size_ = processor_.GetPieceSize();
    eos_ = processor_.eos_id();
    OASES_CHECK(vocab_size_ > 0, "{} holds a SentencePiece model without pieces", source);
    OASES_CHECK(eos_ >= 0 && eos_ < vocab_size_,
                "{} has no end-of-sentence piece (eos_id = {}); oases separates documents with "
                "it: train the model with an eos piece (`oases train-tokenizer` does)",
                source, eos_);
    for (std::size_t k = 0; k < kMetaSpace.size(); ++k) {
      const int id = processor_.PieceToId(
          fmt::format("<0x{:02X}>", static_cast<unsigned char>(kMetaSpace[k])));
      if (!processor_.IsByte(id)) return;  // no byte fallback: U+2581 reads as a space
      meta_space_pieces_.push_back(id);
    }
  }

  std::string name() const override { return std::string(kSentencePieceName); }
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::optional<std::int32_t> document_separator() const override { return eos_; }
  std::int32_t end_of_document() const override { return eos_; }
  std::string model_file_contents() const override { return model_bytes_; }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    const std::size_t bad = first_invalid_utf8(text);
    OASES_CHECK(bad == std::string_view::npos,
                "the sentencepiece tokenizer reads UTF-8 text, and byte {} (0x{:02x}) does not "
                "start a valid UTF-8 character: its tokens would not decode back to the input; "
                "convert the text to UTF-8 (e.g. with iconv) or use the byte or gpt2 tokenizer, "
                "which take any bytes",
                bad, bad == std::string_view::npos ? 0 : static_cast<unsigned char>(text[bad]));
    std::vector<std::int32_t> tokens;
    if (meta_space_pieces_.empty()) {
      encode_piece(text, tokens);
      return tokens;
    }
    // SentencePiece writes spaces as U+2581 before it splits the text, so a U+2581 of the text
    // itself would come back as a space; it is written in byte pieces instead, which decode
    // to its bytes.
    for (std::size_t at = 0;;) {
      const std::size_t meta = text.find(kMetaSpace, at);
      encode_piece(text.substr(at, meta == std::string_view::npos ? meta : meta - at), tokens);
      if (meta == std::string_view::npos) return tokens;
      tokens.insert(tokens.end(), meta_space_pieces_.begin(), meta_space_pieces_.end());
      at = meta + kMetaSpace.size();
    }
  }

  std::string decode(std::span<const std::int32_t> tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      OASES_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_,
                  "token {} at position {} is outside the sentencepiece tokenizer's vocabulary "
                  "[0, {})",
                  tokens[i], i, vocab_size_);
    std::string text;
    const sentencepiece::util::Status status =
        processor_.Decode(std::vector<int>(tokens.begin(), tokens.end()), &text);
    OASES_CHECK(status.ok(), "the sentencepiece tokenizer could not decode {} tokens: {}",
                tokens.size(), library_message(status));
    return text;
  }

 private:
  static constexpr std::string_view kMetaSpace = "\u2581";  // SentencePiece's space symbol

  void encode_piece(std::string_view text, std::vector<std::int32_t>& tokens) const {
    if (text.empty()) return;
    std::vector<int> ids;
    const sentencepiece::util::Status status = processor_.Encode(text, &ids);
    OASES_CHECK(status.ok(), "the sentencepiece tokenizer could not encode a text of {} bytes: {}",
                text.size(), library_message(status));
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }

  std::string model_bytes_;
  sentencepiece::SentencePieceProcessor processor_;
  // The byte pieces of U+2581's UTF-8 bytes; empty when the model has no byte fallback.
  std::vector<std::int32_t> meta_space_pieces_;
  std::int32_t vocab_size_ = 0;
  std::int32_t eos_ = -1;
};

// The lines of the input files, one after another, as SentencePiece's trainer pulls them;
// a line longer than the limit is handed over in pieces cut at character boundaries.
class LineReader final : public sentencepiece::SentenceIterator {
 public:
  LineReader(const std::vector<std::string>& paths, std::size_t max_bytes)
      : paths_(paths), max_bytes_(max_bytes) {
    Next();
  }

  bool done() const override { return done_; }
  const std::string& value() const override { return piece_; }
  sentencepiece::util::Status status() const override { return status_; }
  std::int64_t sentences() const { return sentences_; }

  void Next() override {
    while (true) {
      if (taken_ == line_.size()) {
        taken_ = 0;
        if (!read_line()) {
          done_ = true;
          return;
        }
        continue;  // an empty line teaches nothing
      }
      const std::string_view rest = std::string_view(line_).substr(taken_);
      std::size_t cut = std::min(rest.size(), max_bytes_);
      // Back up to a character boundary (a byte that is not a UTF-8 continuation byte).
      while (cut < rest.size() && cut > 0 && (static_cast<unsigned char>(rest[cut]) & 0xC0) == 0x80)
        --cut;
      if (cut == 0) cut = std::min(rest.size(), max_bytes_);
      piece_.assign(rest.substr(0, cut));
      taken_ += cut;
      ++sentences_;
      return;
    }
  }

 private:
  // Reads the next line into line_; false when every file is read (or one failed: status_).
  bool read_line() {
    while (true) {
      if (!in_.is_open()) {
        if (next_file_ == paths_.size()) return false;
        current_ = paths_[next_file_++];
        in_.open(current_, std::ios::binary);
        if (!in_.good()) {
          status_ = sentencepiece::util::Status(
              sentencepiece::util::StatusCode::kNotFound,
              fmt::format("cannot open --input file '{}': {}", current_, std::strerror(errno)));
          return false;
        }
      }
      if (std::getline(in_, line_)) return true;
      if (in_.bad()) {
        status_ = sentencepiece::util::Status(
            sentencepiece::util::StatusCode::kDataLoss,
            fmt::format("reading --input file '{}' failed: {}", current_, std::strerror(errno)));
        return false;
      }
      in_.close();
    }
  }

  const std::vector<std::string>& paths_;
  std::size_t max_bytes_;
  std::size_t next_file_ = 0;
  std::string current_;
  std::ifstream in_;
  std::string line_;       // the current line
  std::size_t taken_ = 0;  // its bytes handed over already
  std::string piece_;  // the current sentence
  bool done_ = false;
  std::int64_t sentences_ = 0;
  sentencepiece::util::Status status_;
};

// The .vocab file SentencePiece's own trainer writes beside the model: "piece<TAB>score".
std::string vocab_listing(const std::string& model_bytes) {
  sentencepiece::SentencePieceProcessor processor;
  const sentencepiece::util::Status loaded = processor.LoadFromSerializedProto(model_bytes);
  OASES_ASSERT(loaded.ok(), "the model just trained does not load: {}", loaded.message());
  std::string listing;
  for (int id = 0; id < processor.GetPieceSize(); ++id)
    listing += fmt::format("{}\t{}\n", processor.IdToPiece(id), processor.GetScore(id));
  return listing;
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_path) {
  return std::make_unique<SentencePieceTokenizer>(
      read_model_file(model_path), fmt::format("sentencepiece model file '{}'", model_path));
}

std::unique_ptr<Tokenizer> sentencepiece_tokenizer_from_bytes(std::string model_bytes,
                                                             const std::string& source) {
  return std::make_unique<SentencePieceTokenizer>(std::move(model_bytes), source);
}

SentencePieceTrainingSummary train_sentencepiece(const SentencePieceTrainingOptions& o) {
  OASES_CHECK(o.type == "unigram" || o.type == "bpe",
              "--type = '{}' is not a SentencePiece model type oases trains; valid: unigram, bpe",
              o.type);
  OASES_CHECK(o.vocab_size > kReservedPieces &&
                  o.vocab_size <= std::numeric_limits<std::int32_t>::max(),
              "--vocab-size = {} is outside [{}, 2^31): byte fallback alone takes {} pieces (256 "
              "bytes, <unk>, <s> and </s>)",
              o.vocab_size, kReservedPieces + 1, kReservedPieces);
  OASES_CHECK(o.max_sentences >= 1, "the number of training sentences sampled ({}) must be >= 1",
              o.max_sentences);
  OASES_CHECK(o.max_sentence_bytes >= 1, "the longest training sentence ({} bytes) must be >= 1",
              o.max_sentence_bytes);
  OASES_CHECK(o.threads >= 0, "threads = {} must be >= 0 (0: all hardware threads)", o.threads);
  OASES_CHECK(!o.inputs.empty(), "train-tokenizer needs at least one --input file");
  OASES_CHECK(!o.model_prefix.empty() && o.model_prefix.back() != '/',
              "--model-prefix = '{}' must be a path prefix such as 'data/tok' (the model is "
              "written to PREFIX.model and its vocabulary to PREFIX.vocab)",
              o.model_prefix);

  SentencePieceTrainingSummary summary;
  summary.model_path = o.model_prefix + ".model";
  summary.vocab_path = o.model_prefix + ".vocab";
  for (const std::string& input : o.inputs) {
    std::error_code ec;
    const fs::file_status status = fs::status(input, ec);
    OASES_CHECK(fs::exists(status), "--input file '{}' does not exist", input);
    OASES_CHECK(fs::is_regular_file(status), "--input '{}' is not a regular file", input);
    const std::uintmax_t size = fs::file_size(input, ec);
    OASES_CHECK(!ec, "cannot read the size of --input file '{}': {}", input, ec.message());
    OASES_CHECK(size > 0, "--input file '{}' is empty; give files that hold text", input);
    summary.input_bytes += static_cast<std::int64_t>(size);
  }

  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::unordered_map<std::string, std::string> settings = {
      {"model_type", o.type},
      {"vocab_size", std::to_string(o.vocab_size)},
      // Lossless: the text as it is, spaces kept as pieces, bytes for what pieces miss.
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"byte_fallback", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      // Big inputs: a uniform sample of lines, each at most this long.
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(o.max_sentence_bytes)},
      {"num_threads", std::to_string(o.threads > 0 ? static_cast<unsigned>(o.threads) : hardware)},
      // SentencePiece's progress lines go to stderr at INFO; warnings and errors still do.
      {"minloglevel", "1"}};
  LineReader lines(o.inputs, static_cast<std::size_t>(o.max_sentence_bytes));
  std::string model_bytes;
  // The sample of lines is drawn from the library's generator; seeded for repeatable models.
  sentencepiece::SetRandomGeneratorSeed(20240601u);
  const sentencepiece::util::Status trained =
      sentencepiece::SentencePieceTrainer::Train(settings, &lines, &model_bytes);
  OASES_CHECK(lines.status().ok(), "{}", lines.status().message());
  if (!trained.ok()) {
    const std::string message = library_message(trained);
    const std::string text = fmt::format("the text of the --input files ({} bytes, {} lines)",
                                         summary.input_bytes, lines.sentences());
    // "... smaller than required_chars. 262 vs 333. ..." and "... too high (N). Please set it
    // to a value <= M."
    if (const std::size_t vs = message.find(" vs "); vs != std::string::npos &&
                                                       message.find("required_chars") != std::string::npos)
      OASES_FAIL("--vocab-size = {} is too small for {}: it needs at least {} pieces (byte "
                 "fallback's {} and one for each character of the text) (SentencePiece: {})",
                 o.vocab_size, text, std::atoll(message.c_str() + vs + 4), kReservedPieces,
                 message);
    if (const std::size_t le = message.find("<= "); le != std::string::npos)
      OASES_FAIL("--vocab-size = {} is too large for {}: it makes at most {} pieces; give a "
                 "smaller --vocab-size or more text (SentencePiece: {})",
                 o.vocab_size, text, std::atoll(message.c_str() + le + 3), message);
    OASES_CHECK(message.find("ocabulary size") == std::string::npos,
                "--vocab-size = {} does not suit {}: {}", o.vocab_size, text, message);
    OASES_FAIL("training the sentencepiece tokenizer on the --input files failed: {}", message);
  }
  summary.sentences = lines.sentences();

  const fs::path parent = fs::path(o.model_prefix).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    OASES_CHECK(!ec, "cannot create the folder '{}' for --model-prefix '{}': {}", parent.string(),
                o.model_prefix, ec.message());
  }
  const std::string listing = vocab_listing(model_bytes);
  summary.vocab_size = sentencepiece_tokenizer_from_bytes(model_bytes, "the model just trained")
                           ->vocab_size();
  write_file_atomically(summary.vocab_path, listing);
  write_file_atomically(summary.model_path, model_bytes);
  return summary;
}

}  // namespace oases::data
