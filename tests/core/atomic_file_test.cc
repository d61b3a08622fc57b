// The temporary file of an atomic write is created exclusively under a name of its own beside
// the target: a symlink planted in the folder cannot redirect the write, and a directory as
// the target is an error rather than a file written beside it.
#include "core/atomic_file.h"

#include "core/error.h"
#include "support/errors.h"
#include "support/files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace oases {
namespace {

namespace fs = std::filesystem;
using testing::leftover_temporaries;
using testing::read_bytes;
using testing::TempDir;
using testing::user_error_of;
using testing::write_bytes;

TEST(AtomicFile, APlantedSymlinkAtTheOldTemporaryNameIsNotFollowed) {
  TempDir dir("atomic_file");
  const std::string victim = dir.file("victim");
  write_bytes(victim, "precious");
  const std::string target = dir.file("out/data_train.bin");
  fs::create_directories(dir.path() / "out");
  fs::create_symlink(victim, target + ".tmp");
  write_file_atomically(target, "new contents");
  EXPECT_EQ(read_bytes(victim), "precious");
  EXPECT_EQ(read_bytes(target), "new contents");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(target)));
  // The planted link is left as it was; nothing of the write stays behind.
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(target + ".tmp")));
  fs::remove(target + ".tmp");
  EXPECT_TRUE(leftover_temporaries(dir.path() / "out").empty());
}

TEST(AtomicFile, ADirectoryAsTheTargetIsAnErrorAndNothingIsWrittenBesideIt) {
  TempDir dir("atomic_file");
  const fs::path target = dir.path() / "trace";
  fs::create_directories(target);
  const std::string message =
      user_error_of([&] { write_file_atomically(target.string(), "{}"); });
  EXPECT_NE(message.find(target.string()), std::string::npos) << message;
  EXPECT_NE(message.find("it is a directory"), std::string::npos) << message;
  EXPECT_TRUE(leftover_temporaries(dir.path()).empty());
  EXPECT_TRUE(fs::is_empty(target));
}

TEST(AtomicFile, WritersOfOnePathUseTemporariesOfTheirOwn) {
  TempDir dir("atomic_file");
  const std::string target = dir.file("state.json");
  AtomicFileWriter first(target), second(target);
  EXPECT_NE(first.tmp_path(), second.tmp_path());
  EXPECT_EQ(fs::path(first.tmp_path()).parent_path(), dir.path());
  first.write("first");
  second.write("second");
  first.commit();
  EXPECT_EQ(read_bytes(target), "first");
  second.commit();
  EXPECT_EQ(read_bytes(target), "second");
  EXPECT_TRUE(leftover_temporaries(dir.path()).empty());
}

TEST(AtomicFile, APathWithNulIsAnError) {
  TempDir dir("atomic_file");
  std::string path = dir.file("a");
  path.push_back('\0');
  path.push_back('b');
  EXPECT_NE(user_error_of([&] { write_file_atomically(path, "x"); }).find("NUL"),
            std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

}  // namespace
}  // namespace oases
