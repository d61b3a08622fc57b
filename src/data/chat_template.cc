#include "data/chat_template.h"

#include "core/error.h"
#include "core/regular_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <variant>

namespace oases::data {
namespace {

// ---------------------------------------------------------------------------------------
// UTF-8

struct CodePoint {
  char32_t value;
  std::size_t length;  // bytes; 1 for a byte that does not start valid UTF-8
};

CodePoint decode_utf8(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return {lead, 1};
  const std::size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
  if (length == 0 || lead > 0xF4 || at + length > text.size()) return {lead, 1};
  char32_t value = lead & (0xFF >> (length + 1));
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(at + k) & 0xC0) != 0x80) return {lead, 1};
    value = (value << 6) | (byte(at + k) & 0x3F);
  }
  const bool overlong = (length == 3 && value < 0x800) || (length == 4 && value < 0x10000);
  if (overlong || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return {lead, 1};
  return {value, length};
}

void append_utf8(std::string& out, char32_t value) {
  if (value < 0x80) {
    out += static_cast<char>(value);
  } else if (value < 0x800) {
    out += static_cast<char>(0xC0 | (value >> 6));
    out += static_cast<char>(0x80 | (value & 0x3F));
  } else if (value < 0x10000) {
    out += static_cast<char>(0xE0 | (value >> 12));
    out += static_cast<char>(0x80 | ((value >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (value & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (value >> 18));
    out += static_cast<char>(0x80 | ((value >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((value >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (value & 0x3F));
  }
}

// JavaScript's \s, which @huggingface/jinja strips around tags and in trim/strip.
bool is_space(char32_t c) {
  if (c <= 32) return c == 32 || (c >= 9 && c <= 13);
  return c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

// The code points of `text`, each as its bytes.
std::vector<std::string_view> characters(std::string_view text) {
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = decode_utf8(text, i).length;
    out.push_back(text.substr(i, length));
    i += length;
  }
  return out;
}

std::size_t character_count(std::string_view text) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < text.size(); i += decode_utf8(text, i).length) ++count;
  return count;
}

// Strips code points for which `strip` holds from the start and/or end.
std::string_view strip_where(std::string_view text, bool front, bool back,
                             const std::function<bool(char32_t)>& strip) {
  if (front) {
    std::size_t i = 0;
    while (i < text.size()) {
      const CodePoint c = decode_utf8(text, i);
      if (!strip(c.value)) break;
      i += c.length;
    }
    text.remove_prefix(i);
  }
  if (back) {
    const std::vector<std::string_view> chars = characters(text);
    std::size_t keep = text.size();
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) {
      if (!strip(decode_utf8(*it, 0).value)) break;
      keep -= it->size();
    }
    text = text.substr(0, keep);
  }
  return text;
}

std::string_view strip_spaces(std::string_view text, bool front, bool back) {
  return strip_where(text, front, back, is_space);
}

bool is_word_byte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

// JavaScript's value.replace(/\b\w/g, upper): the first character of every ASCII word.
std::string title_case(std::string s) {
  for (std::size_t i = 0; i < s.size(); ++i)
    if (is_word_byte(s[i]) && (i == 0 || !is_word_byte(s[i - 1])) && s[i] >= 'a' && s[i] <= 'z')
      s[i] = static_cast<char>(s[i] - 'a' + 'A');
  return s;
}

// ---------------------------------------------------------------------------------------
// Values

struct Value;
struct Dict;
struct Namespace;
struct Function;
using List = std::vector<Value>;

struct Undefined {};
struct None {};

struct Value {
  std::variant<Undefined, None, bool, std::int64_t, double, std::string,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<Namespace>,
               std::shared_ptr<const Function>>
      data;

  Value() = default;
  Value(None) : data(None{}) {}
  Value(bool b) : data(b) {}
  Value(std::int64_t i) : data(i) {}
  Value(double d) : data(d) {}
  Value(std::string s) : data(std::move(s)) {}
  Value(List list) : data(std::make_shared<const List>(std::move(list))) {}
  Value(std::shared_ptr<const List> list) : data(std::move(list)) {}
  Value(std::shared_ptr<const Dict> dict) : data(std::move(dict)) {}
  Value(std::shared_ptr<Namespace> ns) : data(std::move(ns)) {}
  Value(std::shared_ptr<const Function> f) : data(std::move(f)) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(data); }
  bool is_none() const { return std::holds_alternative<None>(data); }
  bool is_bool() const { return std::holds_alternative<bool>(data); }
  bool is_int() const { return std::holds_alternative<std::int64_t>(data); }
  bool is_float() const { return std::holds_alternative<double>(data); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(data); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<const List>>(data); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<const Dict>>(data); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Namespace>>(data); }
  bool is_function() const { return std::holds_alternative<std::shared_ptr<const Function>>(data); }

  bool boolean() const { return std::get<bool>(data); }
  std::int64_t integer() const { return std::get<std::int64_t>(data); }
  const std::string& string() const { return std::get<std::string>(data); }
  const List& list() const { return *std::get<std::shared_ptr<const List>>(data); }
  const Dict& dict() const { return *std::get<std::shared_ptr<const Dict>>(data); }
  Namespace& ns() const { return *std::get<std::shared_ptr<Namespace>>(data); }
  const Function& function() const { return *std::get<std::shared_ptr<const Function>>(data); }
  // Booleans count as 0 and 1, as in Python.
  double number() const {
    if (is_int()) return static_cast<double>(integer());
    if (is_bool()) return boolean() ? 1 : 0;
    return std::get<double>(data);
  }
};

// Keys in insertion order (the order tojson and items() show).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const {
    for (const auto& [name, value] : entries)
      if (name == key) return &value;
    return nullptr;
  }
  void set(const std::string& key, Value value) {
    for (auto& [name, existing] : entries)
      if (name == key) {
        existing = std::move(value);
        return;
      }
    entries.emplace_back(key, std::move(value));
  }
};

// namespace(): the one mutable value, shared by every reference to it.
struct Namespace {
  Dict attributes;
};

struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;

  const Value* keyword(std::string_view name) const {
    for (const auto& [key, value] : keywords)
      if (key == name) return &value;
    return nullptr;
  }
  // The argument at `index` or called `name`, else nullptr.
  const Value* get(std::size_t index, std::string_view name) const {
    if (index < positional.size()) return &positional[index];
    return keyword(name);
  }
};

class Renderer;
struct Expr;

struct Function {
  std::string name;
  std::function<Value(Renderer&, const Arguments&, const Expr& call)> call;
};

std::string type_name(const Value& v) {
  switch (v.data.index()) {
    case 0:
      return "undefined";
    case 1:
      return "none";
    case 2:
      return "boolean";
    case 3:
      return "integer";
    case 4:
      return "float";
    case 5:
      return "string";
    case 6:
      return "list";
    case 7:
      return "dict";
    case 8:
      return "namespace";
    default:
      return "function";
  }
}

// "an undefined value", "a string", ... for messages.
std::string a_value(const Value& v) {
  if (v.is_undefined()) return "an undefined value";
  if (v.is_int()) return "an integer";
  return "a " + type_name(v);
}

bool truthy(const Value& v) {
  switch (v.data.index()) {
    case 0:
    case 1:
      return false;
    case 2:
      return v.boolean();
    case 3:
      return v.integer() != 0;
    case 4: {
      const double d = std::get<double>(v.data);
      return d != 0 && !std::isnan(d);
    }
    case 5:
      return !v.string().empty();
    case 6:
      return !v.list().empty();
    case 7:
      return !v.dict().entries.empty();
    default:
      return true;
  }
}

// JavaScript's Number.prototype.toString: the shortest digits that read back as `x`, in fixed
// notation for 1e-7 <= |x| < 1e21, else exponential.
std::string js_number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0) return "0";
  std::array<char, 64> buffer{};
  const auto result =
      std::to_chars(buffer.data(), buffer.data() + buffer.size(), x, std::chars_format::scientific);
  std::string_view text(buffer.data(), static_cast<std::size_t>(result.ptr - buffer.data()));
  std::string out;
  if (text.front() == '-') {
    out += '-';
    text.remove_prefix(1);
  }
  const std::size_t e_at = text.find('e');
  std::string digits;
  for (const char c : text.substr(0, e_at))
    if (c != '.') digits += c;
  int exponent = 0;
  std::from_chars(text.data() + e_at + 1 + (text[e_at + 1] == '+'), text.data() + text.size(),
                  exponent);
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;  // the decimal point's position after the first digit
  if (k <= n && n <= 21) {
    out += digits + std::string(static_cast<std::size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, static_cast<std::size_t>(n)) + "." +
           digits.substr(static_cast<std::size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-n), '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{}", n - 1 >= 0 ? "+" : "-", std::abs(n - 1));
  }
  return out;
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const CodePoint c = decode_utf8(s, i);
    const std::string_view bytes = s.substr(i, c.length);
    i += c.length;
    switch (c.value) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (c.value < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c.value));
    } else if (ensure_ascii && c.value >= 0x7F) {
      if (c.value >= 0x10000) {
        const char32_t v = c.value - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<unsigned>(0xD800 + (v >> 10)),
                           static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c.value));
      }
    } else {
      out += bytes;
    }
  }
  out += '"';
}

struct JsonStyle {
  std::optional<std::int64_t> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;
  bool undefined_as_null = true;  // false when printing a container: undefined shows as such
};

// JSON of a value in the layout of Python's json.dumps (and @huggingface/jinja's tojson).
// Returns false for a value JSON cannot hold (a function).
bool append_json(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  const bool indented = style.indent.has_value() && *style.indent > 0;
  const std::string item_separator = style.separators ? style.separators->first
                                     : indented       ? ","
                                                      : ", ";
  const std::string key_separator = style.separators ? style.separators->second : ": ";
  const std::string indent_unit =
      indented ? std::string(static_cast<std::size_t>(*style.indent), ' ') : "";
  const auto newline = [&](int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += indent_unit;
  };
  switch (v.data.index()) {
    case 0:
      out += style.undefined_as_null ? "null" : "undefined";
      return true;
    case 1:
      out += "null";
      return true;
    case 2:
      out += v.boolean() ? "true" : "false";
      return true;
    case 3:
      out += std::to_string(v.integer());
      return true;
    case 4: {
      const double d = std::get<double>(v.data);
      out += std::isfinite(d) ? js_number(d) : "null";
      return true;
    }
    case 5:
      append_json_string(out, v.string(), style.ensure_ascii);
      return true;
    case 6: {
      const List& list = v.list();
      out += '[';
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out += item_separator;
        if (indented) newline(depth + 1);
        if (!append_json(out, list[i], style, depth + 1)) return false;
      }
      if (indented && !list.empty()) newline(depth);
      out += ']';
      return true;
    }
    case 7:
    case 8: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.is_dict() ? v.dict().entries : v.ns().attributes.entries)
        entries.push_back(&entry);
      if (style.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_separator;
        if (indented) newline(depth + 1);
        append_json_string(out, entries[i]->first, style.ensure_ascii);
        out += key_separator;
        if (!append_json(out, entries[i]->second, style, depth + 1)) return false;
      }
      if (indented && !entries.empty()) newline(depth);
      out += '}';
      return true;
    }
    default:
      return false;
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return Value(static_cast<std::int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      list.reserve(j.size());
      for (const auto& item : j) list.push_back(from_json(item));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      for (const auto& [key, item] : j.items()) dict->entries.emplace_back(key, from_json(item));
      return Value(std::shared_ptr<const Dict>(std::move(dict)));
    }
    default:
      return Value();  // binary and discarded values do not occur in parsed JSON
  }
}

bool equal(const Value& a, const Value& b) {
  const bool a_numeric = a.is_number() || a.is_bool(), b_numeric = b.is_number() || b.is_bool();
  if (a_numeric && b_numeric) {
    if (a.is_int() && b.is_int()) return a.integer() == b.integer();
    return a.number() == b.number();
  }
  if (a.data.index() != b.data.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.string() == b.string();
  if (a.is_list()) {
    const List &x = a.list(), &y = b.list();
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict()) {
    const Dict &x = a.dict(), &y = b.dict();
    if (x.entries.size() != y.entries.size()) return false;
    for (const auto& [key, value] : x.entries) {
      const Value* other = y.find(key);
      if (other == nullptr || !equal(value, *other)) return false;
    }
    return true;
  }
  if (a.is_namespace()) return &a.ns() == &b.ns();
  return &a.function() == &b.function();
}

// ---------------------------------------------------------------------------------------
// Syntax tree

enum class ExprKind {
  literal,      // value
  name,         // name
  list,         // items
  tuple,        // items
  dict,         // items: key, value, key, value, ...
  attribute,    // a.name
  subscript,    // a[b]
  slice,        // a[items[0]:items[1]:items[2]], missing parts null
  call,         // a(items, keywords)
  filter,       // a | name(items, keywords)
  test,         // a is [not] name(items)
  unary,        // name a  (name: "-", "+", "not")
  binary,       // a name b
  conditional,  // a if b else c (c may be null)
};

using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  std::size_t offset;  // in the template text, for error messages
  Value value;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  ExprPtr a, b, c;
  bool negated = false;
};

enum class StmtKind { text, output, if_, for_, set, macro, break_, continue_, block };

struct Stmt;
using Block = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind;
  std::size_t offset;
  std::string text;                  // text; macro: its name
  ExprPtr expr;                      // output, if, set value, for iterable
  ExprPtr condition;                 // for ... if condition
  std::vector<std::string> targets;  // for/set names; set on a namespace: {object, attribute}
  bool attribute_target = false;     // set ns.attr = ...
  std::vector<std::pair<std::string, ExprPtr>> parameters;  // macro (default may be null)
  Block body, else_body;
};

std::unique_ptr<Stmt> make_stmt(StmtKind kind, std::size_t offset) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = kind;
  stmt->offset = offset;
  return stmt;
}

}  // namespace

struct ChatTemplate::Program {
  std::string text;  // the template as given (positions in messages refer to it)
  Block body;
};

namespace {

// "line L, column C" of a byte offset, counting characters from 1.
std::string position(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1, line_start = 0;
  for (std::size_t i = 0; i < offset; ++i)
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  return fmt::format("line {}, column {}", line,
                     character_count(text.substr(line_start, offset - line_start)) + 1);
}

// Shows a piece of template text in a message: quoted, escaped, at most 40 characters.
std::string excerpt(std::string_view text) {
  const std::vector<std::string_view> chars = characters(text);
  std::string shown;
  for (std::size_t i = 0; i < chars.size() && i < 40; ++i) shown += chars[i];
  if (chars.size() > 40) shown += "...";
  return fmt::format("{:?}", shown);
}

// ---------------------------------------------------------------------------------------
// Lexer

enum class Tok {
  text,
  block_open,
  block_close,
  output_open,
  output_close,
  name,
  string,
  integer,
  floating,
  op,
  end
};

struct Token {
  Tok kind;
  std::string value;
  std::size_t offset;
};

class Lexer {
 public:
  Lexer(std::string_view text, const std::string& source) : text_(text), source_(source) {
    // Jinja's keep_trailing_newline=False: a single newline ending the template is dropped.
    if (!text_.empty() && text_.back() == '\n') text_.remove_suffix(1);
  }

  std::vector<Token> run() {
    while (pos_ < text_.size()) {
      lex_text();
      if (pos_ < text_.size()) lex_tag();
    }
    tokens_.push_back({Tok::end, "", text_.size()});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(std::size_t offset, const std::string& message) const {
    OASES_FAIL("chat template {}, {}: {}", source_, position(text_, offset), message);
  }

  std::size_t next_tag(std::size_t from) const {
    for (std::size_t i = text_.find('{', from); i != std::string_view::npos;
         i = text_.find('{', i + 1))
      if (i + 1 < text_.size() &&
          (text_[i + 1] == '%' || text_[i + 1] == '{' || text_[i + 1] == '#'))
        return i;
    return text_.size();
  }

  void lex_text() {
    const std::size_t start = pos_, tag = next_tag(pos_);
    std::string_view text = text_.substr(start, tag - start);
    if (after_block_ && !text.empty() && text.front() == '\n')
      text.remove_prefix(1);  // trim_blocks
    if (strip_leading_) text = strip_spaces(text, true, false);
    if (tag < text_.size()) {
      const char kind = text_[tag + 1];
      if (kind != '{') {  // lstrip_blocks: blanks from the line start to {% or {#
        std::size_t k = tag;
        while (k > 0 && (text_[k - 1] == ' ' || text_[k - 1] == '\t')) --k;
        if (k == 0 || text_[k - 1] == '\n' || text_[k - 1] == '\r')
          text.remove_suffix(std::min(text.size(), tag - k));
      }
      if (tag + 2 < text_.size() && text_[tag + 2] == '-') text = strip_spaces(text, false, true);
    }
    if (!text.empty()) tokens_.push_back({Tok::text, std::string(text), start});
    pos_ = tag;
    after_block_ = strip_leading_ = false;
  }

  void skip_spaces() {
    while (pos_ < text_.size()) {
      const CodePoint c = decode_utf8(text_, pos_);
      if (!is_space(c.value)) break;
      pos_ += c.length;
    }
  }

  bool at(std::string_view s) const { return text_.substr(pos_, s.size()) == s; }

  void lex_tag() {
    const std::size_t tag = pos_;
    const char kind = text_[tag + 1];
    pos_ += 2;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    if (kind == '#') {
      const std::size_t end = text_.find("#}", pos_);
      if (end == std::string_view::npos) fail(tag, "the comment {# is never closed with #}");
      strip_leading_ = end > pos_ && text_[end - 1] == '-';
      after_block_ = true;
      pos_ = end + 2;
      return;
    }
    const bool block = kind == '%';
    tokens_.push_back({block ? Tok::block_open : Tok::output_open, "", tag});
    const std::string_view close = block ? "%}" : "}}";
    int braces = 0;
    while (true) {
      skip_spaces();
      if (pos_ >= text_.size())
        fail(tag, fmt::format("the tag {} is never closed with {}", block ? "{%" : "{{", close));
      const std::size_t start = pos_;
      if (text_[pos_] == '-' && text_.substr(pos_ + 1, 2) == close && braces == 0) {
        tokens_.push_back({block ? Tok::block_close : Tok::output_close, "", start});
        pos_ += 3;
        strip_leading_ = true;
        after_block_ = block;
        return;
      }
      if (at(close) && braces == 0) {
        tokens_.push_back({block ? Tok::block_close : Tok::output_close, "", start});
        pos_ += 2;
        after_block_ = block;
        return;
      }
      const char c = text_[pos_];
      if (c == '\'' || c == '"') {
        tokens_.push_back({Tok::string, lex_string(c), start});
      } else if (c >= '0' && c <= '9') {
        const bool after_dot =
            !tokens_.empty() && tokens_.back().kind == Tok::op && tokens_.back().value == ".";
        while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
        Tok number = Tok::integer;
        if (!after_dot && pos_ + 1 < text_.size() && text_[pos_] == '.' && text_[pos_ + 1] >= '0' &&
            text_[pos_ + 1] <= '9') {
          ++pos_;
          while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
          number = Tok::floating;
        }
        tokens_.push_back({number, std::string(text_.substr(start, pos_ - start)), start});
      } else if (is_word_byte(c)) {
        while (pos_ < text_.size() && is_word_byte(text_[pos_])) ++pos_;
        tokens_.push_back({Tok::name, std::string(text_.substr(start, pos_ - start)), start});
      } else {
        static constexpr std::array<std::string_view, 5> kTwoCharacterOps = {"**", "//",
                                                                             "==", "!=", "<="};
        std::string op;
        for (const std::string_view two : kTwoCharacterOps)
          if (at(two)) op = two;
        if (op.empty() && at(">=")) op = ">=";
        if (op.empty() && std::string_view("()[]{},.:|<>+-~*/%=").find(c) != std::string_view::npos)
          op = std::string(1, c);
        if (op.empty())
          fail(start, fmt::format("unexpected character {} inside a tag",
                                  excerpt(text_.substr(start, decode_utf8(text_, start).length))));
        if (op == "{") ++braces;
        if (op == "}") --braces;
        pos_ += op.size();
        tokens_.push_back({Tok::op, op, start});
      }
    }
  }

  unsigned hex_value(std::size_t at, std::size_t digits, std::size_t escape_start) const {
    unsigned value = 0;
    for (std::size_t i = 0; i < digits; ++i) {
      const char c = at + i < text_.size() ? text_[at + i] : '\0';
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0)
        fail(escape_start, fmt::format("the escape {} needs {} hexadecimal digits",
                                       excerpt(text_.substr(escape_start, 2 + digits)), digits));
      value = value * 16 + static_cast<unsigned>(digit);
    }
    return value;
  }

  std::string lex_string(char quote) {
    const std::size_t start = pos_++;
    std::string value;
    while (true) {
      if (pos_ >= text_.size()) fail(start, "the string literal is never closed");
      const char c = text_[pos_];
      if (c == quote) {
        ++pos_;
        return value;
      }
      if (c != '\\') {
        value += c;
        ++pos_;
        continue;
      }
      const std::size_t escape = pos_;
      const char e = pos_ + 1 < text_.size() ? text_[pos_ + 1] : '\0';
      pos_ += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case '\\':
          value += '\\';
          break;
        case 'x':
          append_utf8(value, hex_value(pos_, 2, escape));
          pos_ += 2;
          break;
        case 'u': {
          char32_t unit = hex_value(pos_, 4, escape);
          pos_ += 4;
          if (unit >= 0xD800 && unit <= 0xDBFF && at("\\u")) {  // a surrogate pair
            const char32_t low = hex_value(pos_ + 2, 4, pos_);
            if (low >= 0xDC00 && low <= 0xDFFF) {
              unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
              pos_ += 6;
            }
          }
          if (unit >= 0xD800 && unit <= 0xDFFF)
            fail(escape, "a \\u escape names half of a surrogate pair without the other half");
          append_utf8(value, unit);
          break;
        }
        default:
          fail(escape, fmt::format("unknown escape {} in a string literal (valid: \\n \\t \\r \\b "
                                   "\\f \\v \\' \\\" \\\\ \\xHH \\uHHHH)",
                                   excerpt(text_.substr(escape, 2))));
      }
    }
  }

  std::string_view text_;
  const std::string& source_;
  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
  bool after_block_ = false;    // the last tag was {% %} or {# #}: trim_blocks applies
  bool strip_leading_ = false;  // the last tag ended with -%}, -}} or -#}
};

// ---------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string_view text, const std::string& source)
      : tokens_(std::move(tokens)), text_(text), source_(source) {}

  Block parse_template() {
    Block body = parse_block({}, 0, "");
    return body;
  }

 private:
  [[noreturn]] void fail(std::size_t offset, const std::string& message) const {
    OASES_FAIL("chat template {}, {}: {}", source_, position(text_, offset), message);
  }

  const Token& peek(std::size_t ahead = 0) const {
    return tokens_[std::min(current_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& token = peek();
    if (current_ < tokens_.size() - 1) ++current_;
    return token;
  }
  bool peek_op(std::string_view op, std::size_t ahead = 0) const {
    return peek(ahead).kind == Tok::op && peek(ahead).value == op;
  }
  bool peek_name(std::string_view name, std::size_t ahead = 0) const {
    return peek(ahead).kind == Tok::name && peek(ahead).value == name;
  }

  static std::string describe(const Token& token) {
    switch (token.kind) {
      case Tok::text:
        return "text";
      case Tok::block_open:
        return "{%";
      case Tok::block_close:
        return "%}";
      case Tok::output_open:
        return "{{";
      case Tok::output_close:
        return "}}";
      case Tok::string:
        return fmt::format("the string {}", excerpt(token.value));
      case Tok::end:
        return "the end of the template";
      default:
        return fmt::format("'{}'", token.value);
    }
  }

  [[noreturn]] void unexpected(const std::string& expected) const {
    fail(peek().offset, fmt::format("expected {}, found {}", expected, describe(peek())));
  }

  void expect_op(std::string_view op) {
    if (!peek_op(op)) unexpected(fmt::format("'{}'", op));
    next();
  }
  void expect(Tok kind, std::string_view what) {
    if (peek().kind != kind) unexpected(std::string(what));
    next();
  }
  std::string expect_name(std::string_view what) {
    if (peek().kind != Tok::name) unexpected(std::string(what));
    return next().value;
  }

  // Statements up to (not including) a {% name %} whose name is in `stops`.
  // `opener` describes the statement whose body this is, for the error at the end.
  Block parse_block(const std::vector<std::string_view>& stops, std::size_t opener_offset,
                    std::string_view opener) {
    Block body;
    while (true) {
      const Token& token = peek();
      if (token.kind == Tok::end) {
        if (stops.empty()) return body;
        fail(opener_offset,
             fmt::format("the {} is never closed with {{% {} %}}", opener, stops.back()));
      }
      if (token.kind == Tok::text) {
        auto stmt = make_stmt(StmtKind::text, token.offset);
        stmt->text = next().value;
        body.push_back(std::move(stmt));
      } else if (token.kind == Tok::output_open) {
        next();
        auto stmt = make_stmt(StmtKind::output, token.offset);
        stmt->expr = parse_expression();
        expect(Tok::output_close, "'}}'");
        body.push_back(std::move(stmt));
      } else if (token.kind == Tok::block_open) {
        if (peek(1).kind == Tok::name &&
            std::find(stops.begin(), stops.end(), peek(1).value) != stops.end())
          return body;
        body.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  // Consumes {% name %}.
  void expect_end_tag(std::string_view name) {
    expect(Tok::block_open, "{%");
    if (!peek_name(name)) unexpected(fmt::format("'{}'", name));
    next();
    expect(Tok::block_close, "'%}'");
  }

  std::unique_ptr<Stmt> parse_statement() {
    const NestingGuard guard(*this);
    const std::size_t offset = next().offset;  // {%
    if (peek().kind != Tok::name) unexpected("a statement name");
    const std::string name = next().value;
    if (name == "if") return parse_if(offset);
    if (name == "for") return parse_for(offset);
    if (name == "set") return parse_set(offset);
    if (name == "macro") return parse_macro(offset);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(offset, fmt::format("{{% {} %}} outside a for loop", name));
      expect(Tok::block_close, "'%}'");
      return make_stmt(name == "break" ? StmtKind::break_ : StmtKind::continue_, offset);
    }
    if (name == "generation") {
      expect(Tok::block_close, "'%}'");
      auto stmt = make_stmt(StmtKind::block, offset);
      stmt->body = parse_block({"endgeneration"}, offset, "{% generation %}");
      expect_end_tag("endgeneration");
      return stmt;
    }
    static constexpr std::array<std::string_view, 9> kClosers = {
        "endif",    "elif",          "else",    "endfor",   "endset",
        "endmacro", "endgeneration", "endcall", "endfilter"};
    if (std::find(kClosers.begin(), kClosers.end(), name) != kClosers.end())
      fail(offset, fmt::format("{{% {} %}} without a statement it belongs to", name));
    fail(offset, fmt::format("unsupported statement '{}' (supported: if, for, set, macro, "
                             "break, continue, generation)",
                             name));
  }

  std::unique_ptr<Stmt> parse_if(std::size_t offset) {
    auto stmt = make_stmt(StmtKind::if_, offset);
    stmt->expr = parse_expression();
    expect(Tok::block_close, "'%}'");
    stmt->body = parse_block({"elif", "else", "endif"}, offset, "{% if %}");
    if (peek_name("elif", 1)) {
      const std::size_t elif = next().offset;
      next();
      stmt->else_body.push_back(parse_if(elif));  // consumes the endif
      return stmt;
    }
    if (peek_name("else", 1)) {
      next();
      next();
      expect(Tok::block_close, "'%}'");
      stmt->else_body = parse_block({"endif"}, offset, "{% if %}");
    }
    expect_end_tag("endif");
    return stmt;
  }

  std::unique_ptr<Stmt> parse_for(std::size_t offset) {
    auto stmt = make_stmt(StmtKind::for_, offset);
    stmt->targets.push_back(expect_name("a loop variable"));
    while (peek_op(",")) {
      next();
      stmt->targets.push_back(expect_name("a loop variable"));
    }
    if (!peek_name("in")) unexpected("'in'");
    next();
    stmt->expr = parse_or();
    if (peek_name("if")) {
      next();
      stmt->condition = parse_or();
    }
    if (peek_name("recursive")) fail(peek().offset, "recursive loops are not supported");
    expect(Tok::block_close, "'%}'");
    ++loop_depth_;
    stmt->body = parse_block({"else", "endfor"}, offset, "{% for %}");
    --loop_depth_;
    if (peek_name("else", 1)) {
      next();
      next();
      expect(Tok::block_close, "'%}'");
      stmt->else_body = parse_block({"endfor"}, offset, "{% for %}");
    }
    expect_end_tag("endfor");
    return stmt;
  }

  std::unique_ptr<Stmt> parse_set(std::size_t offset) {
    auto stmt = make_stmt(StmtKind::set, offset);
    stmt->targets.push_back(expect_name("a variable name"));
    if (peek_op(".")) {
      next();
      stmt->targets.push_back(expect_name("an attribute name"));
      stmt->attribute_target = true;
    } else {
      while (peek_op(",")) {
        next();
        stmt->targets.push_back(expect_name("a variable name"));
      }
    }
    if (peek_op("=")) {
      next();
      stmt->expr = parse_tuple_or_expression();
      expect(Tok::block_close, "'%}'");
      return stmt;
    }
    if (stmt->targets.size() > 1 && !stmt->attribute_target)
      unexpected("'=' (a block set assigns one name)");
    expect(Tok::block_close, "'%}'");
    stmt->body = parse_block({"endset"}, offset, "{% set %}");
    expect_end_tag("endset");
    return stmt;
  }

  std::unique_ptr<Stmt> parse_macro(std::size_t offset) {
    auto stmt = make_stmt(StmtKind::macro, offset);
    stmt->text = expect_name("a macro name");
    expect_op("(");
    while (!peek_op(")")) {
      std::string parameter = expect_name("a parameter name");
      ExprPtr default_value;
      if (peek_op("=")) {
        next();
        default_value = parse_expression();
      } else if (!stmt->parameters.empty() && stmt->parameters.back().second) {
        fail(peek().offset, fmt::format("the parameter '{}' without a default follows one with a "
                                        "default",
                                        parameter));
      }
      stmt->parameters.emplace_back(std::move(parameter), std::move(default_value));
      if (!peek_op(")")) expect_op(",");
    }
    next();
    expect(Tok::block_close, "'%}'");
    const int loops = loop_depth_;
    loop_depth_ = 0;
    stmt->body = parse_block({"endmacro"}, offset, "{% macro %}");
    loop_depth_ = loops;
    expect_end_tag("endmacro");
    return stmt;
  }

  ExprPtr make(ExprKind kind, std::size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // a, b, c (a tuple) or a single expression.
  ExprPtr parse_tuple_or_expression() {
    ExprPtr first = parse_expression();
    if (!peek_op(",")) return first;
    ExprPtr tuple = make(ExprKind::tuple, first->offset);
    tuple->items.push_back(std::move(first));
    while (peek_op(",")) {
      next();
      if (peek().kind == Tok::block_close || peek_op(")")) break;
      tuple->items.push_back(parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression() {
    const NestingGuard guard(*this);
    ExprPtr value = parse_or();
    if (!peek_name("if")) return value;
    ExprPtr e = make(ExprKind::conditional, next().offset);
    e->a = std::move(value);
    e->b = parse_or();
    if (peek_name("else")) {
      next();
      e->c = parse_expression();
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, std::size_t offset) {
    ExprPtr e = make(ExprKind::binary, offset);
    e->name = std::move(op);
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (peek_name("or")) {
      const std::size_t offset = next().offset;
      left = binary("or", std::move(left), parse_and(), offset);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (peek_name("and")) {
      const std::size_t offset = next().offset;
      left = binary("and", std::move(left), parse_not(), offset);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (!peek_name("not")) return parse_comparison();
    ExprPtr e = make(ExprKind::unary, next().offset);
    e->name = "not";
    e->a = parse_not();
    return e;
  }

  ExprPtr parse_comparison() {
    ExprPtr left = parse_additive();
    while (true) {
      std::string op;
      const std::size_t offset = peek().offset;
      if (peek_name("not") && peek_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else if (peek_name("in")) {
        next();
        op = "in";
      } else if (peek().kind == Tok::op &&
                 (peek().value == "==" || peek().value == "!=" || peek().value == "<" ||
                  peek().value == ">" || peek().value == "<=" || peek().value == ">=")) {
        op = next().value;
      } else {
        return left;
      }
      left = binary(op, std::move(left), parse_additive(), offset);
    }
  }

  ExprPtr parse_additive() {
    ExprPtr left = parse_multiplicative();
    while (peek_op("+") || peek_op("-") || peek_op("~")) {
      const Token& op = next();
      left = binary(op.value, std::move(left), parse_multiplicative(), op.offset);
    }
    return left;
  }

  ExprPtr parse_multiplicative() {
    ExprPtr left = parse_power();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      const Token& op = next();
      left = binary(op.value, std::move(left), parse_power(), op.offset);
    }
    return left;
  }

  ExprPtr parse_power() {
    ExprPtr left = parse_test();
    while (peek_op("**")) {
      const Token& op = next();
      left = binary(op.value, std::move(left), parse_test(), op.offset);
    }
    return left;
  }

  ExprPtr parse_test() {
    ExprPtr operand = parse_filter();
    while (peek_name("is")) {
      ExprPtr e = make(ExprKind::test, next().offset);
      if (peek_name("not")) {
        next();
        e->negated = true;
      }
      e->name = expect_name("the name of a test");
      if (peek_op("(")) parse_arguments(*e);
      e->a = std::move(operand);
      operand = std::move(e);
    }
    return operand;
  }

  ExprPtr parse_filter() {
    ExprPtr operand = parse_unary();
    while (peek_op("|")) {
      next();
      ExprPtr e = make(ExprKind::filter, peek().offset);
      e->name = expect_name("the name of a filter");
      if (peek_op("(")) parse_arguments(*e);
      e->a = std::move(operand);
      operand = std::move(e);
    }
    return operand;
  }

  ExprPtr parse_unary() {
    const NestingGuard guard(*this);
    if (peek_op("-") || peek_op("+")) {
      const Token& op = next();
      ExprPtr e = make(ExprKind::unary, op.offset);
      e->name = op.value;
      e->a = parse_unary();
      return e;
    }
    return parse_postfix(parse_primary());
  }

  // ( positional..., name=keyword... )
  void parse_arguments(Expr& e) {
    expect_op("(");
    while (!peek_op(")")) {
      if (peek().kind == Tok::name && peek_op("=", 1)) {
        std::string name = next().value;
        next();
        e.keywords.emplace_back(std::move(name), parse_expression());
      } else {
        if (!e.keywords.empty())
          fail(peek().offset, "a positional argument follows a keyword argument");
        e.items.push_back(parse_expression());
      }
      if (!peek_op(")")) expect_op(",");
    }
    next();
  }

  ExprPtr parse_postfix(ExprPtr object) {
    while (true) {
      if (peek_op(".")) {
        const std::size_t offset = next().offset;
        if (peek().kind == Tok::integer) {
          ExprPtr e = make(ExprKind::subscript, offset);
          ExprPtr index = make(ExprKind::literal, peek().offset);
          index->value = Value(static_cast<std::int64_t>(std::stoll(next().value)));
          e->a = std::move(object);
          e->b = std::move(index);
          object = std::move(e);
          continue;
        }
        ExprPtr e = make(ExprKind::attribute, offset);
        e->name = expect_name("an attribute name");
        e->a = std::move(object);
        object = std::move(e);
      } else if (peek_op("[")) {
        const std::size_t offset = next().offset;
        std::array<ExprPtr, 3> parts;
        std::size_t colons = 0;
        while (!peek_op("]")) {
          if (peek_op(":")) {
            next();
            if (++colons > 2) fail(peek().offset, "a slice has at most three parts");
            continue;
          }
          if (parts[colons]) unexpected("':' or ']'");
          parts[colons] = parse_expression();
        }
        next();
        if (colons == 0) {
          if (!parts[0]) fail(offset, "empty subscript []");
          ExprPtr e = make(ExprKind::subscript, offset);
          e->a = std::move(object);
          e->b = std::move(parts[0]);
          object = std::move(e);
        } else {
          ExprPtr e = make(ExprKind::slice, offset);
          e->a = std::move(object);
          for (ExprPtr& part : parts) e->items.push_back(std::move(part));
          object = std::move(e);
        }
      } else if (peek_op("(")) {
        ExprPtr e = make(ExprKind::call, object->offset);
        parse_arguments(*e);
        e->a = std::move(object);
        object = std::move(e);
      } else {
        return object;
      }
    }
  }

  ExprPtr parse_primary() {
    const Token& token = peek();
    switch (token.kind) {
      case Tok::integer:
      case Tok::floating: {
        ExprPtr e = make(ExprKind::literal, token.offset);
        if (token.kind == Tok::integer) {
          std::int64_t value = 0;
          const auto [end, error] =
              std::from_chars(token.value.data(), token.value.data() + token.value.size(), value);
          if (error != std::errc())
            fail(token.offset, fmt::format("the integer {} is too large", token.value));
          e->value = Value(value);
        } else {
          e->value = Value(std::stod(token.value));
        }
        next();
        return e;
      }
      case Tok::string: {
        ExprPtr e = make(ExprKind::literal, token.offset);
        std::string value;
        while (peek().kind == Tok::string) value += next().value;
        e->value = Value(std::move(value));
        return e;
      }
      case Tok::name: {
        ExprPtr e = make(ExprKind::literal, token.offset);
        const std::string& name = token.value;
        if (name == "true" || name == "True") {
          e->value = Value(true);
        } else if (name == "false" || name == "False") {
          e->value = Value(false);
        } else if (name == "none" || name == "None") {
          e->value = Value(None{});
        } else {
          e->kind = ExprKind::name;
          e->name = name;
        }
        next();
        return e;
      }
      case Tok::op:
        break;
      default:
        unexpected("an expression");
    }
    if (token.value == "(") {
      next();
      ExprPtr inner = parse_tuple_or_expression();
      expect_op(")");
      return inner;
    }
    if (token.value == "[") {
      ExprPtr e = make(ExprKind::list, next().offset);
      while (!peek_op("]")) {
        e->items.push_back(parse_expression());
        if (!peek_op("]")) expect_op(",");
      }
      next();
      return e;
    }
    if (token.value == "{") {
      ExprPtr e = make(ExprKind::dict, next().offset);
      while (!peek_op("}")) {
        e->items.push_back(parse_expression());
        expect_op(":");
        e->items.push_back(parse_expression());
        if (!peek_op("}")) expect_op(",");
      }
      next();
      return e;
    }
    unexpected("an expression");
  }

  // Bounds the recursion of the parser, so that a hostile template fails with a message rather
  // than overflowing the stack.
  struct NestingGuard {
    explicit NestingGuard(Parser& parser) : parser_(parser) {
      if (++parser_.nesting_ > kMaxNesting)
        parser_.fail(parser_.peek().offset,
                     fmt::format("statements and expressions nest deeper than {}", kMaxNesting));
    }
    ~NestingGuard() { --parser_.nesting_; }
    NestingGuard(const NestingGuard&) = delete;
    NestingGuard& operator=(const NestingGuard&) = delete;
    Parser& parser_;
  };
  static constexpr int kMaxNesting = 200;

  std::vector<Token> tokens_;
  std::size_t current_ = 0;
  int nesting_ = 0;
  std::string_view text_;
  const std::string& source_;
  int loop_depth_ = 0;
};

// ---------------------------------------------------------------------------------------
// Rendering

struct Scope {
  Scope* parent = nullptr;
  Dict variables;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent)
      if (const Value* v = s->variables.find(name)) return v;
    return nullptr;
  }
};

enum class Flow { normal, break_, continue_ };

constexpr int kMaxCallDepth = 256;
constexpr std::int64_t kMaxRange = 1'000'000;

// Python's str.split(sep, maxsplit).
List split(std::string_view s, const std::optional<std::string>& separator, std::int64_t maxsplit) {
  List parts;
  if (!separator) {
    std::string_view rest = strip_spaces(s, true, false);
    while (!rest.empty()) {
      if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) >= maxsplit) {
        parts.emplace_back(std::string(rest));
        break;
      }
      std::size_t i = 0;
      while (i < rest.size()) {
        const CodePoint c = decode_utf8(rest, i);
        if (is_space(c.value)) break;
        i += c.length;
      }
      parts.emplace_back(std::string(rest.substr(0, i)));
      rest = strip_spaces(rest.substr(i), true, false);
    }
    return parts;
  }
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(*separator, start);
    if (at == std::string_view::npos ||
        (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) >= maxsplit)) {
      parts.emplace_back(std::string(s.substr(start)));
      return parts;
    }
    parts.emplace_back(std::string(s.substr(start, at - start)));
    start = at + separator->size();
  }
}

// Python's str.replace(old, new, count).
std::string replace(std::string_view s, std::string_view old, std::string_view replacement,
                    std::int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::vector<std::string_view> chars = characters(s);
    for (std::size_t i = 0; i <= chars.size(); ++i) {
      if (count < 0 || static_cast<std::int64_t>(i) < count) out += replacement;
      if (i < chars.size()) out += chars[i];
    }
    return out;
  }
  std::size_t start = 0;
  for (std::int64_t done = 0; count < 0 || done < count; ++done) {
    const std::size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += replacement;
    start = at + old.size();
  }
  out += s.substr(start);
  return out;
}

class Renderer {
 public:
  Renderer(const ChatTemplate::Program& program, const std::string& source)
      : program_(program), source_(source) {
    add_global("raise_exception", [](Renderer& r, const Arguments& args, const Expr& call) {
      const Value* message = args.get(0, "message");
      OASES_FAIL("chat template {} refused the input (raise_exception at {}): {}", r.source_,
                 position(r.program_.text, call.offset),
                 message == nullptr ? std::string() : r.text(*message));
      return Value();
    });
    add_global("range", [](Renderer& r, const Arguments& args, const Expr& call) {
      std::array<std::int64_t, 3> bounds{0, 0, 1};
      if (args.positional.empty() || args.positional.size() > 3)
        r.fail(call.offset, fmt::format("range() takes 1 to 3 integers, got {} arguments",
                                        args.positional.size()));
      for (std::size_t i = 0; i < args.positional.size(); ++i)
        if (!args.positional[i].is_int())
          r.fail(call.offset,
                 fmt::format("range() takes integers, got a {}", type_name(args.positional[i])));
      if (args.positional.size() == 1) {
        bounds[1] = args.positional[0].integer();
      } else {
        for (std::size_t i = 0; i < args.positional.size(); ++i)
          bounds[i] = args.positional[i].integer();
      }
      const auto [start, stop, step] = bounds;
      if (step == 0) r.fail(call.offset, "range() step must not be zero");
      List out;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<std::int64_t>(out.size()) >= kMaxRange)
          r.fail(call.offset, fmt::format("range() of more than {} numbers", kMaxRange));
        out.emplace_back(i);
      }
      return Value(std::move(out));
    });
    add_global("namespace", [](Renderer& r, const Arguments& args, const Expr& call) {
      auto ns = std::make_shared<Namespace>();
      if (args.positional.size() > 1)
        r.fail(call.offset, "namespace() takes at most one positional argument (a dict)");
      if (!args.positional.empty()) {
        if (!args.positional[0].is_dict())
          r.fail(call.offset,
                 fmt::format("namespace() takes a dict, got a {}", type_name(args.positional[0])));
        ns->attributes = args.positional[0].dict();
      }
      for (const auto& [key, value] : args.keywords) ns->attributes.set(key, value);
      return Value(std::move(ns));
    });
    add_global("strftime_now", [](Renderer& r, const Arguments& args, const Expr& call) {
      const Value* format = args.get(0, "format");
      if (format == nullptr || !format->is_string())
        r.fail(call.offset, "strftime_now() takes a format string");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      std::string out(256, '\0');
      const std::size_t n = std::strftime(out.data(), out.size(), format->string().c_str(), &local);
      out.resize(n);
      return Value(std::move(out));
    });
  }

  std::string render(Dict variables) {
    Scope& top = new_scope(&globals_);
    top.variables = std::move(variables);
    std::string out;
    render_block(program_.body, top, out);
    return out;
  }

  [[noreturn]] void fail(std::size_t offset, const std::string& message) const {
    OASES_FAIL("chat template {}, {}: {}", source_, position(program_.text, offset), message);
  }

  // How {{ value }} prints it.
  std::string text(const Value& v) const {
    switch (v.data.index()) {
      case 0:
      case 1:
        return "";
      case 2:
        return v.boolean() ? "true" : "false";
      case 3:
        return std::to_string(v.integer());
      case 4: {
        const double d = std::get<double>(v.data);
        if (d == 0 && std::signbit(d)) return "-0.0";
        if (std::isfinite(d) && d == std::trunc(d) && std::abs(d) < 1e21)
          return js_number(d) + ".0";
        return js_number(d);
      }
      case 5:
        return v.string();
      case 9:
        return "<function " + v.function().name + ">";
      default: {
        std::string out;
        JsonStyle style;
        style.undefined_as_null = false;
        append_json(out, v, style, 0);
        return out;
      }
    }
  }

 private:
  using Builtin = std::function<Value(Renderer&, const Arguments&, const Expr&)>;

  void add_global(const std::string& name, Builtin call) {
    globals_.variables.set(
        name, Value(std::make_shared<const Function>(Function{name, std::move(call)})));
  }

  Scope& new_scope(Scope* parent) {
    scopes_.emplace_back();
    scopes_.back().parent = parent;
    return scopes_.back();
  }

  Flow render_block(const Block& block, Scope& scope, std::string& out) {
    for (const auto& stmt : block) {
      const Flow flow = render_statement(*stmt, scope, out);
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow render_statement(const Stmt& stmt, Scope& scope, std::string& out) {
    switch (stmt.kind) {
      case StmtKind::text:
        out += stmt.text;
        return Flow::normal;
      case StmtKind::output: {
        const Value v = eval(*stmt.expr, scope);
        if (v.is_function()) fail(stmt.expr->offset, "cannot print a function; call it with ()");
        out += text(v);
        return Flow::normal;
      }
      case StmtKind::if_:
        return render_block(truthy(eval(*stmt.expr, scope)) ? stmt.body : stmt.else_body, scope,
                            out);
      case StmtKind::for_:
        render_for(stmt, scope, out);
        return Flow::normal;
      case StmtKind::set: {
        Value value;
        if (stmt.expr) {
          value = eval(*stmt.expr, scope);
        } else {
          std::string captured;
          render_block(stmt.body, scope, captured);
          value = Value(std::move(captured));
        }
        assign(stmt, std::move(value), scope);
        return Flow::normal;
      }
      case StmtKind::macro:
        define_macro(stmt, scope);
        return Flow::normal;
      case StmtKind::break_:
        return Flow::break_;
      case StmtKind::continue_:
        return Flow::continue_;
      case StmtKind::block:
        return render_block(stmt.body, scope, out);
    }
    return Flow::normal;
  }

  void bind(const std::vector<std::string>& names, const Value& value, Scope& scope,
            std::size_t offset) {
    if (names.size() == 1) {
      scope.variables.set(names[0], value);
      return;
    }
    if (!value.is_list())
      fail(offset, fmt::format("cannot unpack {} into {} names", a_value(value), names.size()));
    if (value.list().size() != names.size())
      fail(offset,
           fmt::format("cannot unpack {} values into {} names", value.list().size(), names.size()));
    for (std::size_t i = 0; i < names.size(); ++i) scope.variables.set(names[i], value.list()[i]);
  }

  void assign(const Stmt& stmt, Value value, Scope& scope) {
    if (!stmt.attribute_target) {
      bind(stmt.targets, value, scope, stmt.offset);
      return;
    }
    const Value* object = scope.find(stmt.targets[0]);
    if (object == nullptr || !object->is_namespace())
      fail(stmt.offset, fmt::format("cannot set an attribute of '{}', a {}: only namespace() "
                                    "objects take attribute assignments",
                                    stmt.targets[0],
                                    object == nullptr ? "undefined value" : type_name(*object)));
    object->ns().attributes.set(stmt.targets[1], std::move(value));
  }

  void render_for(const Stmt& stmt, Scope& scope, std::string& out) {
    Scope& loop_scope = new_scope(&scope);
    const Value iterable = eval(*stmt.expr, loop_scope);
    List candidates;
    if (iterable.is_list()) {
      candidates = iterable.list();
    } else if (iterable.is_dict()) {
      for (const auto& [key, value] : iterable.dict().entries) candidates.emplace_back(key);
    } else if (iterable.is_string()) {
      for (const std::string_view c : characters(iterable.string()))
        candidates.emplace_back(std::string(c));
    } else if (!iterable.is_undefined()) {
      fail(stmt.expr->offset, fmt::format("cannot loop over a {}", type_name(iterable)));
    }
    List items;
    if (stmt.condition) {
      for (const Value& item : candidates) {
        Scope& test_scope = new_scope(&loop_scope);
        bind(stmt.targets, item, test_scope, stmt.offset);
        if (truthy(eval(*stmt.condition, test_scope))) items.push_back(item);
      }
    } else {
      items = std::move(candidates);
    }
    const auto length = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < length; ++i) {
      auto loop = std::make_shared<Dict>();
      loop->entries = {
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(length - i)},
          {"revindex0", Value(length - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == length - 1)},
          {"length", Value(length)},
          {"previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)] : Value()},
          {"nextitem", i + 1 < length ? items[static_cast<std::size_t>(i + 1)] : Value()}};
      loop_scope.variables.set("loop", Value(std::shared_ptr<const Dict>(std::move(loop))));
      bind(stmt.targets, items[static_cast<std::size_t>(i)], loop_scope, stmt.offset);
      if (render_block(stmt.body, loop_scope, out) == Flow::break_) break;
    }
    if (items.empty()) render_block(stmt.else_body, loop_scope, out);
  }

  void define_macro(const Stmt& stmt, Scope& scope) {
    Scope* defined_in = &scope;
    const Stmt* macro = &stmt;
    auto call = [defined_in, macro](Renderer& r, const Arguments& args, const Expr& site) {
      if (r.call_depth_ >= kMaxCallDepth)
        r.fail(site.offset, fmt::format("macro calls nest deeper than {}", kMaxCallDepth));
      if (args.positional.size() > macro->parameters.size())
        r.fail(site.offset,
               fmt::format("macro '{}' takes at most {} arguments, got {}", macro->text,
                           macro->parameters.size(), args.positional.size()));
      for (const auto& [key, value] : args.keywords) {
        const bool known = std::any_of(macro->parameters.begin(), macro->parameters.end(),
                                       [&](const auto& p) { return p.first == key; });
        if (!known)
          r.fail(site.offset, fmt::format("macro '{}' has no parameter '{}'", macro->text, key));
      }
      Scope& local = r.new_scope(defined_in);
      std::vector<std::size_t> defaulted;
      for (std::size_t i = 0; i < macro->parameters.size(); ++i) {
        const Value* given = args.get(i, macro->parameters[i].first);
        if (given == nullptr && macro->parameters[i].second) defaulted.push_back(i);
        local.variables.set(macro->parameters[i].first, given == nullptr ? Value() : *given);
      }
      for (const std::size_t i : defaulted)
        local.variables.set(macro->parameters[i].first,
                            r.eval(*macro->parameters[i].second, local));
      std::string out;
      ++r.call_depth_;
      r.render_block(macro->body, local, out);
      --r.call_depth_;
      return Value(std::move(out));
    };
    scope.variables.set(stmt.text,
                        Value(std::make_shared<const Function>(Function{stmt.text, call})));
  }

  Arguments eval_arguments(const Expr& e, Scope& scope) {
    Arguments args;
    for (const ExprPtr& item : e.items) args.positional.push_back(eval(*item, scope));
    for (const auto& [name, value] : e.keywords)
      args.keywords.emplace_back(name, eval(*value, scope));
    return args;
  }

  Value eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case ExprKind::literal:
        return e.value;
      case ExprKind::name: {
        const Value* v = scope.find(e.name);
        return v == nullptr ? Value() : *v;
      }
      case ExprKind::list:
      case ExprKind::tuple: {
        List list;
        for (const ExprPtr& item : e.items) list.push_back(eval(*item, scope));
        return Value(std::move(list));
      }
      case ExprKind::dict: {
        auto dict = std::make_shared<Dict>();
        for (std::size_t i = 0; i < e.items.size(); i += 2) {
          const Value key = eval(*e.items[i], scope);
          if (!key.is_string())
            fail(e.items[i]->offset,
                 fmt::format("dict keys must be strings, got a {}", type_name(key)));
          dict->set(key.string(), eval(*e.items[i + 1], scope));
        }
        return Value(std::shared_ptr<const Dict>(std::move(dict)));
      }
      case ExprKind::attribute:
        return member(eval(*e.a, scope), Value(e.name), e);
      case ExprKind::subscript:
        return member(eval(*e.a, scope), eval(*e.b, scope), e);
      case ExprKind::slice:
        return slice(e, scope);
      case ExprKind::call:
        return call(e, scope);
      case ExprKind::filter: {
        Value operand = eval(*e.a, scope);
        return filter(e.name, std::move(operand), eval_arguments(e, scope), e);
      }
      case ExprKind::test: {
        const Value operand = eval(*e.a, scope);
        const bool result = test(e.name, operand, eval_arguments(e, scope).positional, e);
        return Value(result != e.negated);
      }
      case ExprKind::unary: {
        const Value operand = eval(*e.a, scope);
        if (e.name == "not") return Value(!truthy(operand));
        if (operand.is_float())
          return Value(e.name == "-" ? -std::get<double>(operand.data)
                                     : std::get<double>(operand.data));
        if (operand.is_int() || operand.is_bool()) {
          const std::int64_t i = operand.is_int() ? operand.integer() : operand.boolean();
          return Value(e.name == "-" ? -i : i);
        }
        fail(e.offset,
             fmt::format("unary '{}' needs a number, got a {}", e.name, type_name(operand)));
      }
      case ExprKind::binary:
        return binary(e, scope);
      case ExprKind::conditional:
        if (truthy(eval(*e.b, scope))) return eval(*e.a, scope);
        return e.c ? eval(*e.c, scope) : Value();
    }
    return Value();
  }

  Value member(const Value& object, const Value& key, const Expr& /*site*/) {
    if (object.is_dict() || object.is_namespace()) {
      if (!key.is_string()) return Value();
      const Dict& dict = object.is_dict() ? object.dict() : object.ns().attributes;
      const Value* v = dict.find(key.string());
      return v == nullptr ? Value() : *v;
    }
    if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
      std::int64_t index = key.is_int() ? key.integer() : key.boolean();
      if (object.is_list()) {
        const auto size = static_cast<std::int64_t>(object.list().size());
        if (index < 0) index += size;
        if (index < 0 || index >= size) return Value();
        return object.list()[static_cast<std::size_t>(index)];
      }
      const std::vector<std::string_view> chars = characters(object.string());
      const auto size = static_cast<std::int64_t>(chars.size());
      if (index < 0) index += size;
      if (index < 0 || index >= size) return Value();
      return Value(std::string(chars[static_cast<std::size_t>(index)]));
    }
    return Value();  // as Jinja's lenient lookup: a missing attribute is undefined
  }

  std::optional<std::int64_t> slice_bound(const ExprPtr& part, Scope& scope, const Expr& e) {
    if (!part) return std::nullopt;
    const Value v = eval(*part, scope);
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int())
      fail(e.offset, fmt::format("slice bounds must be integers, got a {}", type_name(v)));
    return v.integer();
  }

  Value slice(const Expr& e, Scope& scope) {
    const Value object = eval(*e.a, scope);
    const auto start = slice_bound(e.items[0], scope, e);
    const auto stop = slice_bound(e.items[1], scope, e);
    const std::int64_t step = slice_bound(e.items[2], scope, e).value_or(1);
    if (step == 0) fail(e.offset, "slice step must not be zero");
    std::vector<std::string_view> chars;
    std::int64_t size = 0;
    if (object.is_list()) {
      size = static_cast<std::int64_t>(object.list().size());
    } else if (object.is_string()) {
      chars = characters(object.string());
      size = static_cast<std::int64_t>(chars.size());
    } else if (object.is_undefined()) {
      return Value();
    } else {
      fail(e.offset, fmt::format("cannot slice a {}", type_name(object)));
    }
    // Python's slice.indices.
    const auto clamp = [&](std::optional<std::int64_t> bound, std::int64_t fallback) {
      if (!bound) return fallback;
      std::int64_t i = *bound < 0 ? *bound + size : *bound;
      if (step > 0) return std::clamp<std::int64_t>(i, 0, size);
      return std::clamp<std::int64_t>(i, -1, size - 1);
    };
    const std::int64_t from = clamp(start, step > 0 ? 0 : size - 1);
    const std::int64_t to = clamp(stop, step > 0 ? size : -1);
    List list;
    std::string text;
    for (std::int64_t i = from; step > 0 ? i < to : i > to; i += step) {
      if (object.is_list()) {
        list.push_back(object.list()[static_cast<std::size_t>(i)]);
      } else {
        text += chars[static_cast<std::size_t>(i)];
      }
    }
    return object.is_list() ? Value(std::move(list)) : Value(std::move(text));
  }

  Value call(const Expr& e, Scope& scope) {
    if (e.a->kind == ExprKind::attribute) {
      const Value object = eval(*e.a->a, scope);
      const std::string& name = e.a->name;
      if (object.is_string() || (object.is_dict() && object.dict().find(name) == nullptr))
        return method(object, name, eval_arguments(e, scope), e);
      const Value callee = member(object, Value(name), *e.a);
      return invoke(callee, e, scope, name);
    }
    const Value callee = eval(*e.a, scope);
    return invoke(callee, e, scope, e.a->kind == ExprKind::name ? e.a->name : "");
  }

  Value invoke(const Value& callee, const Expr& e, Scope& scope, const std::string& name) {
    if (!callee.is_function())
      fail(e.offset, fmt::format("{} is {}, not a function",
                                 name.empty() ? "the callee" : "'" + name + "'", a_value(callee)));
    return callee.function().call(*this, eval_arguments(e, scope), e);
  }

  const std::string& string_argument(const Arguments& args, std::size_t index,
                                     std::string_view name, const Expr& e, std::string_view what) {
    const Value* v = args.get(index, name);
    if (v == nullptr || !v->is_string())
      fail(e.offset, fmt::format("{} takes a string as its '{}' argument, got {}", what, name,
                                 v == nullptr ? "none" : "a " + type_name(*v)));
    return v->string();
  }

  std::int64_t int_argument(const Arguments& args, std::size_t index, std::string_view name,
                            std::int64_t fallback, const Expr& e, std::string_view what) {
    const Value* v = args.get(index, name);
    if (v == nullptr || v->is_none()) return fallback;
    if (!v->is_int())
      fail(e.offset, fmt::format("{} takes an integer as its '{}' argument, got a {}", what, name,
                                 type_name(*v)));
    return v->integer();
  }

  Value strip(const std::string& s, const Arguments& args, bool front, bool back) {
    const Value* chars = args.get(0, "chars");
    if (chars == nullptr || chars->is_none() || chars->is_undefined())
      return Value(std::string(strip_spaces(s, front, back)));
    if (!chars->is_string()) return Value(std::string(strip_spaces(s, front, back)));
    std::vector<char32_t> set;
    for (const std::string_view c : characters(chars->string()))
      set.push_back(decode_utf8(c, 0).value);
    return Value(std::string(strip_where(s, front, back, [&](char32_t c) {
      return std::find(set.begin(), set.end(), c) != set.end();
    })));
  }

  bool affix_matches(const std::string& s, const Value& pattern, bool prefix, const Expr& e) {
    const auto one = [&](const Value& p) {
      if (!p.is_string())
        fail(e.offset, fmt::format("startswith/endswith take strings, got a {}", type_name(p)));
      const std::string& a = p.string();
      if (a.size() > s.size()) return false;
      return prefix ? s.compare(0, a.size(), a) == 0
                    : s.compare(s.size() - a.size(), a.size(), a) == 0;
    };
    if (pattern.is_list()) return std::any_of(pattern.list().begin(), pattern.list().end(), one);
    return one(pattern);
  }

  Value method(const Value& object, const std::string& name, const Arguments& args, const Expr& e) {
    if (object.is_string()) {
      const std::string& s = object.string();
      if (name == "upper") return Value(ascii_upper(s));
      if (name == "lower") return Value(ascii_lower(s));
      if (name == "title") return Value(title_case(s));
      if (name == "capitalize") return filter("capitalize", object, {}, e);
      if (name == "strip") return strip(s, args, true, true);
      if (name == "lstrip") return strip(s, args, true, false);
      if (name == "rstrip") return strip(s, args, false, true);
      if (name == "startswith" || name == "endswith") {
        const Value* pattern = args.get(0, "prefix");
        if (pattern == nullptr) fail(e.offset, fmt::format("{}() needs an argument", name));
        return Value(affix_matches(s, *pattern, name == "startswith", e));
      }
      if (name == "split") {
        const Value* sep = args.get(0, "sep");
        std::optional<std::string> separator;
        if (sep != nullptr && !sep->is_none()) {
          if (!sep->is_string()) fail(e.offset, "split() takes a string separator or none");
          if (sep->string().empty()) fail(e.offset, "split() separator must not be empty");
          separator = sep->string();
        }
        return Value(split(s, separator, int_argument(args, 1, "maxsplit", -1, e, "split()")));
      }
      if (name == "replace") {
        return Value(replace(s, string_argument(args, 0, "old", e, "replace()"),
                             string_argument(args, 1, "new", e, "replace()"),
                             int_argument(args, 2, "count", -1, e, "replace()")));
      }
      fail(e.offset, fmt::format("strings have no method '{}' (supported: strip, lstrip, rstrip, "
                                 "startswith, endswith, split, upper, lower, title, capitalize, "
                                 "replace)",
                                 name));
    }
    if (object.is_dict()) {
      const Dict& dict = object.dict();
      if (name == "get") {
        const Value* key = args.get(0, "key");
        if (key == nullptr) fail(e.offset, "get() needs a key");
        const Value* found = key->is_string() ? dict.find(key->string()) : nullptr;
        if (found != nullptr) return *found;
        const Value* fallback = args.get(1, "default");
        return fallback == nullptr ? Value(None{}) : *fallback;
      }
      if (name == "items") return items(dict);
      if (name == "keys" || name == "values") {
        List out;
        for (const auto& [key, value] : dict.entries)
          out.push_back(name == "keys" ? Value(key) : value);
        return Value(std::move(out));
      }
      fail(e.offset, fmt::format("dicts have no method or key '{}' (methods: get, items, keys, "
                                 "values)",
                                 name));
    }
    fail(e.offset, fmt::format("cannot call '{}' on a {}", name,
                               object.is_undefined() ? "undefined value" : type_name(object)));
  }

  static Value items(const Dict& dict) {
    List out;
    for (const auto& [key, value] : dict.entries) out.emplace_back(List{Value(key), value});
    return Value(std::move(out));
  }

  // The value at a dotted attribute path ("function.name", "0"), or undefined.
  Value attribute_path(const Value& item, const std::string& path, const Expr& e) {
    Value v = item;
    for (const auto& part : split(path, std::string("."), -1)) {
      const std::string& key = part.string();
      std::int64_t index = 0;
      const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), index);
      if (error == std::errc() && end == key.data() + key.size() && v.is_list())
        v = member(v, Value(index), e);
      else
        v = member(v, Value(key), e);
    }
    return v;
  }

  // Python's sort order for values of one kind; strings compare case-insensitively unless
  // `case_sensitive`.
  int compare(const Value& a, const Value& b, bool case_sensitive, const Expr& e) {
    if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool()))
      return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
    if (a.is_string() && b.is_string()) {
      const std::string x = case_sensitive ? a.string() : ascii_lower(a.string());
      const std::string y = case_sensitive ? b.string() : ascii_lower(b.string());
      return x < y ? -1 : x > y ? 1 : 0;
    }
    fail(e.offset, fmt::format("cannot order a {} against a {}", type_name(a), type_name(b)));
  }

  bool test(const std::string& name, const Value& v, const std::vector<Value>& args,
            const Expr& e) {
    const auto arg = [&]() -> const Value& {
      if (args.empty()) fail(e.offset, fmt::format("the test '{}' needs an argument", name));
      return args[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.boolean();
    if (name == "false") return v.is_bool() && !v.boolean();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_list() || v.is_string() || v.is_dict();
    if (name == "sequence") return v.is_list() || v.is_string() || v.is_dict();
    if (name == "callable") return v.is_function();
    if (name == "odd" || name == "even") {
      if (!v.is_int())
        fail(e.offset, fmt::format("the test '{}' needs an integer, got a {}", name, type_name(v)));
      return (v.integer() % 2 != 0) == (name == "odd");
    }
    if (name == "lower") return v.is_string() && ascii_lower(v.string()) == v.string();
    if (name == "upper") return v.is_string() && ascii_upper(v.string()) == v.string();
    if (name == "equalto" || name == "eq") return equal(v, arg());
    if (name == "ne") return !equal(v, arg());
    if (name == "in") {
      const Value& container = arg();
      return contains(container, v, e);
    }
    fail(e.offset, fmt::format("unknown test '{}' (supported: defined, undefined, none, string, "
                               "number, integer, float, boolean, true, false, mapping, iterable, "
                               "sequence, callable, odd, even, lower, upper, equalto, eq, ne, in)",
                               name));
  }

  bool contains(const Value& container, const Value& item, const Expr& e) {
    if (container.is_undefined()) return false;
    if (container.is_list())
      return std::any_of(container.list().begin(), container.list().end(),
                         [&](const Value& x) { return equal(x, item); });
    if (container.is_string() && item.is_string())
      return container.string().find(item.string()) != std::string::npos;
    if (container.is_dict() && item.is_string())
      return container.dict().find(item.string()) != nullptr;
    if (container.is_namespace() && item.is_string())
      return container.ns().attributes.find(item.string()) != nullptr;
    fail(e.offset,
         fmt::format("cannot test whether a {} is in a {}", type_name(item), type_name(container)));
  }

  [[noreturn]] void filter_type_error(const std::string& name, const Value& v, const Expr& e) {
    fail(e.offset, fmt::format("the filter '{}' cannot take {}", name, a_value(v)));
  }

  Value filter(const std::string& name, Value v, const Arguments& args, const Expr& e);

  Value binary(const Expr& e, Scope& scope) {
    const std::string& op = e.name;
    const Value left = eval(*e.a, scope);
    if (op == "and") return truthy(left) ? eval(*e.b, scope) : left;
    if (op == "or") return truthy(left) ? left : eval(*e.b, scope);
    const Value right = eval(*e.b, scope);
    if (op == "==") return Value(equal(left, right));
    if (op == "!=") return Value(!equal(left, right));
    if (op == "~") return Value(text(left) + text(right));
    if (op == "in") return Value(contains(right, left, e));
    if (op == "not in") return Value(!contains(right, left, e));
    const auto type_error = [&]() {
      fail(e.offset,
           fmt::format("cannot apply '{}' to {} and {}", op, a_value(left), a_value(right)));
    };
    if (left.is_undefined() || right.is_undefined() || left.is_none() || right.is_none())
      type_error();
    const bool numeric =
        (left.is_number() || left.is_bool()) && (right.is_number() || right.is_bool());
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (!numeric && !(left.is_string() && right.is_string())) type_error();
      const int order = compare(left, right, true, e);
      if (op == "<") return Value(order < 0);
      if (op == ">") return Value(order > 0);
      if (op == "<=") return Value(order <= 0);
      return Value(order >= 0);
    }
    if (op == "+") {
      if (left.is_list() && right.is_list()) {
        List joined = left.list();
        joined.insert(joined.end(), right.list().begin(), right.list().end());
        return Value(std::move(joined));
      }
      if (left.is_string() || right.is_string()) return Value(text(left) + text(right));
    }
    if (op == "*" && left.is_string() && right.is_int()) {
      std::string out;
      for (std::int64_t i = 0; i < right.integer(); ++i) out += left.string();
      return Value(std::move(out));
    }
    if (!numeric) type_error();
    return arithmetic(op, left, right, e);
  }

  Value arithmetic(const std::string& op, const Value& left, const Value& right, const Expr& e) {
    const bool integers = !left.is_float() && !right.is_float();
    const auto as_int = [](const Value& v) {
      return v.is_int() ? v.integer() : std::int64_t{v.boolean()};
    };
    if (integers && op != "/") {
      const std::int64_t a = as_int(left), b = as_int(right);
      std::int64_t result = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(a, b, &result);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(a, b, &result);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(a, b, &result);
      } else if (op == "//" || op == "%") {
        if (b == 0) fail(e.offset, fmt::format("'{}' by zero", op));
        if (a == std::numeric_limits<std::int64_t>::min() && b == -1) {
          overflow = true;
        } else {
          std::int64_t q = a / b, r = a % b;
          if (r != 0 && ((r < 0) != (b < 0))) {  // Python rounds the quotient down
            --q;
            r += b;
          }
          result = op == "//" ? q : r;
        }
      } else if (op == "**") {
        if (b < 0) return Value(std::pow(static_cast<double>(a), static_cast<double>(b)));
        result = 1;
        for (std::int64_t i = 0; i < b && !overflow; ++i)
          overflow = __builtin_mul_overflow(result, a, &result);
      }
      if (overflow) fail(e.offset, fmt::format("integer overflow in '{}'", op));
      return Value(result);
    }
    const double a = left.number(), b = right.number();
    if (op == "+") return Value(a + b);
    if (op == "-") return Value(a - b);
    if (op == "*") return Value(a * b);
    if (op == "**") return Value(std::pow(a, b));
    if (b == 0) fail(e.offset, fmt::format("'{}' by zero", op));
    if (op == "/") return Value(a / b);
    if (op == "//") return Value(std::floor(a / b));
    const double r = std::fmod(a, b);
    return Value(r != 0 && ((r < 0) != (b < 0)) ? r + b : r);
  }

  const ChatTemplate::Program& program_;
  const std::string& source_;
  Scope globals_;
  std::deque<Scope> scopes_;  // every scope of this render; closures hold pointers into it
  int call_depth_ = 0;
};

Value Renderer::filter(const std::string& name, Value v, const Arguments& args, const Expr& e) {
  if (name == "default" || name == "d") {
    const Value* fallback = args.get(0, "default_value");
    const Value* boolean = args.get(1, "boolean");
    const bool replace_falsy = boolean != nullptr && truthy(*boolean);
    if (v.is_undefined() || (replace_falsy && !truthy(v)))
      return fallback == nullptr ? Value(std::string()) : *fallback;
    return v;
  }
  if (name == "safe") return v;
  if (name == "tojson") {
    JsonStyle style;
    if (const Value* indent = args.get(0, "indent"); indent != nullptr && !indent->is_none()) {
      if (!indent->is_int())
        fail(e.offset, fmt::format("tojson's indent must be an integer, got {}", a_value(*indent)));
      style.indent = indent->integer();
    }
    if (const Value* ascii = args.keyword("ensure_ascii")) style.ensure_ascii = truthy(*ascii);
    if (const Value* sort = args.keyword("sort_keys")) style.sort_keys = truthy(*sort);
    if (const Value* separators = args.keyword("separators");
        separators != nullptr && !separators->is_none()) {
      if (!separators->is_list() || separators->list().size() != 2 ||
          !separators->list()[0].is_string() || !separators->list()[1].is_string())
        fail(e.offset, "tojson's separators must be two strings (item separator, key separator)");
      style.separators.emplace(separators->list()[0].string(), separators->list()[1].string());
    }
    std::string out;
    if (!append_json(out, v, style, 0)) fail(e.offset, "tojson cannot write a function");
    return Value(std::move(out));
  }
  if (name == "string") {
    if (v.is_function()) filter_type_error(name, v, e);
    return Value(text(v));
  }
  if (name == "bool") return Value(truthy(v));
  if (name == "map") {
    if (!v.is_list()) filter_type_error(name, v, e);
    List out;
    if (const Value* attribute = args.keyword("attribute")) {
      if (!attribute->is_string()) fail(e.offset, "map's attribute must be a string");
      const Value* fallback = args.keyword("default");
      for (const Value& item : v.list()) {
        Value mapped = attribute_path(item, attribute->string(), e);
        out.push_back(mapped.is_undefined() && fallback != nullptr ? *fallback : std::move(mapped));
      }
      return Value(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string())
      fail(e.offset, "map takes a filter name or attribute=...");
    Arguments rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keywords = args.keywords;
    for (const Value& item : v.list())
      out.push_back(filter(args.positional[0].string(), item, rest, e));
    return Value(std::move(out));
  }
  if (v.is_undefined() || v.is_none() || v.is_function()) filter_type_error(name, v, e);

  const auto code_points_of = [](const std::string& s) {
    List out;
    for (const std::string_view c : characters(s)) out.emplace_back(std::string(c));
    return out;
  };

  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(static_cast<std::int64_t>(character_count(v.string())));
    if (v.is_list()) return Value(static_cast<std::int64_t>(v.list().size()));
    if (v.is_dict()) return Value(static_cast<std::int64_t>(v.dict().entries.size()));
    filter_type_error(name, v, e);
  }
  if (name == "list") {
    if (v.is_list()) return v;
    if (v.is_string()) return Value(code_points_of(v.string()));
    if (v.is_dict()) return method(v, "keys", {}, e);
    filter_type_error(name, v, e);
  }
  if (name == "first" || name == "last") {
    const List list = v.is_list() ? v.list() : v.is_string() ? code_points_of(v.string()) : List{};
    if (!v.is_list() && !v.is_string()) filter_type_error(name, v, e);
    if (list.empty()) return Value();
    return name == "first" ? list.front() : list.back();
  }
  if (name == "reverse") {
    if (v.is_list()) {
      List list = v.list();
      std::reverse(list.begin(), list.end());
      return Value(std::move(list));
    }
    if (v.is_string()) {
      std::vector<std::string_view> chars = characters(v.string());
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    filter_type_error(name, v, e);
  }
  if (name == "items") {
    if (!v.is_dict()) filter_type_error(name, v, e);
    return items(v.dict());
  }
  if (name == "join") {
    const Value* separator = args.get(0, "d");
    if (separator == nullptr) separator = args.keyword("separator");
    const std::string sep = separator == nullptr ? "" : text(*separator);
    const List list = v.is_list() ? v.list() : v.is_string() ? code_points_of(v.string()) : List{};
    if (!v.is_list() && !v.is_string()) filter_type_error(name, v, e);
    const Value* attribute = args.keyword("attribute");
    std::string out;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += sep;
      out += text(attribute != nullptr && attribute->is_string()
                      ? attribute_path(list[i], attribute->string(), e)
                      : list[i]);
    }
    return Value(std::move(out));
  }
  if (name == "unique") {
    if (!v.is_list()) filter_type_error(name, v, e);
    List out;
    for (const Value& item : v.list())
      if (std::none_of(out.begin(), out.end(), [&](const Value& x) { return equal(x, item); }))
        out.push_back(item);
    return Value(std::move(out));
  }
  if (name == "sort") {
    if (!v.is_list()) filter_type_error(name, v, e);
    const Value* reverse = args.get(0, "reverse");
    const Value* case_sensitive = args.get(1, "case_sensitive");
    const Value* attribute = args.get(2, "attribute");
    List list = v.list();
    const auto key = [&](const Value& item) {
      return attribute != nullptr && !attribute->is_none()
                 ? attribute_path(item, text(*attribute), e)
                 : item;
    };
    const bool descending = reverse != nullptr && truthy(*reverse);
    const bool exact = case_sensitive != nullptr && truthy(*case_sensitive);
    std::stable_sort(list.begin(), list.end(), [&](const Value& a, const Value& b) {
      const int order = compare(key(a), key(b), exact, e);
      return descending ? order > 0 : order < 0;
    });
    return Value(std::move(list));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    if (!v.is_list()) filter_type_error(name, v, e);
    const bool by_attribute = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "select" || name == "selectattr";
    std::size_t next = 0;
    std::string attribute;
    if (by_attribute) {
      if (args.positional.empty() || !args.positional[0].is_string())
        fail(e.offset, fmt::format("{} needs the attribute name as its first argument", name));
      attribute = args.positional[0].string();
      next = 1;
    }
    std::optional<std::string> test_name;
    if (next < args.positional.size()) {
      if (!args.positional[next].is_string())
        fail(e.offset, fmt::format("{} takes the name of a test as a string", name));
      test_name = args.positional[next].string();
    }
    const std::vector<Value> test_args(
        args.positional.begin() +
            static_cast<std::ptrdiff_t>(std::min(next + 1, args.positional.size())),
        args.positional.end());
    List out;
    for (const Value& item : v.list()) {
      const Value subject = by_attribute ? attribute_path(item, attribute, e) : item;
      const bool passes = test_name ? test(*test_name, subject, test_args, e) : truthy(subject);
      if (passes == keep) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "int" || name == "float") {
    const bool to_int = name == "int";
    const Value* fallback = args.get(0, "default");
    const Value zero = to_int ? Value(std::int64_t{0}) : Value(0.0);
    if (v.is_bool()) return to_int ? Value(std::int64_t{v.boolean()}) : Value(v.number());
    if (v.is_int()) return to_int ? v : Value(v.number());
    if (v.is_float()) {
      const double d = std::get<double>(v.data);
      if (!to_int) return v;
      if (!std::isfinite(d) || std::abs(d) >= 9.2e18) return fallback ? *fallback : zero;
      return Value(static_cast<std::int64_t>(std::trunc(d)));
    }
    if (!v.is_string()) filter_type_error(name, v, e);
    const std::string_view s = strip_spaces(v.string(), true, true);
    std::string_view digits = s.substr(!s.empty() && s[0] == '+' ? 1 : 0);
    std::int64_t i = 0;
    const auto [int_end, int_error] =
        std::from_chars(digits.data(), digits.data() + digits.size(), i);
    if (!digits.empty() && int_error == std::errc() && int_end == digits.data() + digits.size())
      return to_int ? Value(i) : Value(static_cast<double>(i));
    double d = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    if (digits.empty() || error != std::errc() || end != digits.data() + digits.size())
      return fallback ? *fallback : zero;
    if (!to_int) return Value(d);
    if (!std::isfinite(d) || std::abs(d) >= 9.2e18) return fallback ? *fallback : zero;
    return Value(static_cast<std::int64_t>(std::trunc(d)));
  }
  if (name == "abs") {
    if (v.is_int()) return Value(v.integer() < 0 ? -v.integer() : v.integer());
    if (v.is_float()) return Value(std::abs(std::get<double>(v.data)));
    filter_type_error(name, v, e);
  }
  if (!v.is_string()) {
    static constexpr std::array<std::string_view, 8> kStringFilters = {
        "trim", "upper", "lower", "title", "capitalize", "replace", "indent", "striptags"};
    if (std::find(kStringFilters.begin(), kStringFilters.end(), name) != kStringFilters.end())
      filter_type_error(name, v, e);
  } else {
    const std::string& s = v.string();
    if (name == "trim") return strip(s, args, true, true);
    if (name == "upper") return Value(ascii_upper(s));
    if (name == "lower") return Value(ascii_lower(s));
    if (name == "title") return Value(title_case(s));
    if (name == "capitalize") {
      std::string out = s;
      if (!out.empty() && out[0] >= 'a' && out[0] <= 'z')
        out[0] = static_cast<char>(out[0] - 'a' + 'A');
      return Value(std::move(out));
    }
    if (name == "replace") return method(v, "replace", args, e);
    if (name == "indent") {
      const Value* width = args.get(0, "width");
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      std::string indent(4, ' ');
      if (width != nullptr && width->is_string()) indent = width->string();
      if (width != nullptr && width->is_int())
        indent.assign(static_cast<std::size_t>(std::max<std::int64_t>(0, width->integer())), ' ');
      const bool indent_first = first != nullptr && truthy(*first);
      const bool indent_blank = blank != nullptr && truthy(*blank);
      std::string out;
      std::size_t start = 0;
      for (std::size_t line = 0;; ++line) {
        const std::size_t end = std::min(s.find('\n', start), s.size());
        const std::string_view piece(s.data() + start, end - start);
        if ((line > 0 || indent_first) && (!piece.empty() || indent_blank)) out += indent;
        out += piece;
        if (end == s.size()) break;
        out += '\n';
        start = end + 1;
      }
      return Value(std::move(out));
    }
  }
  fail(e.offset, fmt::format("unknown filter '{}' (supported: trim, upper, lower, title, "
                             "capitalize, length, count, tojson, join, default, d, first, last, "
                             "replace, string, int, float, abs, bool, list, items, reverse, sort, "
                             "unique, indent, safe, select, reject, selectattr, rejectattr, map)",
                             name));
}

// The conversation as a template variable, with each message checked.
Value messages_value(const nlohmann::ordered_json& messages) {
  OASES_CHECK(messages.is_array(),
              "chat messages must be a JSON list of {{\"role\", \"content\"}} "
              "objects, found {}",
              messages.type_name());
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    OASES_CHECK(message.is_object(),
                "chat message {} must be a JSON object with \"role\" and "
                "\"content\", found {}",
                i, message.type_name());
    OASES_CHECK(message.contains("role") && message["role"].is_string(),
                "chat message {} has no string \"role\" (found {}); roles are strings such as "
                "\"system\", \"user\", \"assistant\"",
                i, message.contains("role") ? message["role"].dump() : "none");
  }
  return from_json(messages);
}

Dict variables_dict(const nlohmann::ordered_json& variables, const std::string& source) {
  OASES_CHECK(variables.is_object() || variables.is_null(),
              "the variables for chat template {} must be a JSON object, found {}", source,
              variables.type_name());
  if (variables.is_null()) return {};
  return from_json(variables).dict();
}

std::string render_program(const ChatTemplate::Program& program, const std::string& source,
                           Dict variables) {
  Renderer renderer(program, source);
  return renderer.render(std::move(variables));
}

// Where `a` and `b` first differ, with a few characters of each, for a message.
std::string first_difference(std::string_view a, std::string_view b) {
  std::size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  const std::size_t from = at >= 20 ? at - 20 : 0;
  return fmt::format("they differ from byte {}: {} versus {}", at, excerpt(a.substr(from)),
                     excerpt(b.substr(from)));
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string_view text, std::string source) {
  auto program = std::make_shared<Program>();
  program->text = std::string(text);
  Lexer lexer(program->text, source);
  Parser parser(lexer.run(), program->text, source);
  program->body = parser.parse_template();
  return ChatTemplate(std::move(program), std::move(source));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  return render_program(*program_, source_, variables_dict(variables, source_));
}

std::vector<ChatSegment> render_chat(const ChatTemplate& chat_template,
                                     const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& variables) {
  const Value conversation = messages_value(messages);
  const Dict base = variables_dict(variables, chat_template.source());
  const List& all = conversation.list();
  const std::string& source = chat_template.source();

  const auto render_prefix = [&](std::size_t count, bool generation_prompt) {
    Dict vars = base;
    vars.set("messages",
             Value(List(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(count))));
    vars.set("add_generation_prompt", Value(generation_prompt));
    return render_program(chat_template.program(), source, std::move(vars));
  };
  const auto rethrow = [&](const UserError& e, std::size_t count, bool generation_prompt,
                           std::size_t assistant) {
    throw UserError(fmt::format("{} (while rendering the first {} messages with "
                                "add_generation_prompt={}, to find where the assistant message {} "
                                "{})",
                                e.what(), count, generation_prompt ? "true" : "false", assistant,
                                generation_prompt ? "starts" : "ends"),
                    e.location());
  };

  const std::string whole = render_prefix(all.size(), false);
  std::vector<ChatSegment> segments;
  const auto add = [&](std::size_t begin, std::size_t end, bool trained) {
    if (end <= begin) return;
    const std::string_view piece = std::string_view(whole).substr(begin, end - begin);
    if (!segments.empty() && segments.back().trained == trained) {
      segments.back().text += piece;
    } else {
      segments.push_back({std::string(piece), trained});
    }
  };
  std::size_t cursor = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].dict().find("role")->string() != "assistant") continue;
    std::string prompt, turn;
    try {
      prompt = render_prefix(i, true);
    } catch (const UserError& e) {
      rethrow(e, i, true, i);
    }
    try {
      turn = render_prefix(i + 1, false);
    } catch (const UserError& e) {
      rethrow(e, i + 1, false, i);
    }
    OASES_CHECK(
        turn.compare(0, prompt.size(), prompt) == 0 && prompt.size() <= turn.size(),
        "chat template {} is not prefix-stable at message {} (an assistant message, counting from "
        "0): "
        "the first {} messages rendered with add_generation_prompt=true are not the start of "
        "the first {} rendered without it; {}. Assistant replies can only be marked "
        "for training when rendering more messages only appends text",
        source, i, i, i + 1, first_difference(prompt, turn));
    OASES_CHECK(
        whole.compare(0, turn.size(), turn) == 0 && turn.size() <= whole.size(),
        "chat template {} is not prefix-stable at message {} (an assistant message, counting from "
        "0): "
        "the first {} messages rendered are not the start of the whole conversation rendered "
        "(the template renders earlier messages differently when later ones follow); {}",
        source, i, i + 1, first_difference(turn, whole));
    OASES_CHECK(prompt.size() >= cursor,
                "chat template {} is not prefix-stable at message {} (an assistant message, "
                "counting from 0): its "
                "generation prompt is shorter than the conversation up to the previous assistant "
                "reply",
                source, i);
    add(cursor, prompt.size(), false);
    add(prompt.size(), turn.size(), true);
    cursor = turn.size();
  }
  add(cursor, whole.size(), false);
  return segments;
}

ModelChatTemplate load_model_chat_template(const std::string& folder) {
  namespace fs = std::filesystem;
  const fs::path jinja = fs::path(folder) / "chat_template.jinja";
  const fs::path config_path = fs::path(folder) / "tokenizer_config.json";
  constexpr std::uint64_t kMaxBytes = std::uint64_t{64} << 20;
  std::error_code ec;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::exists(config_path, ec)) {
    const std::string text = read_regular_file(config_path.string(), "tokenizer config", kMaxBytes);
    try {
      config = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      OASES_FAIL("{} is not valid JSON: {}", config_path.string(), e.what());
    }
    OASES_CHECK(config.is_object(), "{} must hold a JSON object, found {}", config_path.string(),
                config.type_name());
  }
  std::optional<ChatTemplate> chat_template;
  if (fs::exists(jinja, ec)) {
    chat_template = ChatTemplate::parse(
        read_regular_file(jinja.string(), "chat template", kMaxBytes), jinja.string());
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const auto& entry = config["chat_template"];
    const std::string source = config_path.string() + " (chat_template)";
    if (entry.is_string()) {
      chat_template = ChatTemplate::parse(entry.get<std::string>(), source);
    } else if (entry.is_array()) {
      std::vector<std::string> names;
      for (const auto& named : entry) {
        if (!named.is_object() || !named.contains("name") || !named["name"].is_string() ||
            !named.contains("template") || !named["template"].is_string())
          OASES_FAIL(
              "{}: chat_template lists must hold {{\"name\", \"template\"}} objects, found {}",
              config_path.string(), named.dump().substr(0, 80));
        names.push_back(named["name"].get<std::string>());
        if (names.back() == "default")
          chat_template =
              ChatTemplate::parse(named["template"].get<std::string>(),
                                  config_path.string() + " (chat_template \"default\")");
      }
      OASES_CHECK(chat_template.has_value(),
                  "{} lists chat templates named {} but none named \"default\"",
                  config_path.string(), fmt::join(names, ", "));
    } else {
      OASES_FAIL(
          "{}: chat_template must be a string or a list of {{\"name\", \"template\"}}, "
          "found {}",
          config_path.string(), entry.type_name());
    }
  }
  OASES_CHECK(chat_template.has_value(),
              "the model folder {} has no chat template: neither {} nor a \"chat_template\" in {}",
              folder, jinja.filename().string(), config_path.filename().string());
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const auto& token = config[key];
    if (token.is_string()) {
      variables[key] = token;
    } else if (token.is_object() && token.contains("content") && token["content"].is_string()) {
      variables[key] = token["content"];
    } else {
      OASES_FAIL("{}: {} must be a string or an object with a string \"content\", found {}",
                 config_path.string(), key, token.dump().substr(0, 80));
    }
  }
  return {std::move(*chat_template), std::move(variables)};
}

}  // namespace oases::data
