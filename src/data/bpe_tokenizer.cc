#include "data/bpe_tokenizer.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "data/tokenizer_files.h"
#include "data/tokenizer_text.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <utility>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------
// Character classes of the pre-tokenization patterns.

enum class CharClass : std::uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify_slow(char32_t c) {
  if (c == kInvalidByte) return CharClass::kOther;
  if (is_white_space(c)) return CharClass::kSpace;
  if (is_letter(c)) return CharClass::kLetter;
  if (is_number(c)) return CharClass::kNumber;
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

Char char_at(std::string_view text, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return {kAsciiClasses[b0], 1, b0};
  const DecodedChar c = decode_char(text, i);
  return {classify_slow(c.value), c.bytes, c.value};
}

bool is_newline(char32_t c) {
  return c == '\r' || c == '\n';
}

// ---------------------------------------------------------------------------------------
// GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+

// Length in bytes of a contraction ('s 't 're 've 'm 'll 'd) at text[i] == '\'', or 0. With
// `any_case`, the letters match in either case, and s also as U+017F (LONG S), as Unicode
// simple case folding has it.
std::size_t contraction_length(std::string_view text, std::size_t i, bool any_case) {
  const auto letter_at = [&](std::size_t at, char lower) -> std::size_t {
    if (at >= text.size()) return 0;
    const char c = text[at];
    if (c == lower || (any_case && c == lower - 'a' + 'A')) return 1;
    if (any_case && lower == 's' && text.substr(at).starts_with("\u017F")) return 2;
    return 0;
  };
  const std::size_t at = i + 1;
  for (const char single : {'s', 't'})
    if (const std::size_t n = letter_at(at, single)) return 1 + n;
  for (const char* pair : {"re", "ve"})
    if (const std::size_t n = letter_at(at, pair[0]))
      if (const std::size_t m = letter_at(at + n, pair[1])) return 1 + n + m;
  if (const std::size_t n = letter_at(at, 'm')) return 1 + n;
  if (const std::size_t n = letter_at(at, 'l'))
    if (const std::size_t m = letter_at(at + n, 'l')) return 1 + n + m;
  if (const std::size_t n = letter_at(at, 'd')) return 1 + n;
  return 0;
}

// The end of the run of characters of class `cls` starting at `begin`.
std::size_t run_end(std::string_view text, std::size_t begin, CharClass cls) {
  std::size_t end = begin;
  while (end < text.size()) {
    const Char d = char_at(text, end);
    if (d.cls != cls) break;
    end += d.bytes;
  }
  return end;
}

// `\s+(?!\S)|\s+` at a whitespace character text[i]: a whitespace run that ends the text is
// taken whole; one followed by another character gives up its last character to it (which
// then starts the next word), unless it is a single character, taken alone.
std::size_t trailing_space_end(std::string_view text, std::size_t i) {
  std::size_t end = i, last = i, count = 0;
  while (end < text.size()) {
    const Char d = char_at(text, end);
    if (d.cls != CharClass::kSpace) break;
    last = end;
    end += d.bytes;
    ++count;
  }
  return end < text.size() && count >= 2 ? last : end;
}

// Each branch is the alternative of the pattern that wins at position i (the alternatives are
// tried in order; each is greedy and nothing follows it, so its longest match is taken).
std::size_t gpt2_word_end(std::string_view text, std::size_t i) {
  const Char c = char_at(text, i);
  if (c.value == '\'')
    if (const std::size_t n = contraction_length(text, i, false)) return i + n;
  // ` ?\p{L}+`, ` ?\p{N}+` and ` ?[^\s\p{L}\p{N}]+` take one leading space when the run of
  // their class follows it; a space followed by whitespace (or nothing) starts a whitespace
  // word instead.
  CharClass run = c.cls;
  std::size_t run_start = i;
  if (c.value == ' ' && i + 1 < text.size()) {
    const Char next = char_at(text, i + 1);
    if (next.cls != CharClass::kSpace) run = next.cls, run_start = i + 1;
  }
  if (run != CharClass::kSpace) return run_end(text, run_start, run);
  return trailing_space_end(text, i);
}

// ---------------------------------------------------------------------------------------
// LLaMA 3's pattern: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+

std::size_t llama3_word_end(std::string_view text, std::size_t i) {
  const std::size_t n = text.size();
  const Char c = char_at(text, i);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c.value == '\'')
    if (const std::size_t length = contraction_length(text, i, true)) return i + length;
  // [^\r\n\p{L}\p{N}]?\p{L}+: letters, maybe after one character that is not a newline, a
  // letter or a number.
  if (c.cls == CharClass::kLetter) return run_end(text, i, CharClass::kLetter);
  if (c.cls != CharClass::kNumber && !is_newline(c.value) && i + c.bytes < n &&
      char_at(text, i + c.bytes).cls == CharClass::kLetter)
    return run_end(text, i + c.bytes, CharClass::kLetter);
  // \p{N}{1,3}
  if (c.cls == CharClass::kNumber) {
    std::size_t end = i;
    for (int k = 0; k < 3 && end < n; ++k) {
      const Char d = char_at(text, end);
      if (d.cls != CharClass::kNumber) break;
      end += d.bytes;
    }
    return end;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  std::size_t other_start = i;
  if (c.value == ' ' && i + 1 < n && char_at(text, i + 1).cls == CharClass::kOther)
    other_start = i + 1;
  if (char_at(text, other_start).cls == CharClass::kOther) {
    std::size_t end = run_end(text, other_start, CharClass::kOther);
    while (end < n && is_newline(static_cast<unsigned char>(text[end]))) ++end;
    return end;
  }
  // Here c is whitespace. `\s*[\r\n]+`: the whitespace run up to and with its last newline.
  std::size_t end = i, after_newline = 0;
  while (end < n) {
    const Char d = char_at(text, end);
    if (d.cls != CharClass::kSpace) break;
    end += d.bytes;
    if (is_newline(d.value)) after_newline = end;
  }
  if (after_newline > 0) return after_newline;
  // `\s+(?!\S)|\s+`
  return trailing_space_end(text, i);
}

template <class Emit>
void for_each_word(PretokenizePattern pattern, std::string_view text, Emit&& emit) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t end =
        pattern == PretokenizePattern::gpt2 ? gpt2_word_end(text, i) : llama3_word_end(text, i);
    OASES_ASSERT(end > i && end <= text.size(), "pre-tokenization made no progress at byte {}", i);
    emit(text.substr(i, end - i));
    i = end;
  }
}

// ---------------------------------------------------------------------------------------
// GPT-2's byte alphabet.

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

// ---------------------------------------------------------------------------------------
// The merge table: (left id, right id) -> (rank, merged id), open addressing, linear probing.

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
    return std::uint64_t{static_cast<std::uint32_t>(left)} << 32 |
           static_cast<std::uint32_t>(right);
  }
  std::size_t hash(std::uint64_t k) const {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

}  // namespace

std::vector<std::string_view> pretokenize(PretokenizePattern pattern, std::string_view text) {
  std::vector<std::string_view> words;
  for_each_word(pattern, text, [&](std::string_view word) { words.push_back(word); });
  return words;
}

std::optional<std::string> byte_alphabet_to_bytes(std::string_view token) {
  std::string bytes;
  for (std::size_t i = 0; i < token.size();) {
    const DecodedChar c = decode_char(token, i);
    if (c.value >= kAlphabetLimit || kAlphabetBytes[c.value] < 0) return std::nullopt;
    bytes += static_cast<char>(kAlphabetBytes[c.value]);
    i += c.bytes;
  }
  return bytes;
}

std::string bytes_to_byte_alphabet(std::string_view bytes) {
  std::string token;
  for (const char b : bytes) append_utf8(token, kByteAlphabet[static_cast<unsigned char>(b)]);
  return token;
}

// ---------------------------------------------------------------------------------------
// ByteLevelBpe

struct ByteLevelBpe::State {
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

  explicit State(std::size_t merge_entries) : merges(merge_entries) {}

  std::vector<std::string> token_bytes;               // id -> the bytes it stands for ("" if none)
  std::unordered_map<std::string, std::int32_t> ids;  // token string (byte alphabet) -> id
  std::unordered_map<std::string, std::int32_t> ids_by_bytes;  // with ignore_merges only
  std::array<std::int32_t, 256> byte_token{};
  MergeTable merges;
  PretokenizePattern pattern = PretokenizePattern::gpt2;
  bool ignore_merges = false;

  void encode_word(std::string_view word, Scratch& s, std::vector<std::int32_t>& out) const {
    if (word.size() == 1) {
      out.push_back(byte_token[static_cast<unsigned char>(word[0])]);
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
    const auto whole = ignore_merges ? ids_by_bytes.find(std::string(word)) : ids_by_bytes.end();
    if (whole != ids_by_bytes.end())
      out.push_back(whole->second);
    else
      merge_word(word, s, out);
    if (cacheable) {
      if (s.cached_tokens.size() >= kCacheTokens) {
        s.cache.clear();
        s.cached_tokens.clear();
      }
      s.cache.emplace(word, std::pair{static_cast<std::uint32_t>(s.cached_tokens.size()),
                                      static_cast<std::uint32_t>(out.size() - first)});
      s.cached_tokens.insert(s.cached_tokens.end(),
                             out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    }
  }

  // Merges the lowest-ranked adjacent pair, leftmost first, until no adjacent pair is a merge
  // (Hugging Face's BPE; GPT-2's bpe() gives the same when each merge's parts were made by
  // earlier merges, which GPT-2's files guarantee: no pair of lower rank can then appear
  // between two occurrences of the pair being merged). Stale queue entries (a symbol that
  // changed since) are skipped when popped.
  void merge_word(std::string_view word, Scratch& s, std::vector<std::int32_t>& out) const {
    OASES_CHECK(word.size() < std::size_t{1} << 31,
                "byte-level BPE cannot encode a word of {} bytes (a run of one character class "
                "without a break); the limit is 2^31 - 1 bytes",
                word.size());
    const auto n = static_cast<std::int32_t>(word.size());
    auto& sym = s.symbols;
    auto& queue = s.queue;
    sym.resize(word.size());
    queue.clear();
    for (std::int32_t k = 0; k < n; ++k)
      sym[k] = {byte_token[static_cast<unsigned char>(word[k])], k + 1 < n ? k + 1 : -1, k - 1};
    const auto consider = [&](std::int32_t left) {
      if (left < 0) return;
      const std::int32_t right = sym[left].next;
      if (right < 0) return;
      if (const MergeTable::Merge* m = merges.find(sym[left].id, sym[right].id)) {
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
};

ByteLevelBpe::ByteLevelBpe(const nlohmann::json& vocab, const std::string& source,
                           std::int32_t id_limit,
                           const std::function<std::vector<Merge>()>& read_merges,
                           PretokenizePattern pattern, bool ignore_merges, bool learned_order)
    : state_(std::make_unique<State>(0)) {
  State& s = *state_;
  s.pattern = pattern;
  s.ignore_merges = ignore_merges;
  OASES_CHECK(vocab.is_object() && !vocab.empty(),
              "{} holds {} where a vocabulary maps token strings to ids", source,
              vocab.is_object() ? std::string("an empty object") : std::string(vocab.type_name()));
  s.token_bytes.assign(static_cast<std::size_t>(id_limit), std::string());
  std::vector<bool> seen(static_cast<std::size_t>(id_limit), false);
  std::unordered_map<std::string, std::int32_t> by_bytes;
  s.byte_token.fill(-1);
  for (const auto& [key, value] : vocab.items()) {
    const std::optional<std::int32_t> id = io::json_integer<std::int32_t>(value);
    OASES_CHECK(id && *id >= 0 && *id < id_limit && !seen[static_cast<std::size_t>(*id)],
                "{} maps \"{}\" to {}; ids must be distinct integers in [0, {})", source, key,
                value.dump(), id_limit);
    const std::optional<std::string> bytes = byte_alphabet_to_bytes(key);
    OASES_CHECK(bytes && !bytes->empty(),
                "{} has the token \"{}\" (id {}), which is not a string of GPT-2's byte alphabet "
                "(byte-level BPE writes every token so)",
                source, key, *id);
    OASES_CHECK(by_bytes.emplace(*bytes, *id).second,
                "{} has the tokens {} and {} for the same bytes", source, by_bytes[*bytes], *id);
    seen[static_cast<std::size_t>(*id)] = true;
    if (bytes->size() == 1) s.byte_token[static_cast<unsigned char>((*bytes)[0])] = *id;
    s.token_bytes[static_cast<std::size_t>(*id)] = *bytes;
    s.ids.emplace(key, *id);
  }
  const auto missing = std::find(s.byte_token.begin(), s.byte_token.end(), -1);
  OASES_CHECK(missing == s.byte_token.end(),
              "{} has no token for the byte 0x{:02x}; byte-level BPE needs one for each of the "
              "256 bytes",
              source, missing - s.byte_token.begin());
  if (ignore_merges) s.ids_by_bytes = std::move(by_bytes);

  const std::vector<Merge> merges = read_merges();
  s.merges = MergeTable(merges.size());

  // The rank that made each token; single bytes are there from the start.
  std::vector<bool> made(static_cast<std::size_t>(id_limit), false);
  std::int32_t rank = 0;
  const auto find_id = [&](const std::string& token) -> std::int32_t {
    const auto it = s.ids.find(token);
    return it == s.ids.end() ? -1 : it->second;
  };
  for (const Merge& merge : merges) {
    const std::int32_t a = find_id(merge.first), b = find_id(merge.second);
    const std::string joined = merge.first + merge.second;
    const std::int32_t merged = find_id(joined);
    OASES_CHECK(a >= 0 && b >= 0 && merged >= 0,
                "{} merges \"{}\" and \"{}\", but \"{}\" is not a token of {}; the vocabulary "
                "and the merges do not belong together",
                merge.where, merge.first, merge.second,
                a < 0   ? merge.first
                : b < 0 ? merge.second
                        : joined,
                source);
    if (learned_order)
      for (const std::int32_t part : {a, b})
        OASES_CHECK(s.token_bytes[static_cast<std::size_t>(part)].size() == 1 ||
                        made[static_cast<std::size_t>(part)],
                    "{} uses the token \"{}\" before a merge that makes it; GPT-2's merges come "
                    "in the order they were learned",
                    merge.where, part == a ? merge.first : merge.second);
    OASES_CHECK(s.merges.insert(a, b, {rank, merged}), "{} repeats the merge \"{} {}\"",
                merge.where, merge.first, merge.second);
    made[static_cast<std::size_t>(merged)] = true;
    ++rank;
  }
}

ByteLevelBpe::~ByteLevelBpe() = default;
ByteLevelBpe::ByteLevelBpe(ByteLevelBpe&&) noexcept = default;

void ByteLevelBpe::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  State::Scratch scratch;
  for_each_word(state_->pattern, text,
                [&](std::string_view word) { state_->encode_word(word, scratch, out); });
}

std::string_view ByteLevelBpe::token_bytes(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= state_->token_bytes.size()) return {};
  return state_->token_bytes[static_cast<std::size_t>(id)];
}

std::optional<std::int32_t> ByteLevelBpe::find(const std::string& token) const {
  const auto it = state_->ids.find(token);
  return it == state_->ids.end() ? std::nullopt : std::optional(it->second);
}

std::size_t ByteLevelBpe::size() const {
  return state_->ids.size();
}

// ---------------------------------------------------------------------------------------
// The bpe tokenizer.

namespace {}  // namespace

std::vector<ByteLevelBpe::Merge> tokenizer_json_merges(const nlohmann::json& model,
                                                       const std::string& source) {
  const auto merges = model.find("merges");
  OASES_CHECK(merges != model.end() && merges->is_array(), "{} has no model.merges list of merges",
              source);
  std::vector<ByteLevelBpe::Merge> list;
  list.reserve(merges->size());
  for (std::size_t i = 0; i < merges->size(); ++i) {
    const nlohmann::json& m = (*merges)[i];
    std::string where = fmt::format("{} model.merges entry {}", source, i);
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const std::size_t space = line.find(' ');
      OASES_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                      line.find(' ', space + 1) == std::string::npos,
                  "{} is \"{}\"; a merge written as a string must be two tokens separated by one "
                  "space",
                  where, line);
      list.push_back({line.substr(0, space), line.substr(space + 1), std::move(where)});
    } else {
      OASES_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string() &&
                      !m[0].get_ref<const std::string&>().empty() &&
                      !m[1].get_ref<const std::string&>().empty(),
                  "{} is {}; a merge is \"first second\" or [\"first\", \"second\"]", where,
                  m.dump());
      list.push_back({m[0].get<std::string>(), m[1].get<std::string>(), std::move(where)});
    }
  }
  return list;
}

namespace {

// The pattern of a byte-level BPE tokenizer.json's pre-tokenizer; UserError for another.
PretokenizePattern read_pattern(const nlohmann::json& json, const std::string& source) {
  const auto pre = json.find("pre_tokenizer");
  const std::string shown = pre == json.end() ? std::string("(none)") : pre->dump();
  const std::string accepted = fmt::format(
      "a \"ByteLevel\" pre-tokenizer with use_regex (GPT-2's pattern), or a \"Sequence\" of a "
      "\"Split\" on exactly GPT-2's pattern {} or LLaMA 3's {} and a \"ByteLevel\" without "
      "use_regex",
      kGpt2PatternText, kLlama3PatternText);
  OASES_CHECK(pre != json.end() && pre->is_object(), "{} has the pre-tokenizer {}; oases reads {}",
              source, shown, accepted);
  const auto byte_level_setting = [&](const nlohmann::json& level, const char* key, bool fallback) {
    return optional_json_bool(level, key, source + " pre_tokenizer").value_or(fallback);
  };
  const std::string type = optional_json_string(*pre, "type", source + " pre_tokenizer");
  if (type == "ByteLevel") {
    OASES_CHECK(!byte_level_setting(*pre, "add_prefix_space", false),
                "{} sets pre_tokenizer.add_prefix_space = true; oases reads byte-level BPE "
                "without a prefix space (GPT-2's and LLaMA 3's are false)",
                source);
    OASES_CHECK(byte_level_setting(*pre, "use_regex", true),
                "{} has the pre-tokenizer {} (use_regex false, no pattern); oases reads {}", source,
                shown, accepted);
    return PretokenizePattern::gpt2;
  }
  const auto steps = pre->find("pretokenizers");
  OASES_CHECK(type == "Sequence" && steps != pre->end() && steps->is_array() &&
                  steps->size() == 2 && (*steps)[0].is_object() && (*steps)[1].is_object(),
              "{} has the pre-tokenizer {}; oases reads {}", source, shown, accepted);
  const nlohmann::json& split = (*steps)[0];
  const nlohmann::json& level = (*steps)[1];
  const std::string split_where = source + " pre_tokenizer.pretokenizers[0]";
  OASES_CHECK(optional_json_string(split, "type", split_where) == "Split" &&
                  optional_json_string(level, "type", source + " pre_tokenizer.pretokenizers[1]") ==
                      "ByteLevel",
              "{} has the pre-tokenizer {}; oases reads {}", source, shown, accepted);
  const auto pattern = split.find("pattern");
  const std::string regex = pattern != split.end() && pattern->is_object()
                                ? optional_json_string(*pattern, "Regex", split_where + ".pattern")
                                : "";
  OASES_CHECK(regex == kGpt2PatternText || regex == kLlama3PatternText,
              "{} splits with the pattern {}; oases knows only GPT-2's {} and LLaMA 3's {}", source,
              pattern == split.end() ? std::string("(none)") : pattern->dump(), kGpt2PatternText,
              kLlama3PatternText);
  const std::string behavior = optional_json_string(split, "behavior", split_where);
  OASES_CHECK(
      behavior == "Isolated" && !optional_json_bool(split, "invert", split_where).value_or(false),
      "{} splits with behavior \"{}\" and invert {}; oases reads \"Isolated\" without "
      "invert, as LLaMA 3's",
      source, behavior, split.value("invert", false));
  OASES_CHECK(!byte_level_setting(level, "add_prefix_space", false) &&
                  !byte_level_setting(level, "use_regex", true),
              "{} has the pre-tokenizer {}; after a Split, oases reads a \"ByteLevel\" with "
              "add_prefix_space and use_regex false, as LLaMA 3's",
              source, shown);
  return regex == kGpt2PatternText ? PretokenizePattern::gpt2 : PretokenizePattern::llama3;
}

// The special token a TemplateProcessing post-processor puts first in a single sequence.
std::string template_first_special(const nlohmann::json& json) {
  const auto post = json.find("post_processor");
  if (post == json.end() || !post->is_object()) return "";
  std::vector<const nlohmann::json*> processors = {&*post};
  if (post->value("type", "") == "Sequence" && post->contains("processors") &&
      (*post)["processors"].is_array()) {
    processors.clear();
    for (const nlohmann::json& p : (*post)["processors"]) processors.push_back(&p);
  }
  for (const nlohmann::json* p : processors) {
    if (!p->is_object() || p->value("type", "") != "TemplateProcessing") continue;
    const auto single = p->find("single");
    if (single == p->end() || !single->is_array() || single->empty()) return "";
    const nlohmann::json& first = (*single)[0];
    if (first.is_object() && first.contains("SpecialToken") && first["SpecialToken"].is_object() &&
        first["SpecialToken"].contains("id") && first["SpecialToken"]["id"].is_string())
      return first["SpecialToken"]["id"].get<std::string>();
    return "";
  }
  return "";
}

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(std::vector<TokenizerFile> files, const std::string& source)
      : files_(std::move(files)) {
    const TokenizerFile& json_file = require_file(files_, kTokenizerJsonFile, source, "bpe");
    const std::string json_source = fmt::format("{} {}", source, kTokenizerJsonFile);
    nlohmann::json json = parse_tokenizer_json(json_file.contents, json_source);
    OASES_CHECK(json.is_object() && json.contains("model") && json["model"].is_object(),
                "{} has no \"model\" object; is it a Hugging Face tokenizer.json?", json_source);
    const nlohmann::json& model = json["model"];
    const std::string model_where = json_source + " model";
    const std::string type = optional_json_string(model, "type", model_where);
    OASES_CHECK(type == "BPE",
                "{} holds a model of type \"{}\"; the bpe tokenizer reads byte-level BPE "
                "(model.type \"BPE\"){}",
                json_source, type.empty() ? "(none)" : type,
                type == "WordPiece" ? "; WordPiece is the wordpiece tokenizer's" : "");
    const auto dropout = model.find("dropout");
    OASES_CHECK(dropout == model.end() || dropout->is_null(),
                "{} sets model.dropout = {}; oases reads BPE without dropout", json_source,
                dropout == model.end() ? "" : dropout->dump());
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const std::string affix = optional_json_string(model, key, model_where);
      OASES_CHECK(affix.empty(), "{} sets model.{} = \"{}\"; byte-level BPE has none", json_source,
                  key, affix);
    }
    OASES_CHECK(!optional_json_bool(model, "byte_fallback", model_where).value_or(false),
                "{} sets model.byte_fallback = true, which is SentencePiece-style BPE; oases "
                "reads byte-level BPE (tokenizer.model of such a model is the sentencepiece "
                "tokenizer's)",
                json_source);
    const auto normalizer = json.find("normalizer");
    OASES_CHECK(normalizer == json.end() || normalizer->is_null(),
                "{} has a normalizer ({}); byte-level BPE as oases reads it tokenizes text as it "
                "is",
                json_source, normalizer == json.end() ? "" : normalizer->dump());
    const PretokenizePattern pattern = read_pattern(json, json_source);
    const bool ignore_merges =
        optional_json_bool(model, "ignore_merges", model_where).value_or(false);
    OASES_CHECK(model.contains("vocab") && model["vocab"].is_object(),
                "{} has no model.vocab object", json_source);
    const nlohmann::json& vocab = model["vocab"];

    // Added tokens: ids beyond the model's, or the model's own.
    struct Added {
      std::string content;
      std::int32_t id;
      bool special, lstrip, rstrip;
    };
    std::vector<Added> added;
    std::int64_t limit = static_cast<std::int64_t>(vocab.size());
    if (const auto list = json.find("added_tokens"); list != json.end() && !list->is_null()) {
      OASES_CHECK(list->is_array(), "{}: added_tokens is {}, expected a list", json_source,
                  list->type_name());
      for (const nlohmann::json& token : *list) {
        const std::string where = json_source + " added token " + token.dump();
        const std::int32_t id = token.is_object() && token.contains("id")
                                    ? io::json_integer<std::int32_t>(token["id"]).value_or(-1)
                                    : -1;
        const std::string content =
            token.is_object() ? optional_json_string(token, "content", where) : "";
        OASES_CHECK(id >= 0 && !content.empty(),
                    "{}: an added token needs an \"id\" >= 0 and a non-empty \"content\"", where);
        OASES_CHECK(!optional_json_bool(token, "single_word", where).value_or(false),
                    "{} sets single_word = true, which oases does not implement", where);
        added.push_back({content, id, optional_json_bool(token, "special", where).value_or(false),
                         optional_json_bool(token, "lstrip", where).value_or(false),
                         optional_json_bool(token, "rstrip", where).value_or(false)});
        limit = std::max<std::int64_t>(limit, std::int64_t{id} + 1);
      }
    }
    OASES_CHECK(limit <= std::numeric_limits<std::int32_t>::max(), "{} has ids up to {}",
                json_source, limit - 1);
    vocab_size_ = static_cast<std::int32_t>(limit);
    bpe_.emplace(
        vocab, json_source + " (model.vocab)", vocab_size_,
        [&] { return tokenizer_json_merges(model, json_source); }, pattern, ignore_merges, false);
    added_text_.assign(static_cast<std::size_t>(vocab_size_), std::string());
    for (const Added& token : added) {
      const std::string_view own = bpe_->token_bytes(token.id);
      const auto same = bpe_->find(token.content);
      OASES_CHECK(own.empty() || (same && *same == token.id),
                  "{} adds the token \"{}\" as id {}, which model.vocab gives to another token",
                  json_source, token.content, token.id);
      if (own.empty()) added_text_[static_cast<std::size_t>(token.id)] = token.content;
      SpecialTokenSplitter& splitter = token.special ? special_ : always_;
      splitter.add({token.content, token.id, token.lstrip, token.rstrip});
      if (!token.special) special_.add({token.content, token.id, token.lstrip, token.rstrip});
    }
    for (std::int32_t id = 0; id < vocab_size_; ++id)
      OASES_CHECK(
          !bpe_->token_bytes(id).empty() || !added_text_[static_cast<std::size_t>(id)].empty(),
          "{} has no token of id {}, below its largest id {}; ids must leave no hole", json_source,
          id, vocab_size_ - 1);

    // tokenizer_config.json: begin and end of sequence.
    std::optional<TokenizerConfig> config;
    if (const TokenizerFile* file = find_file(files_, kTokenizerConfigFile))
      config = parse_tokenizer_config(file->contents,
                                      fmt::format("{} {}", source, kTokenizerConfigFile));
    const auto token_id = [&](const std::string& text, const char* setting) -> std::int32_t {
      const std::optional<std::int32_t> id = special_token_id(text);
      const std::optional<std::int32_t> plain = id ? id : bpe_->find(bytes_to_byte_alphabet(text));
      OASES_CHECK(plain.has_value(), "{} {} sets {} = \"{}\", which is not a token of {}", source,
                  kTokenizerConfigFile, setting, text, json_source);
      return *plain;
    };
    if (config && config->add_bos_token.has_value()) {
      if (*config->add_bos_token) {
        OASES_CHECK(!config->bos_token.empty(),
                    "{} {} sets add_bos_token = true but names no bos_token", source,
                    kTokenizerConfigFile);
        bos_ = token_id(config->bos_token, "bos_token");
      }
    } else if (const std::string first = template_first_special(json); !first.empty()) {
      bos_ = token_id(first, "the post-processor's first token");
    }
    if (config && !config->eos_token.empty()) {
      eos_ = token_id(config->eos_token, "eos_token");
    } else {
      for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>"})
        if (const auto id = special_.id(name); id && !eos_) eos_ = *id;
      OASES_CHECK(eos_.has_value(),
                  "{} names no end-of-sequence token: oases separates documents with it; give a "
                  "{} with eos_token beside it, or add <|end_of_text|>, <|endoftext|> or </s> as a "
                  "special token",
                  json_source, kTokenizerConfigFile);
    }
  }

  std::string name() const override { return std::string(kBpeName); }
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::optional<std::int32_t> begin_of_sequence() const override { return bos_; }
  std::optional<std::int32_t> document_separator() const override { return eos_; }
  std::int32_t end_of_document() const override { return *eos_; }
  std::vector<TokenizerFile> files() const override { return files_; }

  std::optional<std::int32_t> special_token_id(std::string_view text) const override {
    return special_.id(text);
  }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    return encode_split(text, always_);
  }
  std::vector<std::int32_t> encode_with_special_tokens(std::string_view text) const override {
    return encode_split(text, special_);
  }

  std::string decode(std::span<const std::int32_t> tokens) const override {
    std::string text;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      OASES_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_,
                  "token {} at position {} is outside the bpe tokenizer's vocabulary [0, {})",
                  tokens[i], i, vocab_size_);
      const std::string_view bytes = bpe_->token_bytes(tokens[i]);
      text += bytes.empty() ? std::string_view(added_text_[static_cast<std::size_t>(tokens[i])])
                            : bytes;
    }
    return text;
  }

 private:
  std::vector<std::int32_t> encode_split(std::string_view text,
                                         const SpecialTokenSplitter& splitter) const {
    return splitter.encode(text, [&](std::string_view piece, std::vector<std::int32_t>& tokens) {
      bpe_->encode(piece, tokens);
    });
  }

  std::vector<TokenizerFile> files_;
  std::optional<ByteLevelBpe> bpe_;
  std::int32_t vocab_size_ = 0;
  std::vector<std::string> added_text_;  // id -> text, for added ids outside model.vocab
  SpecialTokenSplitter special_;         // every added token
  SpecialTokenSplitter always_;          // the non-special added tokens, cut out by encode too
  std::optional<std::int32_t> bos_, eos_;
};

}  // namespace

std::string default_llama3_tokenizer_dir() {
  return (fs::path(oases_cache_dir()) / "tokenizers" / "llama3").string();
}

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path) {
  const fs::path where = path.empty() ? fs::path(default_llama3_tokenizer_dir()) : fs::path(path);
  std::error_code ec;
  const bool is_file = fs::is_regular_file(where, ec);
  const fs::path folder = is_file ? where.parent_path() : where;
  std::vector<TokenizerFile> files;
  if (is_file) {
    files.push_back({std::string(kTokenizerJsonFile),
                     read_regular_file(where.string(), "tokenizer file", kMaxTokenizerFileBytes)});
  } else {
    const std::string hint =
        path.empty() ? "; `bash scripts/install-deps.sh` writes LLaMA 3's there, or point "
                       "--tokenizer-model (data.tokenizer_model) at a model folder"
                     : "; give a Hugging Face tokenizer.json or a folder holding one";
    OASES_CHECK(fs::is_directory(folder, ec), "bpe tokenizer path '{}' does not exist{}",
                folder.string(), hint);
    std::optional<TokenizerFile> json = read_folder_file(folder.string(), kTokenizerJsonFile);
    OASES_CHECK(json.has_value(),
                "the bpe tokenizer reads a Hugging Face tokenizer.json, and folder '{}' holds "
                "none{}",
                folder.string(), hint);
    files.push_back(std::move(*json));
  }
  if (std::optional<TokenizerFile> config = read_folder_file(folder.string(), kTokenizerConfigFile))
    files.push_back(std::move(*config));
  return std::make_unique<BpeTokenizer>(std::move(files), fmt::format("'{}'", where.string()));
}

std::unique_ptr<Tokenizer> bpe_tokenizer_from_files(const std::vector<TokenizerFile>& files,
                                                    const std::string& source) {
  std::vector<TokenizerFile> kept;
  for (const TokenizerFile& file : files)
    if (file.name == kTokenizerJsonFile || file.name == kTokenizerConfigFile) kept.push_back(file);
  return std::make_unique<BpeTokenizer>(std::move(kept), source);
}

std::optional<TokenizerKind> tokenizer_json_kind(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("model") || !json["model"].is_object())
    return std::nullopt;
  const nlohmann::json& model = json["model"];
  const std::string type = model.value("type", "");
  if (type == "WordPiece") return TokenizerKind::wordpiece;
  if (type != "BPE") return std::nullopt;
  // Byte-level: a ByteLevel pre-tokenizer, alone or in a sequence.
  bool byte_level = false;
  if (const auto pre = json.find("pre_tokenizer"); pre != json.end() && pre->is_object()) {
    byte_level = pre->value("type", "") == "ByteLevel";
    if (const auto steps = pre->find("pretokenizers"); steps != pre->end() && steps->is_array())
      for (const nlohmann::json& step : *steps)
        byte_level = byte_level || (step.is_object() && step.value("type", "") == "ByteLevel");
  }
  if (!byte_level) return std::nullopt;
  const auto vocab = model.find("vocab");
  const bool gpt2 = vocab != model.end() && vocab->is_object() && vocab->size() == 50257 &&
                    vocab->contains("<|endoftext|>") &&
                    io::json_integer<std::int32_t>((*vocab)["<|endoftext|>"]) == 50256;
  return gpt2 ? TokenizerKind::gpt2 : TokenizerKind::bpe;
}

}  // namespace oases::data
