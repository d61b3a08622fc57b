#include "data/prepare_data.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "core/timer.h"
#include "data/chat_template.h"
#include "data/mlm.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <utility>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

// Raw text gathered before a parallel tokenization pass: enough for every thread to have many
// documents, little enough that the text never weighs much next to the tokens.
constexpr std::size_t kBatchBytes = std::size_t{8} << 20;

// The `--jsonl-field` help that ends each JSONL error.
std::string jsonl_rule(const std::string& field) {
  return fmt::format("a .jsonl input holds one JSON object per line, with the document's text "
                     "as a string in the field \"{}\" (--jsonl-field)",
                     field);
}

bool is_jsonl_path(const std::string& path) {
  std::string extension = fs::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jsonl";
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

// An input file as prepare_data reads it.
struct InputFile {
  std::string path;
  std::optional<double> weight;
  bool jsonl = false;
  std::int64_t bytes = 0;
};

// A document read but not yet tokenized: a whole plain-text file, or one JSONL line.
struct PendingDocument {
  std::size_t input = 0;   // index into the inputs
  std::int64_t line = 0;   // JSONL line number from 1; 0 for plain text
  std::string raw;
};

// The text of the document on JSONL line `line_number` of `path`.
std::string jsonl_document_text(const std::string& raw, const std::string& path,
                                std::int64_t line_number, const std::string& field) {
  nlohmann::json line;
  try {
    line = nlohmann::json::parse(raw);
  } catch (const nlohmann::json::parse_error& e) {
    // The library's text counts lines and columns within the one line it was given; the byte
    // position is what locates the problem here.
    std::string what = e.what();
    if (const auto colon = what.find(": "); colon != std::string::npos) what.erase(0, colon + 2);
    OASES_FAIL("--input '{}' line {} is not valid JSON (at byte {}: {}); {}", path, line_number,
               e.byte, what, jsonl_rule(field));
  }
  OASES_CHECK(line.is_object(), "--input '{}' line {} is a JSON {}, not an object; {}", path,
              line_number, line.type_name(), jsonl_rule(field));
  const auto found = line.find(field);
  if (found == line.end()) {
    constexpr std::size_t kKeysShown = 20;
    std::string keys;
    std::size_t shown = 0;
    for (const auto& item : line.items()) {
      if (shown == kKeysShown) {
        keys += fmt::format(" and {} more", line.size() - kKeysShown);
        break;
      }
      keys += fmt::format("{}\"{}\"", shown++ ? ", " : "", item.key());
    }
    OASES_FAIL("--input '{}' line {} has no field \"{}\" (--jsonl-field); {}; {}", path,
               line_number, field,
               keys.empty() ? std::string("the object is empty") : "its keys are " + keys,
               jsonl_rule(field));
  }
  OASES_CHECK(found->is_string(),
              "--input '{}' line {}: the field \"{}\" (--jsonl-field) holds a JSON {} where the "
              "document's text must be a string; {}",
              path, line_number, field, found->type_name(), jsonl_rule(field));
  return found->get_ref<const std::string&>();
}

// Reads the documents of one input file, in order, into batches.
class DocumentReader {
 public:
  DocumentReader(const InputFile& input, std::size_t index) : input_(input), index_(index) {
    stream_.open(input.path, std::ios::binary);
    OASES_CHECK(stream_.good(), "cannot open --input file '{}' for reading: {}", input.path,
                std::strerror(errno));
  }

  // Appends documents to `batch` until `batch_bytes` reaches kBatchBytes or the file ends, and
  // adds the bytes consumed to `bytes_read`. Returns false once the file is exhausted.
  bool read_into(std::vector<PendingDocument>& batch, std::size_t& batch_bytes,
                 std::int64_t& bytes_read) {
    if (!input_.jsonl) {
      std::string text((std::istreambuf_iterator<char>(stream_)), std::istreambuf_iterator<char>());
      OASES_CHECK(!stream_.bad(), "reading --input file '{}' failed: {}", input_.path,
                  std::strerror(errno));
      bytes_read += static_cast<std::int64_t>(text.size());
      batch_bytes += text.size();
      batch.push_back({index_, 0, std::move(text)});
      return false;
    }
    std::string line;
    while (batch_bytes < kBatchBytes) {
      if (!std::getline(stream_, line)) {
        OASES_CHECK(!stream_.bad(), "reading --input file '{}' failed after line {}: {}",
                    input_.path, line_number_, std::strerror(errno));
        return false;
      }
      ++line_number_;
      // The newline getline dropped, except after a last line that has none.
      const auto consumed = static_cast<std::int64_t>(line.size()) + (stream_.eof() ? 0 : 1);
      bytes_read += consumed;
      if (is_blank(line)) continue;
      batch_bytes += line.size();
      batch.push_back({index_, line_number_, std::move(line)});
      line.clear();
    }
    return true;
  }

 private:
  const InputFile& input_;
  std::size_t index_;
  std::ifstream stream_;
  std::int64_t line_number_ = 0;
};

// One document's tokens and, for a chat record, which of them the model learns (1) and which
// it only reads (0); empty `trained`: every token is learned.
struct DocumentTokens {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> trained;

  bool empty() const { return tokens.empty(); }
  std::size_t size() const { return tokens.size(); }
};

// How a document becomes tokens: the tokenizer, the begin-of-sequence token put before each
// text document, and for chat records their field and template.
struct DocumentEncoder {
  const Tokenizer& tokenizer;
  std::string jsonl_field;
  std::optional<std::int32_t> begin_of_sequence;
  std::string chat_field;  // empty: JSONL lines hold text
  const ModelChatTemplate* chat = nullptr;

  DocumentTokens text(std::string_view raw) const {
    DocumentTokens document{tokenizer.encode(raw), {}};
    if (begin_of_sequence && !document.tokens.empty())
      document.tokens.insert(document.tokens.begin(), *begin_of_sequence);
    return document;
  }

  // A chat record: its messages rendered by the template, each segment encoded with its
  // special tokens (the template writes them as text), the assistant's segments learned.
  DocumentTokens conversation(const std::string& raw, const std::string& path,
                              std::int64_t line_number) const {
    nlohmann::ordered_json line;
    try {
      line = nlohmann::ordered_json::parse(raw);
    } catch (const nlohmann::json::parse_error& e) {
      OASES_FAIL(
          "--input '{}' line {} is not valid JSON (at byte {}); a chat record is one JSON "
          "object per line with its messages in the field \"{}\" (--chat-field)",
          path, line_number, e.byte, chat_field);
    }
    OASES_CHECK(line.is_object() && line.contains(chat_field) && line[chat_field].is_array(),
                "--input '{}' line {} has no list in the field \"{}\" (--chat-field); a chat "
                "record holds its messages there, each an object with \"role\" and "
                "\"content\"",
                path, line_number, chat_field);
    std::vector<ChatSegment> segments;
    try {
      segments = render_chat(chat->chat_template, line[chat_field], chat->variables);
    } catch (const UserError& e) {
      OASES_FAIL("--input '{}' line {}: {}", path, line_number, e.what());
    }
    DocumentTokens document;
    for (const ChatSegment& segment : segments) {
      const std::vector<std::int32_t> piece = tokenizer.encode_with_special_tokens(segment.text);
      document.tokens.insert(document.tokens.end(), piece.begin(), piece.end());
      document.trained.insert(document.trained.end(), piece.size(), segment.trained ? 1 : 0);
    }
    return document;
  }
};

// Tokenizes a batch, documents in parallel; the result is in batch order, as if tokenized one
// after the other. The first failing document (in batch order) is the error reported.
std::vector<DocumentTokens> tokenize_batch(const std::vector<PendingDocument>& batch,
                                           const std::vector<InputFile>& inputs,
                                           const DocumentEncoder& encoder) {
  std::vector<DocumentTokens> tokens(batch.size());
  std::vector<std::exception_ptr> errors(batch.size());
  const auto count = static_cast<std::int64_t>(batch.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t i = 0; i < count; ++i) {
    const PendingDocument& document = batch[static_cast<std::size_t>(i)];
    try {
      const InputFile& input = inputs[document.input];
      DocumentTokens& out = tokens[static_cast<std::size_t>(i)];
      if (!input.jsonl)
        out = encoder.text(document.raw);
      else if (!encoder.chat_field.empty())
        out = encoder.conversation(document.raw, input.path, document.line);
      else
        out = encoder.text(
            jsonl_document_text(document.raw, input.path, document.line, encoder.jsonl_field));
    } catch (...) {
      errors[static_cast<std::size_t>(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  return tokens;
}

// Shows a ProgressMeter's text on stderr, when asked to.
class ProgressDisplay {
 public:
  ProgressDisplay(bool enabled, std::int64_t total_bytes)
      : enabled_(enabled),
        terminal_(::isatty(::fileno(stderr)) != 0),
        meter_(total_bytes,
               terminal_ ? ProgressMeter::Style::redraw : ProgressMeter::Style::lines) {}
  // An error that ends the run mid-way starts on a line of its own, not after the progress.
  ~ProgressDisplay() {
    if (line_open_) std::fputs("\n", stderr);
  }
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  void update(std::int64_t bytes_done, std::int64_t tokens) {
    if (enabled_) show(meter_.update(bytes_done, tokens, clock_.seconds()));
  }
  void finish(std::int64_t bytes_done, std::int64_t tokens) {
    if (enabled_) show(meter_.finish(bytes_done, tokens, clock_.seconds()));
    line_open_ = false;
  }

 private:
  void show(const std::string& text) {
    if (text.empty()) return;
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    line_open_ = terminal_ && text.back() != '\n';
  }

  bool enabled_;
  bool terminal_;
  ProgressMeter meter_;
  Stopwatch clock_;
  bool line_open_ = false;  // a redrawn line is on the terminal without its newline
};

// Reads and tokenizes every input in order, handing each non-empty document's tokens to
// `take(input index, tokens)` in that order.
template <class Take>
void tokenize_inputs(const std::vector<InputFile>& inputs, const DocumentEncoder& encoder,
                     const PrepareDataOptions& options, std::int64_t total_bytes, Take&& take) {
  ProgressDisplay progress(options.progress, total_bytes);
  std::int64_t bytes_read = 0, tokens_made = 0;
  std::vector<PendingDocument> batch;
  std::size_t batch_bytes = 0;
  const auto flush = [&] {
    const auto tokens = tokenize_batch(batch, inputs, encoder);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (tokens[i].empty()) continue;
      tokens_made += static_cast<std::int64_t>(tokens[i].size());
      take(batch[i].input, tokens[i]);
    }
    batch.clear();
    batch_bytes = 0;
    progress.update(bytes_read, tokens_made);
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    DocumentReader reader(inputs[i], i);
    while (reader.read_into(batch, batch_bytes, bytes_read))
      if (batch_bytes >= kBatchBytes) flush();
    if (batch_bytes >= kBatchBytes) flush();
  }
  flush();
  progress.finish(bytes_read, tokens_made);
}

// The output stream: tokens and, when the output carries a loss mask, one 0 or 1 per token
// (separators 0: the document after one is not predicted from the one before).
struct TokenStream {
  bool masked = false;
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> mask;

  void separator(std::int32_t token) {
    tokens.push_back(token);
    if (masked) mask.push_back(0);
  }
  void document(std::span<const std::int32_t> document, std::span<const std::uint8_t> trained) {
    tokens.insert(tokens.end(), document.begin(), document.end());
    if (!masked) return;
    if (trained.empty())
      mask.insert(mask.end(), document.size(), 1);
    else
      mask.insert(mask.end(), trained.begin(), trained.end());
  }
};

// One input's documents, tokenized: document d is tokens[ends[d-1] .. ends[d]), and trained
// the same range of `trained` (empty when the input holds no chat records).
struct SourceTokens {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> trained;
  std::vector<std::size_t> ends;

  std::size_t begin_of(std::size_t d) const { return d == 0 ? 0 : ends[d - 1]; }
  std::span<const std::int32_t> document(std::size_t d) const {
    return std::span<const std::int32_t>(tokens).subspan(begin_of(d), ends[d] - begin_of(d));
  }
  std::span<const std::uint8_t> trained_of(std::size_t d) const {
    if (trained.empty()) return {};
    return std::span<const std::uint8_t>(trained).subspan(begin_of(d), ends[d] - begin_of(d));
  }
};

// Interleaves the sources' documents into one stream as described in prepare_data.h, filling
// each source's documents_taken and tokens_taken.
void blend(const std::vector<SourceTokens>& sources, const std::vector<double>& weights,
           std::optional<std::int32_t> separator, std::vector<SourceSummary>& summaries,
           TokenStream& stream) {
  double weight_sum = 0.0;
  std::int64_t all_tokens = 0;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    weight_sum += weights[i];
    all_tokens += static_cast<std::int64_t>(sources[i].tokens.size());
  }
  std::vector<double> targets(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i)
    targets[i] = weights[i] / weight_sum * static_cast<double>(all_tokens);

  std::vector<std::int64_t> emitted(sources.size(), 0);
  std::vector<std::size_t> taken(sources.size(), 0);
  // A source takes its next document while it has none yet, or while taking it ends nearer
  // its target than stopping short does (a tie stops). Whole documents are the rule, so this
  // keeps each source within half a document of its target.
  const auto wants_more = [&](std::size_t i) {
    if (taken[i] == 0) return true;
    const SourceTokens& source = sources[i];
    const auto length = static_cast<double>(source.document(taken[i] % source.ends.size()).size());
    return 2.0 * static_cast<double>(emitted[i]) + length < 2.0 * targets[i];
  };
  stream.tokens.reserve(static_cast<std::size_t>(all_tokens));
  while (true) {
    // The source furthest behind its share, among those that want more.
    std::optional<std::size_t> next;
    for (std::size_t i = 0; i < sources.size(); ++i) {
      if (!wants_more(i)) continue;
      if (!next || static_cast<double>(emitted[i]) / weights[i] <
                       static_cast<double>(emitted[*next]) / weights[*next])
        next = i;
    }
    if (!next) break;
    const SourceTokens& source = sources[*next];
    const std::size_t d = taken[*next] % source.ends.size();
    const auto document = source.document(d);
    if (!stream.tokens.empty() && separator) stream.separator(*separator);
    stream.document(document, source.trained_of(d));
    emitted[*next] += static_cast<std::int64_t>(document.size());
    ++taken[*next];
  }
  for (std::size_t i = 0; i < sources.size(); ++i) {
    summaries[i].documents_taken = static_cast<std::int64_t>(taken[i]);
    summaries[i].tokens_taken = emitted[i];
  }
}

// Checks every input up front, so that a typo in the last of many inputs fails before any
// work.
std::vector<InputFile> check_inputs(const std::vector<std::string>& values) {
  OASES_CHECK(!values.empty(), "prepare-data needs at least one --input file");
  std::vector<InputFile> inputs;
  for (const std::string& value : values) {
    const InputSpec spec = parse_input_spec(value);
    const std::string as_given =
        spec.path == value ? std::string() : fmt::format(" (from --input '{}')", value);
    std::error_code ec;
    const fs::file_status status = fs::status(spec.path, ec);
    OASES_CHECK(fs::exists(status), "--input file '{}'{} does not exist", spec.path, as_given);
    OASES_CHECK(fs::is_regular_file(status), "--input '{}'{} is not a regular file", spec.path,
                as_given);
    const std::uintmax_t size = fs::file_size(spec.path, ec);
    OASES_CHECK(!ec, "cannot read the size of --input file '{}': {}", spec.path, ec.message());
    OASES_CHECK(size > 0, "--input file '{}' is empty; give files that hold text", spec.path);
    inputs.push_back({spec.path, spec.weight, is_jsonl_path(spec.path),
                      static_cast<std::int64_t>(size)});
  }
  const auto weighted = std::count_if(inputs.begin(), inputs.end(),
                                      [](const InputFile& f) { return f.weight.has_value(); });
  if (weighted > 0 && weighted < static_cast<std::ptrdiff_t>(inputs.size())) {
    const auto unweighted = std::find_if(inputs.begin(), inputs.end(),
                                         [](const InputFile& f) { return !f.weight; });
    OASES_FAIL("--input: {} of the {} inputs have a weight (PATH:WEIGHT) but '{}' has none; "
               "a blend needs a weight on every input, and inputs without weights are read "
               "in order, each once",
               weighted, inputs.size(), unweighted->path);
  }
  return inputs;
}

void create_parent_folder(const std::string& output_prefix) {
  const fs::path parent = fs::path(output_prefix).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  OASES_CHECK(!ec, "cannot create the output directory '{}' for --output '{}': {}",
              parent.string(), output_prefix, ec.message());
}

std::string human_count(double value) {
  if (value < 1e4) return fmt::format("{:.0f}", value);
  if (value < 1e6) return fmt::format("{:.1f}k", value / 1e3);
  if (value < 1e9) return fmt::format("{:.1f}M", value / 1e6);
  return fmt::format("{:.2f}G", value / 1e9);
}

std::string human_duration(double seconds) {
  const auto whole = static_cast<std::int64_t>(std::llround(std::max(0.0, seconds)));
  if (whole < 60) return fmt::format("{} s", whole);
  if (whole < 3600) return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, whole % 3600 / 60);
}

}  // namespace

InputSpec parse_input_spec(const std::string& value) {
  std::error_code ec;
  const auto colon = value.rfind(':');
  if (colon == std::string::npos || fs::exists(value, ec)) return {value, std::nullopt};
  std::string_view number = std::string_view(value).substr(colon + 1);
  OASES_CHECK(!number.empty(),
              "--input '{}' ends in ':' with no weight after it; write PATH:WEIGHT with a "
              "positive number (e.g. corpus.txt:0.7), or PATH alone",
              value);
  if (number.front() == '+') number.remove_prefix(1);  // from_chars takes no plus sign
  double weight = 0.0;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), weight);
  const bool parsed_whole = end == number.data() + number.size();
  const bool looks_numeric =
      !number.empty() && number.find_first_not_of("0123456789.+-eE") == std::string_view::npos;
  // Text after the colon that is no number at all makes the whole value a path (whether it
  // exists is checked with the other inputs); a malformed number is a weight gone wrong.
  if (!looks_numeric && !(error == std::errc() && parsed_whole)) return {value, std::nullopt};
  OASES_CHECK(error == std::errc() && parsed_whole,
              "--input '{}': the weight '{}' after the last ':' is not a {}; weights are "
              "positive finite numbers, e.g. corpus.txt:0.7",
              value, value.substr(colon + 1),
              error == std::errc::result_out_of_range ? "representable number" : "number");
  OASES_CHECK(std::isfinite(weight) && weight > 0.0,
              "--input '{}': the weight {} must be a positive finite number (a share of the "
              "blend, e.g. 0.7)",
              value, value.substr(colon + 1));
  return {value.substr(0, colon), weight};
}

std::unique_ptr<Tokenizer> resolve_tokenizer(const std::string& tokenizer,
                                             const std::string& tokenizer_model) {
  std::error_code ec;
  const std::optional<TokenizerKind> in_folder =
      !tokenizer_model.empty() && fs::is_directory(tokenizer_model, ec)
          ? folder_tokenizer_kind(tokenizer_model)
          : std::nullopt;
  if (in_folder) {
    OASES_CHECK(tokenizer.empty() || tokenizer_kind(tokenizer) == in_folder,
                "--tokenizer {} does not fit --tokenizer-model '{}', which holds a {} tokenizer; "
                "leave --tokenizer out (the folder's is taken) or give --tokenizer {}",
                tokenizer, tokenizer_model, name(*in_folder), name(*in_folder));
    return load_tokenizer_folder(tokenizer_model);
  }
  return make_tokenizer(tokenizer.empty() ? std::string("byte") : tokenizer, tokenizer_model);
}

PrepareDataSummary prepare_data(const PrepareDataOptions& options) {
  const std::unique_ptr<Tokenizer> tokenizer =
      resolve_tokenizer(options.tokenizer, options.tokenizer_model);
  std::optional<ModelChatTemplate> chat;
  if (!options.chat_field.empty()) {
    if (!options.chat_template.empty()) {
      chat = ModelChatTemplate{
          ChatTemplate::parse(read_regular_file(options.chat_template, "--chat-template file",
                                                std::uint64_t{16} << 20),
                              options.chat_template),
          nlohmann::ordered_json::object()};
      // The tokenizer's own begin and end tokens, as a model folder's template would get them.
      std::error_code ec;
      if (!options.tokenizer_model.empty() && fs::is_directory(options.tokenizer_model, ec)) {
        try {
          chat->variables = load_model_chat_template(options.tokenizer_model).variables;
        } catch (const UserError&) {
        }
      }
    } else {
      std::error_code ec;
      OASES_CHECK(!options.tokenizer_model.empty() && fs::is_directory(options.tokenizer_model, ec),
                  "--chat-field {} renders chat records with a chat template: give the model "
                  "folder whose tokenizer_config.json holds it (--tokenizer-model DIR) or a "
                  "template file (--chat-template FILE)",
                  options.chat_field);
      chat = load_model_chat_template(options.tokenizer_model);
    }
  }
  // The token a sequence starts with (LLaMA's <s>, <|begin_of_text|>) starts each text
  // document; masked-language models' [CLS] is the batches' to place, per row.
  std::optional<std::int32_t> begin_of_sequence = tokenizer->begin_of_sequence();
  if (const auto mlm = tokenizer_mlm_special_tokens(*tokenizer);
      mlm && begin_of_sequence == mlm->cls)
    begin_of_sequence.reset();
  const DocumentEncoder encoder{*tokenizer, options.jsonl_field, begin_of_sequence,
                                options.chat_field, chat ? &*chat : nullptr};
  OASES_CHECK(options.val_fraction >= 0.0 && options.val_fraction < 1.0,
              "--val-fraction = {} is outside [0, 1): it is the share of the tokens kept for "
              "validation (e.g. 0.1; 0 keeps none)",
              options.val_fraction);
  OASES_CHECK(!options.output_prefix.empty() && options.output_prefix.back() != '/',
              "--output = '{}' must be a path prefix such as 'data/corpus' (shards are written "
              "to PREFIX_train.bin and PREFIX_val.bin)",
              options.output_prefix);
  OASES_CHECK(!options.jsonl_field.empty(),
              "--jsonl-field is empty; give the name of the JSON field that holds each "
              "document's text (e.g. text)");
  const std::vector<InputFile> inputs = check_inputs(options.inputs);

  PrepareDataSummary summary;
  summary.tokenizer = tokenizer->name();
  summary.vocab_size = tokenizer->vocab_size();
  summary.train_path = options.output_prefix + "_train.bin";
  summary.val_path = options.output_prefix + "_val.bin";
  summary.weighted = inputs.front().weight.has_value();
  for (const InputFile& input : inputs) {
    summary.input_bytes += input.bytes;
    summary.sources.push_back({input.path, input.weight});
  }

  const std::optional<std::int32_t> separator = tokenizer->document_separator();
  TokenStream stream;
  stream.masked = chat.has_value();
  if (!summary.weighted) {
    tokenize_inputs(inputs, encoder, options, summary.input_bytes,
                    [&](std::size_t input, const DocumentTokens& document) {
                      if (!stream.tokens.empty() && separator) stream.separator(*separator);
                      stream.document(document.tokens, document.trained);
                      ++summary.sources[input].documents;
                      summary.sources[input].tokens += static_cast<std::int64_t>(document.size());
                    });
    for (SourceSummary& source : summary.sources) {
      source.documents_taken = source.documents;
      source.tokens_taken = source.tokens;
    }
  } else {
    std::vector<SourceTokens> sources(inputs.size());
    tokenize_inputs(inputs, encoder, options, summary.input_bytes,
                    [&](std::size_t input, const DocumentTokens& document) {
                      SourceTokens& source = sources[input];
                      if (stream.masked) {
                        if (document.trained.empty())
                          source.trained.insert(source.trained.end(), document.size(), 1);
                        else
                          source.trained.insert(source.trained.end(), document.trained.begin(),
                                                document.trained.end());
                      }
                      source.tokens.insert(source.tokens.end(), document.tokens.begin(),
                                           document.tokens.end());
                      source.ends.push_back(source.tokens.size());
                    });
    std::vector<double> weights;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      summary.sources[i].documents = static_cast<std::int64_t>(sources[i].ends.size());
      summary.sources[i].tokens = static_cast<std::int64_t>(sources[i].tokens.size());
      weights.push_back(*inputs[i].weight);
    }
    for (const SourceSummary& source : summary.sources)
      OASES_CHECK(source.documents > 0,
                  "--input '{}' (weight {}) holds no document with text, so it cannot supply "
                  "its share of the blend; {}",
                  source.path, *source.weight,
                  is_jsonl_path(source.path) ? jsonl_rule(options.jsonl_field)
                                             : std::string("give a file that holds text"));
    blend(sources, weights, separator, summary.sources, stream);
  }
  for (const SourceSummary& source : summary.sources)
    OASES_CHECK(source.documents > 0 || !is_jsonl_path(source.path),
                "--input '{}' holds no document with text: every line is blank or has an empty "
                "text; {}",
                source.path, jsonl_rule(options.jsonl_field));

  const std::vector<std::int32_t>& tokens = stream.tokens;
  const auto total = static_cast<std::int64_t>(tokens.size());
  const auto val = static_cast<std::int64_t>(
      std::llround(static_cast<double>(total) * options.val_fraction));
  summary.total_tokens = total;
  summary.val_tokens = val;
  summary.train_tokens = total - val;
  OASES_CHECK(total > 0, "the --input files produced no tokens");
  OASES_CHECK(options.val_fraction == 0.0 || (val >= 1 && val < total),
              "--val-fraction = {} of {} tokens gives {} validation and {} training tokens; both "
              "must be non-empty: use a fraction that leaves at least one token on each side, "
              "or more input text",
              options.val_fraction, total, val, total - val);

  create_parent_folder(options.output_prefix);
  // A tokenizer that its name does not determine travels with its shards (written first: the
  // shards complete the output): a lone SentencePiece model as <prefix>_tokenizer.model, any
  // other files (a model folder's tokenizer.json, vocab.txt, tokenizer_config.json) in a
  // folder.
  const std::vector<TokenizerFile> files = tokenizer->files();
  const bool lone_model = files.size() == 1 && files.front().name == "tokenizer.model";
  if (!known_vocab_size(summary.tokenizer) && !lone_model) {
    summary.tokenizer_files_path = tokenizer_folder_beside_shards(options.output_prefix);
    std::error_code ec;
    fs::create_directories(summary.tokenizer_files_path, ec);
    OASES_CHECK(!ec, "cannot create '{}' for the tokenizer's files: {}",
                summary.tokenizer_files_path, ec.message());
    for (const TokenizerFile& file : files)
      write_file_atomically((fs::path(summary.tokenizer_files_path) / file.name).string(),
                            file.contents);
  }
  if (const std::string model = tokenizer->model_file_contents(); !model.empty() && lone_model) {
    summary.tokenizer_model_path = tokenizer_model_beside_shards(options.output_prefix);
    write_file_atomically(summary.tokenizer_model_path, model);
  }
  const std::span<const std::int32_t> all(tokens);
  const std::span<const std::uint8_t> mask(stream.mask);
  const auto train_count = static_cast<std::size_t>(summary.train_tokens);
  const auto val_count = static_cast<std::size_t>(summary.val_tokens);
  write_token_shard(summary.train_path, summary.tokenizer, summary.vocab_size,
                    all.first(train_count),
                    stream.masked ? mask.first(train_count) : std::span<const std::uint8_t>());
  write_token_shard(summary.val_path, summary.tokenizer, summary.vocab_size, all.last(val_count),
                    stream.masked ? mask.last(val_count) : std::span<const std::uint8_t>());
  summary.loss_masked = stream.masked;
  if (stream.masked)
    summary.trained_tokens = std::count(stream.mask.begin(), stream.mask.end(), std::uint8_t{1});
  return summary;
}

PrepareDataSummary prepare_data(const std::vector<std::string>& inputs,
                                const std::string& output_prefix, double val_fraction,
                                const std::string& tokenizer, const std::string& tokenizer_model) {
  PrepareDataOptions options;
  options.inputs = inputs;
  options.output_prefix = output_prefix;
  options.val_fraction = val_fraction;
  options.tokenizer = tokenizer;
  options.tokenizer_model = tokenizer_model;
  return prepare_data(options);
}

// -----------------------------------------------------------------------------------------
// ProgressMeter

std::string ProgressMeter::describe(std::int64_t bytes_done, std::int64_t total_bytes,
                                    std::int64_t tokens, double seconds, bool finished) {
  const double done_mb = static_cast<double>(bytes_done) / 1e6;
  const double total_mb = static_cast<double>(total_bytes) / 1e6;
  const double rate = seconds > 0.0 ? done_mb / seconds : 0.0;
  const double percent =
      total_bytes > 0 ? 100.0 * static_cast<double>(bytes_done) / static_cast<double>(total_bytes)
                      : 100.0;
  std::string line = fmt::format("{:.1f} / {:.1f} MB ({:.0f}%), {:.1f} MB/s, {} tokens", done_mb,
                                 total_mb, percent, rate, human_count(static_cast<double>(tokens)));
  if (finished) return line + fmt::format(", {}", human_duration(seconds));
  if (rate <= 0.0) return line + ", ETA unknown";
  return line + fmt::format(", ETA {}", human_duration(std::max(0.0, total_mb - done_mb) / rate));
}

std::string ProgressMeter::update(std::int64_t bytes_done, std::int64_t tokens, double seconds) {
  if (seconds < kQuietSeconds) return {};
  const double interval = style_ == Style::redraw ? kRedrawSeconds : kLineSeconds;
  if (last_shown_ && seconds - *last_shown_ < interval) return {};
  last_shown_ = seconds;
  const std::string line =
      "prepare-data: " + describe(bytes_done, total_bytes_, tokens, seconds, false);
  if (style_ == Style::lines) return line + "\n";
  // Spaces cover what is left of a longer line drawn before.
  const std::size_t padding = drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
  drawn_width_ = line.size();
  return "\r" + line + std::string(padding, ' ');
}

std::string ProgressMeter::finish(std::int64_t bytes_done, std::int64_t tokens, double seconds) {
  if (!last_shown_) return {};
  const std::string line =
      "prepare-data: " + describe(bytes_done, total_bytes_, tokens, seconds, true);
  if (style_ == Style::lines) return line + "\n";
  const std::size_t padding = drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
  return "\r" + line + std::string(padding, ' ') + "\n";
}

}  // namespace oases::data
