#include "core/checksum.h"
#include "core/line_file.h"

#include "support/files.h"

#include <gtest/gtest.h>

#include <string>

namespace oases {
namespace {

TEST(Crc32, MatchesTheStandardCheckValue) {
  // The published check value of CRC-32 (zlib, PNG, gzip) for the ASCII digits 1 to 9.
  const std::string digits = "123456789";
  EXPECT_EQ(crc32(digits.data(), digits.size()), 0xCBF43926u);
  EXPECT_EQ(crc32(digits.data(), 0), 0u);
  // Continuing a checksum over pieces gives the checksum of the whole.
  EXPECT_EQ(crc32(digits.data() + 4, 5, crc32(digits.data(), 4)), 0xCBF43926u);
}

TEST(Crc32, FileChecksumCoversEveryByte) {
  testing::TempDir dir("checksum");
  testing::write_bytes(dir.file("a"), "123456789");
  const FileChecksum sum = file_checksum(dir.file("a"));
  EXPECT_EQ(sum.bytes, 9u);
  EXPECT_EQ(sum.crc32, 0xCBF43926u);
  testing::write_bytes(dir.file("a"), "123456788");
  EXPECT_NE(file_checksum(dir.file("a")).crc32, 0xCBF43926u);
  testing::expect_user_error([&] { file_checksum(dir.file("missing")); }, {dir.file("missing")});
}

TEST(LineFile, AppendsWholeLinesAndTruncatesWhenAsked) {
  testing::TempDir dir("line_file");
  const std::string path = dir.file("sub/metrics.jsonl");
  {
    LineFile file(path);
    file.append("one");
    file.append("two");
  }
  {
    LineFile file(path);
    file.append("three");
  }
  EXPECT_EQ(testing::read_bytes(path), "one\ntwo\nthree\n");
  {
    LineFile file(path, LineFile::Start::truncate);
    file.append("four");
  }
  EXPECT_EQ(testing::read_bytes(path), "four\n");
}

TEST(LineFile, AFullDiskIsAnErrorNamingTheFile) {
  // /dev/full accepts the open and fails every write with ENOSPC.
  LineFile file("/dev/full");
  testing::expect_user_error([&] { file.append("{\"step\": 1}"); },
                             {"/dev/full", "No space left on device"});
}

TEST(LineFile, AnUnwritablePathIsAnErrorNamingIt) {
  testing::expect_user_error([] { LineFile file("/proc/version/metrics.jsonl"); },
                             {"/proc/version"});
}

}  // namespace
}  // namespace oases
