// The JavaScript tokenizers the tokenizer tests compare against (tests/data/tokenizer_reference.js,
// run with node; the npm packages come from scripts/install-deps.sh).
#pragma once

#include "support/command.h"

#include <gtest/gtest.h>

#include <string>

namespace oases::testing {

// What tests/data/tokenizer_reference.js prints for `arguments` (already shell-quoted where
// needed); the test fails when it exits non-zero.
inline std::string tokenizer_reference(const std::string& arguments) {
  const std::string driver = std::string(OASES_SOURCE_DIR) + "/tests/data/tokenizer_reference.js";
  const CommandResult result = run_command("node " + shell_quote(driver) + " " + arguments);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return result.output;
}

}  // namespace oases::testing
