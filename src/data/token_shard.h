// Token shard files, as `oases prepare-data` writes them (data/prepare_data.h).
//
// Token shard file (`<prefix>_train.bin`, `<prefix>_val.bin`), all integers little-endian:
//
//   offset  size  field
//        0     8  magic "OASESTOK"
//        8     4  format version (uint32): 2 (written), 1 (still read)
//       12     4  token width in bytes (uint32): 2 or 4, the smallest that holds vocab_size
//       16     4  vocab size (uint32), >= 1; every token is < vocab size; for a tokenizer that
//                 oases knows by name, exactly its vocabulary size
//       20     8  token count (uint64)
//       28    16  tokenizer name, ASCII, NUL-padded (no terminator when exactly 16 bytes)
//       44     4  version 2 only: CRC-32 (zlib polynomial) of the token bytes that follow
//   44/48     -  token count tokens, each `width` bytes (unsigned)
//
// The file size is exactly header + count * width; readers reject anything else, a checksum
// that does not match, and every other violated rule, with a UserError naming the file, what
// was found and what was expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

inline constexpr char kTokenShardMagic[8] = {'O', 'A', 'S', 'E', 'S', 'T', 'O', 'K'};
inline constexpr std::uint32_t kTokenShardVersion = 2;  // the version written
inline constexpr std::size_t kTokenShardHeaderBytes = 48;  // of the version written
inline constexpr std::size_t kTokenShardV1HeaderBytes = 44;
inline constexpr std::size_t kTokenShardNameBytes = 16;

// The smallest supported width (2 or 4 bytes) that holds tokens in [0, vocab_size).
std::uint32_t token_width_for_vocab(std::int64_t vocab_size);

// Writes a version-2 shard atomically (`<path>.tmp`, then rename). Tokens must be in
// [0, vocab_size).
void write_token_shard(const std::string& path, std::string_view tokenizer_name,
                       std::int64_t vocab_size, std::span<const std::int32_t> tokens);

// A validated shard held fully in memory.
struct TokenShard {
  std::string path;
  std::string tokenizer;  // name from the header
  std::int64_t vocab_size = 0;
  std::uint32_t token_width = 0;  // bytes per token in the file
  std::uint32_t version = 0;      // format version of the file
  std::vector<std::int32_t> tokens;

  std::int64_t size() const { return static_cast<std::int64_t>(tokens.size()); }
};

// Reads and validates a shard (see the format above).
TokenShard load_token_shard(const std::string& path);

}  // namespace oases::data
