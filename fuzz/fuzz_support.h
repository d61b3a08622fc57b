// What every libFuzzer target in fuzz/ shares: a scratch file for the readers that take a
// path, and the readers' error contract.
//
// The contract (core/error.h): bad input is a UserError whose message names the input and
// what is wrong. A target therefore swallows UserError and treats anything else as a
// finding: an InternalError means bad input reached an engine invariant, and any other
// exception (a std::filesystem_error, an nlohmann::json::exception, ...) means a library's
// error escaped without being turned into a message for the user. A finding prints the
// exception's type and message and aborts, so that libFuzzer saves the input as a crash.
#pragma once

#include "core/error.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace oases::fuzz {

// A file named after the target and this process id, so concurrent fuzzers never share one,
// in /dev/shm (or the temporary directory where /dev/shm is not writable). write() replaces
// its contents; the file is removed when the process exits normally.
class ScratchFile {
 public:
  explicit ScratchFile(std::string_view target);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }
  void write(const std::uint8_t* data, std::size_t size) const;

 private:
  std::string path_;
};

// Prints "<what>: <type>: <message>" for the exception in flight and aborts.
[[noreturn]] void abort_on_exception(std::string_view what, const std::exception& e);

// Aborts with `message` when `condition` is false: a property of accepted input broke.
void require(bool condition, std::string_view message);

// With OASES_FUZZ_VERBOSE set in the environment, accepts() prints every UserError message:
// run a target on a few files to see what its readers answer.
void note_user_error(const UserError& e);

// Runs `read`. A UserError is the expected answer to bad input and returns false; anything
// else thrown aborts (see above). Returns true when `read` returned normally.
template <class Read>
bool accepts(Read&& read) {
  try {
    read();
    return true;
  } catch (const UserError& e) {
    note_user_error(e);
    return false;
  } catch (const std::exception& e) {
    abort_on_exception("the reader threw something other than oases::UserError", e);
  }
}

}  // namespace oases::fuzz
