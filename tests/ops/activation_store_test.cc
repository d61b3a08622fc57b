#include "ops/activation_store.h"

#include "core/error.h"
#include "kernels/cpu/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace oases::ops {
namespace {

constexpr ActivationKey kKey{.segment = 3, .micro_batch = 1, .sub_batch = 0, .set = kInternals};

template <class T>
std::vector<T> values(std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)  // signs, magnitudes over 2^-20..2^20, and ties
    v[i] = static_cast<T>((i % 3 == 0 ? -1 : 1) * std::ldexp(1.0 + static_cast<double>(i % 257) / 256, static_cast<int>(i % 41) - 20));
  return v;
}

TEST(ActivationStore, EncodingToBf16RoundsEveryElementToNearestEven) {
  ActivationStore store;
  constexpr std::int64_t n = 5000;
  const std::vector<float> f = values<float>(n);
  Tensor block = store.acquire(kKey, DType::f32, n);
  std::copy(f.begin(), f.end(), block.data<float>());
  store.encode(kKey, ActivationEncoding::bf16);
  EXPECT_TRUE(store.encoded(kKey));
  store.decode(kKey);
  EXPECT_FALSE(store.encoded(kKey));
  const Tensor back = store.get(kKey);
  ASSERT_EQ(back.dtype(), DType::f32);
  ASSERT_EQ(back.numel(), n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float want = kernels::cpu::bf16_bits_to_float(kernels::cpu::float_to_bf16_bits(f[i]));
    ASSERT_EQ(back.data<float>()[i], want) << i;
    // Within half a unit in the last place of bf16 (8 significant bits).
    ASSERT_LE(std::fabs(back.data<float>()[i] - f[i]), std::ldexp(std::fabs(f[i]), -8)) << i;
  }

  // f64 blocks (the verification precision) are rounded once, straight from double.
  const ActivationKey wide{.segment = 4, .set = kCheckpoint};
  const std::vector<double> d = values<double>(n);
  Tensor dblock = store.acquire(wide, DType::f64, n);
  std::copy(d.begin(), d.end(), dblock.data<double>());
  store.encode(wide, ActivationEncoding::bf16);
  store.decode(wide);
  for (std::int64_t i = 0; i < n; ++i) {
    const double want = kernels::cpu::bf16_bits_to_float(kernels::cpu::double_to_bf16_bits(d[i]));
    ASSERT_EQ(store.get(wide).data<double>()[i], want) << i;
  }
}

// A bf16 block (mixed precision) whose tail holds f32 statistics: fp8 rounds the leading
// bf16 elements as the fp8 kernels do and keeps the statistics' bytes exactly; the encoded
// block is one byte per encoded element plus the tail.
TEST(ActivationStore, EncodingKeepsTheStatisticsTailAsItIs) {
  ActivationStore store;
  constexpr std::int64_t n = 4096, encodable = 4000;
  const std::vector<float> f = values<float>(n);
  Tensor block = store.acquire(kKey, DType::bf16, n, encodable);
  for (std::int64_t i = 0; i < encodable; ++i)
    block.data<BFloat16>()[i] = BFloat16(f[static_cast<std::size_t>(i)] / 64);
  std::vector<std::uint16_t> tail(static_cast<std::size_t>(n - encodable));
  for (std::size_t i = 0; i < tail.size(); ++i) tail[i] = static_cast<std::uint16_t>(0xFFFF - 3 * i);
  std::copy(tail.begin(), tail.end(), reinterpret_cast<std::uint16_t*>(block.data<BFloat16>() + encodable));
  const std::vector<BFloat16> before(block.data<BFloat16>(), block.data<BFloat16>() + n);
  const std::size_t live = store.live_bytes();
  store.encode(kKey, ActivationEncoding::fp8_e4m3);
  EXPECT_EQ(store.live_bytes(), live - n * 2 + encodable + (n - encodable) * 2);
  store.decode(kKey);
  const Tensor back = store.get(kKey);
  for (std::int64_t i = 0; i < encodable; ++i) {
    std::uint8_t code = 0;
    float want = 0;
    const float x = before[static_cast<std::size_t>(i)];
    kernels::cpu::encode_e4m3(&x, &code, 1);
    kernels::cpu::decode_e4m3(&code, &want, 1);
    ASSERT_EQ(static_cast<float>(back.data<BFloat16>()[i]), want) << i;
  }
  for (std::int64_t i = encodable; i < n; ++i)
    ASSERT_EQ(back.data<BFloat16>()[i].bits, tail[static_cast<std::size_t>(i - encodable)]) << i;
}

// e4m3 keeps 4 significant bits and saturates at +-448: each value comes back as the fp8
// kernels round it, from f32 directly and from f64 through f32.
TEST(ActivationStore, EncodingToFp8RoundsAsTheFp8Kernels) {
  ActivationStore store;
  constexpr std::int64_t n = 9000;  // more than one piece of the f64 path
  const std::vector<float> f = values<float>(n);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
  std::vector<float> want(static_cast<std::size_t>(n));
  kernels::cpu::encode_e4m3(f.data(), codes.data(), n);
  kernels::cpu::decode_e4m3(codes.data(), want.data(), n);

  Tensor block = store.acquire(kKey, DType::f32, n);
  std::copy(f.begin(), f.end(), block.data<float>());
  store.encode(kKey, ActivationEncoding::fp8_e4m3);
  EXPECT_EQ(store.live_bytes(), static_cast<std::size_t>(n));
  store.decode(kKey);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(store.get(kKey).data<float>()[i], want[i]) << i;

  const ActivationKey wide{.segment = 4, .set = kCheckpoint};
  Tensor dblock = store.acquire(wide, DType::f64, n);
  for (std::int64_t i = 0; i < n; ++i) dblock.data<double>()[i] = f[i];  // exact in f32
  store.encode(wide, ActivationEncoding::fp8_e4m3);
  store.decode(wide);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(store.get(wide).data<double>()[i], static_cast<double>(want[i])) << i;
}

TEST(ActivationStore, AnEncodedBlockCountsItsEncodedBytesAndBothCountWhileConverting) {
  ActivationStore store;
  constexpr std::int64_t n = 1000;
  store.acquire(kKey, DType::f32, n);
  EXPECT_EQ(store.live_bytes(), 4 * n);
  store.encode(kKey, ActivationEncoding::bf16);
  EXPECT_EQ(store.live_bytes(), 2 * n);
  EXPECT_EQ(store.peak_bytes(), 6 * n);
  store.reset_peak();
  store.decode(kKey);
  EXPECT_EQ(store.live_bytes(), 4 * n);
  EXPECT_EQ(store.peak_bytes(), 6 * n);
  store.release(kKey);
  EXPECT_EQ(store.live_bytes(), 0);

  // The next step asks for the same sizes: nothing new is allocated.
  const std::size_t reserved = store.reserved_bytes();
  for (int step = 0; step < 3; ++step) {
    store.acquire(kKey, DType::f32, n);
    store.encode(kKey, ActivationEncoding::bf16);
    store.decode(kKey);
    store.release(kKey);
  }
  EXPECT_EQ(store.reserved_bytes(), reserved);

  // Freed while encoded: its encoded block goes back.
  store.acquire(kKey, DType::f32, n);
  store.encode(kKey, ActivationEncoding::bf16);
  store.release(kKey);
  EXPECT_EQ(store.live_bytes(), 0);
  EXPECT_EQ(store.live_count(), 0u);
  EXPECT_EQ(encoded_element_bytes(ActivationEncoding::bf16), 2u);
}

TEST(ActivationStore, ReadingOrEncodingInTheWrongStateIsABug) {
  ActivationStore store;
  EXPECT_THROW(store.encode(kKey, ActivationEncoding::bf16), InternalError);  // not live
  store.acquire(kKey, DType::f32, 10);
  EXPECT_THROW(store.decode(kKey), InternalError);  // not encoded
  store.encode(kKey, ActivationEncoding::bf16);
  EXPECT_THROW(store.get(kKey), InternalError);  // a read of the encoded bits as values
  EXPECT_THROW(store.encode(kKey, ActivationEncoding::bf16), InternalError);
  store.decode(kKey);
  EXPECT_NO_THROW(store.get(kKey));
}

}  // namespace
}  // namespace oases::ops
