// Opening a file the user named (a config, a checkpoint's files and marker, a token shard, a
// profile, a plan, a tokenizer model, a JSON file) for reading, so that a wrong path fails at
// once with a message instead of hanging or eating memory:
//  - a FIFO is opened with O_NONBLOCK, so the open returns instead of waiting for a writer;
//  - the open file (not the path, which may change meanwhile) must be a regular file: a
//    directory, FIFO, device or socket is a UserError saying which it is;
//  - its size must be within the reader's bound, so /dev/zero behind a symlink or a huge
//    file given by mistake is refused before anything is read.
// Every reader of such files goes through here; nothing else checks a file's type.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace oases {

inline constexpr std::uint64_t kNoSizeBound = std::numeric_limits<std::uint64_t>::max();

// Bounds of the files read whole into memory: far above any real one (a config is a few KiB,
// a profile or GPT-2's tokenizer.json a few MiB), there so that a wrong path fails at once.
// TOML configs, cluster descriptions, checkpoint markers.
inline constexpr std::uint64_t kMaxTextFileBytes = std::uint64_t{16} << 20;
inline constexpr std::uint64_t kMaxJsonFileBytes = std::uint64_t{256} << 20;  // profiles, plans,
                                                                              // run.json, ...
// Tokenizer models (a SentencePiece model, GPT-2's vocabulary and merges).
inline constexpr std::uint64_t kMaxTokenizerFileBytes = std::uint64_t{1} << 30;

// What is at `path`, following symlinks, for messages: "a regular file", "a directory", "a FIFO
// (named pipe)", "a character device", ...; nullopt when nothing is (or it cannot be seen).
std::optional<std::string> file_kind(const std::string& path);

// A regular file open for reading (blocking reads; the O_NONBLOCK of the open is cleared).
class ReadableFile {
 public:
  // Opens `path`. `what` names the file's role in messages ("config file", "safetensors
  // file"). UserError naming `what`, the path and the cause when the path is empty or holds a
  // NUL byte, when the file is missing or unreadable, when it is not a regular file (saying
  // what it is), or when it is larger than `max_bytes` (saying both sizes).
  static ReadableFile open(const std::string& path, std::string_view what,
                           std::uint64_t max_bytes = kNoSizeBound);
  ReadableFile(ReadableFile&& other) noexcept;
  ReadableFile& operator=(ReadableFile&& other) noexcept;
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;
  ~ReadableFile();

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }  // at the open
  const std::string& path() const { return path_; }

  // Everything in the file, read from its start. Reading stops at the size bound of the open:
  // a file grown past it since is a UserError rather than an unbounded read.
  std::string read_all();

  // Hands the descriptor to the caller, who closes it.
  int release();

 private:
  ReadableFile() = default;
  std::string path_;
  std::string what_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint64_t max_bytes_ = kNoSizeBound;
};

// ReadableFile::open(path, what, max_bytes).read_all().
std::string read_regular_file(const std::string& path, std::string_view what,
                              std::uint64_t max_bytes = kNoSizeBound);

// The checks of ReadableFile::open alone, for readers that stream the file with a library of
// their own after it (std::ifstream over a document, a CRC over a checkpoint file).
void check_regular_file(const std::string& path, std::string_view what,
                        std::uint64_t max_bytes = kNoSizeBound);

// UserError naming `setting` when `path` (or any setting's text) holds a NUL byte, which the
// operating system would take as the end of the path (so the file used would not be the one
// named) and C strings as the end of a message.
void check_path_has_no_nul(const std::string& path, std::string_view setting);

// "12.0 MiB (12582912 bytes)": a size for messages.
std::string describe_bytes(std::uint64_t bytes);

}  // namespace oases
