// Reading the files of Hugging Face tokenizers (tokenizer.json, tokenizer_config.json, ...) for
// the tokenizers that load them: files from a folder or from a list of TokenizerFile, JSON
// parsed with messages naming the file, and the settings of tokenizer_config.json.
#pragma once

#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

inline constexpr std::string_view kTokenizerJsonFile = "tokenizer.json";
inline constexpr std::string_view kTokenizerConfigFile = "tokenizer_config.json";

// Reads the file `name` of `folder`; nullopt when it does not exist. UserError when it exists
// but cannot be read (not a regular file, unreadable, too large).
std::optional<TokenizerFile> read_folder_file(const std::string& folder, std::string_view name);

// The file called `name` among `files`, or nullptr.
const TokenizerFile* find_file(const std::vector<TokenizerFile>& files, std::string_view name);
// The same, or a UserError naming `source`, the files given and `needed_for`.
const TokenizerFile& require_file(const std::vector<TokenizerFile>& files, std::string_view name,
                                  const std::string& source, std::string_view needed_for);

// Parses JSON text; UserError "`source` is not valid JSON: ..." otherwise.
nlohmann::json parse_tokenizer_json(const std::string& text, const std::string& source);

// A string member of a JSON object, "" when absent or null; UserError when of another type.
std::string optional_json_string(const nlohmann::json& object, const char* key,
                                 const std::string& where);
// A boolean member of a JSON object, nullopt when absent or null; UserError when of another
// type.
std::optional<bool> optional_json_bool(const nlohmann::json& object, const char* key,
                                       const std::string& where);

// The settings of tokenizer_config.json oases uses. Token settings may be written as a string
// or as an object with "content" (AddedToken); absent or null is "".
struct TokenizerConfig {
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::string bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token;
  std::optional<bool> do_lower_case;
  // null in the file (follow do_lower_case) reads as nullopt, like absent.
  std::optional<bool> strip_accents;
  std::optional<bool> tokenize_chinese_chars;
  std::string tokenizer_class;
  struct AddedToken {
    std::int32_t id = 0;
    std::string content;
    bool special = false;
  };
  std::vector<AddedToken> added_tokens;  // added_tokens_decoder, by id
};

// Parses tokenizer_config.json's text; `source` names it in messages.
TokenizerConfig parse_tokenizer_config(const std::string& text, const std::string& source);

}  // namespace oases::data
