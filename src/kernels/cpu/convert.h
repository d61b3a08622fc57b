// Conversions between the floating-point storage types: f64, f32 and the two 16-bit formats,
// bf16 (bfloat16: 1 sign, 8 exponent and 7 mantissa bits, the top half of a float) and f16
// (IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits). A 16-bit value is carried as its
// bit pattern in a std::uint16_t.
//
// Rounding is IEEE round to nearest, ties to even, everywhere a value must be rounded:
//  - finite values beyond the largest finite value of the target round to infinity exactly when
//    IEEE rounding says so (f16: |x| >= 65520; bf16: |x| >= 2^128 - 2^119), keeping the sign;
//  - f16 has subnormals (steps of 2^-24) and results below half the smallest one become a
//    signed zero (ties to even: 2^-25 itself becomes 0);
//  - infinities stay infinite; NaN stays NaN with its sign and the top bits of its payload,
//    made quiet (a signalling NaN whose kept payload bits would all be zero would otherwise
//    turn into infinity), so a quiet NaN survives a round trip bit for bit.
// Widening (16-bit -> f32 -> f64) is exact.
#pragma once

#include "core/dtype.h"

#include <cstdint>

namespace oases::kernels::cpu {

std::uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(std::uint16_t bits);  // exact

std::uint16_t float_to_f16_bits(float value);
float f16_bits_to_float(std::uint16_t bits);  // exact

// Directly from double, rounded once: double -> float -> 16 bits would round twice, which
// can land on the wrong side of a tie (1 + 2^-8 + 2^-40 is above the bf16 midpoint between 1
// and 1 + 2^-7, but rounds to float as exactly that midpoint, which then goes to even, 1).
// The double is first rounded to float with round-to-odd (truncate, then set the last bit if
// anything was cut off): a float 16 or more bits wider than the target that way keeps the
// information a single rounding needs, so its nearest-even rounding is the correct rounding
// of the double (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
// algorithms using rounding to odd", 2008).
std::uint16_t double_to_bf16_bits(double value);
std::uint16_t double_to_f16_bits(double value);

// dst[i] = src[i] converted, for i in [0, n), between any two of DType::f64, f32, bf16, f16
// (bf16 and f16 elements are std::uint16_t bit patterns). Conversions are exact or rounded
// once as above: f64 -> f32 as static_cast<float> (round to nearest even, overflow to inf),
// f64 -> 16 bits by double_to_*_bits, bf16 <-> f16 through float (exact) and one rounding.
// Same type: a copy. src and dst must not overlap unless they are the same pointer with the
// same type. Element-wise, split across OpenMP threads for large n; the result does not
// depend on the thread count. Another DType is an InternalError.
void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n);

}  // namespace oases::kernels::cpu
