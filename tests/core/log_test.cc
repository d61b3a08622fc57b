// The progress line (in place on a terminal, plain lines otherwise) and the error types'
// messages: a UserError's message carries no source position, which stays in location().
#include "core/log.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace oases {
namespace {

// A ProgressLine writing to a temporary file, and what it wrote.
class Captured {
 public:
  Captured() : file_(std::tmpfile()) {}
  ~Captured() { std::fclose(file_); }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    std::rewind(file_);
    std::string out;
    for (int c; (c = std::fgetc(file_)) != EOF;) out += static_cast<char>(c);
    return out;
  }

 private:
  std::FILE* file_;
};

TEST(ProgressLine, PlainLinesAreWhatLogInfoWrites) {
  Captured out;
  {
    ProgressLine line(ProgressLine::Mode::plain_lines, out.file());
    line.update("step 1");
    line.update("step 2");
    line.log(LogLevel::warning, "disk nearly full");
    line.keep("step 3 | val_loss 1.0");
  }
  EXPECT_EQ(out.text(), "step 1\nstep 2\nwarning: disk nearly full\nstep 3 | val_loss 1.0\n");
}

TEST(ProgressLine, InPlaceRedrawsWithoutNewlinesAndEndsTheLineBeforeWhatMustStay) {
  Captured out;
  {
    ProgressLine line(ProgressLine::Mode::in_place, out.file());
    line.update("step 1 long text");
    line.update("step 2");
    line.log(LogLevel::info, "saved checkpoint c");
    line.update("step 3");
    line.keep("step 4 | val_loss 1.0");
    line.update("step 5");
  }  // ends the pending line
  EXPECT_EQ(out.text(),
            "\rstep 1 long text\x1b[K"
            "\rstep 2\x1b[K"
            "\nsaved checkpoint c\n"
            "\rstep 3\x1b[K"
            "\rstep 4 | val_loss 1.0\x1b[K\n"
            "\rstep 5\x1b[K\n");
}

TEST(ProgressLine, DebugLinesOnlyWhenAskedFor) {
  Captured out;
  ::unsetenv("OASES_LOG_LEVEL");
  {
    ProgressLine line(ProgressLine::Mode::plain_lines, out.file());
    line.log(LogLevel::debug, "hidden");
    ::setenv("OASES_LOG_LEVEL", "debug", 1);
    line.log(LogLevel::debug, "shown");
    ::unsetenv("OASES_LOG_LEVEL");
  }
  EXPECT_EQ(out.text(), "debug: shown\n");
}

TEST(Errors, UserErrorMessageHasNoSourceLocationButKeepsIt) {
  int line = 0;
  try {
    line = __LINE__ + 1;  // the check below
    OASES_CHECK(1 + 1 == 3, "train.lr = {} must be positive", -1);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "train.lr = -1 must be positive");
    EXPECT_EQ(e.location(), "log_test.cc:" + std::to_string(line));
  }
}

TEST(Errors, InternalErrorNamesItsLocation) {
  int line = 0;
  try {
    line = __LINE__ + 1;  // the check below
    OASES_ASSERT(false, "broken invariant {}", 7);
    FAIL() << "no error";
  } catch (const InternalError& e) {
    const std::string location = "log_test.cc:" + std::to_string(line);
    EXPECT_EQ(e.location(), location);
    EXPECT_NE(std::string(e.what()).find("broken invariant 7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(location), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace oases
