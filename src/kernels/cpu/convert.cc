#include "kernels/cpu/convert.h"

#include "core/error.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace oases::kernels::cpu {
namespace {

using std::uint16_t;
using std::uint32_t;

// Conversions are a few integer operations an element; below this many elements the cost of
// waking the OpenMP team exceeds the work.
[[maybe_unused]] constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 16;  // unused without OpenMP


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

uint16_t double_to_bf16_bits(double value) {
  if (std::isnan(value)) return float_to_bf16_bits(static_cast<float>(value));
  return float_to_bf16_bits(round_to_odd_float(value));
}

uint16_t double_to_f16_bits(double value) {
  if (std::isnan(value)) return float_to_f16_bits(static_cast<float>(value));
  return float_to_f16_bits(round_to_odd_float(value));
}

namespace {

template <class Half>
double widen_to_double(Half value) {
  if constexpr (std::is_same_v<Half, BFloat16>) return bf16_bits_to_float(value.bits);
  else return f16_bits_to_float(value.bits);
}

template <class Half>
Half round_from_double(double value) {
  if constexpr (std::is_same_v<Half, BFloat16>) return Half::from_bits(double_to_bf16_bits(value));
  else return Half::from_bits(double_to_f16_bits(value));
}

template <class Half, Reduction kOp>
void reduce_elements(const Half* in, Half* inout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = widen_to_double(in[i]), y = widen_to_double(inout[i]);
    if constexpr (kOp == Reduction::sum) {
      inout[i] = round_from_double<Half>(x + y);
    } else if constexpr (kOp == Reduction::max) {
      if (x > y || std::isnan(x)) inout[i] = in[i];
    } else {
      if (x < y || std::isnan(x)) inout[i] = in[i];
    }
  }
}

template <class Half>
void reduce_typed(const Half* in, Half* inout, std::int64_t n, Reduction op) {
  switch (op) {
    case Reduction::sum: return reduce_elements<Half, Reduction::sum>(in, inout, n);
    case Reduction::max: return reduce_elements<Half, Reduction::max>(in, inout, n);
    case Reduction::min: return reduce_elements<Half, Reduction::min>(in, inout, n);
  }
}

}  // namespace

void reduce_into(const BFloat16* in, BFloat16* inout, std::int64_t n, Reduction op) {
  reduce_typed(in, inout, n, op);
}

void reduce_into(const Float16* in, Float16* inout, std::int64_t n, Reduction op) {
  reduce_typed(in, inout, n, op);
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
        narrow(static_cast<const float*>(src), static_cast<BFloat16*>(dst), n);
      } else {
        narrow(static_cast<const float*>(src), static_cast<Float16*>(dst), n);
      }
      return;
    case DType::bf16:
      if (dst_type == DType::f64) {
        map_elements<u16, double>(src, dst, n,
                                  [](u16 v) { return static_cast<double>(bf16_bits_to_float(v)); });
      } else if (dst_type == DType::f32) {
        widen(static_cast<const BFloat16*>(src), static_cast<float*>(dst), n);
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
        widen(static_cast<const Float16*>(src), static_cast<float*>(dst), n);
      } else {
        map_elements<u16, u16>(src, dst, n,
                               [](u16 v) { return float_to_bf16_bits(f16_bits_to_float(v)); });
      }
      return;
    default:
      return;  // excluded by the assertion above
  }
}

namespace {

// ---- Array conversions, one function per instruction family over a range [0, n). ----------
// Each handles whole vectors and leaves the tail to the portable loop, which gives the same
// bits.

void widen_portable(const BFloat16* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i].bits);
}
void widen_portable(const Float16* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_float(src[i].bits);
}
void narrow_portable(const float* src, BFloat16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i].bits = float_to_bf16_bits(src[i]);
}
void narrow_portable(const float* src, Float16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i].bits = float_to_f16_bits(src[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define OASES_X86_CONVERT 1
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), a self-initialised variable
// that -Wmaybe-uninitialized reports at -O3 once inlined (a false positive: the lanes are
// all overwritten).
#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no such warning (and rejects the unknown name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx2"))) void widen_avx2(const BFloat16* src, float* dst,
                                                std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  widen_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx2,f16c"))) void widen_f16c(const Float16* src, float* dst,
                                                     std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  widen_portable(src + i, dst + i, n - i);
}

// float -> bf16 as float_to_bf16_bits: bits + 0x7FFF + (bit 16), shifted down; NaN lanes
// take (bits >> 16) | 0x40 instead.
__attribute__((target("avx2"))) void narrow_avx2(const float* src, BFloat16* dst,
                                                 std::int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf_bits = _mm256_set1_epi32(0x7F800000);
  const __m256i round_bias = _mm256_set1_epi32(0x7FFF);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, round_bias), lsb), 16);
    const __m256i nan_value = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf_bits);
    const __m256i r = _mm256_blendv_epi8(rounded, nan_value, is_nan);
    // Pack the eight 32-bit lanes (each < 2^16, so no saturation) to 16 bits: packus works
    // within 128-bit halves, and the permute gathers the two halves' results.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  narrow_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx2,f16c"))) void narrow_f16c(const float* src, Float16* dst,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  narrow_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx512f"))) void widen_avx512(const BFloat16* src, float* dst,
                                                     std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(w));
  }
  widen_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx512f"))) void widen_avx512(const Float16* src, float* dst,
                                                     std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(src + i))));
  widen_portable(src + i, dst + i, n - i);
}

// The integer rounding of narrow_avx2 on 16 lanes: the bf16 bits in the low half of each lane.
__attribute__((target("avx512f"))) inline __m512i bf16_bits_avx512(__m512i x) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i nan_value = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_blend_epi32(is_nan, rounded, nan_value);
}

__attribute__((target("avx512f"))) void narrow_avx512(const float* src, BFloat16* dst,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = bf16_bits_avx512(_mm512_castps_si512(_mm512_loadu_ps(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
  }
  narrow_portable(src + i, dst + i, n - i);
}

__attribute__((target("avx512f"))) void narrow_avx512(const float* src, Float16* dst,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  narrow_portable(src + i, dst + i, n - i);
}

// vcvtneps2bf16 rounds to nearest even and quiets NaNs as float_to_bf16_bits does, but treats
// float subnormal inputs as zero; a vector holding a nonzero subnormal takes the integer
// rounding instead, so the bits stay those of the portable code.
__attribute__((target("avx512f,avx512bf16"))) void narrow_avx512_bf16(const float* src,
                                                                     BFloat16* dst,
                                                                     std::int64_t n) {
  const __m512i exponent_mask = _mm512_set1_epi32(0x7F800000);
  const __m512i mantissa_mask = _mm512_set1_epi32(0x007FFFFF);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    const __m512i xi = _mm512_castps_si512(x);
    const __mmask16 subnormal = _mm512_testn_epi32_mask(xi, exponent_mask) &
                                _mm512_test_epi32_mask(xi, mantissa_mask);
    __m256i packed;
    if (subnormal == 0) {
      packed = (__m256i)_mm512_cvtneps_pbh(x);  // the same 16 bit patterns
    } else {
      packed = _mm512_cvtepi32_epi16(bf16_bits_avx512(xi));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  narrow_portable(src + i, dst + i, n - i);
}

bool cpuid_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool cpuid_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
}

#pragma GCC diagnostic pop
#endif

// Elements a thread converts at a time; a conversion of up to this many runs on the calling
// thread. Converting is bound by memory bandwidth (a 2^20-element block takes ~0.25 ms on one
// core), and on a busy machine a parallel region can wait milliseconds for a descheduled
// thread: measured on 2 shared cores, widening 0.65M elements took 0.1 ms on one thread and
// up to 7 ms split across two.
constexpr std::int64_t kConvertBlock = std::int64_t{1} << 20;

// Runs convert(first, count) over [0, n) in blocks shared among the OpenMP threads, or at once
// on the calling thread.
template <class Convert>
void in_blocks(std::int64_t n, Threads threads, Convert convert) {
  if (threads == Threads::calling_thread) {
    if (n > 0) convert(0, n);
    return;
  }
  const std::int64_t blocks = (n + kConvertBlock - 1) / kConvertBlock;
#pragma omp parallel for schedule(dynamic) if (blocks > 1)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t first = b * kConvertBlock;
    convert(first, std::min(kConvertBlock, n - first));
  }
}

template <class Half>
void widen_range(detail::ConvertIsa isa, const Half* src, float* dst, std::int64_t n) {
  using detail::ConvertIsa;
#ifdef OASES_X86_CONVERT
  switch (isa) {
    case ConvertIsa::portable: break;
    case ConvertIsa::avx2_f16c:
      if constexpr (std::is_same_v<Half, BFloat16>) widen_avx2(src, dst, n);
      else widen_f16c(src, dst, n);
      return;
    case ConvertIsa::avx512:
    case ConvertIsa::avx512_bf16: widen_avx512(src, dst, n); return;
  }
#else
  (void)isa;
#endif
  widen_portable(src, dst, n);
}

template <class Half>
void narrow_range(detail::ConvertIsa isa, const float* src, Half* dst, std::int64_t n) {
  using detail::ConvertIsa;
#ifdef OASES_X86_CONVERT
  switch (isa) {
    case ConvertIsa::portable: break;
    case ConvertIsa::avx2_f16c:
      if constexpr (std::is_same_v<Half, BFloat16>) narrow_avx2(src, dst, n);
      else narrow_f16c(src, dst, n);
      return;
    case ConvertIsa::avx512: narrow_avx512(src, dst, n); return;
    case ConvertIsa::avx512_bf16:
      if constexpr (std::is_same_v<Half, BFloat16>) narrow_avx512_bf16(src, dst, n);
      else narrow_avx512(src, dst, n);
      return;
  }
#else
  (void)isa;
#endif
  narrow_portable(src, dst, n);
}

// ---- fp8 --------------------------------------------------------------------------------------

// An 8-bit format with `M` mantissa bits and exponent bias `B`; `max_code` is the magnitude
// code of the largest finite value.
struct Fp8Format {
  std::uint32_t mantissa_bits, bias, max_code;
  bool saturate;             // out-of-range values clamp to max_code (else: infinity)
  std::uint8_t nan_code;     // magnitude code of the NaN produced
  std::uint8_t inf_code;     // magnitude code of infinity (unused when saturating)
};
constexpr Fp8Format kE4M3{3, 7, 0x7E, true, 0x7F, 0};
constexpr Fp8Format kE5M2{2, 15, 0x7B, false, 0x7E, 0x7C};

constexpr std::uint8_t float_to_fp8(float value, const Fp8Format& f) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | f.nan_code;
  const uint32_t overflow_code = f.saturate ? f.max_code : f.inf_code;
  if (magnitude == 0x7F800000u) return sign | static_cast<std::uint8_t>(overflow_code);
  const uint32_t shift = 23 - f.mantissa_bits;
  // Float exponent field of the smallest normal of the format: 2^(1 - B).
  const uint32_t min_normal_field = 127 + 1 - f.bias;
  uint32_t code = 0;
  if ((magnitude >> 23) >= min_normal_field) {
    // Round the mantissa to M bits (a carry steps the exponent), then rebias the exponent
    // field from 127 to B.
    const uint32_t rounded = magnitude + ((1u << (shift - 1)) - 1) + ((magnitude >> shift) & 1u);
    code = (rounded >> shift) - ((127 - f.bias) << f.mantissa_bits);
    if (code > f.max_code) code = overflow_code;
  } else {
    // Subnormal: round(|value| / 2^(1 - B - M)). |value| = mantissa * 2^(e - 150) for the
    // float exponent field e (float subnormals are far below and round to 0).
    const uint32_t field = magnitude >> 23;
    if (field == 0) return sign;
    const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    // |value| / 2^(1 - B - M) = mantissa / 2^down with down = 150 - field + 1 - B - M.
    const uint32_t down = 150 + 1 - field - f.bias - f.mantissa_bits;
    if (down >= 25) return sign;  // below half the smallest subnormal (mantissa < 2^24)
    code = mantissa >> down;
    const uint32_t remainder = mantissa & ((1u << down) - 1);
    const uint32_t half = 1u << (down - 1);
    if (remainder > half || (remainder == half && (code & 1u))) ++code;
  }
  return static_cast<std::uint8_t>(sign | code);
}

constexpr float fp8_to_float(std::uint8_t bits, const Fp8Format& f) {
  const uint32_t sign = uint32_t{bits & 0x80u} << 24;
  const uint32_t magnitude = bits & 0x7Fu;
  if (magnitude == f.nan_code || (!f.saturate && magnitude > f.inf_code))
    return std::bit_cast<float>(sign | 0x7FC00000u);
  if (!f.saturate && magnitude == f.inf_code) return std::bit_cast<float>(sign | 0x7F800000u);
  const uint32_t exponent = magnitude >> f.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << f.mantissa_bits) - 1);
  if (exponent == 0) {  // mantissa * 2^(1 - B - M), exact in float
    const float scale = std::bit_cast<float>((127 + 1 - f.bias - f.mantissa_bits) << 23);
    return std::bit_cast<float>(sign |
                                std::bit_cast<uint32_t>(static_cast<float>(mantissa) * scale));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - f.bias) << 23) |
                              (mantissa << (23 - f.mantissa_bits)));
}

// Decoding tables: every code's value, computed at compile time (constant data).
template <const Fp8Format& F>
constexpr std::array<float, 256> fp8_table() {
  std::array<float, 256> table{};
  for (uint32_t code = 0; code < 256; ++code)
    table[code] = fp8_to_float(static_cast<std::uint8_t>(code), F);
  return table;
}
constexpr std::array<float, 256> kE4M3Values = fp8_table<kE4M3>();
constexpr std::array<float, 256> kE5M2Values = fp8_table<kE5M2>();

}  // namespace

void widen(const BFloat16* src, float* dst, std::int64_t n, Threads threads) {
  const detail::ConvertIsa isa = detail::best_convert_isa();
  in_blocks(n, threads,
            [&](std::int64_t i, std::int64_t m) { widen_range(isa, src + i, dst + i, m); });
}
void widen(const Float16* src, float* dst, std::int64_t n, Threads threads) {
  const detail::ConvertIsa isa = detail::best_convert_isa();
  in_blocks(n, threads,
            [&](std::int64_t i, std::int64_t m) { widen_range(isa, src + i, dst + i, m); });
}
void narrow(const float* src, BFloat16* dst, std::int64_t n, Threads threads) {
  const detail::ConvertIsa isa = detail::best_convert_isa();
  in_blocks(n, threads,
            [&](std::int64_t i, std::int64_t m) { narrow_range(isa, src + i, dst + i, m); });
}
void narrow(const float* src, Float16* dst, std::int64_t n, Threads threads) {
  const detail::ConvertIsa isa = detail::best_convert_isa();
  in_blocks(n, threads,
            [&](std::int64_t i, std::int64_t m) { narrow_range(isa, src + i, dst + i, m); });
}
void widen(const float* src, float* dst, std::int64_t n, Threads /*threads*/) {
  if (src != dst && n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}
void narrow(const float* src, float* dst, std::int64_t n, Threads threads) {
  widen(src, dst, n, threads);
}

std::uint8_t float_to_e4m3(float value) { return float_to_fp8(value, kE4M3); }
std::uint8_t float_to_e5m2(float value) { return float_to_fp8(value, kE5M2); }
float e4m3_to_float(std::uint8_t bits) { return kE4M3Values[bits]; }
float e5m2_to_float(std::uint8_t bits) { return kE5M2Values[bits]; }

void encode_e4m3(const float* src, std::uint8_t* dst, std::int64_t n) {
  in_blocks(n, Threads::team, [&](std::int64_t i, std::int64_t m) {
    for (std::int64_t j = i; j < i + m; ++j) dst[j] = float_to_fp8(src[j], kE4M3);
  });
}
void encode_e5m2(const float* src, std::uint8_t* dst, std::int64_t n) {
  in_blocks(n, Threads::team, [&](std::int64_t i, std::int64_t m) {
    for (std::int64_t j = i; j < i + m; ++j) dst[j] = float_to_fp8(src[j], kE5M2);
  });
}
void decode_e4m3(const std::uint8_t* src, float* dst, std::int64_t n) {
  in_blocks(n, Threads::team, [&](std::int64_t i, std::int64_t m) {
    for (std::int64_t j = i; j < i + m; ++j) dst[j] = kE4M3Values[src[j]];
  });
}
void decode_e5m2(const std::uint8_t* src, float* dst, std::int64_t n) {
  in_blocks(n, Threads::team, [&](std::int64_t i, std::int64_t m) {
    for (std::int64_t j = i; j < i + m; ++j) dst[j] = kE5M2Values[src[j]];
  });
}

namespace detail {

const char* convert_isa_name(ConvertIsa isa) {
  switch (isa) {
    case ConvertIsa::portable: return "portable";
    case ConvertIsa::avx2_f16c: return "avx2+f16c";
    case ConvertIsa::avx512: return "avx512f";
    case ConvertIsa::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

bool convert_isa_supported(ConvertIsa isa) {
#ifdef OASES_X86_CONVERT
  switch (isa) {
    case ConvertIsa::portable: return true;
    case ConvertIsa::avx2_f16c: return __builtin_cpu_supports("avx2") && cpuid_f16c();
    case ConvertIsa::avx512: return __builtin_cpu_supports("avx512f");
    case ConvertIsa::avx512_bf16: return __builtin_cpu_supports("avx512f") && cpuid_avx512_bf16();
  }
  return false;
#else
  return isa == ConvertIsa::portable;
#endif
}

ConvertIsa best_convert_isa() {
  // CPUID traps to the hypervisor in a virtual machine (tens of microseconds), so the answer
  // is found once per process; it is a constant of the machine, not mutable state.
  static const ConvertIsa best = [] {
    for (ConvertIsa isa : {ConvertIsa::avx512_bf16, ConvertIsa::avx512, ConvertIsa::avx2_f16c})
      if (convert_isa_supported(isa)) return isa;
    return ConvertIsa::portable;
  }();
  return best;
}

void widen_with(ConvertIsa isa, const BFloat16* src, float* dst, std::int64_t n) {
  OASES_ASSERT(convert_isa_supported(isa), "widen_with: {} not supported here",
               convert_isa_name(isa));
  widen_range(isa, src, dst, n);
}
void widen_with(ConvertIsa isa, const Float16* src, float* dst, std::int64_t n) {
  OASES_ASSERT(convert_isa_supported(isa), "widen_with: {} not supported here",
               convert_isa_name(isa));
  widen_range(isa, src, dst, n);
}
void narrow_with(ConvertIsa isa, const float* src, BFloat16* dst, std::int64_t n) {
  OASES_ASSERT(convert_isa_supported(isa), "narrow_with: {} not supported here",
               convert_isa_name(isa));
  narrow_range(isa, src, dst, n);
}
void narrow_with(ConvertIsa isa, const float* src, Float16* dst, std::int64_t n) {
  OASES_ASSERT(convert_isa_supported(isa), "narrow_with: {} not supported here",
               convert_isa_name(isa));
  narrow_range(isa, src, dst, n);
}

}  // namespace detail

}  // namespace oases::kernels::cpu
