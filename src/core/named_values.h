// Named values: the one place an enum-like setting's words live.
//
// Every enum a user can name in a config (schedule kinds, precisions, tokenizers, ...) has a
// table of NamedValue entries beside its declaration. Parsing and printing go through the table,
// so a setting is compared to its words only here, and every message lists the same valid
// words the parser accepts. An enum value may have several entries (an accepted alias); the
// first entry of a value is its canonical name, the one printed and listed.
#pragma once

#include "core/error.h"

#include <fmt/format.h>

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace oases {

template <class E>
struct NamedValue {
  E value;
  std::string_view name;
};

// The canonical names of `table`, in table order, each once: "a", "b", "c".
template <class E>
std::vector<std::string> value_names(std::span<const NamedValue<E>> table) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < table.size(); ++i) {
    bool first_of_value = true;
    for (std::size_t j = 0; j < i; ++j) first_of_value = first_of_value && !(table[j].value == table[i].value);
    if (first_of_value) names.emplace_back(table[i].name);
  }
  return names;
}

// "\"a\", \"b\", \"c\"": the canonical names quoted, for messages.
template <class E>
std::string quoted_value_names(std::span<const NamedValue<E>> table) {
  std::string out;
  for (const std::string& name : value_names(table))
    out += fmt::format("{}\"{}\"", out.empty() ? "" : ", ", name);
  return out;
}

// The value `text` names, or nothing.
template <class E>
const E* find_named_value(std::span<const NamedValue<E>> table, std::string_view text) {
  for (const NamedValue<E>& entry : table)
    if (entry.name == text) return &entry.value;
  return nullptr;
}

// The value `text` names. UserError naming `setting`, the text and the valid names otherwise.
template <class E>
E parse_named_value(std::span<const NamedValue<E>> table, std::string_view text,
                    std::string_view setting) {
  const E* value = find_named_value(table, text);
  OASES_CHECK(value != nullptr, "{} = \"{}\" is not known; valid: {}", setting, text,
              quoted_value_names(table));
  return *value;
}

// The canonical name of `value`. REQUIRES: the table has an entry for it.
template <class E>
std::string_view value_name(std::span<const NamedValue<E>> table, E value) {
  for (const NamedValue<E>& entry : table)
    if (entry.value == value) return entry.name;
  OASES_ASSERT(false, "a value without a name in its table");
  return {};
}

}  // namespace oases
