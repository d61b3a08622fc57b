#include "kernels/cpu/convert.h"

#include "core/error.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace oases::kernels::cpu {
namespace {

using std::uint16_t;
using std::uint32_t;

// Conversions are a few integer operations an element; below this many elements the cost of
// waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 16;

constexpr uint32_t kFloatAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInfBits = 0x7F800000u;

// The float nearest to `value` with round-to-odd: if the conversion is inexact, the float
// truncated towards zero with its last mantissa bit set. REQUIRES: value is not NaN.
float round_to_odd_float(double value) {
  const float nearest = static_cast<float>(value);  // round to nearest even (may overflow)
  if (static_cast<double>(nearest) == value) return nearest;
  uint32_t bits = std::bit_cast<uint32_t>(nearest);
  // Rounded away from zero (this includes overflow to inf): one step back towards zero. The
  // magnitude is nonzero there, so the decrement never reaches the sign bit.
  if (std::abs(static_cast<double>(nearest)) > std::abs(value)) --bits;
  return std::bit_cast<float>(bits | 1u);
}

template <class Src, class Dst, class Convert>
void map_elements(const void* src, void* dst, std::int64_t n, Convert convert) {
  const Src* in = static_cast<const Src*>(src);
  Dst* out = static_cast<Dst*>(dst);
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (std::int64_t i = 0; i < n; ++i) out[i] = convert(in[i]);
}

bool is_float_type(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

}  // namespace

uint16_t float_to_bf16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & kFloatAbsMask) > kFloatInfBits) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the cut-off
  // half is above the midpoint, or at it with an odd kept half; a carry out of the mantissa
  // steps the exponent (up to inf), which is the correct result.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}

uint16_t float_to_f16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & kFloatAbsMask;
  if (magnitude > kFloatInfBits) {  // NaN: quiet, top 9 payload bits kept
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  // 65520 = 0x477FF000 is the midpoint between the largest f16, 65504, and 2^16; 65504 has an
  // odd mantissa, so the tie goes up, to inf. Infinity itself lands here too.
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (magnitude >= 0x38800000u) {  // normal in f16: >= 2^-14
    // Round the 23-bit mantissa to 10 bits (as for bf16: a carry steps the exponent), then
    // rebias the exponent from 127 to 15 (subtract 112 << 23).
    const uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // Subnormal or zero in f16: the result is round(|value| * 2^24). At or below 2^-25 (0x33000000)
  // that is 0 (2^-25 is the tie between 0 and 2^-24, and 0 is even).
  if (magnitude <= 0x33000000u) return sign;
  const uint32_t exponent = magnitude >> 23;  // in [102, 112]
  const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // |value| * 2^24 = mantissa / 2^shift, shift in [14, 24]
  uint32_t quotient = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (quotient & 1u))) ++quotient;
  return static_cast<uint16_t>(sign | quotient);  // 0x400 (the smallest normal) if it rounds up
}

float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = (uint32_t{bits} & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | kFloatInfBits | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t double_to_bf16_bits(double value) {
  if (std::isnan(value)) return float_to_bf16_bits(static_cast<float>(value));
  return float_to_bf16_bits(round_to_odd_float(value));
}

uint16_t double_to_f16_bits(double value) {
  if (std::isnan(value)) return float_to_f16_bits(static_cast<float>(value));
  return float_to_f16_bits(round_to_odd_float(value));
}

void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n) {
  OASES_ASSERT(is_float_type(src_type) && is_float_type(dst_type),
               "convert_elements: {} -> {} is not a conversion between floating-point types",
               dtype_name(src_type), dtype_name(dst_type));
  OASES_ASSERT(n >= 0, "convert_elements: negative size {}", n);
  if (n == 0) return;
  if (src_type == dst_type) {
    if (src != dst) std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(src_type));
    return;
  }
  using u16 = uint16_t;
  switch (src_type) {
    case DType::f64:
      if (dst_type == DType::f32) {
        map_elements<double, float>(src, dst, n, [](double v) { return static_cast<float>(v); });
      } else if (dst_type == DType::bf16) {
        map_elements<double, u16>(src, dst, n, double_to_bf16_bits);
      } else {
        map_elements<double, u16>(src, dst, n, double_to_f16_bits);
      }
      return;
    case DType::f32:
      if (dst_type == DType::f64) {
        map_elements<float, double>(src, dst, n, [](float v) { return static_cast<double>(v); });
      } else if (dst_type == DType::bf16) {
        map_elements<float, u16>(src, dst, n, float_to_bf16_bits);
      } else {
        map_elements<float, u16>(src, dst, n, float_to_f16_bits);
      }
      return;
    case DType::bf16:
      if (dst_type == DType::f64) {
        map_elements<u16, double>(src, dst, n,
                                  [](u16 v) { return static_cast<double>(bf16_bits_to_float(v)); });
      } else if (dst_type == DType::f32) {
        map_elements<u16, float>(src, dst, n, bf16_bits_to_float);
      } else {
        map_elements<u16, u16>(src, dst, n,
                               [](u16 v) { return float_to_f16_bits(bf16_bits_to_float(v)); });
      }
      return;
    case DType::f16:
      if (dst_type == DType::f64) {
        map_elements<u16, double>(src, dst, n,
                                  [](u16 v) { return static_cast<double>(f16_bits_to_float(v)); });
      } else if (dst_type == DType::f32) {
        map_elements<u16, float>(src, dst, n, f16_bits_to_float);
      } else {
        map_elements<u16, u16>(src, dst, n,
                               [](u16 v) { return float_to_bf16_bits(f16_bits_to_float(v)); });
      }
      return;
    default:
      return;  // excluded by the assertion above
  }
}

}  // namespace oases::kernels::cpu
