#include "data/token_shard.h"

#include "core/regular_file.h"
#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/error.h"
#include "data/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
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
constexpr std::size_t kOffsetChecksum = 44;  // version 2
static_assert(kOffsetName + kTokenShardNameBytes == kTokenShardV1HeaderBytes);
static_assert(kOffsetChecksum + 4 == kTokenShardHeaderBytes);

// Tokens are converted in chunks so that a multi-GB shard never needs a second full copy.
constexpr std::size_t kChunkTokens = std::size_t{1} << 20;

std::string hex_bytes(const std::uint8_t* bytes, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += fmt::format("{}{:02x}", i ? " " : "", bytes[i]);
  return out;
}

bool valid_tokenizer_name(std::string_view name) {
  if (name.empty() || name.size() > kTokenShardNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 127; });
}


}  // namespace

std::uint32_t token_width_for_vocab(std::int64_t vocab_size) {
  OASES_CHECK(vocab_size >= 1 && vocab_size <= std::int64_t{1} << 31,
              "vocabulary size {} is outside the supported range [1, 2^31]", vocab_size);
  return vocab_size <= 65536 ? 2 : 4;
}

void write_token_shard(const std::string& path, std::string_view tokenizer_name,
                       std::int64_t vocab_size, std::span<const std::int32_t> tokens) {
  const std::uint32_t width = token_width_for_vocab(vocab_size);
  OASES_CHECK(valid_tokenizer_name(tokenizer_name),
              "tokenizer name '{}' cannot be stored in a token shard: it must be 1 to {} "
              "printable ASCII characters without spaces",
              tokenizer_name, kTokenShardNameBytes);

  // The token bytes, encoded chunk by chunk: once for the checksum in the header, once to
  // write them (so a large shard never needs a second full copy).
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
  std::uint32_t checksum = 0;
  for (std::size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    encode_chunk(begin);
    checksum = crc32(chunk.data(), chunk.size(), checksum);
  }

  std::array<std::uint8_t, kTokenShardHeaderBytes> header{};
  std::memcpy(header.data(), kTokenShardMagic, sizeof(kTokenShardMagic));
  store_le(header.data() + kOffsetVersion, kTokenShardVersion, 4);
  store_le(header.data() + kOffsetWidth, width, 4);
  store_le(header.data() + kOffsetVocab, static_cast<std::uint64_t>(vocab_size), 4);
  store_le(header.data() + kOffsetCount, tokens.size(), 8);
  std::memcpy(header.data() + kOffsetName, tokenizer_name.data(), tokenizer_name.size());
  store_le(header.data() + kOffsetChecksum, checksum, 4);

  AtomicFileWriter file(path);
  file.write(header.data(), header.size());
  for (std::size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    encode_chunk(begin);
    file.write(chunk.data(), chunk.size());
  }
  file.commit();
}

TokenShard load_token_shard(const std::string& path) {
  constexpr std::string_view kRemedy = "re-run `oases prepare-data`";
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
  std::array<std::uint8_t, kTokenShardHeaderBytes> header{};
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
  OASES_CHECK(version == 1 || version == 2,
              "data shard '{}' has format version {}, but this oases reads versions 1 and 2; {}",
              path, version, kRemedy);
  const std::size_t header_bytes = version == 1 ? kTokenShardV1HeaderBytes : kTokenShardHeaderBytes;
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

  const std::uint64_t token_bytes = file_bytes - header_bytes;
  const bool count_fits = count <= std::numeric_limits<std::uint64_t>::max() / width;
  OASES_CHECK(count_fits && count * width <= token_bytes,
              "data shard '{}' is truncated: header says {} tokens ({} bytes) but the file holds "
              "{} bytes of tokens; {}",
              path, count, count_fits ? fmt::format("{}", count * width) : std::string("> 2^64"),
              token_bytes, kRemedy);
  OASES_CHECK(count * width == token_bytes,
              "data shard '{}' has {} unexpected bytes after its tokens: header says {} tokens "
              "({} bytes) but the file holds {} bytes of tokens; {}",
              path, token_bytes - count * width, count, count * width, token_bytes, kRemedy);

  TokenShard shard;
  shard.path = path;
  shard.tokenizer = tokenizer;
  shard.vocab_size = static_cast<std::int64_t>(vocab);
  shard.token_width = static_cast<std::uint32_t>(width);
  shard.version = static_cast<std::uint32_t>(version);
  shard.tokens.resize(count);
  // Version 2 files are read from after the checksum field (the header read took 48 bytes
  // only when the file has them; a version-1 file's tokens start at byte 44).
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
  OASES_CHECK(!first_bad,
              "data shard '{}' holds token {} at position {}, outside its vocabulary of {} "
              "(tokens must be < {}); the file is damaged, {}",
              path, first_bad ? first_bad->second : 0, first_bad ? first_bad->first : 0, vocab,
              vocab, kRemedy);
  return shard;
}

// -----------------------------------------------------------------------------------------

}  // namespace oases::data
