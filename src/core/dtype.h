// Element types. The CPU engine computes in f32 (f64 in numerical tests); bf16 and f16 are
// storage types for mixed precision: kernels widen them to f32 (exactly), compute in f32 and
// round results back once.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace oases {

// Scalar conversions between float and the 16-bit formats, as bit patterns:
//   bf16 (bfloat16): 1 sign, 8 exponent, 7 mantissa bits: the top half of a float;
//   f16 (IEEE 754 binary16): 1 sign, 5 exponent (bias 15), 10 mantissa bits, subnormals in
//   steps of 2^-24, largest finite 65504.
// Narrowing rounds to nearest, ties to even; finite values that round past the largest finite
// value become infinity with their sign (f16: |x| >= 65520; bf16: |x| >= 2^128 - 2^119);
// results below half the smallest f16 subnormal are signed zeros (2^-25 itself ties to 0);
// NaN stays NaN with its sign and the top payload bits, made quiet (so that a signalling NaN
// whose kept payload is zero does not turn into infinity). Widening is exact; an f16
// signalling NaN widens to the quiet float NaN of the same payload (as F16C's vcvtph2ps does),
// a bf16 one to the signalling float NaN of the same bits (widening bf16 is a shift).
// These are the portable reference; kernels/kernels.h's convert is the array form over
// Tensors (vectorised on the CPU), which gives the same bits.
constexpr std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the cut-off
  // half is above the midpoint, or at it with an odd kept half; a carry out of the mantissa
  // steps the exponent (up to inf), which is the correct result.
  return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(std::uint32_t{bits} << 16);
}

constexpr std::uint16_t float_to_f16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u)  // NaN: quiet, top 9 payload bits kept
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  // 65520 = 0x477FF000 is the midpoint between the largest f16, 65504, and 2^16; 65504 has an
  // odd mantissa, so the tie goes up, to inf. Infinity itself lands here too.
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (magnitude >= 0x38800000u) {  // normal in f16: >= 2^-14
    // Round the 23-bit mantissa to 10 bits (as for bf16: a carry steps the exponent), then
    // rebias the exponent from 127 to 15 (subtract 112 << 23).
    const std::uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // Subnormal or zero in f16: the result is round(|value| * 2^24). At or below 2^-25
  // (0x33000000) that is 0 (2^-25 is the tie between 0 and 2^-24, and 0 is even).
  if (magnitude <= 0x33000000u) return sign;
  const std::uint32_t exponent = magnitude >> 23;  // in [102, 112]
  const std::uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126 - exponent;  // |value| * 2^24 = mantissa / 2^shift
  std::uint32_t quotient = mantissa >> shift;
  const std::uint32_t remainder = mantissa & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (quotient & 1u))) ++quotient;
  return static_cast<std::uint16_t>(sign | quotient);  // 0x400 (smallest normal) if rounded up
}

constexpr float f16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = (std::uint32_t{bits} & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) {  // infinity, or NaN made quiet (as the F16C instruction does)
    const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) | quiet);
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Storage types of the 16-bit formats: a bit pattern with conversions. Widening to float is
// implicit (it is exact); narrowing is explicit (it rounds, as above). There is no arithmetic
// on them: compute in float.
struct BFloat16 {
  std::uint16_t bits = 0;

  BFloat16() = default;
  constexpr explicit BFloat16(float value) : bits(float_to_bf16_bits(value)) {}
  static constexpr BFloat16 from_bits(std::uint16_t b) {
    BFloat16 v;
    v.bits = b;
    return v;
  }
  constexpr operator float() const { return bf16_bits_to_float(bits); }
};

struct Float16 {
  std::uint16_t bits = 0;

  Float16() = default;
  constexpr explicit Float16(float value) : bits(float_to_f16_bits(value)) {}
  static constexpr Float16 from_bits(std::uint16_t b) {
    Float16 v;
    v.bits = b;
    return v;
  }
  constexpr operator float() const { return f16_bits_to_float(bits); }
};

static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, i64, u8, u16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: case DType::u16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::u16: return "u16";
  }
  return "?";
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<Float16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<std::uint16_t> { static constexpr DType value = DType::u16; };
template <class T> struct dtype_of<const T> : dtype_of<T> {};

}  // namespace oases
