#include "kernels/cpu/convert.h"

#include "core/error.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using std::uint16_t;
using std::uint32_t;

// An independent description of each 16-bit format, from which the tests derive values and
// correctly rounded results without using the code under test.
struct Format {
  const char* name;
  int mantissa_bits;    // stored mantissa bits
  int bias;             // exponent bias
  uint16_t max_finite;  // bit pattern of the largest finite value
  double (*decode)(uint16_t);
  uint16_t (*from_float)(float);
  float (*to_float)(uint16_t);
  uint16_t (*from_double)(double);
};

// Value of a bit pattern by the IEEE definition, computed with ldexp in double.
double decode_ieee(uint16_t bits, int mantissa_bits, int exponent_bits, int bias) {
  const int exponent_all_ones = (1 << exponent_bits) - 1;
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> mantissa_bits) & exponent_all_ones;
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  if (exponent == exponent_all_ones)
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - bias - mantissa_bits);
  return sign * std::ldexp((1 << mantissa_bits) + mantissa, exponent - bias - mantissa_bits);
}

const Format kBf16{"bf16",
                   7,
                   127,
                   0x7F7F,
                   [](uint16_t b) { return decode_ieee(b, 7, 8, 127); },
                   float_to_bf16_bits,
                   bf16_bits_to_float,
                   double_to_bf16_bits};
const Format kF16{"f16",
                  10,
                  15,
                  0x7BFF,
                  [](uint16_t b) { return decode_ieee(b, 10, 5, 15); },
                  float_to_f16_bits,
                  f16_bits_to_float,
                  double_to_f16_bits};

bool is_nan_pattern(const Format& f, uint16_t bits) {
  const uint16_t exponent_mask = static_cast<uint16_t>(0x7FFFu & ~((1u << f.mantissa_bits) - 1));
  return (bits & exponent_mask) == exponent_mask && (bits & ((1u << f.mantissa_bits) - 1)) != 0;
}

// Round to nearest, ties to even, by search over the positive finite patterns (their values
// increase with the pattern). The value past the largest finite one is the next power of two,
// whose pattern (max_finite + 1) is infinity: so overflow follows the IEEE rule too. Midpoints
// of neighbours are exact in double.
uint16_t reference_round(const Format& f, double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::abs(x);
  uint16_t lo = 0, hi = static_cast<uint16_t>(f.max_finite + 1);
  const double top = std::ldexp(1.0, (f.max_finite >> f.mantissa_bits) - f.bias + 1);
  auto value = [&](uint16_t bits) { return bits == f.max_finite + 1 ? top : f.decode(bits); };
  if (a >= top) return static_cast<uint16_t>(sign | hi);
  while (hi - lo > 1) {  // invariant: value(lo) <= a < value(hi)
    const auto mid = static_cast<uint16_t>((lo + hi) / 2);
    (value(mid) <= a ? lo : hi) = mid;
  }
  const double midpoint = (value(lo) + value(hi)) / 2;
  const uint16_t pick = a < midpoint ? lo : a > midpoint ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | pick);
}

class ConvertFormatTest : public ::testing::TestWithParam<const Format*> {};
INSTANTIATE_TEST_SUITE_P(Formats, ConvertFormatTest, ::testing::Values(&kBf16, &kF16),
                         [](const auto& test) { return std::string(test.param->name); });

// Every one of the 65536 patterns widens to its IEEE value and narrows back to itself; NaNs
// stay NaN (with their sign), and quiet NaNs keep every bit.
TEST_P(ConvertFormatTest, EveryBitPatternRoundTripsThroughFloat) {
  const Format& f = *GetParam();
  const uint16_t quiet_bit = static_cast<uint16_t>(1u << (f.mantissa_bits - 1));
  for (uint32_t pattern = 0; pattern < 65536; ++pattern) {
    const auto bits = static_cast<uint16_t>(pattern);
    const float widened = f.to_float(bits);
    const uint16_t back = f.from_float(widened);
    if (is_nan_pattern(f, bits)) {
      ASSERT_TRUE(std::isnan(widened)) << std::hex << pattern;
      ASSERT_TRUE(is_nan_pattern(f, back)) << std::hex << pattern;
      ASSERT_EQ(back & 0x8000, bits & 0x8000) << std::hex << pattern;
      ASSERT_TRUE(back & quiet_bit) << "NaN made quiet: " << std::hex << pattern;
      if (bits & quiet_bit) {
        ASSERT_EQ(back, bits) << std::hex << pattern;
      }
      continue;
    }
    const double expected = f.decode(bits);
    ASSERT_EQ(static_cast<double>(widened), expected) << std::hex << pattern;
    ASSERT_EQ(std::signbit(widened), (bits & 0x8000) != 0) << std::hex << pattern;
    ASSERT_EQ(back, bits) << std::hex << pattern;
    ASSERT_EQ(f.from_double(expected), bits) << std::hex << pattern;
  }
}

// Ties between every pair of neighbouring values (positive and negative, subnormals and the
// overflow threshold included) go to the even pattern; a float or double one step off the tie
// goes to the nearer neighbour. The doubles sit closer to the tie than float can resolve, which
// is where rounding through float would go wrong.
TEST_P(ConvertFormatTest, TiesGoToEvenAndNeighboursToTheNearerValue) {
  const Format& f = *GetParam();
  for (uint32_t lo = 0; lo <= f.max_finite; ++lo) {
    const double top = std::ldexp(1.0, (f.max_finite >> f.mantissa_bits) - f.bias + 1);
    const double hi_value = lo == f.max_finite ? top : f.decode(static_cast<uint16_t>(lo + 1));
    const double midpoint = (f.decode(static_cast<uint16_t>(lo)) + hi_value) / 2;
    const auto even = static_cast<uint16_t>(lo % 2 == 0 ? lo : lo + 1);
    for (double sign : {1.0, -1.0}) {
      const uint16_t sign_bit = sign < 0 ? 0x8000 : 0;
      const double tie = sign * midpoint;
      ASSERT_EQ(f.from_float(static_cast<float>(tie)), sign_bit | even) << std::hex << lo;
      ASSERT_EQ(f.from_double(tie), sign_bit | even) << std::hex << lo;
      const auto below = static_cast<uint16_t>(sign_bit | lo);
      const auto above = static_cast<uint16_t>(sign_bit | (lo + 1));
      const double toward_zero = std::nextafter(midpoint, 0.0) * sign;
      const double away = std::nextafter(midpoint, std::numeric_limits<double>::infinity()) * sign;
      ASSERT_EQ(f.from_double(toward_zero), below) << std::hex << lo;
      ASSERT_EQ(f.from_double(away), above) << std::hex << lo;
      const float toward_zero_f = std::nextafter(static_cast<float>(midpoint), 0.0f);
      const float away_f =
          std::nextafter(static_cast<float>(midpoint), std::numeric_limits<float>::infinity());
      ASSERT_EQ(f.from_float(toward_zero_f * static_cast<float>(sign)), below) << std::hex << lo;
      ASSERT_EQ(f.from_float(away_f * static_cast<float>(sign)), above) << std::hex << lo;
    }
  }
}

// Random floats and doubles over the whole exponent range against the search reference.
TEST_P(ConvertFormatTest, RandomValuesRoundCorrectly) {
  const Format& f = *GetParam();
  const auto mantissas = oases::testing::random_vector(200000, 7, 1.0, 2.0);
  const auto exponents = oases::testing::random_vector(200000, 8, -160.0, 140.0);
  for (std::size_t i = 0; i < mantissas.size(); ++i) {
    const double sign = i % 2 ? -1.0 : 1.0;
    const double d = sign * std::ldexp(mantissas[i], static_cast<int>(std::floor(exponents[i])));
    ASSERT_EQ(f.from_double(d), reference_round(f, d)) << d;
    const float x = static_cast<float>(d);
    ASSERT_EQ(f.from_float(x), reference_round(f, x)) << x;
  }
}

TEST(Convert, HandPickedBf16Values) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1p-8f), 0x3F80);      // tie, to even (down)
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie, to even (up)
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-23f), 0x3F81);
  EXPECT_EQ(float_to_bf16_bits(-(1.0f + 0x1p-8f)), 0xBF80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // overflow
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x7FC00001u)), 0x7FC0);
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // signalling
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0xFF810000u)), 0xFFC1);
  // Rounding through float would round twice: to the midpoint, then to even.
  const double above_tie = 1.0 + 0x1p-8 + 0x1p-40;
  EXPECT_EQ(float_to_bf16_bits(static_cast<float>(above_tie)), 0x3F80);
  EXPECT_EQ(double_to_bf16_bits(above_tie), 0x3F81);
  EXPECT_EQ(double_to_bf16_bits(1e300), 0x7F80);
  EXPECT_EQ(double_to_bf16_bits(-1e-300), 0x8000);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(double_to_bf16_bits(std::nan("")))));
}

TEST(Convert, HandPickedF16Values) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16_bits(1.0f + 0x1p-11f), 0x3C00);      // tie, to even (down)
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, to even (up)
  EXPECT_EQ(float_to_f16_bits(2049.0f), 0x6800);              // 2048
  EXPECT_EQ(float_to_f16_bits(2051.0f), 0x6802);              // 2052
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7BFF);             // largest finite
  EXPECT_EQ(float_to_f16_bits(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7C00);  // the tie above the largest: to inf
  EXPECT_EQ(float_to_f16_bits(1e10f), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_f16_bits(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16_bits(0x1p-25f), 0x0000);  // tie between 0 and 2^-24: to even 0
  EXPECT_EQ(float_to_f16_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_f16_bits(3 * 0x1p-25f), 0x0002);         // tie: to even (up)
  EXPECT_EQ(float_to_f16_bits(5 * 0x1p-25f), 0x0002);         // tie: to even (down)
  EXPECT_EQ(float_to_f16_bits(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up to the first normal
  EXPECT_EQ(float_to_f16_bits(0x1p-14f - 3 * 0x1p-25f), 0x03FE);
  EXPECT_EQ(float_to_f16_bits(-0x1p-26f), 0x8000);
  EXPECT_EQ(float_to_f16_bits(std::bit_cast<float>(0x7F800001u)), 0x7E00);  // signalling NaN
  EXPECT_EQ(float_to_f16_bits(std::bit_cast<float>(0xFFC02000u)), 0xFE01);
  EXPECT_EQ(f16_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_bits_to_float(0x03FF), 0x3FFp-24f);
  EXPECT_EQ(f16_bits_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(double_to_f16_bits(65519.999999999), 0x7BFF);
  EXPECT_EQ(double_to_f16_bits(1.0 + 0x1p-11 + 0x1p-50), 0x3C01);
}

template <class T>
std::vector<T> bytes_as(const std::vector<unsigned char>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// convert_elements agrees with the scalar functions for every pair of types, on a buffer long
// enough to go parallel.
TEST(ConvertElements, EveryPairMatchesTheScalarFunctions) {
  const std::int64_t n = 70001;
  auto values = oases::testing::random_vector(n, 21, -70000.0, 70000.0);
  const auto small = oases::testing::random_vector(n, 22, -1e-4, 1e-4);
  for (std::int64_t i = 0; i < n; i += 3) values[i] = small[i];
  values[1] = std::numeric_limits<double>::infinity();
  values[2] = std::nan("");
  values[4] = -0.0;
  // The source buffers of each type, each from the double values by the scalar functions.
  std::vector<double> f64 = values;
  std::vector<float> f32(n);
  std::vector<uint16_t> bf16(n), f16(n);
  for (std::int64_t i = 0; i < n; ++i) {
    f32[i] = static_cast<float>(values[i]);
    bf16[i] = double_to_bf16_bits(values[i]);
    f16[i] = double_to_f16_bits(values[i]);
  }
  struct Buffer {
    DType type;
    const void* data;
  };
  const Buffer sources[] = {{DType::f64, f64.data()},
                            {DType::f32, f32.data()},
                            {DType::bf16, bf16.data()},
                            {DType::f16, f16.data()}};
  // Element i of source `s` converted to `d` by the scalar functions, as double (so NaN
  // compares through isnan) or as 16-bit pattern.
  auto expected_double = [&](DType s, std::int64_t i) -> double {
    switch (s) {
      case DType::f64:
        return f64[i];
      case DType::f32:
        return f32[i];
      case DType::bf16:
        return bf16_bits_to_float(bf16[i]);
      default:
        return f16_bits_to_float(f16[i]);
    }
  };
  for (const Buffer& s : sources) {
    for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(s.type) << " -> " << dtype_name(d));
      std::vector<unsigned char> out(static_cast<std::size_t>(n) * dtype_size(d), 0xAB);
      convert_elements(s.data, s.type, out.data(), d, n);
      for (std::int64_t i = 0; i < n; ++i) {
        const double x = expected_double(s.type, i);
        if (d == DType::f64 || d == DType::f32) {
          const double got = d == DType::f64 ? bytes_as<double>(out)[i] : bytes_as<float>(out)[i];
          const double want = d == DType::f64 ? x : static_cast<float>(x);
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << i;
          } else {
            ASSERT_EQ(got, want) << i;
          }
          if (i > 100 && i < n - 100) i += 97;  // the middle is sampled; both ends read fully
          continue;
        }
        const uint16_t got = bytes_as<uint16_t>(out)[i];
        const uint16_t want = d == DType::bf16 ? double_to_bf16_bits(x) : double_to_f16_bits(x);
        ASSERT_EQ(got, want) << i << " value " << x;
        if (i > 100 && i < n - 100) i += 97;
      }
    }
  }
}

TEST(ConvertElements, NonFloatTypesAreInternalErrors) {
  std::vector<float> a(4), b(4);
  EXPECT_THROW(convert_elements(a.data(), DType::i32, b.data(), DType::f32, 4), InternalError);
  EXPECT_THROW(convert_elements(a.data(), DType::f32, b.data(), DType::u16, 4), InternalError);
}

// Every pair of types converts bitwise equally at 1, 2 and 3 threads.
TEST(ConvertElements, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t n = 70001;
  const std::vector<double> f64 = oases::testing::random_vector(n, 23, -70000.0, 70000.0);
  std::vector<float> f32(n);
  std::vector<uint16_t> bf16(n), f16(n);
  for (std::int64_t i = 0; i < n; ++i) {
    f32[i] = static_cast<float>(f64[i]);
    bf16[i] = double_to_bf16_bits(f64[i]);
    f16[i] = double_to_f16_bits(f64[i]);
  }
  const std::pair<DType, const void*> sources[] = {{DType::f64, f64.data()},
                                                   {DType::f32, f32.data()},
                                                   {DType::bf16, bf16.data()},
                                                   {DType::f16, f16.data()}};
  oases::testing::expect_independent_of_thread_count("convert", [&] {
    std::vector<unsigned char> all;
    for (const auto& [type, data] : sources) {
      for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
        std::vector<unsigned char> out(static_cast<std::size_t>(n) * dtype_size(d), 0xAB);
        convert_elements(data, type, out.data(), d, n);
        all.insert(all.end(), out.begin(), out.end());
      }
    }
    return all;
  });
}

}  // namespace
}  // namespace oases::kernels::cpu
