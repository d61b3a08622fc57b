// Token shard files, as `oases prepare-data` writes them (data/prepare_data.h).
//
// Token shard file (`<prefix>_train.bin`, `<prefix>_val.bin`), all integers little-endian:
//
//   offset  size  field
//        0     8  magic "OASESTOK"
//        8     4  format version (uint32): 2 (written without a loss mask), 3 (written with
//                 one), 1 (still read)
//       12     4  token width in bytes (uint32): 2 or 4, the smallest that holds vocab_size
//       16     4  vocab size (uint32), >= 1; every token is < vocab size; for a tokenizer that
//                 oases knows by name, exactly its vocabulary size
//       20     8  token count (uint64)
//       28    16  tokenizer name, ASCII, NUL-padded (no terminator when exactly 16 bytes)
//       44     4  versions 2 and 3: CRC-32 (zlib polynomial) of the token bytes
//       48     4  version 3 only: CRC-32 of the loss mask bytes
//   44/48/52   -  token count tokens, each `width` bytes (unsigned)
//   then       -  version 3 only: the loss mask, ceil(count / 8) bytes: token i's bit is bit
//                 (i mod 8) of byte i / 8 (least significant bit first); the bits after the
//                 last token's are 0
//
// The file size is exactly header + count * width (+ ceil(count / 8) in version 3); readers
// reject anything else, a checksum that does not match, and every other violated rule, with a
// UserError naming the file, what was found and what was expected.
//
// The loss mask (instruction data, where only some tokens are to be learnt): bit i = 1 means
// token i counts as a training target, that is, the prediction of token i from the tokens
// before it enters the loss; bit i = 0 means it does not (data/loader.h gives such a target
// the value -1, which the loss ignores). Token i's bit says nothing about token i as an input:
// every token is read as context. A shard without a mask (versions 1 and 2) counts every token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

inline constexpr char kTokenShardMagic[8] = {'O', 'A', 'S', 'E', 'S', 'T', 'O', 'K'};
inline constexpr std::uint32_t kTokenShardVersion = 2;        // written for a shard without a mask
inline constexpr std::size_t kTokenShardHeaderBytes = 48;     // of version 2
inline constexpr std::uint32_t kTokenShardMaskedVersion = 3;  // written for a shard with a mask
inline constexpr std::size_t kTokenShardMaskedHeaderBytes = 52;  // of version 3
inline constexpr std::size_t kTokenShardV1HeaderBytes = 44;
inline constexpr std::size_t kTokenShardNameBytes = 16;

// The smallest supported width (2 or 4 bytes) that holds tokens in [0, vocab_size).
std::uint32_t token_width_for_vocab(std::int64_t vocab_size);

// Writes a shard atomically (`<path>.tmp`, then rename). Tokens must be in [0, vocab_size).
// Without `loss_mask` (empty) every token counts and the file is version 2, as shards without
// masks always were (older readers still read them); with one, it holds one value per token,
// 1 (token i is a target) or 0 (it is not), and the file is version 3. UserError naming the
// position for a token outside the vocabulary or a mask value other than 0 or 1, and for a
// mask whose length is not the token count.
void write_token_shard(const std::string& path, std::string_view tokenizer_name,
                       std::int64_t vocab_size, std::span<const std::int32_t> tokens,
                       std::span<const std::uint8_t> loss_mask = {});

// A validated shard held fully in memory.
struct TokenShard {
  std::string path;
  std::string tokenizer;  // name from the header
  std::int64_t vocab_size = 0;
  std::uint32_t token_width = 0;  // bytes per token in the file
  std::uint32_t version = 0;      // format version of the file
  std::vector<std::int32_t> tokens;
  // One value per token, 1 where the token counts as a target and 0 where it does not (see the
  // format above); empty when the file has no mask, which counts every token.
  std::vector<std::uint8_t> loss_mask;

  std::int64_t size() const { return static_cast<std::int64_t>(tokens.size()); }
  bool has_loss_mask() const { return !loss_mask.empty(); }
  // Whether token `position` (in [0, size())) counts as a target.
  bool counts_in_loss(std::int64_t position) const {
    return loss_mask.empty() || loss_mask[static_cast<std::size_t>(position)] != 0;
  }
};

// Reads and validates a shard (see the format above).
TokenShard load_token_shard(const std::string& path);

}  // namespace oases::data
