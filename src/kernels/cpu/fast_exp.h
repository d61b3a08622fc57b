// exp() that the compiler can vectorise, for the softmax loops of the CPU kernels.
//
// Why not std::exp: glibc's expf is a scalar call (about 3 ns an element here), and softmax
// over a 50k vocabulary or an attention tile is dominated by it. This version is plain
// arithmetic on float and int32 lanes, so a loop over it compiles to SIMD code. Relative
// error < 3e-7 (about 2 ulp) over the clamped range; inputs below -87 (and -inf) give
// exp(-87) ~ 1.6e-38 rather than a subnormal or 0, inputs above 88 give exp(88), and NaN
// gives NaN. Softmax callers pass x - max <= 0, where that floor is far below anything that
// can change a sum that includes exp(0) = 1.
//
// The double overload is std::exp: double is the precision of the reference tests, not of
// production, so it stays exact.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

// The build targets baseline x86-64 (SSE2, 4 float lanes) so that binaries run anywhere.
// Functions whose loops call exp_approx are therefore compiled once per ISA level and the
// widest one this CPU supports is picked at load time (GCC's target_clones). Measured on
// cross_entropy_forward over [2048, 50304] floats, one thread: 220 ms with SSE2 only, 76 ms
// with the clones. The choice is fixed per machine, so results stay deterministic; across
// machines of different vector widths the last bits may differ (FMA contraction, reduction
// order). Not under ThreadSanitizer: GCC instruments the clones' resolvers, which run at load
// time, before TSan has started, and the binary crashes there.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define OASES_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OASES_VECTOR_CLONES
#endif

namespace oases::kernels::cpu {

inline float exp_approx(float x) {
  // Clamp through the integer bit pattern: with the default -ftrapping-math a float compare
  // may raise an exception, which stops GCC from if-converting (and so vectorising) the loop;
  // integer compares do not. As unsigned integers, the floats in [-inf, -87) are exactly the
  // bit patterns in (bits(-87), bits(-inf)] (the sign bit puts negatives above positives and
  // a larger magnitude has larger bits), and those in (88, +inf] are (bits(88), bits(+inf)].
  // A range test (lo, hi] is one unsigned compare: u - lo - 1 < hi - lo. NaNs lie outside
  // both ranges and pass through, so a NaN input gives NaN rather than a plausible number.
  constexpr std::uint32_t kLowBits = 0xC2AE0000u;  // -87.0f
  constexpr std::uint32_t kMinusInfBits = 0xFF800000u;
  constexpr std::uint32_t kHighBits = 0x42B00000u;  // 88.0f
  constexpr std::uint32_t kPlusInfBits = 0x7F800000u;
  // The selects are written as masks because GCC 12 leaves these ternaries as branches.
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const bool below = u - kLowBits - 1 < kMinusInfBits - kLowBits;
  const bool above = u - kHighBits - 1 < kPlusInfBits - kHighBits;
  const std::uint32_t low = 0u - static_cast<std::uint32_t>(below);
  const std::uint32_t high = 0u - static_cast<std::uint32_t>(above);
  u = (u & ~(low | high)) | (kLowBits & low) | (kHighBits & high);
  x = std::bit_cast<float>(u);

  // x = n ln2 + r with n integral, |r| <= ln2 / 2. Adding 1.5 * 2^23 rounds x log2(e) to an
  // integer held in the low mantissa bits (SSE2 has no vector round instruction).
  constexpr float kRoundShift = 12582912.0f;  // 1.5 * 2^23
  const float shifted = x * 1.44269504088896341f + kRoundShift;
  const float n = shifted - kRoundShift;
  // ln2 split in two so that n * kLn2Hi is exact for |n| <= 128.
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  // Taylor series of exp(r) to degree 7: truncation error < 2e-8 on |r| <= ln2 / 2.
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n built directly as an exponent field; n is in [-126, 127] after the clamp.
  const std::int32_t n_int = std::bit_cast<std::int32_t>(shifted) - 0x4B400000;
  const float two_to_n = std::bit_cast<float>((n_int + 127) << 23);
  return p * two_to_n;
}

inline double exp_approx(double x) { return std::exp(x); }

}  // namespace oases::kernels::cpu
