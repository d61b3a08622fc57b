#include "fuzz_support.h"

#include <fcntl.h>
#include <unistd.h>

#include <cxxabi.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <typeinfo>

namespace oases::fuzz {

ScratchFile::ScratchFile(std::string_view target) {
  // Memory-backed when possible: an input rewritten on a disk file system costs a flush (ext4
  // flushes a file that was truncated and rewritten) and a hundredfold in executions per second.
  std::error_code ec;
  std::filesystem::path dir = "/dev/shm";
  if (::access(dir.c_str(), W_OK) != 0) dir = std::filesystem::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  path_ = (dir / ("oases-fuzz-" + std::string(target) + "-" + std::to_string(::getpid()))).string();
}

ScratchFile::~ScratchFile() {
  ::unlink(path_.c_str());
}

void ScratchFile::write(const std::uint8_t* data, std::size_t size) const {
  // Overwritten in place and cut to size rather than truncated first, for the same reason.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "cannot create the scratch file %s: %s\n", path_.c_str(),
                 std::strerror(errno));
    std::abort();
  }
  const auto file_size = static_cast<off_t>(size);
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "cannot write the scratch file %s: %s\n", path_.c_str(),
                   std::strerror(errno));
      std::abort();
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  if (::ftruncate(fd, file_size) != 0) {
    std::fprintf(stderr, "cannot resize the scratch file %s: %s\n", path_.c_str(),
                 std::strerror(errno));
    std::abort();
  }
  ::close(fd);
}

void abort_on_exception(std::string_view what, const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  std::fprintf(stderr, "\n*** fuzz finding: %.*s: %s: %s\n", static_cast<int>(what.size()),
               what.data(), status == 0 ? demangled.get() : mangled, e.what());
  std::abort();
}

void note_user_error(const UserError& e) {
  static const bool verbose = std::getenv("OASES_FUZZ_VERBOSE") != nullptr;
  // The message is what a user would see: it must say something.
  require(e.what()[0] != '\0', "a UserError without a message");
  if (verbose) std::fprintf(stderr, "UserError: %s\n", e.what());
}

void require(bool condition, std::string_view message) {
  if (condition) return;
  std::fprintf(stderr, "\n*** fuzz finding: %.*s\n", static_cast<int>(message.size()),
               message.data());
  std::abort();
}

}  // namespace oases::fuzz
