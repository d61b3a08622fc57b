// Loss masks carried by token shards (data/token_shard.h, format version 3) and honoured by the
// loader (data/loader.h): a masked shard round-trips and every kind of damage to its mask is
// refused naming the file; shards without a mask are still written as version 2 and read with
// every token counted; the loader's targets are -1 exactly where the target token's mask bit
// is 0, shuffled or not and across the shard's end, compared with a reference that reads the
// tokens and the mask position by position.
#include "data/loader.h"
#include "data/token_shard.h"

#include "core/checksum.h"
#include "core/error.h"
#include "core/philox.h"

#include "support/files.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::TempDir;
using oases::testing::write_bytes;

// A mask from Philox in which about `counted_per_mille` tokens in 1000 count.
std::vector<std::uint8_t> random_mask(std::size_t count, std::uint64_t seed,
                                      std::uint32_t counted_per_mille = 333) {
  std::vector<std::uint8_t> mask(count);
  const PhiloxKey key = philox_key(seed, fnv1a64("loss_mask_test"));
  for (std::size_t i = 0; i < count; ++i)
    mask[i] =
        philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key)[0] % 1000 < counted_per_mille ? 1
                                                                                                : 0;
  return mask;
}

std::vector<std::int32_t> byte_tokens(std::size_t count) {
  std::vector<std::int32_t> tokens(count);
  for (std::size_t i = 0; i < count; ++i)
    tokens[i] = static_cast<std::int32_t>((i * 37 + 11) % 256);
  return tokens;
}

std::uint32_t load_u32(const std::string& bytes, std::size_t offset) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i)
    value |= std::uint32_t{static_cast<std::uint8_t>(bytes[offset + static_cast<std::size_t>(i)])}
             << (8 * i);
  return value;
}

void store_u32(std::string& bytes, std::size_t offset, std::uint32_t value) {
  for (int i = 0; i < 4; ++i)
    bytes[offset + static_cast<std::size_t>(i)] = static_cast<char>(value >> (8 * i));
}

// ---------------------------------------------------------------------------------------
// The format

TEST(LossMaskShard, RoundTripsAsVersionThree) {
  TempDir dir("loss_mask_test");
  // Counts that fill the last mask byte and that leave it partly unused.
  for (const std::size_t count :
       {std::size_t{1}, std::size_t{8}, std::size_t{21}, std::size_t{1000}}) {
    const std::vector<std::int32_t> tokens = byte_tokens(count);
    const std::vector<std::uint8_t> mask = random_mask(count, count);
    write_token_shard(dir.file("masked.bin"), "byte", 256, tokens, mask);
    const TokenShard shard = load_token_shard(dir.file("masked.bin"));
    EXPECT_EQ(shard.version, 3u);
    EXPECT_EQ(shard.tokens, tokens);
    EXPECT_EQ(shard.loss_mask, mask);
    EXPECT_TRUE(shard.has_loss_mask());
    for (std::size_t i = 0; i < count; ++i)
      EXPECT_EQ(shard.counts_in_loss(static_cast<std::int64_t>(i)), mask[i] == 1);
    // Header, 2-byte tokens, one bit per token rounded up to whole bytes.
    EXPECT_EQ(fs::file_size(dir.file("masked.bin")),
              kTokenShardMaskedHeaderBytes + 2 * count + (count + 7) / 8)
        << count;
  }
}

TEST(LossMaskShard, BitsAreLeastSignificantFirstAndCoveredByTheirChecksum) {
  TempDir dir("loss_mask_test");
  // Tokens 0..9 with mask 1 0 0 1 1 0 1 0 | 0 1: bytes 0b01011001 = 0x59 and 0b10 = 0x02.
  const std::vector<std::int32_t> tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<std::uint8_t> mask = {1, 0, 0, 1, 1, 0, 1, 0, 0, 1};
  write_token_shard(dir.file("bits.bin"), "byte", 256, tokens, mask);
  const std::string bytes = read_bytes(dir.file("bits.bin"));
  ASSERT_EQ(bytes.size(), kTokenShardMaskedHeaderBytes + 20 + 2);
  EXPECT_EQ(load_u32(bytes, 8), 3u);
  const std::string mask_bytes = bytes.substr(kTokenShardMaskedHeaderBytes + 20);
  EXPECT_EQ(static_cast<std::uint8_t>(mask_bytes[0]), 0x59);
  EXPECT_EQ(static_cast<std::uint8_t>(mask_bytes[1]), 0x02);
  EXPECT_EQ(load_u32(bytes, 48), crc32(mask_bytes.data(), mask_bytes.size()));
  EXPECT_EQ(load_u32(bytes, 44), crc32(bytes.data() + kTokenShardMaskedHeaderBytes, 20));
}

TEST(LossMaskShard, WithoutAMaskTheShardIsVersionTwoAndCountsEveryToken) {
  TempDir dir("loss_mask_test");
  const std::vector<std::int32_t> tokens = byte_tokens(30);
  write_token_shard(dir.file("plain.bin"), "byte", 256, tokens);
  const TokenShard shard = load_token_shard(dir.file("plain.bin"));
  EXPECT_EQ(shard.version, 2u);
  EXPECT_FALSE(shard.has_loss_mask());
  EXPECT_TRUE(shard.loss_mask.empty());
  for (std::int64_t i = 0; i < shard.size(); ++i) EXPECT_TRUE(shard.counts_in_loss(i));
  EXPECT_EQ(fs::file_size(dir.file("plain.bin")), kTokenShardHeaderBytes + 2 * 30);

  // Version 1 (no checksum): the version-2 bytes without the checksum field.
  std::string bytes = read_bytes(dir.file("plain.bin"));
  bytes[8] = 1;
  write_bytes(dir.file("v1.bin"),
              bytes.substr(0, kTokenShardV1HeaderBytes) + bytes.substr(kTokenShardHeaderBytes));
  const TokenShard v1 = load_token_shard(dir.file("v1.bin"));
  EXPECT_EQ(v1.version, 1u);
  EXPECT_EQ(v1.tokens, tokens);
  EXPECT_FALSE(v1.has_loss_mask());
}

TEST(LossMaskShard, WriterRefusesABadMask) {
  TempDir dir("loss_mask_test");
  const std::vector<std::int32_t> tokens = byte_tokens(10);
  const std::vector<std::uint8_t> short_mask(9, 1);
  expect_user_error(
      [&] { write_token_shard(dir.file("bad.bin"), "byte", 256, tokens, short_mask); },
      {"bad.bin", "9 values for 10 tokens"});
  std::vector<std::uint8_t> mask(10, 1);
  mask[6] = 2;
  expect_user_error([&] { write_token_shard(dir.file("bad.bin"), "byte", 256, tokens, mask); },
                    {"bad.bin", "value 2 at position 6", "0", "1"});
  EXPECT_FALSE(fs::exists(dir.file("bad.bin")));
}

class CorruptMaskedShard : public ::testing::Test {
 protected:
  static constexpr std::size_t kCount = 100;  // 13 mask bytes, the last with 4 bits used
  static constexpr std::size_t kMaskOffset = kTokenShardMaskedHeaderBytes + 2 * kCount;

  void SetUp() override {
    path_ = dir_.file("shard.bin");
    write_token_shard(path_, "byte", 256, byte_tokens(kCount), random_mask(kCount, 5, 500));
    bytes_ = read_bytes(path_);
    ASSERT_EQ(bytes_.size(), kMaskOffset + 13);
  }
  void write(const std::string& bytes) { write_bytes(path_, bytes); }

  TempDir dir_{"loss_mask_test"};
  std::string path_;
  std::string bytes_;
};

TEST_F(CorruptMaskedShard, ValidFileLoads) {
  const TokenShard shard = load_token_shard(path_);
  EXPECT_EQ(shard.loss_mask, random_mask(kCount, 5, 500));
}

TEST_F(CorruptMaskedShard, ChangedMaskBitFailsItsChecksum) {
  bytes_[kMaskOffset + 3] ^= 0x10;
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "damaged", "loss mask has CRC-32", "prepare-data"});
}

TEST_F(CorruptMaskedShard, DamagedMaskChecksumField) {
  bytes_[49] ^= 0x01;
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "loss mask has CRC-32"});
}

TEST_F(CorruptMaskedShard, ChangedTokenFailsTheTokensChecksum) {
  bytes_[kTokenShardMaskedHeaderBytes + 2 * 9] ^= 0x01;
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "its tokens have CRC-32"});
}

TEST_F(CorruptMaskedShard, PaddingBitsMustBeZero) {
  // A bit past the last token's, with a checksum that agrees: only the padding rule catches it.
  bytes_[kMaskOffset + 12] = static_cast<char>(bytes_[kMaskOffset + 12] | 0x40);
  store_u32(bytes_, 48, crc32(bytes_.data() + kMaskOffset, 13));
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "malformed loss mask", "lowest 4 bits"});
}

TEST_F(CorruptMaskedShard, TruncatedMask) {
  write(bytes_.substr(0, bytes_.size() - 1));
  expect_user_error(
      [&] { load_token_shard(path_); },
      {path_, "truncated", "100 tokens", "200 bytes of tokens and 13 bytes of loss mask",
       "holds 212 bytes after the header"});
  write(bytes_.substr(0, 50));
  expect_user_error([&] { load_token_shard(path_); }, {path_, "truncated", "52-byte header"});
}

TEST_F(CorruptMaskedShard, TrailingBytes) {
  write(bytes_ + "xyz");
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "3 unexpected bytes after its loss mask", "100 tokens"});
}

TEST_F(CorruptMaskedShard, AVersionTwoHeaderOverMaskedBytesIsRefused) {
  // The mask's bytes read as tokens of a version-2 file: its size does not add up.
  store_u32(bytes_, 8, 2);
  write(bytes_.substr(0, 48) + bytes_.substr(52));
  expect_user_error([&] { load_token_shard(path_); }, {path_, "13 unexpected bytes"});
}

TEST_F(CorruptMaskedShard, UnknownVersion) {
  store_u32(bytes_, 8, 4);
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "version 4", "versions 1, 2 and 3", "prepare-data"});
}

// ---------------------------------------------------------------------------------------
// The loader

// Token i of the shard is i, so a target names the position it was read from.
TokenShard counting_shard(std::int64_t count, std::vector<std::uint8_t> mask) {
  TokenShard shard;
  shard.path = "memory";
  shard.tokenizer = "test";
  shard.vocab_size = count;
  shard.token_width = 4;
  shard.version = 3;
  for (std::int64_t i = 0; i < count; ++i) shard.tokens.push_back(static_cast<std::int32_t>(i));
  shard.loss_mask = std::move(mask);
  return shard;
}

// Every sample of `steps` steps: inputs are the window's tokens; a target is the next token
// where its mask bit is 1 and -1 where it is 0, read position by position with wrapping.
void expect_masked_targets(const DataLoader& loader, const TokenShard& shard, std::int64_t steps,
                           bool* saw_wrap) {
  const std::int64_t n = shard.size(), seq = loader.seq_len(), batch = loader.global_batch();
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch * seq));
  std::vector<std::int32_t> targets(inputs.size());
  for (std::int64_t step = 0; step < steps; ++step) {
    loader.fill(step, 0, batch, inputs.data(), targets.data());
    std::int64_t counted = 0;
    for (std::int64_t j = 0; j < batch; ++j) {
      const std::int64_t start = loader.window_start(step, j);
      *saw_wrap |= start + seq + 1 > n;
      for (std::int64_t t = 0; t < seq; ++t) {
        const auto at = static_cast<std::size_t>(j * seq + t);
        const std::int64_t next = (start + t + 1) % n;
        ASSERT_EQ(inputs[at], (start + t) % n) << "step " << step << " sample " << j;
        const std::int32_t want =
            shard.loss_mask[static_cast<std::size_t>(next)] ? static_cast<std::int32_t>(next) : -1;
        ASSERT_EQ(targets[at], want) << "step " << step << " sample " << j << " t " << t;
        counted += want >= 0;
      }
    }
    EXPECT_EQ(loader.counted_targets(step, 0, batch), counted) << "step " << step;
    // A sub-range counts and fills as its rows of the whole batch.
    std::vector<std::int32_t> part_inputs(static_cast<std::size_t>(2 * seq)),
        part(part_inputs.size());
    loader.fill(step, 1, 2, part_inputs.data(), part.data());
    EXPECT_EQ(part, std::vector<std::int32_t>(targets.begin() + seq, targets.begin() + 3 * seq));
    EXPECT_EQ(loader.counted_targets(step, 1, 2),
              std::count_if(part.begin(), part.end(), [](std::int32_t t) { return t >= 0; }));
  }
}

TEST(LossMaskLoader, TargetsAreMinusOneExactlyWhereMaskedUnshuffledAndWrapping) {
  // 103 tokens do not divide into windows of 8: unshuffled windows wrap the end, inputs and
  // targets both, and a target-only wrap reads token 0's bit.
  const TokenShard shard = counting_shard(103, random_mask(103, 11, 500));
  const DataLoader loader(shard, 8, 4, /*shuffle=*/false, 1);
  bool saw_wrap = false;
  expect_masked_targets(loader, shard, 40, &saw_wrap);
  EXPECT_TRUE(saw_wrap);
}

TEST(LossMaskLoader, TargetsAreMinusOneExactlyWhereMaskedShuffled) {
  // Shuffled windows start at multiples of seq_len; the last whole window's target wraps to
  // token 0 when seq_len divides the count.
  const TokenShard shard = counting_shard(96, random_mask(96, 12, 500));
  const DataLoader loader(shard, 8, 4, /*shuffle=*/true, 77);
  bool saw_wrap = false;
  expect_masked_targets(loader, shard, 30, &saw_wrap);
  EXPECT_TRUE(saw_wrap);
}

TEST(LossMaskLoader, NoMaskCountsEveryTarget) {
  TokenShard shard = counting_shard(50, {});
  const DataLoader loader(shard, 8, 3, false, 0);
  std::vector<std::int32_t> inputs(24), targets(24);
  loader.fill(5, 0, 3, inputs.data(), targets.data());
  for (const std::int32_t t : targets) EXPECT_GE(t, 0);
  EXPECT_EQ(loader.counted_targets(5, 0, 3), 24);
}

TEST(LossMaskLoader, RefusesAMaskThatCountsNothing) {
  const TokenShard nothing = counting_shard(40, std::vector<std::uint8_t>(40, 0));
  expect_user_error([&] { DataLoader(nothing, 8, 2, false, 0); },
                    {"memory", "counts none of its 40 tokens"});
  std::vector<std::uint8_t> one(40, 0);
  one[39] = 1;
  const TokenShard something = counting_shard(40, one);
  EXPECT_NO_THROW(DataLoader(something, 8, 2, false, 0));
}

}  // namespace
}  // namespace oases::data
