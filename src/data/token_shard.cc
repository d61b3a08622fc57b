#include "data/token_shard.h"

#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "data/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <utility>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------
// Little-endian fields, independent of the host's byte order.

void store_le(std::uint8_t* out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
}

std::uint64_t load_le(const std::uint8_t* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= std::uint64_t{in[i]} << (8 * i);
  return value;
}

constexpr std::size_t kOffsetVersion = 8;
constexpr std::size_t kOffsetWidth = 12;
constexpr std::size_t kOffsetVocab = 16;
constexpr std::size_t kOffsetCount = 20;
constexpr std::size_t kOffsetName = 28;
constexpr std::size_t kOffsetChecksum = 44;      // versions 2 and 3
constexpr std::size_t kOffsetMaskChecksum = 48;  // version 3
static_assert(kOffsetName + kTokenShardNameBytes == kTokenShardV1HeaderBytes);
static_assert(kOffsetChecksum + 4 == kTokenShardHeaderBytes);
static_assert(kOffsetMaskChecksum + 4 == kTokenShardMaskedHeaderBytes);

// Tokens are converted in chunks so that a multi-GB shard never needs a second full copy. A
// multiple of 8, so that a chunk's mask bits fill whole bytes.
constexpr std::size_t kChunkTokens = std::size_t{1} << 20;
static_assert(kChunkTokens % 8 == 0);

// What a reader's error tells the user to do about a damaged shard.
constexpr std::string_view kRemedy = "re-run `oases prepare-data`";

// Bytes of the packed loss mask of `count` tokens (one bit each).
constexpr std::uint64_t mask_bytes_for(std::uint64_t count) {
  return count / 8 + (count % 8 != 0);
}

std::string hex_bytes(const std::uint8_t* bytes, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += fmt::format("{}{:02x}", i ? " " : "", bytes[i]);
  return out;
}

bool valid_tokenizer_name(std::string_view name) {
  if (name.empty() || name.size() > kTokenShardNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 127; });
}

// Reads the packed loss mask that follows a version-3 shard's tokens into `shard.loss_mask`
// (one value per token), checking it against its CRC-32 (`stored_checksum`, the header field)
// and that the bits after the last token's are 0.
void read_loss_mask(std::ifstream& in, const std::string& path, const std::uint8_t* stored_checksum,
                    TokenShard& shard) {
  const std::size_t count = shard.tokens.size();
  shard.loss_mask.resize(count);
  std::uint32_t checksum = 0;
  std::vector<std::uint8_t> chunk;
  for (std::size_t begin = 0; begin < count; begin += kChunkTokens) {
    const std::size_t end = std::min(count, begin + kChunkTokens);
    chunk.resize(mask_bytes_for(end - begin));
    in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(chunk.size()));
    OASES_CHECK(in.good(),
                "data shard '{}' could not be read past the loss mask of token {} (was it "
                "modified while loading?)",
                path, begin);
    checksum = crc32(chunk.data(), chunk.size(), checksum);
    for (std::size_t i = begin; i < end; ++i)
      shard.loss_mask[i] = (chunk[(i - begin) / 8] >> ((i - begin) % 8)) & 1;
  }
  const std::uint64_t stored = load_le(stored_checksum, 4);
  OASES_CHECK(checksum == stored,
              "data shard '{}' is damaged: its loss mask has CRC-32 {:08x} but the header says "
              "{:08x}; {}",
              path, checksum, stored, kRemedy);
  const unsigned used_bits = count % 8;
  const std::uint8_t last = chunk.empty() ? 0 : chunk.back();
  OASES_CHECK(used_bits == 0 || (last >> used_bits) == 0,
              "data shard '{}' has a malformed loss mask: its last byte is {:02x}, but only its "
              "lowest {} bits belong to tokens and the others must be 0; {}",
              path, last, used_bits, kRemedy);
}

}  // namespace

std::uint32_t token_width_for_vocab(std::int64_t vocab_size) {
  OASES_CHECK(vocab_size >= 1 && vocab_size <= std::int64_t{1} << 31,
              "vocabulary size {} is outside the supported range [1, 2^31]", vocab_size);
  return vocab_size <= 65536 ? 2 : 4;
}

void write_token_shard(const std::string& path, std::string_view tokenizer_name,
                       std::int64_t vocab_size, std::span<const std::int32_t> tokens,
                       std::span<const std::uint8_t> loss_mask) {
  const std::uint32_t width = token_width_for_vocab(vocab_size);
  OASES_CHECK(valid_tokenizer_name(tokenizer_name),
              "tokenizer name '{}' cannot be stored in a token shard: it must be 1 to {} "
              "printable ASCII characters without spaces",
              tokenizer_name, kTokenShardNameBytes);
  const bool masked = !loss_mask.empty();
  OASES_CHECK(!masked || loss_mask.size() == tokens.size(),
              "cannot write token shard '{}': its loss mask has {} values for {} tokens (one per "
              "token is needed)",
              path, loss_mask.size(), tokens.size());

  // The token bytes, encoded chunk by chunk: once for the checksum in the header, once to
  // write them (so a large shard never needs a second full copy). Likewise the mask's bits.
  std::vector<std::uint8_t> chunk;
  const auto encode_chunk = [&](std::size_t begin) {
    const std::size_t end = std::min(tokens.size(), begin + kChunkTokens);
    chunk.resize((end - begin) * width);
    for (std::size_t i = begin; i < end; ++i) {
      OASES_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size,
                  "cannot write token shard '{}': token {} at position {} is outside the "
                  "vocabulary [0, {})",
                  path, tokens[i], i, vocab_size);
      store_le(chunk.data() + (i - begin) * width, static_cast<std::uint32_t>(tokens[i]),
               static_cast<int>(width));
    }
  };
  const auto encode_mask_chunk = [&](std::size_t begin) {
    const std::size_t end = std::min(loss_mask.size(), begin + kChunkTokens);
    chunk.assign(mask_bytes_for(end - begin), 0);
    for (std::size_t i = begin; i < end; ++i) {
      OASES_CHECK(loss_mask[i] <= 1,
                  "cannot write token shard '{}': loss mask value {} at position {} is neither "
                  "0 (not a target) nor 1 (a target)",
                  path, loss_mask[i], i);
      chunk[(i - begin) / 8] |= static_cast<std::uint8_t>(loss_mask[i] << ((i - begin) % 8));
    }
  };
  std::uint32_t checksum = 0, mask_checksum = 0;
  for (std::size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    encode_chunk(begin);
    checksum = crc32(chunk.data(), chunk.size(), checksum);
    if (!masked) continue;
    encode_mask_chunk(begin);
    mask_checksum = crc32(chunk.data(), chunk.size(), mask_checksum);
  }

  std::array<std::uint8_t, kTokenShardMaskedHeaderBytes> header{};
  std::memcpy(header.data(), kTokenShardMagic, sizeof(kTokenShardMagic));
  store_le(header.data() + kOffsetVersion, masked ? kTokenShardMaskedVersion : kTokenShardVersion,
           4);
  store_le(header.data() + kOffsetWidth, width, 4);
  store_le(header.data() + kOffsetVocab, static_cast<std::uint64_t>(vocab_size), 4);
  store_le(header.data() + kOffsetCount, tokens.size(), 8);
  std::memcpy(header.data() + kOffsetName, tokenizer_name.data(), tokenizer_name.size());
  store_le(header.data() + kOffsetChecksum, checksum, 4);
  if (masked) store_le(header.data() + kOffsetMaskChecksum, mask_checksum, 4);

  AtomicFileWriter file(path);
  file.write(header.data(), masked ? kTokenShardMaskedHeaderBytes : kTokenShardHeaderBytes);
  for (std::size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    encode_chunk(begin);
    file.write(chunk.data(), chunk.size());
  }
  for (std::size_t begin = 0; masked && begin < tokens.size(); begin += kChunkTokens) {
    encode_mask_chunk(begin);
    file.write(chunk.data(), chunk.size());
  }
  file.commit();
}

TokenShard load_token_shard(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  OASES_CHECK(fs::exists(status),
              "data shard '{}' does not exist; create it with `oases prepare-data --input FILE "
              "--output PREFIX` (shards are PREFIX_train.bin and PREFIX_val.bin)",
              path);
  check_regular_file(path, "data shard");
  const std::uint64_t file_bytes = fs::file_size(path, ec);
  OASES_CHECK(!ec, "cannot read the size of data shard '{}': {}", path, ec.message());

  std::ifstream in(path, std::ios::binary);
  OASES_CHECK(in.good(), "cannot open data shard '{}': {}", path, std::strerror(errno));
  std::array<std::uint8_t, kTokenShardMaskedHeaderBytes> header{};
  const std::size_t header_read =
      static_cast<std::size_t>(std::min<std::uint64_t>(file_bytes, header.size()));
  in.read(reinterpret_cast<char*>(header.data()), static_cast<std::streamsize>(header_read));
  OASES_CHECK(in.good(), "cannot read the header of data shard '{}'", path);

  OASES_CHECK(header_read >= sizeof(kTokenShardMagic) &&
                  std::memcmp(header.data(), kTokenShardMagic, sizeof(kTokenShardMagic)) == 0,
              "data shard '{}' is not an oases token shard: it starts with bytes [{}] where a "
              "shard starts with \"OASESTOK\"; create shards with `oases prepare-data`",
              path, hex_bytes(header.data(), std::min<std::size_t>(header_read, 8)));
  OASES_CHECK(header_read >= kOffsetVersion + 4,
              "data shard '{}' is truncated: it holds {} bytes, less than the {}-byte header; {}",
              path, file_bytes, kTokenShardHeaderBytes, kRemedy);
  const std::uint64_t version = load_le(header.data() + kOffsetVersion, 4);
  OASES_CHECK(version >= 1 && version <= kTokenShardMaskedVersion,
              "data shard '{}' has format version {}, but this oases reads versions 1, 2 and 3; {}",
              path, version, kRemedy);
  const bool masked = version == kTokenShardMaskedVersion;
  const std::size_t header_bytes = version == 1 ? kTokenShardV1HeaderBytes
                                   : masked     ? kTokenShardMaskedHeaderBytes
                                                : kTokenShardHeaderBytes;
  OASES_CHECK(header_read >= header_bytes,
              "data shard '{}' is truncated: it holds {} bytes, less than the {}-byte header; {}",
              path, file_bytes, header_bytes, kRemedy);
  const std::uint64_t width = load_le(header.data() + kOffsetWidth, 4);
  OASES_CHECK(width == 2 || width == 4,
              "data shard '{}' declares a token width of {} bytes; valid widths are 2 and 4 (the "
              "file is damaged); {}",
              path, width, kRemedy);
  const std::uint64_t vocab = load_le(header.data() + kOffsetVocab, 4);
  const std::uint64_t max_vocab = width == 2 ? 65536 : std::uint64_t{1} << 31;
  OASES_CHECK(vocab >= 1 && vocab <= max_vocab,
              "data shard '{}' declares a vocabulary of {} tokens, which {}-byte tokens cannot "
              "hold (valid: 1 to {}); {}",
              path, vocab, width, max_vocab, kRemedy);
  const std::uint64_t count = load_le(header.data() + kOffsetCount, 8);

  const char* name_field = reinterpret_cast<const char*>(header.data() + kOffsetName);
  const std::string tokenizer(name_field, strnlen(name_field, kTokenShardNameBytes));
  const bool padding_clean =
      std::all_of(name_field + tokenizer.size(), name_field + kTokenShardNameBytes,
                  [](char c) { return c == '\0'; });
  OASES_CHECK(valid_tokenizer_name(tokenizer) && padding_clean,
              "data shard '{}' has a malformed tokenizer name field [{}] (expected 1 to {} "
              "printable ASCII characters padded with NUL bytes); {}",
              path, hex_bytes(header.data() + kOffsetName, kTokenShardNameBytes),
              kTokenShardNameBytes, kRemedy);

  if (const auto known = known_vocab_size(tokenizer); known.has_value())
    OASES_CHECK(vocab == static_cast<std::uint64_t>(*known),
                "data shard '{}' declares a vocabulary of {} tokens, but its tokenizer \"{}\" "
                "has {}; the header is damaged, {}",
                path, vocab, tokenizer, *known, kRemedy);

  // What follows the header: the tokens, then (version 3) the mask.
  const std::uint64_t payload_bytes = file_bytes - header_bytes;
  const bool count_fits = count <= std::numeric_limits<std::uint64_t>::max() / (width + 1);
  const std::uint64_t mask_bytes = masked ? mask_bytes_for(count) : 0;
  const std::uint64_t expected_bytes = count * width + mask_bytes;
  const std::string expected =
      !count_fits ? std::string("> 2^64 bytes")
      : masked
          ? fmt::format("{} bytes of tokens and {} bytes of loss mask", count * width, mask_bytes)
          : fmt::format("{} bytes", count * width);
  const char* held = masked ? "bytes after the header" : "bytes of tokens";
  OASES_CHECK(count_fits && expected_bytes <= payload_bytes,
              "data shard '{}' is truncated: header says {} tokens ({}) but the file holds {} {}; "
              "{}",
              path, count, expected, payload_bytes, held, kRemedy);
  OASES_CHECK(expected_bytes == payload_bytes,
              "data shard '{}' has {} unexpected bytes after its {}: header says {} tokens ({}) "
              "but the file holds {} {}; {}",
              path, payload_bytes - expected_bytes, masked ? "loss mask" : "tokens", count,
              expected, payload_bytes, held, kRemedy);

  TokenShard shard;
  shard.path = path;
  shard.tokenizer = tokenizer;
  shard.vocab_size = static_cast<std::int64_t>(vocab);
  shard.token_width = static_cast<std::uint32_t>(width);
  shard.version = static_cast<std::uint32_t>(version);
  shard.tokens.resize(count);
  // The tokens start right after the header (the header read took up to 52 bytes, which in
  // versions 1 and 2 may include the first tokens).
  in.clear();
  in.seekg(static_cast<std::streamoff>(header_bytes));
  std::uint32_t checksum = 0;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> first_bad;  // (position, token)
  std::vector<std::uint8_t> chunk;
  for (std::uint64_t begin = 0; begin < count; begin += kChunkTokens) {
    const std::uint64_t end = std::min<std::uint64_t>(count, begin + kChunkTokens);
    chunk.resize((end - begin) * width);
    in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(chunk.size()));
    OASES_CHECK(in.good(),
                "data shard '{}' could not be read past token {} (was it modified "
                "while loading?)",
                path, begin);
    checksum = crc32(chunk.data(), chunk.size(), checksum);
    for (std::uint64_t i = begin; i < end; ++i) {
      const std::uint64_t token =
          load_le(chunk.data() + (i - begin) * width, static_cast<int>(width));
      if (token >= vocab && !first_bad) first_bad.emplace(i, token);
      shard.tokens[i] = static_cast<std::int32_t>(token);
    }
  }
  if (version >= 2) {
    const std::uint64_t stored = load_le(header.data() + kOffsetChecksum, 4);
    OASES_CHECK(checksum == stored,
                "data shard '{}' is damaged: its tokens have CRC-32 {:08x} but the header says "
                "{:08x}; {}",
                path, checksum, stored, kRemedy);
  }
  if (masked) read_loss_mask(in, path, header.data() + kOffsetMaskChecksum, shard);
  OASES_CHECK(!first_bad,
              "data shard '{}' holds token {} at position {}, outside its vocabulary of {} "
              "(tokens must be < {}); the file is damaged, {}",
              path, first_bad ? first_bad->second : 0, first_bad ? first_bad->first : 0, vocab,
              vocab, kRemedy);
  return shard;
}

// -----------------------------------------------------------------------------------------

}  // namespace oases::data
