#include "data/tokenizer_files.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

std::string file_names(const std::vector<TokenizerFile>& files) {
  std::string names;
  for (const TokenizerFile& file : files) names += (names.empty() ? "" : ", ") + file.name;
  return names.empty() ? "none" : names;
}

// A token setting: "text", {"content": "text", ...}, or null.
std::string token_setting(const nlohmann::json& config, const char* key,
                          const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  OASES_CHECK(it->is_object() && it->contains("content") && (*it)["content"].is_string(),
              "{}: {} is {}; a token is written as a string or as an object with a \"content\" "
              "string",
              source, key, it->dump());
  return (*it)["content"].get<std::string>();
}

}  // namespace

std::optional<TokenizerFile> read_folder_file(const std::string& folder, std::string_view name) {
  const fs::path path = fs::path(folder) / name;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  return TokenizerFile{std::string(name),
                       read_regular_file(path.string(), "tokenizer file", kMaxTokenizerFileBytes)};
}

const TokenizerFile* find_file(const std::vector<TokenizerFile>& files, std::string_view name) {
  const auto it = std::find_if(files.begin(), files.end(),
                               [&](const TokenizerFile& f) { return f.name == name; });
  return it == files.end() ? nullptr : &*it;
}

const TokenizerFile& require_file(const std::vector<TokenizerFile>& files, std::string_view name,
                                  const std::string& source, std::string_view needed_for) {
  const TokenizerFile* file = find_file(files, name);
  OASES_CHECK(file != nullptr, "{} has no {} (files: {}); the {} tokenizer needs it", source, name,
              file_names(files), needed_for);
  return *file;
}

nlohmann::json parse_tokenizer_json(const std::string& text, const std::string& source) {
  try {
    return io::parse_untrusted_json(text, source);
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("{} is not valid JSON: {}", source, e.what());
  }
}

std::string optional_json_string(const nlohmann::json& object, const char* key,
                                 const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return "";
  OASES_CHECK(it->is_string(), "{}: {} is {}, expected a string", where, key, it->dump());
  return it->get<std::string>();
}

std::optional<bool> optional_json_bool(const nlohmann::json& object, const char* key,
                                       const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  OASES_CHECK(it->is_boolean(), "{}: {} is {}, expected true or false", where, key, it->dump());
  return it->get<bool>();
}

TokenizerConfig parse_tokenizer_config(const std::string& text, const std::string& source) {
  const nlohmann::json json = parse_tokenizer_json(text, source);
  OASES_CHECK(json.is_object(), "{} holds {} where a tokenizer_config.json holds an object", source,
              json.type_name());
  TokenizerConfig config;
  config.add_bos_token = optional_json_bool(json, "add_bos_token", source);
  config.add_eos_token = optional_json_bool(json, "add_eos_token", source);
  config.bos_token = token_setting(json, "bos_token", source);
  config.eos_token = token_setting(json, "eos_token", source);
  config.unk_token = token_setting(json, "unk_token", source);
  config.sep_token = token_setting(json, "sep_token", source);
  config.pad_token = token_setting(json, "pad_token", source);
  config.cls_token = token_setting(json, "cls_token", source);
  config.mask_token = token_setting(json, "mask_token", source);
  config.do_lower_case = optional_json_bool(json, "do_lower_case", source);
  config.strip_accents = optional_json_bool(json, "strip_accents", source);
  config.tokenize_chinese_chars = optional_json_bool(json, "tokenize_chinese_chars", source);
  config.tokenizer_class = optional_json_string(json, "tokenizer_class", source);
  if (const auto added = json.find("added_tokens_decoder");
      added != json.end() && !added->is_null()) {
    OASES_CHECK(added->is_object(),
                "{}: added_tokens_decoder is {}, expected an object of id -> "
                "token",
                source, added->type_name());
    for (const auto& [key, token] : added->items()) {
      TokenizerConfig::AddedToken entry;
      std::size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      OASES_CHECK(used == key.size() && id >= 0 && id <= std::numeric_limits<std::int32_t>::max(),
                  "{}: added_tokens_decoder has the key \"{}\", which is not a token id", source,
                  key);
      entry.id = static_cast<std::int32_t>(id);
      OASES_CHECK(token.is_object() && token.contains("content") && token["content"].is_string(),
                  "{}: added_tokens_decoder[\"{}\"] is {}; expected an object with a \"content\" "
                  "string",
                  source, key, token.dump());
      entry.content = token["content"].get<std::string>();
      entry.special =
          optional_json_bool(token, "special", source + " added_tokens_decoder").value_or(false);
      config.added_tokens.push_back(std::move(entry));
    }
    std::sort(config.added_tokens.begin(), config.added_tokens.end(),
              [](const auto& a, const auto& b) { return a.id < b.id; });
  }
  return config;
}

}  // namespace oases::data
