// A command started in the background from a test, and waiting on what it writes.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

extern char** environ;

namespace oases::testing {

// A command started in the background (through sh -c, whose `exec` makes the pid the
// command's own), its output going to a file; the stop signals start at their default actions
// whatever the test inherited (nohup, a shell's background job).
class Background {
 public:
  // Runs `command` in the folder `dir`.
  Background(const std::filesystem::path& dir, const std::string& command) {
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&defaults, s);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
    const std::string shell_command = "cd " + dir.string() + " && exec " + command;
    const char* argv[] = {"sh", "-c", shell_command.c_str(), nullptr};
    spawned_ = posix_spawnp(&pid_, "sh", nullptr, &attributes, const_cast<char**>(argv),
                            environ) == 0;
    posix_spawnattr_destroy(&attributes);
  }
  ~Background() {
    if (pid_ > 0 && !waited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool spawned() const { return spawned_; }
  pid_t pid() const { return pid_; }
  bool running() {
    if (waited_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      waited_ = true;
      status_ = status;
      return false;
    }
    return true;
  }
  // The exit status (128 + N for a process a signal N ended, as a shell reports it).
  int wait() {
    if (!waited_) {
      waitpid(pid_, &status_, 0);
      waited_ = true;
    }
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }
  bool ended_by_signal() const { return waited_ && WIFSIGNALED(status_); }

 private:
  pid_t pid_ = -1;
  bool spawned_ = false;
  bool waited_ = false;
  int status_ = 0;
};

// Waits until `ready` holds or `process` ended; false on the latter or after 60 s.
template <class Ready>
inline bool wait_until(Background& process, Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    if (!process.running()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return false;
}

// Lines of a file (0 when it does not exist yet).
inline int line_count(const std::filesystem::path& path) {
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

}  // namespace oases::testing
