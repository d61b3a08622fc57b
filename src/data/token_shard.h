// Token shard files and `prepare_data` (the `oases prepare-data` verb).
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

// What prepare_data wrote, for the CLI to print.
struct PrepareDataSummary {
  std::string tokenizer;
  std::int64_t vocab_size = 0;
  std::int64_t input_bytes = 0;  // total size of the input files
  std::int64_t total_tokens = 0;
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
  std::string train_path;  // <prefix>_train.bin
  std::string val_path;    // <prefix>_val.bin
  // <prefix>_tokenizer.model, the copy of the tokenizer's model file; empty when the
  // tokenizer's name determines it (Tokenizer::model_file_contents).
  std::string tokenizer_model_path;
};

// Tokenizes `inputs` in order, each file on its own, and concatenates their tokens, with the
// tokenizer's end-of-document token (gpt2: <|endoftext|>) between consecutive files when it has
// one; writes `<output_prefix>_train.bin` (the first tokens) and `<output_prefix>_val.bin` (the
// last round(total * val_fraction) tokens). `tokenizer_model` is the tokenizer's file or folder
// (make_tokenizer); a sentencepiece model is copied to `<output_prefix>_tokenizer.model`
// (tokenizer_model_beside_shards), where training finds it by default. Missing parent
// directories of the prefix are created.
// With val_fraction = 0 the validation shard is written empty. Preconditions (UserError
// otherwise): at least one input; every input an existing non-empty regular file;
// val_fraction in [0, 1); when val_fraction > 0, both splits non-empty.
PrepareDataSummary prepare_data(const std::vector<std::string>& inputs,
                                const std::string& output_prefix, double val_fraction,
                                const std::string& tokenizer,
                                const std::string& tokenizer_model = "");

}  // namespace oases::data
