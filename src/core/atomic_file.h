// Atomic file replacement: a reader (or a run resumed after a crash) sees either the previous
// content of a file or the complete new content, never a prefix of it.
//
// Protocol: write everything to a temporary `<path>.<random>.tmp` beside it, fsync it, rename
// it over `<path>` (rename is atomic on POSIX file systems), then fsync the directory so the
// rename itself is durable. If anything fails before the rename, `<path>` is untouched and the
// temporary is removed. The temporary is created exclusively (O_EXCL, O_NOFOLLOW) under a name
// of its own, so a symlink planted in the folder cannot redirect the write.
// Every writer of durable output (token shards, safetensors, checkpoint state, completion
// markers) goes through here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace oases {

// Streams bytes into a temporary beside `<path>`; commit() publishes them under `<path>`.
// Destroying the writer without a successful commit() removes the temporary and leaves
// `<path>` as it was. Failures (an existing directory at `<path>`, a NUL byte in it, cannot
// create, disk full, ...) throw UserError naming the file and the cause.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);  // creates the temporary
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t size);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }

  // fsync, close, rename over path(), fsync the directory. At most once.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_path_; }
  std::size_t bytes_written() const { return bytes_written_; }

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  std::size_t bytes_written_ = 0;
  bool committed_ = false;
};

// For writers that produced `tmp_path` themselves: fsync it, rename it to `final_path`
// (replacing any existing file) and fsync the containing directory.
void fsync_and_rename(const std::string& tmp_path, const std::string& final_path);

// Makes renames and creations inside `dir` durable (best effort: some file systems refuse
// fsync on a directory).
void fsync_directory(const std::string& dir);

// Whole-file convenience over AtomicFileWriter (small files: state, markers).
void write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace oases
