#include "data/wordpiece_tokenizer.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer_files.h"
#include "data/tokenizer_text.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <unordered_map>
#include <utility>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

// The CJK blocks BERT's basic tokenizer makes words of their own (its _is_chinese_char).
bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BERT's punctuation: all of ASCII's non-alphanumeric printable characters (^, $, ` and the
// like are symbols in Unicode, punctuation for BERT), and category P*.
bool is_bert_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  return c >= 0x80 && is_punctuation(c);
}

struct WordPieceSettings {
  bool clean_text = true;
  bool split_cjk = true;
  bool lowercase = true;
  bool strip_accents = true;
  std::string continuing_prefix = "##";
  std::size_t max_word_chars = 100;
  std::string unk = "[UNK]", cls = "[CLS]", sep = "[SEP]", pad = "[PAD]", mask = "[MASK]";
};

class WordPieceTokenizer final : public Tokenizer {
 public:
  WordPieceTokenizer(std::vector<TokenizerFile> files, const std::string& source)
      : files_(std::move(files)) {
    std::optional<TokenizerConfig> config;
    if (const TokenizerFile* file = find_file(files_, kTokenizerConfigFile))
      config = parse_tokenizer_config(file->contents,
                                      fmt::format("{} {}", source, kTokenizerConfigFile));
    std::vector<std::string> added_special;
    if (const TokenizerFile* vocab = find_file(files_, kWordPieceVocabFile)) {
      vocab_source_ = fmt::format("{} {}", source, kWordPieceVocabFile);
      read_vocab_txt(vocab->contents);
      // BertTokenizer's defaults, unless the configuration says otherwise.
      if (config) {
        settings_.lowercase = config->do_lower_case.value_or(true);
        settings_.strip_accents = config->strip_accents.value_or(settings_.lowercase);
        settings_.split_cjk = config->tokenize_chinese_chars.value_or(true);
      }
    } else {
      const TokenizerFile& json = require_file(files_, kTokenizerJsonFile, source, "wordpiece");
      vocab_source_ = fmt::format("{} {}", source, kTokenizerJsonFile);
      read_tokenizer_json(json.contents, added_special);
      files_.erase(std::remove_if(files_.begin(), files_.end(),
                                  [](const TokenizerFile& f) {
                                    return f.name != kTokenizerJsonFile &&
                                           f.name != kTokenizerConfigFile;
                                  }),
                   files_.end());
    }
    if (config) {
      for (auto [name, setting] : {std::pair{&settings_.unk, &config->unk_token},
                                   std::pair{&settings_.cls, &config->cls_token},
                                   std::pair{&settings_.sep, &config->sep_token},
                                   std::pair{&settings_.pad, &config->pad_token},
                                   std::pair{&settings_.mask, &config->mask_token}})
        if (!setting->empty()) *name = *setting;
      for (const TokenizerConfig::AddedToken& token : config->added_tokens)
        if (token.special) added_special.push_back(token.content);
    }
    const auto required = [&](const std::string& token, const char* role) {
      const auto it = ids_.find(token);
      OASES_CHECK(it != ids_.end(),
                  "{} has no {} token \"{}\"; BERT's WordPiece needs it (tokenizer_config.json "
                  "names it otherwise with {}_token)",
                  vocab_source_, role, token, role);
      special_.add({token, it->second});
      return it->second;
    };
    unk_ = required(settings_.unk, "unk");
    cls_ = required(settings_.cls, "cls");
    sep_ = required(settings_.sep, "sep");
    for (const std::string& token : {settings_.pad, settings_.mask})
      if (const auto it = ids_.find(token); it != ids_.end()) special_.add({token, it->second});
    for (const std::string& token : added_special) {
      const auto it = ids_.find(token);
      OASES_CHECK(it != ids_.end(),
                  "{}: the special token \"{}\" is not in the vocabulary; oases takes special "
                  "tokens from the vocabulary, never adds them",
                  vocab_source_, token);
      special_.add({token, it->second});
    }
  }

  std::string name() const override { return std::string(kWordPieceName); }
  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(tokens_.size()); }
  std::optional<std::int32_t> begin_of_sequence() const override { return cls_; }
  std::optional<std::int32_t> document_separator() const override { return sep_; }
  std::int32_t end_of_document() const override { return sep_; }
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
    std::string text;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      OASES_CHECK(tokens[i] >= 0 && static_cast<std::size_t>(tokens[i]) < tokens_.size(),
                  "token {} at position {} is outside the wordpiece tokenizer's vocabulary [0, {})",
                  tokens[i], i, tokens_.size());
      const std::string_view token = tokens_[static_cast<std::size_t>(tokens[i])];
      if (token.starts_with(settings_.continuing_prefix) &&
          token.size() > settings_.continuing_prefix.size()) {
        text += token.substr(settings_.continuing_prefix.size());
      } else {
        if (i > 0) text += ' ';
        text += token;
      }
    }
    return text;
  }

 private:
  static void check_utf8(std::string_view text) {
    const std::size_t bad = first_invalid_utf8(text);
    OASES_CHECK(bad == std::string_view::npos,
                "the wordpiece tokenizer reads UTF-8 text, and byte {} (0x{:02x}) does not start "
                "a valid UTF-8 character; convert the text to UTF-8 (e.g. with iconv) or use the "
                "byte, gpt2 or bpe tokenizer, which take any bytes",
                bad, bad == std::string_view::npos ? 0 : static_cast<unsigned char>(text[bad]));
  }

  void read_vocab_txt(const std::string& text) {
    for (std::size_t begin = 0; begin < text.size();) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::string token = text.substr(begin, end - begin);
      if (!token.empty() && token.back() == '\r') token.pop_back();
      // As BertTokenizer's load_vocab: a token listed twice keeps its last line's id.
      ids_[token] = static_cast<std::int32_t>(tokens_.size());
      tokens_.push_back(std::move(token));
      begin = end + 1;
    }
    OASES_CHECK(!tokens_.empty(), "{} is empty; vocab.txt lists one token per line", vocab_source_);
  }

  void read_tokenizer_json(const std::string& text, std::vector<std::string>& added_special) {
    const nlohmann::json json = parse_tokenizer_json(text, vocab_source_);
    OASES_CHECK(json.is_object() && json.contains("model") && json["model"].is_object(),
                "{} has no \"model\" object; is it a Hugging Face tokenizer.json?", vocab_source_);
    const nlohmann::json& model = json["model"];
    const std::string where = vocab_source_ + " model";
    const std::string type = optional_json_string(model, "type", where);
    OASES_CHECK(type == "WordPiece",
                "{} holds a model of type \"{}\"; the wordpiece tokenizer reads \"WordPiece\"",
                vocab_source_, type.empty() ? "(none)" : type);
    if (const std::string unk = optional_json_string(model, "unk_token", where); !unk.empty())
      settings_.unk = unk;
    if (model.contains("continuing_subword_prefix") &&
        !model["continuing_subword_prefix"].is_null())
      settings_.continuing_prefix = optional_json_string(model, "continuing_subword_prefix", where);
    if (const auto max = model.find("max_input_chars_per_word"); max != model.end()) {
      const auto value = io::json_integer<std::int32_t>(*max);
      OASES_CHECK(value && *value >= 1,
                  "{}: max_input_chars_per_word is {}; expected an integer "
                  ">= 1",
                  where, max->dump());
      settings_.max_word_chars = static_cast<std::size_t>(*value);
    }
    const auto vocab = model.find("vocab");
    OASES_CHECK(vocab != model.end() && vocab->is_object() && !vocab->empty(),
                "{} has no model.vocab object of token -> id", vocab_source_);
    tokens_.assign(vocab->size(), std::string());
    std::vector<bool> seen(vocab->size(), false);
    for (const auto& [token, value] : vocab->items()) {
      const auto id = io::json_integer<std::int32_t>(value);
      OASES_CHECK(id && *id >= 0 && static_cast<std::size_t>(*id) < tokens_.size() &&
                      !seen[static_cast<std::size_t>(*id)],
                  "{} maps \"{}\" to {}; ids must be distinct integers in [0, {})", vocab_source_,
                  token, value.dump(), tokens_.size());
      seen[static_cast<std::size_t>(*id)] = true;
      tokens_[static_cast<std::size_t>(*id)] = token;
      ids_[token] = *id;
    }
    const auto normalizer = json.find("normalizer");
    if (normalizer != json.end() && !normalizer->is_null()) {
      const std::string norm_where = vocab_source_ + " normalizer";
      OASES_CHECK(normalizer->is_object() &&
                      optional_json_string(*normalizer, "type", norm_where) == "BertNormalizer",
                  "{} has the normalizer {}; the wordpiece tokenizer reads \"BertNormalizer\" or "
                  "none",
                  vocab_source_, normalizer->dump());
      settings_.clean_text =
          optional_json_bool(*normalizer, "clean_text", norm_where).value_or(true);
      settings_.split_cjk =
          optional_json_bool(*normalizer, "handle_chinese_chars", norm_where).value_or(true);
      settings_.lowercase = optional_json_bool(*normalizer, "lowercase", norm_where).value_or(true);
      settings_.strip_accents = optional_json_bool(*normalizer, "strip_accents", norm_where)
                                    .value_or(settings_.lowercase);
    } else {
      settings_.clean_text = settings_.split_cjk = settings_.lowercase = settings_.strip_accents =
          false;
    }
    const auto pre = json.find("pre_tokenizer");
    OASES_CHECK(pre != json.end() && pre->is_object() &&
                    optional_json_string(*pre, "type", vocab_source_ + " pre_tokenizer") ==
                        "BertPreTokenizer",
                "{} has the pre-tokenizer {}; the wordpiece tokenizer reads \"BertPreTokenizer\"",
                vocab_source_, pre == json.end() ? std::string("(none)") : pre->dump());
    if (const auto added = json.find("added_tokens"); added != json.end() && added->is_array())
      for (const nlohmann::json& token : *added)
        if (token.is_object() && token.value("special", false) && token.contains("content") &&
            token["content"].is_string())
          added_special.push_back(token["content"].get<std::string>());
  }

  // BERT's normalization of `text`: clean-up, CJK spacing, lower-casing, accent stripping.
  std::string normalize(std::string_view text) const {
    std::string out;
    out.reserve(text.size() + 16);
    for (std::size_t i = 0; i < text.size();) {
      const DecodedChar d = decode_char(text, i);
      i += d.bytes;
      char32_t c = d.value;
      if (settings_.clean_text) {
        const bool kept_control = c == '\t' || c == '\n' || c == '\r';
        if (c == 0 || c == 0xFFFD || (!kept_control && is_other(c))) continue;
        if (is_white_space(c) || is_space_separator(c)) c = ' ';
      }
      if (settings_.split_cjk && is_cjk_ideograph(c)) {
        out += ' ';
        append_utf8(out, c);
        out += ' ';
        continue;
      }
      if (!settings_.lowercase && !settings_.strip_accents) {
        append_utf8(out, c);
        continue;
      }
      std::string lowered;
      if (settings_.lowercase)
        append_lowercase(lowered, c);
      else
        append_utf8(lowered, c);
      if (!settings_.strip_accents) {
        out += lowered;
        continue;
      }
      for (std::size_t k = 0; k < lowered.size();) {
        const DecodedChar l = decode_char(lowered, k);
        append_without_accents(out, l.value);
        k += l.bytes;
      }
    }
    return out;
  }

  void encode_text(std::string_view text, std::vector<std::int32_t>& tokens) const {
    const std::string normal = normalize(text);
    const std::string_view view = normal;
    std::size_t word_start = 0;
    const auto finish_word = [&](std::size_t end) {
      if (end > word_start) encode_word(view.substr(word_start, end - word_start), tokens);
    };
    for (std::size_t i = 0; i < view.size();) {
      const DecodedChar c = decode_char(view, i);
      if (is_white_space(c.value)) {
        finish_word(i);
        word_start = i + c.bytes;
      } else if (is_bert_punctuation(c.value)) {
        finish_word(i);
        encode_word(view.substr(i, c.bytes), tokens);
        word_start = i + c.bytes;
      }
      i += c.bytes;
    }
    finish_word(view.size());
  }

  // Greedy longest-match-first WordPiece.
  void encode_word(std::string_view word, std::vector<std::int32_t>& tokens) const {
    std::vector<std::size_t> boundaries;  // byte offsets of the code points, and the end
    for (std::size_t i = 0; i < word.size(); i += decode_char(word, i).bytes)
      boundaries.push_back(i);
    if (boundaries.size() > settings_.max_word_chars) {
      tokens.push_back(unk_);
      return;
    }
    boundaries.push_back(word.size());
    const std::size_t first = tokens.size();
    std::string candidate;
    for (std::size_t start = 0; start + 1 < boundaries.size();) {
      std::optional<std::int32_t> found;
      std::size_t end = boundaries.size() - 1;
      for (; end > start; --end) {
        candidate.assign(start > 0 ? settings_.continuing_prefix : std::string());
        candidate.append(word.substr(boundaries[start], boundaries[end] - boundaries[start]));
        if (const auto it = ids_.find(candidate); it != ids_.end()) {
          found = it->second;
          break;
        }
      }
      if (!found) {
        tokens.resize(first);
        tokens.push_back(unk_);
        return;
      }
      tokens.push_back(*found);
      start = end;
    }
  }

  std::vector<TokenizerFile> files_;
  std::string vocab_source_;
  WordPieceSettings settings_;
  std::vector<std::string> tokens_;  // id -> token
  std::unordered_map<std::string, std::int32_t> ids_;
  SpecialTokenSplitter special_;
  std::int32_t unk_ = 0, cls_ = 0, sep_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> load_wordpiece_tokenizer(const std::string& path) {
  OASES_CHECK(!path.empty(),
              "the wordpiece tokenizer needs its files: pass --tokenizer-model DIR (prepare-data) "
              "or set data.tokenizer_model (training) to a folder holding vocab.txt (and "
              "tokenizer_config.json) or tokenizer.json");
  std::error_code ec;
  OASES_CHECK(fs::exists(path, ec),
              "wordpiece tokenizer path '{}' does not exist; give a folder holding vocab.txt or "
              "tokenizer.json, or one of those files",
              path);
  std::vector<TokenizerFile> files;
  fs::path folder = path;
  if (fs::is_regular_file(path, ec)) {
    const std::string file_name = fs::path(path).filename().string();
    const std::string name = file_name.ends_with(".json") ? std::string(kTokenizerJsonFile)
                                                          : std::string(kWordPieceVocabFile);
    files.push_back({name, read_regular_file(path, "tokenizer file", kMaxTokenizerFileBytes)});
    folder = fs::path(path).parent_path();
  } else {
    for (const std::string_view name : {kWordPieceVocabFile, kTokenizerJsonFile})
      if (std::optional<TokenizerFile> file = read_folder_file(folder.string(), name)) {
        files.push_back(std::move(*file));
        break;
      }
    OASES_CHECK(!files.empty(),
                "folder '{}' holds neither {} nor {}; the wordpiece tokenizer "
                "reads one of them",
                path, kWordPieceVocabFile, kTokenizerJsonFile);
  }
  if (std::optional<TokenizerFile> config = read_folder_file(folder.string(), kTokenizerConfigFile))
    files.push_back(std::move(*config));
  return std::make_unique<WordPieceTokenizer>(std::move(files), fmt::format("'{}'", path));
}

std::unique_ptr<Tokenizer> wordpiece_tokenizer_from_files(const std::vector<TokenizerFile>& files,
                                                          const std::string& source) {
  std::vector<TokenizerFile> kept;
  const bool has_vocab = find_file(files, kWordPieceVocabFile) != nullptr;
  for (const TokenizerFile& file : files)
    if (file.name == kTokenizerConfigFile || file.name == kWordPieceVocabFile ||
        (!has_vocab && file.name == kTokenizerJsonFile))
      kept.push_back(file);
  return std::make_unique<WordPieceTokenizer>(std::move(kept), source);
}

}  // namespace oases::data
