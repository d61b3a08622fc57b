#include "io/safetensors.h"

#include "core/error.h"
#include "core/atomic_file.h"

#include "support/files.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace oases::io {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_safetensors_test") {}
};

using oases::testing::expect_user_error;
using oases::testing::leftover_temporaries;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

// The on-disk bytes as Python's safetensors builds them: length, JSON padded with spaces to
// 8-byte alignment, data.
std::string safetensors_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] =
        static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  return out + header + data;
}

template <class T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

TEST(Safetensors, WriteReadRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<float> weight = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const std::vector<std::int32_t> ids = {1, -2, 300000, 4};
  std::vector<std::uint8_t> mask = {1, 0, 1};
  const std::vector<std::uint16_t> halves = {0x3f80, 0xc000};  // bf16 1.0, -2.0
  const float scalar = 42.0f;

  SafetensorsWriter writer;
  writer.add("wte.weight", DType::f32, {2, 3}, weight.data());
  writer.add("ids", DType::i32, {4}, ids.data());
  writer.add_copy("mask", DType::u8, {3}, mask.data());
  mask[0] = 9;  // the writer kept its own copy
  writer.add("half", DType::bf16, {2}, halves.data());
  writer.add("scalar", DType::f32, {}, &scalar);
  writer.add("empty", DType::f32, {0, 5}, nullptr);
  writer.set_metadata("format", "pt");
  writer.set_metadata("step", "10");
  writer.write(path);
  EXPECT_TRUE(leftover_temporaries(fs::path(path).parent_path()).empty());

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.names(),
            (std::vector<std::string>{"empty", "half", "ids", "mask", "scalar", "wte.weight"}));
  EXPECT_TRUE(file.has("ids"));
  EXPECT_FALSE(file.has("idz"));
  EXPECT_EQ(file.info("ids").dtype, DType::i32);
  EXPECT_EQ(file.info("ids").shape, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(file.info("wte.weight").shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(file.info("scalar").shape, std::vector<std::int64_t>{});
  EXPECT_EQ(file.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"step", "10"}}));

  std::vector<float> got(6);
  file.read_f32("wte.weight", {2, 3}, got.data());
  EXPECT_EQ(got, weight);
  float got_scalar = 0;
  file.read_f32("scalar", {}, &got_scalar);
  EXPECT_EQ(got_scalar, 42.0f);
  std::vector<float> got_half(2);
  file.read_f32("half", {2}, got_half.data());
  EXPECT_EQ(got_half, (std::vector<float>{1.0f, -2.0f}));
  file.read_f32("empty", {0, 5}, nullptr);

  const std::vector<std::byte> id_bytes = file.read_raw("ids");
  ASSERT_EQ(id_bytes.size(), 16u);
  EXPECT_EQ(std::memcmp(id_bytes.data(), ids.data(), 16), 0);
  const std::vector<std::byte> mask_bytes = file.read_raw("mask");
  EXPECT_EQ(mask_bytes, (std::vector<std::byte>{std::byte{1}, std::byte{0}, std::byte{1}}));

  // Layout: data section 8-byte aligned, every tensor aligned to its element size, no gaps.
  const std::string bytes = read_bytes(path);
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  std::uint64_t total = 0;
  for (const std::string& name : file.names()) {
    const SafetensorsTensorInfo& info = file.info(name);
    EXPECT_EQ(info.data_begin % dtype_size(info.dtype), 0u) << name;
    total += info.nbytes();
  }
  EXPECT_EQ(8 + header_len + total, bytes.size());
}

TEST(Safetensors, OutputDoesNotDependOnInsertionOrder) {
  TempDir dir;
  const std::vector<float> a = {1, 2};
  const std::vector<std::uint8_t> b = {3};
  const std::vector<double> c = {4};
  SafetensorsWriter first, second;
  first.add("a", DType::f32, {2}, a.data());
  first.add("b", DType::u8, {1}, b.data());
  first.add("c", DType::f64, {1}, c.data());
  second.add("c", DType::f64, {1}, c.data());
  second.add("b", DType::u8, {1}, b.data());
  second.add("a", DType::f32, {2}, a.data());
  first.write(dir.file("1.safetensors"));
  second.write(dir.file("2.safetensors"));
  EXPECT_EQ(read_bytes(dir.file("1.safetensors")), read_bytes(dir.file("2.safetensors")));
}

TEST(Safetensors, ReadsAHandBuiltFileInPythonsLayout) {
  TempDir dir;
  const std::string path = dir.file("hf.safetensors");
  // F32 [2] at [0, 8); F64 [1] at [8, 16); F16 [2, 1] at [16, 20); BF16 [1] at [20, 22).
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"h.0.ln_1.weight":{"dtype":"F32","shape":[2],)"
      R"("data_offsets":[0,8]},"wpe.weight":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
      R"("h.0.ln_1.bias":{"dtype":"F16","shape":[2,1],"data_offsets":[16,20]},)"
      R"("x":{"dtype":"BF16","shape":[1],"data_offsets":[20,22]}})";
  const std::string data = raw(std::vector<float>{1.5f, -2.0f}) + raw(std::vector<double>{0.25}) +
                           raw(std::vector<std::uint16_t>{0x3c00, 0x8001}) +  // 1.0, -2^-24
                           raw(std::vector<std::uint16_t>{0x4049});           // bf16 3.140625
  write_bytes(path, safetensors_bytes(header, data));

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.names().size(), 4u);
  std::vector<float> w(2), p(1), b(2), x(1);
  file.read_f32("h.0.ln_1.weight", {2}, w.data());
  file.read_f32("wpe.weight", {1}, p.data());
  file.read_f32("h.0.ln_1.bias", {2, 1}, b.data());
  file.read_f32("x", {1}, x.data());
  EXPECT_EQ(w, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(p[0], 0.25f);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -std::ldexp(1.0f, -24));
  EXPECT_EQ(x[0], 3.140625f);
  EXPECT_EQ(file.info("h.0.ln_1.bias").dtype, DType::f16);
}

TEST(Safetensors, ReadF32ReportsMissingNamesAndShapeMismatches) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<float> wte(100 * 64, 0.5f);
  const std::vector<std::int64_t> ids = {1};
  SafetensorsWriter writer;
  writer.add("wte.weight", DType::f32, {100, 64}, wte.data());
  writer.add("h.0.attn.c_attn.weight", DType::f32, {1}, wte.data());
  writer.add("ids", DType::i64, {1}, ids.data());
  writer.write(path);
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<float> out(512 * 1536);
  expect_user_error(
      [&] {
        file.read_f32("h.3.attn.c_attn.weight", {512, 1536}, out.data());
      },
      {path, "has no tensor 'h.3.attn.c_attn.weight'", "expected shape [512, 1536]",
       "h.0.attn.c_attn.weight"});
  expect_user_error(
      [&] {
        file.read_f32("wte.weight", {256, 64}, out.data());
      },
      {path, "'wte.weight'", "has shape [100, 64]", "needs [256, 64]"});
  expect_user_error([&] { file.read_f32("ids", {1}, out.data()); }, {path, "'ids'", "I64"});
  expect_user_error([&] { file.info("nothing"); }, {path, "'nothing'"});
  expect_user_error([&] { file.read_raw("nothing"); }, {path, "'nothing'"});
}

class CorruptSafetensors : public ::testing::Test {
 protected:
  void expect_rejected(const std::string& bytes, const std::vector<std::string>& parts) {
    write_bytes(path_, bytes);
    std::vector<std::string> all = parts;
    all.insert(all.begin(), path_);
    expect_user_error([&] { SafetensorsFile::open(path_); }, all);
  }
  static std::string one_tensor(const std::string& entry) { return R"({"t":)" + entry + "}"; }

  TempDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
};

TEST_F(CorruptSafetensors, TooShortForTheLengthField) {
  expect_rejected("abc", {"truncated", "3 bytes"});
}

TEST_F(CorruptSafetensors, HeaderLengthLargerThanTheFile) {
  std::string bytes =
      safetensors_bytes(one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), "abcd");
  bytes[0] = static_cast<char>(0xff);
  bytes[1] = static_cast<char>(0x7f);
  expect_rejected(bytes, {"header length of 32767 bytes"});
}

TEST_F(CorruptSafetensors, TruncatedData) {
  TempDir dir;
  const std::vector<float> values(16, 1.0f);
  SafetensorsWriter writer;
  writer.add("w", DType::f32, {16}, values.data());
  writer.write(path_);
  const std::string bytes = read_bytes(path_);
  expect_rejected(bytes.substr(0, bytes.size() - 10),
                  {"'w'", "outside the data section", "truncated"});
}

TEST_F(CorruptSafetensors, OffsetsOutOfRange) {
  expect_rejected(
      safetensors_bytes(one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[4,12]})"),
                        "12345678"),
      {"'t'", "[4, 12]", "8 bytes"});
  expect_rejected(
      safetensors_bytes(one_tensor(R"({"dtype":"F32","shape":[0],"data_offsets":[4,0]})"), "1234"),
      {"'t'", "[4, 0]"});
  expect_rejected(
      safetensors_bytes(one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"), "1234"),
      {"'t'", "data_offsets"});
}

TEST_F(CorruptSafetensors, ShapeDisagreesWithByteSize) {
  expect_rejected(
      safetensors_bytes(one_tensor(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
                        "12345678"),
      {"'t'", "F32", "[3]", "needs 12 bytes", "span 8 bytes"});
  expect_rejected(
      safetensors_bytes(one_tensor(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
                        "12345678"),
      {"'t'", "non-negative"});
  expect_rejected(
      safetensors_bytes(
          one_tensor(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
          "12345678"),
      {"'t'", "does not fit in 64 bits"});
  // No element, but the element count (numel) overflows before the zero is reached.
  expect_rejected(
      safetensors_bytes(
          one_tensor(R"({"dtype":"U8","shape":[4294967296,2147483648,0],"data_offsets":[0,0]})"),
          ""),
      {"'t'", "[4294967296, 2147483648, 0]", "does not fit in 64 bits"});
}

TEST_F(CorruptSafetensors, OverlappingTensors) {
  expect_rejected(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                    "123456789012"),
                  {"'a'", "'b'", "overlap"});
}

TEST_F(CorruptSafetensors, MalformedHeaders) {
  expect_rejected(safetensors_bytes(R"({"t": {"dtype": "F32", )", "1234"), {"malformed JSON"});
  expect_rejected(safetensors_bytes(R"([1, 2, 3])", ""), {"JSON object"});
  expect_rejected(
      safetensors_bytes(one_tensor(R"({"dtype":"BOOL","shape":[1],"data_offsets":[0,1]})"), "1"),
      {"'t'", "BOOL", "F32"});
  expect_rejected(safetensors_bytes(one_tensor(R"({"dtype":"F32","shape":[1]})"), "1234"),
                  {"'t'", "data_offsets"});
  expect_rejected(safetensors_bytes(R"({"__metadata__":{"step":10}})", ""),
                  {"__metadata__", "step"});
  // Printing a value nested this deep in the message about it overflowed the stack.
  expect_rejected(
      safetensors_bytes(one_tensor(std::string(100000, '[') + std::string(100000, ']')), ""),
      {"deeper than 64 levels"});
}

TEST(AtomicWrite, FailureBeforeRenameLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<float> v1 = {1, 2, 3}, v2 = {9, 9, 9};
  SafetensorsWriter first;
  first.add("w", DType::f32, {3}, v1.data());
  first.write(path);
  const std::string old_bytes = read_bytes(path);
  SafetensorsWriter second;
  second.add("w", DType::f32, {3}, v2.data());

  // The write fails midway: a file-size limit (works as root too) turns writes past 16 bytes
  // into EFBIG instead of a signal.
  {
    struct rlimit was {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &was), 0);
    const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = was;
    small.rlim_cur = 16;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    try {
      second.write(path);
      ADD_FAILURE() << "a write past RLIMIT_FSIZE succeeded";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot write"), std::string::npos) << e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &was);
    std::signal(SIGXFSZ, previous_handler);
  }
  EXPECT_EQ(read_bytes(path), old_bytes);
  EXPECT_TRUE(leftover_temporaries(dir.path()).empty());

  // A write abandoned midway (an exception between writes) removes its .tmp.
  try {
    AtomicFileWriter writer(path);
    writer.write("partial");
    throw std::runtime_error("simulated failure");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(leftover_temporaries(dir.path()).empty());
  EXPECT_EQ(read_bytes(path), old_bytes);

  std::vector<float> got(3);
  SafetensorsFile::open(path).read_f32("w", {3}, got.data());
  EXPECT_EQ(got, v1);

  second.write(path);
  SafetensorsFile::open(path).read_f32("w", {3}, got.data());
  EXPECT_EQ(got, v2);
}

TEST(AtomicWrite, ReadOnlyDirectoryLeavesTheOldFileIntact) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  const std::string sub = dir.file("ro");
  fs::create_directory(sub);
  const std::string path = sub + "/state.json";
  write_file_atomically(path, "old");
  fs::permissions(sub, fs::perms::owner_read | fs::perms::owner_exec);
  expect_user_error([&] { write_file_atomically(path, "new"); }, {path});
  fs::permissions(sub, fs::perms::owner_all);
  EXPECT_EQ(read_bytes(path), "old");
}

TEST(AtomicWrite, FsyncAndRenamePublishesATemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("complete");
  write_file_atomically(path, "v1");
  write_bytes(path + ".partial", "v2");
  fsync_and_rename(path + ".partial", path);
  EXPECT_EQ(read_bytes(path), "v2");
  EXPECT_FALSE(fs::exists(path + ".partial"));
  expect_user_error([&] { fsync_and_rename(dir.file("absent.tmp"), path); }, {"absent.tmp"});
  EXPECT_EQ(read_bytes(path), "v2");
}

}  // namespace
}  // namespace oases::io
