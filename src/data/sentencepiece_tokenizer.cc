#include "data/sentencepiece_tokenizer.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "data/tokenizer_files.h"
#include "data/tokenizer_text.h"

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

// The tokenizer.model of a folder, or the model file itself; with tokenizer_config.json when
// the folder holds one (a model file is taken as part of a folder when it is called
// tokenizer.model, as in Hugging Face's).
std::vector<TokenizerFile> read_model_files(const std::string& path) {
  OASES_CHECK(!path.empty(),
              "the sentencepiece tokenizer needs its model file: pass --tokenizer-model P.model "
              "(prepare-data) or set data.tokenizer_model (training); `oases train-tokenizer "
              "--model-prefix P ...` makes P.model");
  std::error_code ec;
  OASES_CHECK(fs::exists(path, ec),
              "sentencepiece model file '{}' does not exist; `oases train-tokenizer "
              "--model-prefix P ...` makes P.model",
              path);
  std::vector<TokenizerFile> files;
  fs::path folder;
  if (fs::is_directory(path, ec)) {
    folder = path;
    std::optional<TokenizerFile> model = read_folder_file(path, kSentencePieceModelFile);
    OASES_CHECK(model.has_value(),
                "folder '{}' holds no {}; the sentencepiece tokenizer reads a SentencePiece model "
                "file (give the .model file itself, or a model folder holding {})",
                path, kSentencePieceModelFile, kSentencePieceModelFile);
    files.push_back(std::move(*model));
  } else {
    files.push_back({std::string(kSentencePieceModelFile),
                     read_regular_file(path, "sentencepiece model file", kMaxTokenizerFileBytes)});
    if (fs::path(path).filename() == kSentencePieceModelFile) folder = fs::path(path).parent_path();
  }
  if (!folder.empty())
    if (std::optional<TokenizerFile> config =
            read_folder_file(folder.string(), kTokenizerConfigFile))
      files.push_back(std::move(*config));
  return files;
}

// The settings of a model's normalizer_spec that encode must know, read from the serialized
// ModelProto (protocol buffers wire format: ModelProto field 3 is the NormalizerSpec, whose
// field 3 is add_dummy_prefix, default true). The library does not expose them.
struct NormalizerSettings {
  bool add_dummy_prefix = true;
};

std::optional<std::uint64_t> read_varint(std::string_view bytes, std::size_t& at) {
  std::uint64_t value = 0;
  for (int shift = 0; shift < 64 && at < bytes.size(); shift += 7) {
    const auto byte = static_cast<unsigned char>(bytes[at++]);
    value |= std::uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) return value;
  }
  return std::nullopt;
}

// Calls on_field(number, wire type, varint value, length-delimited bytes) for each field of a
// message; false when the bytes are not a well-formed message.
template <class OnField>
bool for_each_field(std::string_view message, OnField&& on_field) {
  for (std::size_t at = 0; at < message.size();) {
    const std::optional<std::uint64_t> key = read_varint(message, at);
    if (!key) return false;
    const auto type = static_cast<int>(*key & 7);
    const std::uint64_t field = *key >> 3;
    std::uint64_t value = 0;
    std::string_view bytes;
    if (type == 0) {
      const auto v = read_varint(message, at);
      if (!v) return false;
      value = *v;
    } else if (type == 1 || type == 5) {
      const std::size_t size = type == 1 ? 8 : 4;
      if (message.size() - at < size) return false;
      at += size;
    } else if (type == 2) {
      const auto length = read_varint(message, at);
      if (!length || *length > message.size() - at) return false;
      bytes = message.substr(at, static_cast<std::size_t>(*length));
      at += static_cast<std::size_t>(*length);
    } else {
      return false;
    }
    on_field(field, type, value, bytes);
  }
  return true;
}

NormalizerSettings normalizer_settings(std::string_view model) {
  NormalizerSettings settings;
  for_each_field(model, [&](std::uint64_t field, int type, std::uint64_t, std::string_view bytes) {
    if (field != 3 || type != 2) return;
    for_each_field(bytes,
                   [&](std::uint64_t inner, int inner_type, std::uint64_t value, std::string_view) {
                     if (inner == 3 && inner_type == 0) settings.add_dummy_prefix = value != 0;
                   });
  });
  return settings;
}

// The model with add_dummy_prefix false: a NormalizerSpec appended to a serialized message is
// merged into the one before it, its fields replacing theirs.
std::string without_dummy_prefix(const std::string& model) {
  return model + std::string("\x1a\x02\x18\x00", 4);
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::vector<TokenizerFile> files, const std::string& source)
      : files_(std::move(files)) {
    const TokenizerFile& model =
        require_file(files_, kSentencePieceModelFile, source, "sentencepiece");
    const std::string model_source =
        files_.size() == 1 ? source : fmt::format("{} {}", source, kSentencePieceModelFile);
    const sentencepiece::util::Status loaded = processor_.LoadFromSerializedProto(model.contents);
    OASES_CHECK(loaded.ok(), "{} is not a SentencePiece model: {}", model_source,
                library_message(loaded));
    vocab_size_ = processor_.GetPieceSize();
    eos_ = processor_.eos_id();
    OASES_CHECK(vocab_size_ > 0, "{} holds a SentencePiece model without pieces", model_source);
    OASES_CHECK(eos_ >= 0 && eos_ < vocab_size_,
                "{} has no end-of-sentence piece (eos_id = {}); oases separates documents with "
                "it: train the model with an eos piece (`oases train-tokenizer` does)",
                model_source, eos_);
    if (normalizer_settings(model.contents).add_dummy_prefix) {
      const sentencepiece::util::Status plain =
          no_prefix_processor_.LoadFromSerializedProto(without_dummy_prefix(model.contents));
      OASES_ASSERT(plain.ok(), "{} without its dummy prefix does not load: {}", model_source,
                   plain.message());
      has_dummy_prefix_ = true;
    }
    for (std::size_t k = 0; k < kMetaSpace.size(); ++k) {
      const int id = processor_.PieceToId(
          fmt::format("<0x{:02X}>", static_cast<unsigned char>(kMetaSpace[k])));
      if (!processor_.IsByte(id)) {
        meta_space_pieces_.clear();  // no byte fallback: U+2581 reads as a space
        break;
      }
      meta_space_pieces_.push_back(id);
    }
    // Special tokens: the control and unknown pieces (<s>, </s>, <unk>), and those
    // tokenizer_config.json marks special.
    for (int id = 0; id < vocab_size_; ++id)
      if (processor_.IsControl(id) || processor_.IsUnknown(id))
        special_.add({processor_.IdToPiece(id), id});
    std::optional<TokenizerConfig> config;
    if (const TokenizerFile* file = find_file(files_, kTokenizerConfigFile))
      config = parse_tokenizer_config(file->contents,
                                      fmt::format("{} {}", source, kTokenizerConfigFile));
    if (config) {
      const std::string config_source = fmt::format("{} {}", source, kTokenizerConfigFile);
      for (const TokenizerConfig::AddedToken& token : config->added_tokens) {
        if (!token.special) continue;
        OASES_CHECK(token.id < vocab_size_ && processor_.IdToPiece(token.id) == token.content,
                    "{} lists the special token \"{}\" as id {}, which the model's piece {} does "
                    "not match; oases takes special tokens from the model's pieces",
                    config_source, token.content, token.id,
                    token.id < vocab_size_ ? "\"" + processor_.IdToPiece(token.id) + "\""
                                           : std::string("(none: the model is smaller)"));
        special_.add({token.content, token.id});
      }
      // LlamaTokenizer adds <s> unless add_bos_token says otherwise.
      const bool llama = config->tokenizer_class.starts_with("Llama") ||
                         config->tokenizer_class.starts_with("CodeLlama");
      if (config->add_bos_token.value_or(llama)) {
        const std::string bos_text = config->bos_token.empty()
                                         ? processor_.IdToPiece(processor_.bos_id())
                                         : config->bos_token;
        const int bos = bos_text.empty() ? -1 : processor_.PieceToId(bos_text);
        OASES_CHECK(bos >= 0 && bos < vocab_size_ && processor_.IdToPiece(bos) == bos_text,
                    "{} asks for a begin-of-sequence token (add_bos_token), but \"{}\" is not a "
                    "piece of the model",
                    config_source, bos_text);
        bos_ = bos;
      }
    }
  }

  std::string name() const override { return std::string(kSentencePieceName); }
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::optional<std::int32_t> begin_of_sequence() const override { return bos_; }
  std::optional<std::int32_t> document_separator() const override { return eos_; }
  std::int32_t end_of_document() const override { return eos_; }
  std::string model_file_contents() const override { return files_.front().contents; }
  std::vector<TokenizerFile> files() const override { return files_; }
  std::optional<std::int32_t> special_token_id(std::string_view text) const override {
    return special_.id(text);
  }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    check_utf8(text);
    std::vector<std::int32_t> tokens;
    encode_text(text, tokens);
    return tokens;
  }

  std::vector<std::int32_t> encode_with_special_tokens(std::string_view text) const override {
    check_utf8(text);
    return special_.encode(text, [&](std::string_view piece, std::vector<std::int32_t>& tokens) {
      encode_text(piece, tokens);
    });
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

  static void check_utf8(std::string_view text) {
    const std::size_t bad = first_invalid_utf8(text);
    OASES_CHECK(bad == std::string_view::npos,
                "the sentencepiece tokenizer reads UTF-8 text, and byte {} (0x{:02x}) does not "
                "start a valid UTF-8 character: its tokens would not decode back to the input; "
                "convert the text to UTF-8 (e.g. with iconv) or use the byte or gpt2 tokenizer, "
                "which take any bytes",
                bad, bad == std::string_view::npos ? 0 : static_cast<unsigned char>(text[bad]));
  }

  // The tokens of `text` as SentencePiece encodes a text of its own (with the model's dummy
  // prefix, if it has one, before the text), except for U+2581 (see the header).
  void encode_text(std::string_view text, std::vector<std::int32_t>& tokens) const {
    if (text.empty()) return;
    if (meta_space_pieces_.empty()) {
      encode_piece(processor_, text, tokens);
      return;
    }
    // SentencePiece writes spaces as U+2581 before it splits the text, so a U+2581 of the text
    // itself would come back as a space; it is written in byte pieces instead, which decode
    // to its bytes. The dummy prefix goes before the text only, not before each part.
    for (std::size_t at = 0;;) {
      const std::size_t meta = text.find(kMetaSpace, at);
      const std::string_view part =
          text.substr(at, meta == std::string_view::npos ? meta : meta - at);
      if (at > 0 && has_dummy_prefix_)
        encode_piece(no_prefix_processor_, part, tokens);
      else if (part.empty() && has_dummy_prefix_)
        encode_piece(no_prefix_processor_, " ", tokens);  // the text starts with U+2581
      else
        encode_piece(processor_, part, tokens);
      if (meta == std::string_view::npos) return;
      tokens.insert(tokens.end(), meta_space_pieces_.begin(), meta_space_pieces_.end());
      at = meta + kMetaSpace.size();
    }
  }

  static void encode_piece(const sentencepiece::SentencePieceProcessor& processor,
                           std::string_view text, std::vector<std::int32_t>& tokens) {
    if (text.empty()) return;
    std::vector<int> ids;
    const sentencepiece::util::Status status = processor.Encode(text, &ids);
    OASES_CHECK(status.ok(), "the sentencepiece tokenizer could not encode a text of {} bytes: {}",
                text.size(), library_message(status));
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }

  std::vector<TokenizerFile> files_;  // tokenizer.model first
  sentencepiece::SentencePieceProcessor processor_;
  // The same model without its dummy prefix, for the parts of a text after a U+2581.
  sentencepiece::SentencePieceProcessor no_prefix_processor_;
  bool has_dummy_prefix_ = false;
  // The byte pieces of U+2581's UTF-8 bytes; empty when the model has no byte fallback.
  std::vector<std::int32_t> meta_space_pieces_;
  SpecialTokenSplitter special_;
  std::int32_t vocab_size_ = 0;
  std::int32_t eos_ = -1;
  std::optional<std::int32_t> bos_;
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
  std::string piece_;      // the current sentence
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
      read_model_files(model_path), fmt::format("sentencepiece model file '{}'", model_path));
}

std::unique_ptr<Tokenizer> sentencepiece_tokenizer_from_bytes(std::string model_bytes,
                                                              const std::string& source) {
  std::vector<TokenizerFile> files;
  files.push_back({std::string(kSentencePieceModelFile), std::move(model_bytes)});
  return std::make_unique<SentencePieceTokenizer>(std::move(files), source);
}

std::unique_ptr<Tokenizer> sentencepiece_tokenizer_from_files(
    const std::vector<TokenizerFile>& files, const std::string& source) {
  std::vector<TokenizerFile> kept = {
      require_file(files, kSentencePieceModelFile, source, "sentencepiece")};
  if (const TokenizerFile* config = find_file(files, kTokenizerConfigFile)) kept.push_back(*config);
  return std::make_unique<SentencePieceTokenizer>(std::move(kept), source);
}

SentencePieceTrainingSummary train_sentencepiece(const SentencePieceTrainingOptions& o) {
  OASES_CHECK(o.type == "unigram" || o.type == "bpe",
              "--type = '{}' is not a SentencePiece model type oases trains; valid: unigram, bpe",
              o.type);
  OASES_CHECK(
      o.vocab_size > kReservedPieces && o.vocab_size <= std::numeric_limits<std::int32_t>::max(),
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
    if (const std::size_t vs = message.find(" vs ");
        vs != std::string::npos && message.find("required_chars") != std::string::npos)
      OASES_FAIL(
          "--vocab-size = {} is too small for {}: it needs at least {} pieces (byte "
          "fallback's {} and one for each character of the text) (SentencePiece: {})",
          o.vocab_size, text, std::atoll(message.c_str() + vs + 4), kReservedPieces, message);
    if (const std::size_t le = message.find("<= "); le != std::string::npos)
      OASES_FAIL(
          "--vocab-size = {} is too large for {}: it makes at most {} pieces; give a "
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
  summary.vocab_size =
      sentencepiece_tokenizer_from_bytes(model_bytes, "the model just trained")->vocab_size();
  write_file_atomically(summary.vocab_path, listing);
  write_file_atomically(summary.model_path, model_bytes);
  return summary;
}

}  // namespace oases::data
