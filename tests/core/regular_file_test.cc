// Every file the engine reads goes through core/regular_file.h: a directory, FIFO, device or
// socket is a UserError saying which it is, a FIFO never blocks the open, and a file beyond the
// reader's bound is refused before it is read.
#include "core/regular_file.h"

#include "core/error.h"
#include "support/errors.h"
#include "support/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <filesystem>
#include <string>
#include <thread>

namespace oases {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::user_error_of;

// Runs `call` on a FIFO at `fifo`. Should the call block in open (the bug this guards against),
// a watchdog opens the FIFO's other end after a few seconds, which releases it, so that the
// test fails instead of hanging. Returns the UserError's message ("" when none).
std::string error_on_fifo(const std::string& fifo, const std::function<void()>& call) {
  std::atomic<bool> done{false};
  std::atomic<bool> rescued{false};
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (done) return;
    rescued = true;
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);  // meets the blocked reader
    if (fd >= 0) ::close(fd);
  });
  const std::string message = user_error_of(call);
  done = true;
  watchdog.join();
  EXPECT_FALSE(rescued) << "opening the FIFO '" << fifo << "' blocked";
  return message;
}

TEST(RegularFile, ReadsARegularFileWhole) {
  TempDir dir("regular_file");
  const std::string path = dir.file("config.toml");
  testing::write_bytes(path, "[model]\nlayers = 2\n");
  EXPECT_EQ(read_regular_file(path, "config file", 1024), "[model]\nlayers = 2\n");
  const ReadableFile file = ReadableFile::open(path, "config file");
  EXPECT_EQ(file.size(), 19u);
  EXPECT_EQ(file_kind(path), "a regular file");
}

TEST(RegularFile, ADirectoryIsNamedAsSuch) {
  TempDir dir("regular_file");
  const std::string message = user_error_of([&] { read_regular_file(dir.path(), "config file"); });
  EXPECT_NE(message.find("config file '" + dir.path().string() + "' is a directory"),
            std::string::npos)
      << message;
  EXPECT_EQ(file_kind(dir.path()), "a directory");
}

TEST(RegularFile, AFifoIsNamedWithoutBlocking) {
  TempDir dir("regular_file");
  const std::string fifo = dir.file("model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string message =
      error_on_fifo(fifo, [&] { read_regular_file(fifo, "safetensors file"); });
  EXPECT_NE(message.find("'" + fifo + "' is a FIFO"), std::string::npos) << message;
  EXPECT_EQ(file_kind(fifo), "a FIFO (named pipe)");
  EXPECT_NE(error_on_fifo(fifo, [&] { check_regular_file(fifo, "profile"); }).find("FIFO"),
            std::string::npos);
}

TEST(RegularFile, ADeviceBehindASymlinkIsNamedAsSuch) {
  TempDir dir("regular_file");
  const std::string link = dir.file("model.safetensors");
  fs::create_symlink("/dev/zero", link);
  for (const std::string& path : {std::string("/dev/zero"), link}) {
    const std::string message = user_error_of([&] { read_regular_file(path, "checkpoint marker"); });
    EXPECT_NE(message.find("'" + path + "' is a character device"), std::string::npos) << message;
  }
}

TEST(RegularFile, AFileBeyondTheBoundIsRefusedBeforeItIsRead) {
  TempDir dir("regular_file");
  const std::string path = dir.file("huge.toml");
  testing::write_bytes(path, "");
  // Sparse: 17 MiB of size without the disk.
  fs::resize_file(path, std::uint64_t{17} << 20);
  const std::string message =
      user_error_of([&] { read_regular_file(path, "config file", kMaxTextFileBytes); });
  EXPECT_NE(message.find("config file '" + path + "' is 17.0 MiB (17825792 bytes)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("16.0 MiB"), std::string::npos) << message;
}

TEST(RegularFile, AMissingFileAndAPathWithNulAreNamed) {
  TempDir dir("regular_file");
  const std::string missing = dir.file("absent.json");
  EXPECT_NE(user_error_of([&] { read_regular_file(missing, "plan file"); })
                .find("plan file '" + missing + "' does not exist"),
            std::string::npos);
  EXPECT_FALSE(file_kind(missing).has_value());
  std::string with_nul = dir.file("a");
  with_nul.push_back('\0');
  with_nul.push_back('b');
  const std::string message = user_error_of([&] { read_regular_file(with_nul, "plan file"); });
  EXPECT_NE(message.find("NUL"), std::string::npos) << message;
  EXPECT_NE(user_error_of([] { check_path_has_no_nul(std::string("x\0y", 3), "log.metrics"); })
                .find("log.metrics holds a NUL byte at character 1"),
            std::string::npos);
}

}  // namespace
}  // namespace oases
