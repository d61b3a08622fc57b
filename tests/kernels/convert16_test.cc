// The 16-bit storage types (core/dtype.h), the vectorised array conversions of every
// instruction family this CPU has (cpu/convert.h: portable, AVX2+F16C, AVX-512F, AVX-512 BF16),
// and the fp8 encodings e4m3 and e5m2, against references written here from the formats'
// definitions.
#include "kernels/cpu/convert.h"

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using detail::ConvertIsa;

const std::vector<ConvertIsa>& all_isas() {
  static const std::vector<ConvertIsa> isas = {ConvertIsa::portable, ConvertIsa::avx2_f16c,
                                               ConvertIsa::avx512, ConvertIsa::avx512_bf16};
  return isas;
}

// Value of an IEEE-style 16-bit pattern from its definition (exponent bits e, mantissa bits m).
double decode16(std::uint16_t bits, int m, int e) {
  const int bias = (1 << (e - 1)) - 1, all_ones = (1 << e) - 1;
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> m) & all_ones, mantissa = bits & ((1 << m) - 1);
  if (exponent == all_ones)
    return mantissa == 0 ? sign * HUGE_VAL : std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - bias - m);
  return sign * std::ldexp((1 << m) + mantissa, exponent - bias - m);
}

// Floats that exercise narrowing: every value of both 16-bit formats, the midpoints between
// neighbours of each (ties) and one float step either side of them, float subnormals,
// infinities, NaNs with several payloads (signalling ones whose kept bits are zero too), and
// random bit patterns. Odd length, so that every vector loop has a tail.
std::vector<float> narrowing_inputs() {
  std::vector<float> v;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto bits = static_cast<std::uint16_t>(p);
    for (int format = 0; format < 2; ++format) {
      const int m = format == 0 ? 7 : 10, e = format == 0 ? 8 : 5;
      const double lo = decode16(bits, m, e);
      const double hi = decode16(static_cast<std::uint16_t>(p + 1), m, e);
      if (!std::isfinite(lo)) continue;
      v.push_back(static_cast<float>(lo));
      if (!std::isfinite(hi) || (p & 0x7FFFu) == 0x7FFFu) continue;
      const auto mid = static_cast<float>((lo + hi) / 2);  // exact: at most 12 bits
      v.push_back(mid);
      v.push_back(std::nextafter(mid, HUGE_VALF));
      v.push_back(std::nextafter(mid, -HUGE_VALF));
    }
  }
  for (std::uint32_t bits :
       {0x00000001u, 0x00400000u, 0x007FFFFFu, 0x807FFFFFu, 0x00008000u, 0x7F800000u, 0xFF800000u,
        0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7F802000u, 0x7FBFFFFFu, 0x7F7FFFFFu,
        0x477FF000u, 0x477FEFFFu, 0x33000000u, 0x33000001u})
    v.push_back(std::bit_cast<float>(bits));
  std::mt19937 rng(7);
  for (int i = 0; i < 200001; ++i)
    v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  return v;
}

template <class Half>
std::uint16_t scalar_bits(float x) {
  return std::is_same_v<Half, BFloat16> ? float_to_bf16_bits(x) : float_to_f16_bits(x);
}
template <class Half>
float scalar_value(std::uint16_t b) {
  return std::is_same_v<Half, BFloat16> ? bf16_bits_to_float(b) : f16_bits_to_float(b);
}

template <class Half>
void check_every_isa() {
  const std::vector<float> inputs = narrowing_inputs();
  for (ConvertIsa isa : all_isas()) {
    if (!detail::convert_isa_supported(isa)) continue;
    SCOPED_TRACE(detail::convert_isa_name(isa));
    // Narrowing: the bits of the scalar conversion (itself checked against the formats'
    // definitions in convert_test.cc), NaN payloads included.
    std::vector<Half> narrowed(inputs.size());
    detail::narrow_with(isa, inputs.data(), narrowed.data(),
                        static_cast<std::int64_t>(inputs.size()));
    for (std::size_t i = 0; i < inputs.size(); ++i)
      ASSERT_EQ(narrowed[i].bits, scalar_bits<Half>(inputs[i]))
          << std::hex << std::bit_cast<std::uint32_t>(inputs[i]);
    // Widening every pattern (plus a tail): the scalar code's bits (the exact value; NaNs
    // with their sign and payload, made quiet for f16).
    std::vector<Half> all(65536 + 5);
    for (std::size_t p = 0; p < all.size(); ++p)
      all[p] = Half::from_bits(static_cast<std::uint16_t>(p));
    std::vector<float> widened(all.size());
    detail::widen_with(isa, all.data(), widened.data(), static_cast<std::int64_t>(all.size()));
    for (std::size_t p = 0; p < all.size(); ++p) {
      const float want = scalar_value<Half>(all[p].bits);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(widened[p]), std::bit_cast<std::uint32_t>(want)) << p;
    }
  }
}

TEST(Convert16, EveryInstructionFamilyNarrowsAndWidensAsTheScalarCode) {
  EXPECT_TRUE(detail::convert_isa_supported(ConvertIsa::portable));
  EXPECT_TRUE(detail::convert_isa_supported(detail::best_convert_isa()));
  check_every_isa<BFloat16>();
  check_every_isa<Float16>();
}

// The array entry points (the best family here, split across threads) round trip every
// pattern and send ties to even, for both formats.
template <class Half>
void check_round_trip(int m, int e) {
  std::vector<Half> all(65536);
  for (std::size_t p = 0; p < all.size(); ++p)
    all[p] = Half::from_bits(static_cast<std::uint16_t>(p));
  std::vector<float> wide(all.size());
  widen(all.data(), wide.data(), static_cast<std::int64_t>(all.size()));
  std::vector<Half> back(all.size());
  narrow(wide.data(), back.data(), static_cast<std::int64_t>(all.size()));
  const std::uint16_t quiet = static_cast<std::uint16_t>(1u << (m - 1));
  for (std::size_t p = 0; p < all.size(); ++p) {
    const double value = decode16(static_cast<std::uint16_t>(p), m, e);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(wide[p]));
      ASSERT_TRUE(std::isnan(static_cast<float>(back[p])));
      ASSERT_TRUE(back[p].bits & quiet) << "NaN made quiet";
      continue;
    }
    ASSERT_EQ(static_cast<double>(wide[p]), value) << p;
    ASSERT_EQ(back[p].bits, p) << p;
    // The midpoint to the next pattern goes to the even one of the two.
    if ((p & 0x7FFFu) >= ((((1u << e) - 1) << m) - 1)) continue;  // up to the largest finite
    const double next = decode16(static_cast<std::uint16_t>(p + 1), m, e);
    const float mid = static_cast<float>((value + next) / 2);
    Half rounded;
    narrow(&mid, &rounded, 1);
    ASSERT_EQ(rounded.bits, (p % 2 == 0) ? p : p + 1) << "tie at " << mid;
  }
}

TEST(Convert16, ArraysRoundTripEveryPatternAndTieToEven) {
  check_round_trip<BFloat16>(7, 8);
  check_round_trip<Float16>(10, 5);
}

TEST(Convert16, StorageTypesConvertLikeTheScalarFunctions) {
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 0x1p-8f)), 1.0f);  // tie to even
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(static_cast<float>(Float16(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(static_cast<float>(Float16(65520.0f))));
  EXPECT_EQ(static_cast<float>(Float16(0x1p-24f)), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(Float16(0x1p-25f).bits, 0);                        // tie to even: zero
  EXPECT_EQ(Float16(-0x1p-25f).bits, 0x8000);                  // with its sign
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(dtype_of<BFloat16>::value, DType::bf16);
  EXPECT_EQ(dtype_of<Float16>::value, DType::f16);
}

// ---- fp8 --------------------------------------------------------------------------------------

// An OCP 8-bit format from its definition: exponent bits, mantissa bits, bias; e4m3 has no
// infinities and one NaN magnitude (all ones); e5m2 reserves the top exponent as IEEE does.
struct Fp8Spec {
  const char* name;
  int e, m, bias;
  bool ieee_specials;  // e5m2: top exponent = inf / NaN; e4m3: only S.1111.111 is NaN
  std::uint8_t (*encode)(float);
  float (*decode)(std::uint8_t);
};

double fp8_value(const Fp8Spec& f, std::uint8_t code) {
  const double sign = (code & 0x80u) ? -1.0 : 1.0;
  const int exponent = (code >> f.m) & ((1 << f.e) - 1), mantissa = code & ((1 << f.m) - 1);
  const int top = (1 << f.e) - 1;
  if (f.ieee_specials && exponent == top)
    return mantissa == 0 ? sign * HUGE_VAL : std::numeric_limits<double>::quiet_NaN();
  if (!f.ieee_specials && exponent == top && mantissa == (1 << f.m) - 1)
    return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - f.bias - f.m);
  return sign * std::ldexp((1 << f.m) + mantissa, exponent - f.bias - f.m);
}

// The correctly rounded code of x by the definition: the nearest of the finite positive
// codes (ties to the even code), for e5m2 with infinity standing one step above the largest
// finite value (where IEEE rounding puts it), for e4m3 after clamping to the largest finite
// value (saturation); NaN to NaN; the sign kept.
std::uint8_t fp8_reference(const Fp8Spec& f, double x) {
  if (std::isnan(x)) return 0;  // NaN is checked separately
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  double a = std::fabs(x);
  std::vector<std::pair<double, int>> candidates;
  for (int code = 0; code < 128; ++code) {
    const double v = fp8_value(f, static_cast<std::uint8_t>(code));
    if (std::isfinite(v)) candidates.emplace_back(v, code);
  }
  const double largest = candidates.back().first;
  if (f.ieee_specials) {
    // The value 2^(emax + 1) as the next code: exponent all ones, mantissa 0: infinity.
    candidates.emplace_back(2 * std::ldexp(1.0, (1 << f.e) - 2 - f.bias),
                            (((1 << f.e) - 1) << f.m));
    if (std::isinf(a)) return static_cast<std::uint8_t>(sign | candidates.back().second);
  } else {
    a = std::min(a, largest);
  }
  int best = 0;
  double best_distance = HUGE_VAL;
  for (const auto& [v, code] : candidates) {
    const double d = std::fabs(v - a);
    if (d < best_distance || (d == best_distance && code % 2 == 0)) {
      best = code;
      best_distance = d;
    }
  }
  if (f.ieee_specials && a > candidates.back().first) best = candidates.back().second;
  return static_cast<std::uint8_t>(sign | best);
}

const Fp8Spec kE4M3{"e4m3", 4, 3, 7, false, float_to_e4m3, e4m3_to_float};
const Fp8Spec kE5M2{"e5m2", 5, 2, 15, true, float_to_e5m2, e5m2_to_float};

class Fp8Test : public ::testing::TestWithParam<const Fp8Spec*> {};

TEST_P(Fp8Test, EveryCodeDecodesToItsDefinedValue) {
  const Fp8Spec& f = *GetParam();
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    const double want = fp8_value(f, static_cast<std::uint8_t>(code));
    const float got = f.decode(static_cast<std::uint8_t>(code));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << code;
    EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << code;
    // Round trip: every value encodes to its own code.
    EXPECT_EQ(f.encode(got), code) << code;
  }
  EXPECT_EQ(nans, f.ieee_specials ? 6 : 2);  // e5m2: S.11111.{01,10,11}; e4m3: S.1111.111
}

TEST_P(Fp8Test, EncodingRoundsToNearestEvenAndSaturatesAsSpecified) {
  const Fp8Spec& f = *GetParam();
  std::vector<float> inputs;
  for (int code = 0; code < 128; ++code) {
    const double v = fp8_value(f, static_cast<std::uint8_t>(code));
    const double next = fp8_value(f, static_cast<std::uint8_t>(code + 1));
    if (!std::isfinite(v)) continue;
    const double hi =
        std::isfinite(next) ? next : 2 * v - fp8_value(f, static_cast<std::uint8_t>(code - 1));
    const auto mid = static_cast<float>((v + hi) / 2);  // exact in float
    for (float x :
         {static_cast<float>(v), mid, std::nextafter(mid, HUGE_VALF), std::nextafter(mid, 0.0f),
          static_cast<float>(v * 1.3), static_cast<float>(v * 0.9)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  for (float x : {0.0f, 1e-30f, 0x1p-130f, 500.0f, 464.0f, 463.99f, 57344.0f, 61439.0f, 61440.0f,
                  1e10f, 3.0e38f, HUGE_VALF})
    for (float s : {1.0f, -1.0f}) inputs.push_back(s * x);
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> exponent(-20, 18);
  for (int i = 0; i < 20000; ++i)
    inputs.push_back(static_cast<float>((rng() & 1 ? 1 : -1) * std::exp2(exponent(rng))));
  for (float x : inputs)
    ASSERT_EQ(f.encode(x), fp8_reference(f, static_cast<double>(x)))
        << f.name << " of " << x << " (" << std::hex << std::bit_cast<std::uint32_t>(x) << ")";
  // NaN stays NaN, with its sign.
  for (float nan : {std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7F800001u)}) {
    const std::uint8_t code = f.encode(nan);
    EXPECT_TRUE(std::isnan(f.decode(code)));
    EXPECT_EQ((code & 0x80) != 0, std::signbit(nan));
  }
  // The array forms equal the scalar ones.
  std::vector<std::uint8_t> codes(inputs.size());
  std::vector<float> decoded(inputs.size());
  const auto n = static_cast<std::int64_t>(inputs.size());
  if (f.ieee_specials) {
    encode_e5m2(inputs.data(), codes.data(), n);
    decode_e5m2(codes.data(), decoded.data(), n);
  } else {
    encode_e4m3(inputs.data(), codes.data(), n);
    decode_e4m3(codes.data(), decoded.data(), n);
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_EQ(codes[i], f.encode(inputs[i]));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(decoded[i]),
              std::bit_cast<std::uint32_t>(f.decode(codes[i])));
  }
}

TEST(Fp8, SaturationAndInfinityAsTheOcpSpecification) {
  EXPECT_EQ(e4m3_to_float(float_to_e4m3(1e6f)), 448.0f);
  EXPECT_EQ(e4m3_to_float(float_to_e4m3(-HUGE_VALF)), -448.0f);
  EXPECT_EQ(e4m3_to_float(float_to_e4m3(0x1p-9f)), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0);                      // its half: tie to zero
  EXPECT_TRUE(std::isinf(e5m2_to_float(float_to_e5m2(61440.0f))));
  EXPECT_EQ(e5m2_to_float(float_to_e5m2(61439.0f)), 57344.0f);
  EXPECT_EQ(e5m2_to_float(float_to_e5m2(0x1p-16f)), 0x1p-16f);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test, ::testing::Values(&kE4M3, &kE5M2),
                         [](const auto& param_info) {
                           return std::string(param_info.param->name);
                         });

// The Tensor entry points: 16-bit sources encode after an exact widening (one rounding), and
// decoding into 16 bits is exact (e4m3 and e5m2 values are bf16 and f16 values).
TEST(Fp8, TensorEncodeDecodeFromAndTo16Bits) {
  std::vector<float> values;
  for (int i = -300; i <= 300; ++i) values.push_back(static_cast<float>(i) * 0.37f);
  const auto n = static_cast<std::int64_t>(values.size());
  for (auto format : {kernels::Fp8Format::e4m3, kernels::Fp8Format::e5m2}) {
    std::vector<BFloat16> b(values.size());
    std::vector<Float16> h(values.size());
    kernels::convert(Tensor::of(values.data(), {n}), Tensor::of(b.data(), {n}));
    kernels::convert(Tensor::of(values.data(), {n}), Tensor::of(h.data(), {n}));
    std::vector<std::uint8_t> from_b(values.size()), from_h(values.size());
    kernels::encode_fp8(Tensor::of(b.data(), {n}), Tensor::of(from_b.data(), {n}), format);
    kernels::encode_fp8(Tensor::of(h.data(), {n}), Tensor::of(from_h.data(), {n}), format);
    std::vector<BFloat16> back_b(values.size());
    std::vector<Float16> back_h(values.size());
    kernels::decode_fp8(Tensor::of(from_b.data(), {n}), Tensor::of(back_b.data(), {n}), format);
    kernels::decode_fp8(Tensor::of(from_h.data(), {n}), Tensor::of(back_h.data(), {n}), format);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto encode = format == kernels::Fp8Format::e4m3 ? float_to_e4m3 : float_to_e5m2;
      const auto decode = format == kernels::Fp8Format::e4m3 ? e4m3_to_float : e5m2_to_float;
      ASSERT_EQ(from_b[i], encode(static_cast<float>(b[i])));
      ASSERT_EQ(from_h[i], encode(static_cast<float>(h[i])));
      ASSERT_EQ(static_cast<float>(back_b[i]), decode(from_b[i]));
      ASSERT_EQ(static_cast<float>(back_h[i]), decode(from_h[i]));
    }
  }
}

// Every element of a tensor longer than the conversions' fixed buffer (pieces of 4096 elements
// through f32) is encoded and decoded as the scalar functions do: f32 rounds once, f64 goes
// through f32 (two roundings, as documented), and decoding into f64 or bf16 is exact.
TEST(Fp8, TensorEncodeDecodeFromAndToF32AndF64AcrossPieces) {
  const std::int64_t n = 3 * 4096 + 123;
  std::vector<double> wide(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    wide[static_cast<std::size_t>(i)] = std::ldexp(std::sin(0.37 * static_cast<double>(i)),
                                                   static_cast<int>(i % 40) - 20);
  std::vector<float> narrow32(wide.begin(), wide.end());
  for (auto format : {kernels::Fp8Format::e4m3, kernels::Fp8Format::e5m2}) {
    const auto encode = format == kernels::Fp8Format::e4m3 ? float_to_e4m3 : float_to_e5m2;
    const auto decode = format == kernels::Fp8Format::e4m3 ? e4m3_to_float : e5m2_to_float;
    std::vector<std::uint8_t> from64(wide.size()), from32(wide.size());
    kernels::encode_fp8(Tensor::of(wide.data(), {n}), Tensor::of(from64.data(), {n}), format);
    kernels::encode_fp8(Tensor::of(narrow32.data(), {n}), Tensor::of(from32.data(), {n}), format);
    std::vector<double> back64(wide.size());
    std::vector<BFloat16> back16(wide.size());
    kernels::decode_fp8(Tensor::of(from64.data(), {n}), Tensor::of(back64.data(), {n}), format);
    kernels::decode_fp8(Tensor::of(from32.data(), {n}), Tensor::of(back16.data(), {n}), format);
    for (std::size_t i = 0; i < wide.size(); ++i) {
      ASSERT_EQ(from64[i], encode(static_cast<float>(wide[i]))) << i;
      ASSERT_EQ(from32[i], encode(narrow32[i])) << i;
      ASSERT_EQ(back64[i], static_cast<double>(decode(from64[i]))) << i;
      ASSERT_EQ(static_cast<float>(back16[i]), decode(from32[i])) << i;
    }
  }
}

// The reduction MPI's 16-bit operators run: sums formed in double and rounded once, max and min
// keeping one operand's bits with NaN winning, over random bit patterns of each format (NaNs,
// infinities and subnormals included) and the ties of round to nearest even.
template <class Half>
void check_reduce_into() {
  constexpr DType kType = std::is_same_v<Half, BFloat16> ? DType::bf16 : DType::f16;
  const auto widen_one = [](Half h) {
    return static_cast<double>(kType == DType::bf16 ? bf16_bits_to_float(h.bits)
                                                    : f16_bits_to_float(h.bits));
  };
  const auto round_one = [](double v) {
    return kType == DType::bf16 ? double_to_bf16_bits(v) : double_to_f16_bits(v);
  };
  std::mt19937 rng(11);
  const std::int64_t n = 5000;
  std::vector<Half> in(static_cast<std::size_t>(n)), other(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = Half::from_bits(static_cast<std::uint16_t>(rng()));
    // Half of the pairs are close in magnitude, where sums round.
    other[i] = Half::from_bits(static_cast<std::uint16_t>(
        i % 2 ? rng() : (in[i].bits ^ (rng() & 0x00FFu))));
  }
  for (kernels::Reduction op :
       {kernels::Reduction::sum, kernels::Reduction::max, kernels::Reduction::min}) {
    std::vector<Half> inout = other;
    kernels::reduce_into(Tensor(in.data(), kType, {n}), Tensor(inout.data(), kType, {n}), op);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const double x = widen_one(in[i]), y = widen_one(other[i]);
      if (std::isnan(x) || std::isnan(y)) {
        ASSERT_TRUE(std::isnan(widen_one(inout[i]))) << i;
        // Which payload a sum of two NaNs carries is the processor's choice of operand.
        if (op == kernels::Reduction::sum) continue;
      }
      std::uint16_t want = other[i].bits;
      if (op == kernels::Reduction::sum) want = round_one(x + y);
      if (op == kernels::Reduction::max && (x > y || std::isnan(x))) want = in[i].bits;
      if (op == kernels::Reduction::min && (x < y || std::isnan(x))) want = in[i].bits;
      ASSERT_EQ(inout[i].bits, want) << i;
    }
  }
}

TEST(Reduce16, SumsRoundOnceAndNanWinsInEitherFormat) {
  check_reduce_into<BFloat16>();
  check_reduce_into<Float16>();
  // Ties go to even: 1 + 2^-8 is halfway between bf16's 1 and 1 + 2^-7, and (1 + 2^-7) + 2^-8
  // halfway between 1 + 2^-7 and 1 + 2^-6.
  std::vector<BFloat16> a{BFloat16(0x1p-8f), BFloat16(0x1p-8f)};
  std::vector<BFloat16> b{BFloat16(1.0f), BFloat16(1.0f + 0x1p-7f)};
  kernels::reduce_into(Tensor(a.data(), DType::bf16, {2}), Tensor(b.data(), DType::bf16, {2}),
                       kernels::Reduction::sum);
  EXPECT_EQ(static_cast<float>(b[0]), 1.0f);
  EXPECT_EQ(static_cast<float>(b[1]), 1.0f + 0x1p-6f);
}

TEST(Reduce16, OtherTypesAreInternalErrors) {
  std::vector<float> f(4);
  std::vector<BFloat16> b(4);
  std::vector<Float16> h(4);
  EXPECT_THROW(kernels::reduce_into(Tensor::of(f.data(), {4}), Tensor::of(f.data(), {4}),
                                    kernels::Reduction::sum),
               InternalError);
  EXPECT_THROW(kernels::reduce_into(Tensor(b.data(), DType::bf16, {4}),
                                    Tensor(h.data(), DType::f16, {4}), kernels::Reduction::sum),
               InternalError);
}

}  // namespace
}  // namespace oases::kernels::cpu
