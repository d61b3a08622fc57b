// Training data: tokenizers, token shard files, `prepare_data` (the `oases prepare-data`
// verb) and the deterministic, resumable DataLoader.
//
// Token shard file (`<prefix>_train.bin`, `<prefix>_val.bin`), all integers little-endian:
//
//   offset  size  field
//        0     8  magic "OASESTOK"
//        8     4  format version (uint32) = 1
//       12     4  token width in bytes (uint32): 2 or 4, the smallest that holds vocab_size
//       16     4  vocab size (uint32), >= 1; every token is < vocab size
//       20     8  token count (uint64)
//       28    16  tokenizer name, ASCII, NUL-padded (no terminator when exactly 16 bytes)
//       44     -  token count tokens, each `width` bytes (unsigned)
//
// The file size is exactly 44 + count * width; readers reject anything else, and every other
// violated rule, with a UserError naming the file, what was found and what was expected.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace oases::train {

// Text <-> token ids. Implementations are stateless after construction and thread-safe.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;         // as stored in shard headers, <= 16 chars
  virtual std::int64_t vocab_size() const = 0;  // tokens are in [0, vocab_size)
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Throws UserError for a token outside [0, vocab_size).
  virtual std::string decode(std::span<const std::int32_t> tokens) const = 0;
};

// The names make_tokenizer accepts, for help texts and error messages.
std::vector<std::string> tokenizer_names();

// "byte": token = byte value, vocab 256. Any other name is a UserError listing valid names.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name);

inline constexpr char kTokenShardMagic[8] = {'O', 'A', 'S', 'E', 'S', 'T', 'O', 'K'};
inline constexpr std::uint32_t kTokenShardVersion = 1;
inline constexpr std::size_t kTokenShardHeaderBytes = 44;
inline constexpr std::size_t kTokenShardNameBytes = 16;

// The smallest supported width (2 or 4 bytes) that holds tokens in [0, vocab_size).
std::uint32_t token_width_for_vocab(std::int64_t vocab_size);

// Writes a shard atomically (`<path>.tmp`, then rename). Tokens must be in [0, vocab_size).
void write_token_shard(const std::string& path, std::string_view tokenizer_name,
                       std::int64_t vocab_size, std::span<const std::int32_t> tokens);

// A validated shard held fully in memory.
struct TokenShard {
  std::string path;
  std::string tokenizer;  // name from the header
  std::int64_t vocab_size = 0;
  std::uint32_t token_width = 0;  // bytes per token in the file
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
};

// Reads `inputs` in order as one concatenated text, tokenizes it and writes
// `<output_prefix>_train.bin` (the first tokens) and `<output_prefix>_val.bin` (the last
// round(total * val_fraction) tokens). Missing parent directories of the prefix are created.
// With val_fraction = 0 the validation shard is written empty. Preconditions (UserError
// otherwise): at least one input; every input an existing non-empty regular file;
// val_fraction in [0, 1); when val_fraction > 0, both splits non-empty.
PrepareDataSummary prepare_data(const std::vector<std::string>& inputs,
                                const std::string& output_prefix, double val_fraction,
                                const std::string& tokenizer);

// Deterministic batches of (inputs, targets) windows from a shard.
//
// Sample j of step s (j in [0, global_batch), counted over the global batch: every DP rank
// and micro-batch reads a sub-range) is the window of seq_len + 1 tokens starting at
// token `window_start(s, j)`, read modulo the token count (windows wrap around the end);
// inputs are its first seq_len tokens and targets its last seq_len.
//  - shuffle = false: window_start = ((s * global_batch + j) * seq_len) mod count
//    (DESIGN.md, "Reference semantics").
//  - shuffle = true: the shard is cut into W = count / seq_len windows starting at multiples
//    of seq_len; global sample k = s * global_batch + j lies in epoch k / W and takes window
//    P(seed, epoch, k mod W), where P(seed, epoch, .) is a Philox-keyed Feistel permutation
//    of [0, W) (cycle-walking). Each epoch visits every window exactly once.
// The position in the data is the step number alone: resuming at step s reproduces exactly
// the batches an uninterrupted run would have read. No other state exists.
class DataLoader {
 public:
  // `shard` must outlive the loader. UserError if the shard holds fewer than seq_len + 1
  // tokens, or seq_len / global_batch < 1.
  DataLoader(const TokenShard& shard, std::int64_t seq_len, std::int64_t global_batch, bool shuffle,
             std::uint64_t seed);

  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t global_batch() const { return global_batch_; }
  bool shuffle() const { return shuffle_; }
  // Windows per epoch when shuffling (count / seq_len).
  std::int64_t windows_per_epoch() const { return windows_; }

  // First token (before wrapping) of sample `sample` of step `step`.
  std::int64_t window_start(std::int64_t step, std::int64_t sample) const;

  // Writes samples [first_sample, first_sample + num_samples) of `step` as row-major
  // [num_samples, seq_len] arrays; requires first_sample + num_samples <= global_batch.
  void fill(std::int64_t step, std::int64_t first_sample, std::int64_t num_samples,
            std::int32_t* inputs, std::int32_t* targets) const;

 private:
  const TokenShard* shard_;
  std::int64_t seq_len_;
  std::int64_t global_batch_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t windows_;
};

}  // namespace oases::train
