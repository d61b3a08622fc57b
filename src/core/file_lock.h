// An exclusive advisory lock on a file, held by one process at a time (flock(2)).
//
// The lock lives as long as the FileLock object (or the process: the kernel releases an
// flock when its holder exits, however it exits, so a lock left by a killed process is
// simply taken by the next one). The locked file holds one line that names its holder,
// "host <name> pid <pid> since <UTC time>", so that whoever finds it taken can say by whom.
// The file itself stays after release: removing it would let two processes lock two
// different files under one name.
#pragma once

#include <optional>
#include <string>

namespace oases {

class FileLock {
 public:
  // Creates `path` if needed (never through a symbolic link) and takes its lock without
  // waiting. Returns the lock, or nullopt when another process holds it; `holder` then
  // receives the holder's line ("" when the holder has not written it yet). UserError naming
  // `what` (the setting the path comes from) when the file cannot be created or locked.
  static std::optional<FileLock> try_take(const std::string& path, const std::string& what,
                                          std::string* holder);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  const std::string& path() const { return path_; }

 private:
  FileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

// "host <hostname> pid <pid> since <UTC time>": how this process names itself in a lock.
std::string this_process_holder_line();

}  // namespace oases
