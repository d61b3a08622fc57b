// The configuration reference (docs/configuration.md) lists exactly the keys the parser accepts.
//
// A key is listed by a table row whose first cell is the key in backticks, `section.key`
// (docs/configuration.md says so in its first lines); every such row names one key, and no key
// is listed twice. The parser's keys come from plan::config_key_names(), the schema table
// itself, so a key added to the parser without a row in the page, or a row left behind by a key
// that was removed or renamed, fails this test naming the key.
#include "plan/run_config.h"

#include "support/errors.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace oases {
namespace {

const std::string kReference = std::string(OASES_SOURCE_DIR) + "/docs/configuration.md";

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The keys the page lists, each with how many rows list it: the first cell of every table row
// that is a backticked `section.key`.
std::map<std::string, int> listed_keys(const std::string& page) {
  static const std::regex kKeyRow(R"(^\|\s*`([A-Za-z0-9_]+\.[A-Za-z0-9_]+)`\s*\|)");
  std::map<std::string, int> keys;
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (std::regex_search(line, match, kKeyRow)) ++keys[match[1].str()];
  }
  return keys;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

TEST(ConfigurationReference, ListsEveryKeyTheParserAccepts) {
  const std::map<std::string, int> listed = listed_keys(read_text(kReference));
  std::vector<std::string> missing;
  for (const std::string& key : plan::config_key_names())
    if (!listed.contains(key)) missing.push_back(key);
  EXPECT_TRUE(missing.empty())
      << "docs/configuration.md does not list these config keys (add a table row whose first "
         "cell is the key in backticks, e.g. | `train.lr` | ...): "
      << joined(missing);
}

TEST(ConfigurationReference, ListsNoKeyTheParserRejects) {
  const std::vector<std::string> names = plan::config_key_names();
  const std::set<std::string> accepted(names.begin(), names.end());
  std::vector<std::string> unknown, repeated;
  for (const auto& [key, rows] : listed_keys(read_text(kReference))) {
    if (!accepted.contains(key)) unknown.push_back(key);
    if (rows > 1) repeated.push_back(key);
  }
  EXPECT_TRUE(unknown.empty())
      << "docs/configuration.md lists keys the config parser does not accept (remove or rename "
         "their rows): "
      << joined(unknown);
  EXPECT_TRUE(repeated.empty())
      << "docs/configuration.md lists these keys in more than one row (keep one): "
      << joined(repeated);
}

// The list the two tests above compare against is the parser's own: every name it gives is a
// key --set accepts (a value of the wrong type is rejected for its type, never as an unknown
// key), and a name it does not give is rejected as unknown.
TEST(ConfigurationReference, KeyNamesAreTheKeysTheParserAccepts) {
  const std::vector<std::string> names = plan::config_key_names();
  ASSERT_GT(names.size(), 50u);
  for (const std::string& name : names) {
    const std::string error = testing::user_error_of(
        [&] { plan::parse_run_config("", "test", {name + "=[1, 2]"}); });
    EXPECT_NE(error.find(name), std::string::npos) << name << ": " << error;
    EXPECT_EQ(error.find("unknown config key"), std::string::npos) << name << ": " << error;
  }
  const std::string unknown = testing::user_error_of(
      [] { plan::parse_run_config("", "test", {"train.no_such_key=1"}); });
  EXPECT_NE(unknown.find("unknown config key train.no_such_key"), std::string::npos) << unknown;
}

}  // namespace
}  // namespace oases
