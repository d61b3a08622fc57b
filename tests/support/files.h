// File helpers shared by tests: a private temporary folder, whole-file reads and writes, and
// the check that a call fails with a UserError naming given things.
#pragma once

#include "core/error.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace oases::testing {

// A fresh folder under the system temporary directory, removed (permissions restored first)
// when the object goes away. `prefix` names the test in the folder name.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The temporaries an atomic write left in `folder` (names ending in ".tmp"): none, after a
// write that succeeded or failed.
inline std::vector<std::string> leftover_temporaries(const std::filesystem::path& folder) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec))
    if (entry.path().extension() == ".tmp") found.push_back(entry.path().string());
  return found;
}

// Runs `fn`, expects a UserError whose message contains every string in `parts`.
inline void expect_user_error(const std::function<void()>& fn,
                              const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no UserError thrown; expected one mentioning " << parts.front();
  } catch (const UserError& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos)
          << "message lacks '" << part << "': " << message;
  }
}

}  // namespace oases::testing
