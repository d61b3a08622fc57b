// LineFile: a text file grown a line at a time (metrics), every write checked and handed to
// the operating system at once, so that a failure (a full disk, a vanished mount) is an error
// naming the file and the cause instead of a silently shorter file.
#pragma once

#include <string>
#include <string_view>

namespace oases {

class LineFile {
 public:
  enum class Start { append, truncate };
  // Opens `path` for appending (after emptying it, with Start::truncate), creating it and its
  // missing parent folders. Devices and pipes (/dev/stdout, a FIFO) work too. UserError naming
  // the path and the cause when it cannot.
  explicit LineFile(std::string path, Start start = Start::append);
  ~LineFile();
  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;

  // Writes `line` and a newline; UserError naming the path, how much of the file was written
  // and the cause when the write fails or is short.
  void append(std::string_view line);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace oases
