#include "data/tokenizer_text.h"

#include <algorithm>
#include <iterator>

namespace oases::data {
namespace {

struct CodePointRange {
  char32_t first, last;
};

struct CodePointMapping {
  char32_t from;
  std::uint32_t start;  // in the table's pool
  std::uint8_t length;
};

#include "data/unicode_classes.inc"
#include "data/unicode_text_tables.inc"

template <std::size_t N>
bool in_ranges(char32_t c, const CodePointRange (&ranges)[N]) {
  const CodePointRange* end = std::end(ranges);
  const CodePointRange* it = std::upper_bound(
      std::begin(ranges), end, c, [](char32_t v, const CodePointRange& r) { return v < r.first; });
  return it != std::begin(ranges) && c <= std::prev(it)->last;
}

// The mapping of `c` in `table`, or nullptr.
template <std::size_t N>
const CodePointMapping* find_mapping(char32_t c, const CodePointMapping (&table)[N]) {
  const CodePointMapping* it =
      std::lower_bound(std::begin(table), std::end(table), c,
                       [](const CodePointMapping& m, char32_t v) { return m.from < v; });
  return it != std::end(table) && it->from == c ? it : nullptr;
}

// Hangul syllables decompose arithmetically (Unicode 3.12): a leading consonant, a vowel and
// maybe a trailing consonant.
constexpr char32_t kHangulFirst = 0xAC00, kLeadFirst = 0x1100, kVowelFirst = 0x1161,
                   kTrailBase = 0x11A7;
constexpr char32_t kVowels = 21, kTrails = 28, kSyllables = 19 * 21 * 28;

}  // namespace

DecodedChar decode_char(std::string_view text, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return {b0, 1};
  const auto cont = [&](std::size_t k) {
    return i + k < text.size() && (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
  };
  const auto bits = [&](std::size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(text[i + k]) & 0x3F);
  };
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) return {(char32_t{b0} & 0x1F) << 6 | bits(1), 2};
  if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    const char32_t v = (char32_t{b0} & 0x0F) << 12 | bits(1) << 6 | bits(2);
    if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) return {v, 3};
  } else if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    const char32_t v = (char32_t{b0} & 0x07) << 18 | bits(1) << 12 | bits(2) << 6 | bits(3);
    if (v >= 0x10000 && v <= 0x10FFFF) return {v, 4};
  }
  return {kInvalidByte, 1};
}

std::size_t first_invalid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const DecodedChar c = decode_char(text, i);
    if (c.value == kInvalidByte) return i;
    i += c.bytes;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_letter(char32_t c) {
  return in_ranges(c, kLetterRanges);
}
bool is_number(char32_t c) {
  return in_ranges(c, kNumberRanges);
}
bool is_punctuation(char32_t c) {
  return in_ranges(c, kPunctuationRanges);
}
bool is_other(char32_t c) {
  return in_ranges(c, kOtherRanges);
}
bool is_space_separator(char32_t c) {
  return in_ranges(c, kSpaceSeparatorRanges);
}
bool is_nonspacing_mark(char32_t c) {
  return in_ranges(c, kNonspacingMarkRanges);
}

void append_lowercase(std::string& out, char32_t c) {
  if (c >= 'A' && c <= 'Z') {
    out += static_cast<char>(c - 'A' + 'a');
  } else if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (const CodePointMapping* m = find_mapping(c, kLowercase)) {
    for (std::uint32_t k = 0; k < m->length; ++k) append_utf8(out, kLowercasePool[m->start + k]);
  } else {
    append_utf8(out, c);
  }
}

void append_without_accents(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c >= kHangulFirst && c < kHangulFirst + kSyllables) {
    const char32_t index = c - kHangulFirst;
    append_utf8(out, kLeadFirst + index / (kVowels * kTrails));
    append_utf8(out, kVowelFirst + index % (kVowels * kTrails) / kTrails);
    if (index % kTrails != 0) append_utf8(out, kTrailBase + index % kTrails);
  } else if (is_nonspacing_mark(c)) {
    // removed
  } else if (const CodePointMapping* m = find_mapping(c, kStripAccents)) {
    for (std::uint32_t k = 0; k < m->length; ++k) append_utf8(out, kStripAccentsPool[m->start + k]);
  } else {
    append_utf8(out, c);
  }
}

}  // namespace oases::data
