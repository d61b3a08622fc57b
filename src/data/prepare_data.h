// `prepare_data`: text in, token shards out (the `oases prepare-data` verb). The shard format
// is in data/token_shard.h.
//
// Inputs. Each input is a file, read as one of two kinds by its name:
//  - `*.jsonl`: JSON lines. Every non-blank line is one JSON object holding one document, whose
//    text is the string in the field `jsonl_field` ("text" unless set). Blank lines (nothing
//    but spaces, tabs and line ends) are skipped. A line that is not valid JSON, is not an
//    object, lacks the field or holds a non-string there is a UserError naming the file, the
//    line number (from 1) and the field (and, for a missing field, the keys the line has).
//  - anything else: plain text, the whole file one document.
// Each document is tokenized on its own (no word spans two documents). Documents that give no
// tokens (a JSON text "") are dropped. Between consecutive documents of the output stream goes
// the tokenizer's document_separator() where it has one (gpt2: <|endoftext|>); the byte
// tokenizer has none, so its documents are concatenated as they are. The separators are
// framing: "a source's tokens" below counts its documents' tokens only.
//
// Unweighted inputs (`a.txt b.jsonl`): the output is every document of every input, inputs in
// the order given, documents in file order, each once.
//
// Weighted inputs (`a.txt:0.7 b.jsonl:0.3`, every input weighted): each input with its weight
// is a source. With T the tokens of all sources together and W the sum of the weights, the
// output holds about T tokens (one epoch of the blend), of which source i contributes its
// target w_i / W * T: its documents are taken in file order, cycling back to its first
// document when they run out (a source smaller than its target is repeated, whole documents
// only), and taking stops at the document boundary nearest the target (a larger source is
// cut there). So a source's tokens are within half a document of its target, except that
// every source gives at least its first document. The output's size is T give or take those
// half documents. The sources' documents are interleaved deterministically, without
// randomness: the next document always comes from the source that is furthest behind its share
// (least tokens emitted per unit of weight; the earlier input on a tie). Hence every prefix of
// the stream, and with it both the training and the validation split, holds each source at
// its weight's share to within about one document of each source.
//
// Split: the last round(total * val_fraction) tokens of the stream (separators included) are
// the validation shard, the others the training shard.
//
// Memory: the output tokens, plus (weighted) every source's tokens, plus the text of the
// documents being tokenized (a batch of about 8 MB, or one plain-text file however large).
// Documents are tokenized in parallel (OpenMP threads); the tokens are those of tokenizing
// them one after the other.
#pragma once

#include "data/tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

struct PrepareDataOptions {
  // Files, each given as `PATH` or `PATH:WEIGHT` (see parse_input_spec); all weighted or none.
  std::vector<std::string> inputs;
  std::string output_prefix;  // shards go to <prefix>_train.bin and <prefix>_val.bin
  double val_fraction = 0.1;  // in [0, 1)
  // The tokenizer's name (tokenizer_names()); empty: the kind the files of a Hugging Face
  // model folder in tokenizer_model are (folder_tokenizer_kind), else "byte".
  std::string tokenizer;
  // The tokenizer's file or folder where it has files (make_tokenizer): a Hugging Face model
  // folder, gpt2's tokenizer.json or folder, sentencepiece's .model, ... The files of a
  // tokenizer its name does not determine are copied beside the shards.
  std::string tokenizer_model;
  std::string jsonl_field = "text";
  // Chat records (instruction data): every *.jsonl line holds a conversation in this field, a
  // list of {"role", "content"} objects, rendered with the chat template (below) and
  // tokenized with its special tokens; only the assistant's turns are learned (the shards carry
  // a loss mask: token_shard.h, chat_template.h's span rule). Empty: JSONL lines hold text.
  std::string chat_field;
  // A Jinja file holding the chat template; empty: the template of the model folder given as
  // tokenizer_model (tokenizer_config.json's chat_template, or chat_template.jinja).
  std::string chat_template;
  bool progress = false;  // report progress on stderr for runs that last over a second
};

// One `--input` value taken apart.
struct InputSpec {
  std::string path;
  std::optional<double> weight;  // positive and finite when present
};

// `PATH` or `PATH:WEIGHT`. A value naming an existing file is a path as it stands, so a file
// whose name holds colons needs no escaping; otherwise a trailing `:NUMBER` is the weight. A
// weight that is not positive and finite is a UserError naming the input and the weight.
// Whether the path exists is checked later, by prepare_data.
InputSpec parse_input_spec(const std::string& value);

// What prepare_data read from one input and put into the output.
struct SourceSummary {
  std::string path;
  std::optional<double> weight;       // as given; none for unweighted inputs
  std::int64_t documents = 0;         // non-empty documents the input holds
  std::int64_t tokens = 0;            // their tokens together
  std::int64_t documents_taken = 0;   // into the output, repeats counted
  std::int64_t tokens_taken = 0;
  double epochs() const {
    return tokens > 0 ? static_cast<double>(tokens_taken) / static_cast<double>(tokens) : 0.0;
  }
};

// What prepare_data wrote, for the CLI to print.
struct PrepareDataSummary {
  std::string tokenizer;
  std::int64_t vocab_size = 0;
  std::int64_t input_bytes = 0;  // total size of the input files
  std::int64_t total_tokens = 0;
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
  std::string train_path;  // <prefix>_train.bin
  std::string val_path;    // <prefix>_val.bin
  // <prefix>_tokenizer, the folder holding a copy of the tokenizer's files (Tokenizer::files);
  // empty when the tokenizer's name determines it (byte, gpt2) or it is a lone SentencePiece
  // model file.
  std::string tokenizer_files_path;
  // <prefix>_tokenizer.model, the copy of a lone SentencePiece model file (one from
  // train-tokenizer); empty otherwise.
  std::string tokenizer_model_path;
  bool weighted = false;   // the inputs carried weights (a blend)
  bool loss_masked = false;            // chat records: the shards carry a loss mask
  std::int64_t trained_tokens = 0;     // with a loss mask: the tokens it counts (both shards)
  std::vector<SourceSummary> sources;  // one per input, in the order given
};

// Tokenizes the inputs as described at the top and writes `<output_prefix>_train.bin` and
// `<output_prefix>_val.bin` (atomically; missing parent folders of the prefix are created),
// and, for a tokenizer its name does not determine, a copy of its files where training finds
// them by default: tokenizer_folder_beside_shards(output_prefix), or for a lone SentencePiece
// model tokenizer_model_beside_shards(output_prefix).
// With val_fraction = 0 the validation shard is written empty. Preconditions (UserError
// otherwise, before any shard is written): a known tokenizer (with its files); at least one
// input; every input an existing non-empty regular file; weights on all inputs or none;
// val_fraction in [0, 1); when val_fraction > 0, both splits non-empty; a non-empty
// jsonl_field.
PrepareDataSummary prepare_data(const PrepareDataOptions& options);

// The tokenizer `tokenizer` and `tokenizer_model` name, as PrepareDataOptions describes them.
// UserError when --tokenizer names another kind than the folder holds.
std::unique_ptr<Tokenizer> resolve_tokenizer(const std::string& tokenizer,
                                             const std::string& tokenizer_model);

// The same for unweighted or weighted `inputs` with the other options at their defaults.
PrepareDataSummary prepare_data(const std::vector<std::string>& inputs,
                                const std::string& output_prefix, double val_fraction,
                                const std::string& tokenizer,
                                const std::string& tokenizer_model = "");

// The progress line of a long run: bytes read of the total, the read rate, tokens so far and
// the time left at that rate. It is given the time rather than reading a clock, so that what
// it shows when is a function of its inputs. Nothing is shown during the first second (a run
// that ends within it prints nothing); after that, on a terminal the line is redrawn in place
// ('\r') at most every 0.25 s, elsewhere (a log file) a full line is written every 5 s.
class ProgressMeter {
 public:
  enum class Style { redraw, lines };
  ProgressMeter(std::int64_t total_bytes, Style style) : total_bytes_(total_bytes), style_(style) {}

  // The text to write to stderr now ("" when nothing is due), `seconds` after the start.
  std::string update(std::int64_t bytes_done, std::int64_t tokens, double seconds);
  // The text to write at the end: the final figures and a newline where anything was shown
  // before, else "".
  std::string finish(std::int64_t bytes_done, std::int64_t tokens, double seconds);

  // "12.3 / 80.0 MB (15%), 4.1 MB/s, 3.2M tokens, ETA 14 s" (the ETA left out at the end).
  static std::string describe(std::int64_t bytes_done, std::int64_t total_bytes,
                              std::int64_t tokens, double seconds, bool finished);

  static constexpr double kQuietSeconds = 1.0;
  static constexpr double kRedrawSeconds = 0.25;
  static constexpr double kLineSeconds = 5.0;

 private:
  std::int64_t total_bytes_;
  Style style_;
  std::optional<double> last_shown_;  // seconds at the last text returned
  std::size_t drawn_width_ = 0;       // of the line now on the terminal (redraw style)
};

}  // namespace oases::data
