#include "data/loader.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

#include "core/error.h"

#include "support/files.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_token_data_test") {}
};

using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

TokenShard counting_shard(std::int64_t count) {
  TokenShard shard;
  shard.path = "memory";
  shard.tokenizer = "test";
  shard.vocab_size = count;
  shard.token_width = 4;
  for (std::int64_t i = 0; i < count; ++i) shard.tokens.push_back(static_cast<std::int32_t>(i));
  return shard;
}

// ---------------------------------------------------------------------------------------
// Tokenizers

TEST(ByteTokenizer, EncodesBytesAndDecodesBack) {
  const auto tokenizer = make_tokenizer("byte");
  EXPECT_EQ(tokenizer->name(), "byte");
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  const std::string text = std::string("hi \xff\x80\x01", 6) + std::string(1, '\0') + "!";
  const std::vector<std::int32_t> tokens = tokenizer->encode(text);
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{'h', 'i', ' ', 255, 128, 1, 0, '!'}));
  EXPECT_EQ(tokenizer->decode(tokens), text);
  const std::vector<std::int32_t> bad = {65, 256};
  expect_user_error([&] { tokenizer->decode(bad); }, {"token 256", "position 1", "[0, 256)"});
}

TEST(ByteTokenizer, UnknownNameListsValidNames) {
  expect_user_error([] { make_tokenizer("gpt2-bpe"); }, {"gpt2-bpe", "byte"});
}

TEST(TokenShard, WidthIsTheSmallestThatHoldsTheVocabulary) {
  EXPECT_EQ(token_width_for_vocab(256), 2u);
  EXPECT_EQ(token_width_for_vocab(65536), 2u);
  EXPECT_EQ(token_width_for_vocab(65537), 4u);
  EXPECT_EQ(token_width_for_vocab(50257), 2u);
  EXPECT_THROW(token_width_for_vocab(0), UserError);
}

TEST(TokenShard, FourByteShardRoundTrips) {
  TempDir dir;
  const std::vector<std::int32_t> tokens = {0, 70000, 99999, 5};
  write_token_shard(dir.file("wide.bin"), "bpe-test", 100000, tokens);
  const TokenShard shard = load_token_shard(dir.file("wide.bin"));
  EXPECT_EQ(shard.token_width, 4u);
  EXPECT_EQ(shard.vocab_size, 100000);
  EXPECT_EQ(shard.tokenizer, "bpe-test");
  EXPECT_EQ(shard.tokens, tokens);
  EXPECT_EQ(fs::file_size(dir.file("wide.bin")), kTokenShardHeaderBytes + 4 * 4);
}

// ---------------------------------------------------------------------------------------
// Shard validation

class CorruptShard : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("shard.bin");
    std::vector<std::int32_t> tokens(100);
    for (int i = 0; i < 100; ++i) tokens[static_cast<std::size_t>(i)] = (i * 37) % 256;
    write_token_shard(path_, "byte", 256, tokens);
    bytes_ = read_bytes(path_);
    ASSERT_EQ(bytes_.size(), kTokenShardHeaderBytes + 200);
  }
  void write(const std::string& bytes) { write_bytes(path_, bytes); }
  void put_u32(std::size_t offset, std::uint32_t value) {
    for (int i = 0; i < 4; ++i)
      bytes_[offset + static_cast<std::size_t>(i)] = static_cast<char>(value >> (8 * i));
  }

  TempDir dir_;
  std::string path_;
  std::string bytes_;
};

TEST_F(CorruptShard, ValidFileLoads) {
  const TokenShard shard = load_token_shard(path_);
  EXPECT_EQ(shard.size(), 100);
  EXPECT_EQ(shard.tokens[3], 111);
}

TEST_F(CorruptShard, ForeignFile) {
  write(std::string("PK\x03\x04 this is a zip file, not tokens", 36));
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "not an oases token shard", "50 4b 03 04", "OASESTOK"});
  write("OAS");
  expect_user_error([&] { load_token_shard(path_); }, {path_, "OASESTOK"});
}

TEST_F(CorruptShard, ShorterThanTheHeader) {
  write(bytes_.substr(0, 20));
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "truncated", "20 bytes", "48-byte header"});
}

TEST_F(CorruptShard, UnknownVersion) {
  put_u32(8, 4);
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "version 4", "versions 1, 2 and 3", "prepare-data"});
}

// A version-1 file: the version-2 bytes without the checksum field.
std::string as_version_one(std::string bytes) {
  bytes[8] = 1;
  return bytes.substr(0, kTokenShardV1HeaderBytes) + bytes.substr(kTokenShardHeaderBytes);
}

TEST_F(CorruptShard, VersionOneFilesStillLoad) {
  write(as_version_one(bytes_));
  const TokenShard shard = load_token_shard(path_);
  EXPECT_EQ(shard.version, 1u);
  EXPECT_EQ(shard.size(), 100);
  EXPECT_EQ(shard.tokens[3], 111);
  write(as_version_one(bytes_).substr(0, 30));
  expect_user_error([&] { load_token_shard(path_); }, {path_, "truncated", "44-byte header"});
}

TEST_F(CorruptShard, ChangedTokenFailsTheChecksum) {
  // Still inside the vocabulary, so only the checksum can tell.
  bytes_[kTokenShardHeaderBytes + 2 * 7] ^= 0x01;
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "damaged", "CRC-32", "prepare-data"});
}

TEST_F(CorruptShard, DamagedChecksumField) {
  bytes_[45] ^= 0x40;
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "CRC-32"});
}

TEST_F(CorruptShard, VocabularyDisagreesWithItsTokenizer) {
  put_u32(16, 300);  // fits 2-byte tokens, but the byte tokenizer has 256
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "300", "tokenizer \"byte\" has 256"});
}

TEST_F(CorruptShard, BadWidth) {
  put_u32(12, 3);
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "width of 3 bytes", "2 and 4"});
}

TEST_F(CorruptShard, VocabularyTooLargeForWidth) {
  put_u32(16, 70000);
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "70000", "2-byte"});
}

TEST_F(CorruptShard, Truncated) {
  write(bytes_.substr(0, bytes_.size() - 3));
  expect_user_error([&] { load_token_shard(path_); },
                    {path_, "truncated", "header says 100 tokens (200 bytes)", "holds 197 bytes",
                     "oases prepare-data"});
}

TEST_F(CorruptShard, TrailingBytes) {
  write(bytes_ + "xy");
  expect_user_error([&] { load_token_shard(path_); }, {path_, "2 unexpected bytes", "100 tokens"});
}

TEST_F(CorruptShard, TokenOutsideVocabulary) {
  bytes_[kTokenShardHeaderBytes + 2 * 5] = 0x2c;  // 300 = 0x012c, little-endian
  bytes_[kTokenShardHeaderBytes + 2 * 5 + 1] = 0x01;
  write(bytes_);  // version 2: the checksum catches it first
  expect_user_error([&] { load_token_shard(path_); }, {path_, "CRC-32"});
  write(as_version_one(bytes_));  // version 1 has only the range check
  expect_user_error([&] { load_token_shard(path_); }, {path_, "token 300", "position 5", "256"});
}

TEST_F(CorruptShard, MalformedTokenizerName) {
  bytes_[28 + 6] = 'x';  // a character after the NUL padding began
  write(bytes_);
  expect_user_error([&] { load_token_shard(path_); }, {path_, "tokenizer name"});
}

TEST_F(CorruptShard, MissingFile) {
  expect_user_error([&] { load_token_shard(dir_.file("nope_train.bin")); },
                    {"nope_train.bin", "does not exist", "prepare-data"});
}

// ---------------------------------------------------------------------------------------
// DataLoader

std::vector<std::int32_t> fill_rows(const DataLoader& loader, std::int64_t step, std::int64_t first,
                                    std::int64_t count, std::vector<std::int32_t>* targets) {
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(count * loader.seq_len()), -1);
  targets->assign(inputs.size(), -1);
  loader.fill(step, first, count, inputs.data(), targets->data());
  return inputs;
}

TEST(DataLoader, UnshuffledWindowsFollowTheReferenceFormulaAndWrap) {
  const std::int64_t n = 103, seq_len = 8, batch = 4;
  const TokenShard shard = counting_shard(n);
  const DataLoader loader(shard, seq_len, batch, /*shuffle=*/false, /*seed=*/1);
  bool saw_wrap = false;
  for (std::int64_t step : {0, 1, 2, 3, 7, 50, 1000000000}) {
    std::vector<std::int32_t> targets;
    const std::vector<std::int32_t> inputs = fill_rows(loader, step, 0, batch, &targets);
    for (std::int64_t j = 0; j < batch; ++j) {
      const std::int64_t start = ((step * batch + j) * seq_len) % n;
      EXPECT_EQ(loader.window_start(step, j), start);
      saw_wrap |= start + seq_len + 1 > n;
      for (std::int64_t t = 0; t < seq_len; ++t) {
        const auto at = static_cast<std::size_t>(j * seq_len + t);
        ASSERT_EQ(inputs[at], (start + t) % n) << "step " << step << " sample " << j << " t " << t;
        ASSERT_EQ(targets[at], (start + t + 1) % n) << "step " << step << " sample " << j;
      }
    }
  }
  EXPECT_TRUE(saw_wrap);
}

TEST(DataLoader, WrapsWithTargetOnlyCrossingTheEnd) {
  // Window 2 of seq_len 4 over 12 tokens starts at 8: inputs 8..11, targets 9..11 then 0.
  const TokenShard shard = counting_shard(12);
  const DataLoader loader(shard, 4, 3, false, 0);
  std::vector<std::int32_t> targets;
  const std::vector<std::int32_t> inputs = fill_rows(loader, 0, 2, 1, &targets);
  EXPECT_EQ(inputs, (std::vector<std::int32_t>{8, 9, 10, 11}));
  EXPECT_EQ(targets, (std::vector<std::int32_t>{9, 10, 11, 0}));
}

TEST(DataLoader, SubrangeFillEqualsRowsOfTheFullBatch) {
  const TokenShard shard = counting_shard(211);
  for (bool shuffle : {false, true}) {
    const DataLoader loader(shard, 10, 6, shuffle, 42);
    for (std::int64_t step : {0, 3, 17}) {
      std::vector<std::int32_t> full_targets;
      const std::vector<std::int32_t> full = fill_rows(loader, step, 0, 6, &full_targets);
      for (const auto& [first, count] : std::vector<std::pair<std::int64_t, std::int64_t>>{
               {0, 1}, {2, 3}, {5, 1}, {3, 3}, {0, 6}}) {
        std::vector<std::int32_t> part_targets;
        const std::vector<std::int32_t> part = fill_rows(loader, step, first, count, &part_targets);
        const auto begin = static_cast<std::ptrdiff_t>(first * 10);
        const auto end = static_cast<std::ptrdiff_t>((first + count) * 10);
        EXPECT_EQ(part, std::vector<std::int32_t>(full.begin() + begin, full.begin() + end));
        EXPECT_EQ(part_targets, std::vector<std::int32_t>(full_targets.begin() + begin,
                                                          full_targets.begin() + end));
      }
    }
  }
}

// Window indices (start / seq_len) of global samples [0, count) in order.
std::vector<std::int64_t> window_sequence(const DataLoader& loader, std::int64_t count) {
  std::vector<std::int64_t> windows;
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t start =
        loader.window_start(k / loader.global_batch(), k % loader.global_batch());
    EXPECT_EQ(start % loader.seq_len(), 0);
    windows.push_back(start / loader.seq_len());
  }
  return windows;
}

TEST(DataLoader, ShuffleVisitsEveryWindowOncePerEpoch) {
  const std::int64_t seq_len = 8, windows = 50;
  const TokenShard shard = counting_shard(seq_len * windows + 3);
  const DataLoader loader(shard, seq_len, /*global_batch=*/7, true, 1234);
  ASSERT_EQ(loader.windows_per_epoch(), windows);
  const std::vector<std::int64_t> sequence = window_sequence(loader, 3 * windows);
  std::vector<std::vector<std::int64_t>> epochs(3);
  for (std::int64_t e = 0; e < 3; ++e) {
    std::vector<std::int64_t> epoch(sequence.begin() + e * windows,
                                    sequence.begin() + (e + 1) * windows);
    epochs[static_cast<std::size_t>(e)] = epoch;
    std::sort(epoch.begin(), epoch.end());
    for (std::int64_t w = 0; w < windows; ++w)
      ASSERT_EQ(epoch[static_cast<std::size_t>(w)], w) << "epoch " << e;
  }
  EXPECT_NE(epochs[0], epochs[1]);  // each epoch has its own order
  std::vector<std::int64_t> identity(static_cast<std::size_t>(windows));
  for (std::int64_t w = 0; w < windows; ++w) identity[static_cast<std::size_t>(w)] = w;
  EXPECT_NE(epochs[0], identity);

  // The fill agrees with window_start.
  std::vector<std::int32_t> targets;
  const std::vector<std::int32_t> inputs = fill_rows(loader, 2, 3, 1, &targets);
  EXPECT_EQ(inputs[0], loader.window_start(2, 3));
  EXPECT_EQ(targets[0], loader.window_start(2, 3) + 1);
}

TEST(DataLoader, ShuffleIsAPermutationForEveryWindowCount) {
  for (std::int64_t windows = 1; windows <= 70; ++windows) {
    const TokenShard shard = counting_shard(windows * 3 + (windows == 1 ? 1 : 0));
    const DataLoader loader(shard, 3, 1, true, 99);
    ASSERT_EQ(loader.windows_per_epoch(), windows);
    std::vector<std::int64_t> sequence = window_sequence(loader, windows);
    std::sort(sequence.begin(), sequence.end());
    for (std::int64_t w = 0; w < windows; ++w)
      ASSERT_EQ(sequence[static_cast<std::size_t>(w)], w) << "windows " << windows;
  }
}

TEST(DataLoader, ShuffleIsDeterministicPerSeedAndResumable) {
  const TokenShard shard = counting_shard(8 * 64);
  const DataLoader a(shard, 8, 4, true, 7);
  const DataLoader b(shard, 8, 4, true, 7);
  const DataLoader other(shard, 8, 4, true, 8);
  EXPECT_EQ(window_sequence(a, 200), window_sequence(b, 200));
  EXPECT_NE(window_sequence(a, 64), window_sequence(other, 64));
  // A loader created at step 30 (a resumed run) reads what the original read at step 30.
  std::vector<std::int32_t> ta, tb;
  EXPECT_EQ(fill_rows(a, 30, 0, 4, &ta), fill_rows(b, 30, 0, 4, &tb));
  EXPECT_EQ(ta, tb);
}

TEST(DataLoader, RejectsAShardShorterThanOneWindow) {
  TokenShard shard = counting_shard(64);
  shard.path = "data/tiny_train.bin";
  expect_user_error([&] { DataLoader(shard, 64, 1, false, 0); },
                    {"data/tiny_train.bin", "64 tokens", "65", "seq_len = 64"});
  EXPECT_NO_THROW(DataLoader(shard, 63, 1, false, 0));
  expect_user_error([&] { DataLoader(shard, 0, 1, false, 0); }, {"seq_len"});
  expect_user_error([&] { DataLoader(shard, 8, 0, false, 0); }, {"global_batch"});
}

}  // namespace
}  // namespace oases::data
