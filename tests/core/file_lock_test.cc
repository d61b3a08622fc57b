// The lock that makes one process the only writer of a folder: taken once, refused to a second
// holder with the first's host and pid, released by the kernel when its holder dies however
// it dies, and never taken through a symbolic link.
#include "core/file_lock.h"

#include "support/files.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

namespace oases {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

TEST(FileLock, ASecondHolderIsRefusedAndToldWhoHoldsIt) {
  TempDir dir("file_lock");
  const std::string path = (dir.path() / "LOCK").string();
  std::string holder;
  std::optional<FileLock> first = FileLock::try_take(path, "checkpoint.dir", &holder);
  ASSERT_TRUE(first.has_value());
  // flock belongs to an open file: a second open, even in this process, is a second holder.
  std::optional<FileLock> second = FileLock::try_take(path, "checkpoint.dir", &holder);
  EXPECT_FALSE(second.has_value());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(holder.rfind(std::string("host ") + host + " pid " + std::to_string(getpid()) +
                             " since ",
                         0),
            0u)
      << holder;
  first.reset();  // released
  EXPECT_TRUE(FileLock::try_take(path, "checkpoint.dir", &holder).has_value());
  EXPECT_TRUE(fs::exists(path)) << "the lock file stays, so that every holder locks one file";
}

TEST(FileLock, ALockWhoseHolderWasKilledIsTakenOver) {
  TempDir dir("file_lock");
  const std::string path = (dir.path() / "LOCK").string();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string unused;
    const auto lock = FileLock::try_take(path, "checkpoint.dir", &unused);
    const char byte = lock ? 'y' : 'n';
    (void)!write(ready[1], &byte, 1);
    pause();  // held until killed
    _exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 'y');
  std::string holder;
  EXPECT_FALSE(FileLock::try_take(path, "checkpoint.dir", &holder).has_value());
  EXPECT_NE(holder.find("pid " + std::to_string(child)), std::string::npos) << holder;
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  std::optional<FileLock> taken = FileLock::try_take(path, "checkpoint.dir", &holder);
  ASSERT_TRUE(taken.has_value()) << "a dead holder's lock must be free";
  close(ready[0]);
  close(ready[1]);
}

TEST(FileLock, ASymbolicLinkOrAnUnwritableFolderIsAClearError) {
  TempDir dir("file_lock");
  const fs::path target = dir.path() / "elsewhere";
  testing::write_bytes(target.string(), "not to be touched\n");
  const fs::path link = dir.path() / "LOCK";
  fs::create_symlink(target, link);
  std::string holder;
  testing::expect_user_error(
      [&] { FileLock::try_take(link.string(), "checkpoint.dir", &holder); },
      {"checkpoint.dir", link.string()});
  EXPECT_EQ(testing::read_bytes(target.string()), "not to be touched\n");
  testing::expect_user_error(
      [&] { FileLock::try_take("/dev/null/LOCK", "log.metrics", &holder); },
      {"log.metrics", "/dev/null/LOCK"});
}

}  // namespace
}  // namespace oases
