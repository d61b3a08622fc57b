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
#include "kernels/cpu/threads.h"
#include "kernels/types.h"

#include <cstdint>

namespace oases::kernels::cpu {

// The scalar conversions (core/dtype.h), under their historical names here.
using oases::bf16_bits_to_float;  // exact
using oases::f16_bits_to_float;   // exact
using oases::float_to_bf16_bits;
using oases::float_to_f16_bits;

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

// Array conversions between float and the 16-bit types, with the bits of the scalar functions
// above (NaN payloads included), vectorised with the widest instructions this CPU has
// (detail::ConvertIsa): AVX-512 BF16's vcvtneps2bf16 for float -> bf16, AVX-512F or F16C's
// vcvtps2ph / vcvtph2ps for f16, AVX-512F or AVX2 integer code for the rest of bf16 (widening
// is a shift), portable C++ on a CPU with none of them. The family is detected from CPUID once
// per process (detail::best_convert_isa); every family gives the same bits, so results do not
// depend on the CPU. Split across OpenMP threads for large n (Threads::calling_thread: on the
// calling thread alone, for a caller that shares its own work among the threads; the same
// bits); src and dst must not overlap.
void widen(const BFloat16* src, float* dst, std::int64_t n, Threads threads = Threads::team);
void widen(const Float16* src, float* dst, std::int64_t n, Threads threads = Threads::team);
void narrow(const float* src, BFloat16* dst, std::int64_t n, Threads threads = Threads::team);
void narrow(const float* src, Float16* dst, std::int64_t n, Threads threads = Threads::team);
// The same for a float array that stands in a 16-bit one: the identity (a copy unless the
// pointers are equal), so templates over the storage type can call widen/narrow uniformly.
void widen(const float* src, float* dst, std::int64_t n, Threads threads = Threads::team);
void narrow(const float* src, float* dst, std::int64_t n, Threads threads = Threads::team);

// 8-bit floating point (OCP 8-bit Floating Point Specification, OFP8, rev. 1.0), for
// compressed activations. A value is its bit pattern in a std::uint8_t.
//   e4m3 ("E4M3FN"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111
//     is NaN; largest finite 448 (S.1111.110); subnormals in steps of 2^-9.
//   e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is infinity,
//     S.11111.{01,10,11} NaN; largest finite 57344; subnormals in steps of 2^-16.
// Encoding rounds to nearest, ties to even, from float (one rounding). e4m3 saturates: a
// finite value or infinity beyond 448 encodes as +-448 (the OCP "saturating" conversion); e5m2
// does not: a value that rounds past 57344 (|x| >= 61440) encodes as infinity, and infinity
// stays infinity. NaN encodes as NaN (e4m3: S.1111.111; e5m2: S.11111.10, quiet), keeping the
// sign. Values below half the smallest subnormal become signed zeros. Decoding is exact.
std::uint8_t float_to_e4m3(float value);
std::uint8_t float_to_e5m2(float value);
float e4m3_to_float(std::uint8_t bits);
float e5m2_to_float(std::uint8_t bits);

// Array forms (element-wise; split across OpenMP threads for large n).
void encode_e4m3(const float* src, std::uint8_t* dst, std::int64_t n);
void encode_e5m2(const float* src, std::uint8_t* dst, std::int64_t n);
void decode_e4m3(const std::uint8_t* src, float* dst, std::int64_t n);
void decode_e5m2(const std::uint8_t* src, float* dst, std::int64_t n);

// inout[i] = in[i] (op) inout[i] for i in [0, n), over two arrays of one 16-bit format: the
// element-wise reduction MPI cannot do itself on 16-bit data. A sum is formed exactly in double
// (any two bf16 or f16 values sum exactly there, up to bf16's far exponent range, where the
// smaller term lies below half a unit of the larger) and rounded once to the format as
// double_to_*_bits rounds, so it is the correctly rounded sum. max and min keep one of the two
// bit patterns, and a NaN on either side wins (so every rank of a reduction sees it).
// Sequential, on the calling thread. in and inout must not overlap.
void reduce_into(const BFloat16* in, BFloat16* inout, std::int64_t n, Reduction op);
void reduce_into(const Float16* in, Float16* inout, std::int64_t n, Reduction op);

namespace detail {

// The instruction families the array conversions can use, exposed so that tests can run
// every path the CPU supports against the portable one.
enum class ConvertIsa : std::uint8_t {
  portable,     // plain C++, any CPU
  avx2_f16c,    // AVX2 integer code for bf16, F16C for f16
  avx512,       // AVX-512F integer code for bf16, AVX-512F conversions for f16
  avx512_bf16,  // as avx512, with vcvtneps2bf16 for float -> bf16
};
const char* convert_isa_name(ConvertIsa isa);
bool convert_isa_supported(ConvertIsa isa);  // by CPUID and the OS's saved vector state
ConvertIsa best_convert_isa();

void widen_with(ConvertIsa isa, const BFloat16* src, float* dst, std::int64_t n);
void widen_with(ConvertIsa isa, const Float16* src, float* dst, std::int64_t n);
void narrow_with(ConvertIsa isa, const float* src, BFloat16* dst, std::int64_t n);
void narrow_with(ConvertIsa isa, const float* src, Float16* dst, std::int64_t n);

}  // namespace detail

}  // namespace oases::kernels::cpu
