#include "kernels/cpu/rotary.h"

#include "core/error.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::expect_gradient_matches;
using oases::testing::random_vector;

constexpr double kTheta = 10000.0;  // LLaMA's rope_theta

double reference_angle(std::int64_t t, std::int64_t i, std::int64_t head_dim, double theta) {
  return static_cast<double>(t) *
         std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
}

template <class T>
struct Tables {
  Tables(std::int64_t seq, std::int64_t head_dim, double theta)
      : cos(static_cast<std::size_t>(seq * head_dim / 2)), sin(cos.size()) {
    rotary_tables(seq, rotary_inverse_frequencies(head_dim, theta), cos.data(), sin.data());
  }
  std::vector<T> cos, sin;
};

// The buffer under test: [B, seq, ld] rows with the rotated heads at column `offset`.
struct Layout {
  std::int64_t B, seq, ld, offset, heads, head_dim;
  std::size_t size() const { return static_cast<std::size_t>(B * seq * ld); }
  bool rotated(std::int64_t column) const {
    return column >= offset && column < offset + heads * head_dim;
  }
};

// Each pair (x[i], x[i + d/2]) as the complex number x[i] + i x[i + d/2], times
// exp(i * angle), computed in double from the definition (not from the tables).
std::vector<double> complex_reference(const std::vector<double>& x, const Layout& l, double theta,
                                      bool inverse) {
  std::vector<double> y = x;
  const std::int64_t half = l.head_dim / 2;
  for (std::int64_t b = 0; b < l.B; ++b) {
    for (std::int64_t t = 0; t < l.seq; ++t) {
      for (std::int64_t h = 0; h < l.heads; ++h) {
        const std::size_t base =
            static_cast<std::size_t>((b * l.seq + t) * l.ld + l.offset + h * l.head_dim);
        for (std::int64_t i = 0; i < half; ++i) {
          const double angle = reference_angle(t, i, l.head_dim, theta) * (inverse ? -1 : 1);
          const std::size_t j1 = base + static_cast<std::size_t>(i);
          const std::size_t j2 = j1 + static_cast<std::size_t>(half);
          const std::complex<double> z =
              std::complex<double>(x[j1], x[j2]) * std::polar(1.0, angle);
          y[j1] = z.real();
          y[j2] = z.imag();
        }
      }
    }
  }
  return y;
}

template <class T>
class RotaryTest : public ::testing::Test {};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(RotaryTest, Floats);

TYPED_TEST(RotaryTest, TablesAreTheDefinitionRoundedToT) {
  using T = TypeParam;
  const std::int64_t seq = 37, head_dim = 10;
  const Tables<T> tables(seq, head_dim, kTheta);
  for (std::int64_t t = 0; t < seq; ++t) {
    for (std::int64_t i = 0; i < head_dim / 2; ++i) {
      const double angle = reference_angle(t, i, head_dim, kTheta);
      const auto k = static_cast<std::size_t>(t * head_dim / 2 + i);
      EXPECT_NEAR(tables.cos[k], static_cast<T>(std::cos(angle)), 1e-15) << t << "," << i;
      EXPECT_NEAR(tables.sin[k], static_cast<T>(std::sin(angle)), 1e-15) << t << "," << i;
    }
  }
  EXPECT_EQ(tables.cos[0], T(1));  // position 0 is the identity
  EXPECT_EQ(tables.sin[0], T(0));
}

// Strided rows with other columns on both sides of the rotated heads, which must not change.
TYPED_TEST(RotaryTest, ApplyMatchesComplexReferenceAndLeavesOtherColumns) {
  using T = TypeParam;
  const Layout l{2, 9, 3 * 2 * 6 + 5, 2 * 6 + 1, 2, 6};
  const Tables<T> tables(l.seq + 4, l.head_dim, 500.0);  // more positions than rows need
  const std::vector<double> x = random_vector(l.size(), 1, -2.0, 2.0);
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-14;
  for (bool inverse : {false, true}) {
    std::vector<T> y(x.begin(), x.end());
    const std::vector<double> before(y.begin(), y.end());
    rotary_apply(y.data() + l.offset, l.ld, l.B, l.seq, l.heads, l.head_dim, tables.cos.data(),
                 tables.sin.data(), inverse);
    // The reference starts from the values rotary_apply saw (x rounded to T).
    const std::vector<double> expected = complex_reference(before, l, 500.0, inverse);
    for (std::size_t j = 0; j < y.size(); ++j) {
      const std::int64_t column = static_cast<std::int64_t>(j) % l.ld;
      if (l.rotated(column)) {
        ASSERT_NEAR(y[j], expected[j], tol) << "inverse=" << inverse << " element " << j;
      } else {
        ASSERT_EQ(y[j], static_cast<T>(x[j])) << "column " << column << " changed";
      }
    }
  }
}

TYPED_TEST(RotaryTest, InverseUndoesApply) {
  using T = TypeParam;
  const std::int64_t B = 3, seq = 50, heads = 3, head_dim = 16, ld = heads * head_dim;
  const Tables<T> tables(seq, head_dim, kTheta);
  const std::vector<double> x = random_vector(static_cast<std::size_t>(B * seq * ld), 2);
  std::vector<T> y(x.begin(), x.end());
  rotary_apply(y.data(), ld, B, seq, heads, head_dim, tables.cos.data(), tables.sin.data(), false);
  double moved = 0;
  for (std::size_t j = 0; j < y.size(); ++j) moved = std::max(moved, std::abs(y[j] - x[j]));
  EXPECT_GT(moved, 0.1);  // the forward rotation did something
  rotary_apply(y.data(), ld, B, seq, heads, head_dim, tables.cos.data(), tables.sin.data(), true);
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-15;
  for (std::size_t j = 0; j < y.size(); ++j) ASSERT_NEAR(y[j], x[j], tol) << j;
}

// The "rotate half" pairing (Hugging Face LLaMA), not GPT-NeoX-style interleaving: at t = 1,
// inv_freq[0] = 1, so e_0 turns towards e_{d/2}.
TEST(Rotary, PairsElementIWithElementIPlusHalf) {
  const std::int64_t seq = 2, head_dim = 4;
  const Tables<double> tables(seq, head_dim, kTheta);
  std::vector<double> x = {9, 9, 9, 9, 1, 0, 0, 0};  // row t = 1 holds e_0
  rotary_apply(x.data(), head_dim, 1, seq, 1, head_dim, tables.cos.data(), tables.sin.data(),
               false);
  EXPECT_EQ(x[0], 9.0);  // row t = 0: the identity
  EXPECT_NEAR(x[4], std::cos(1.0), 1e-16);
  EXPECT_EQ(x[5], 0.0);
  EXPECT_NEAR(x[6], std::sin(1.0), 1e-16);
  EXPECT_EQ(x[7], 0.0);
}

// L = sum(w * rotate(x)); its gradient is the inverse rotation of w.
TEST(Rotary, InverseIsTheBackwardPass) {
  const Layout l{2, 5, 2 * 6 + 3, 3, 2, 6};
  const Tables<double> tables(l.seq, l.head_dim, 100.0);
  std::vector<double> x = random_vector(l.size(), 3);
  std::vector<double> w = random_vector(l.size(), 4);
  for (std::size_t j = 0; j < w.size(); ++j)
    if (!l.rotated(static_cast<std::int64_t>(j) % l.ld)) w[j] = 0.0;  // only rotated outputs
  std::vector<double> grad = w;
  rotary_apply(grad.data() + l.offset, l.ld, l.B, l.seq, l.heads, l.head_dim, tables.cos.data(),
               tables.sin.data(), true);
  expect_gradient_matches("dx", x, grad, [&] {
    std::vector<double> y = x;
    rotary_apply(y.data() + l.offset, l.ld, l.B, l.seq, l.heads, l.head_dim, tables.cos.data(),
                 tables.sin.data(), false);
    return oases::testing::dot(w, y);
  });
}

TEST(Rotary, OddHeadDimIsAnInternalError) {
  std::vector<float> c(16), s(16), x(16);
  EXPECT_THROW(rotary_inverse_frequencies(3, kTheta), InternalError);
  EXPECT_THROW(rotary_apply(x.data(), 3, 1, 2, 1, 3, c.data(), s.data(), false), InternalError);
  EXPECT_THROW(rotary_apply(x.data(), 3, 1, 2, 1, 4, c.data(), s.data(), false), InternalError);
}

// Tables and both rotations are bitwise equal at 1, 2 and 3 threads.
TEST(Rotary, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t B = 3, seq = 150, heads = 5, head_dim = 32, ld = heads * head_dim + 7;
  const auto xd = random_vector(B * seq * ld, 61);
  const std::vector<float> x(xd.begin(), xd.end());
  expect_independent_of_thread_count("rotary", [&] {
    std::vector<float> cos(seq * head_dim / 2), sin(seq * head_dim / 2), forward = x;
    rotary_tables(seq, rotary_inverse_frequencies(head_dim, 10000.0), cos.data(), sin.data());
    rotary_apply(forward.data(), ld, B, seq, heads, head_dim, cos.data(), sin.data(), false);
    std::vector<float> inverse = forward;
    rotary_apply(inverse.data(), ld, B, seq, heads, head_dim, cos.data(), sin.data(), true);
    for (const auto* part : {&cos, &sin, &inverse}) append(forward, *part);
    return forward;
  });
}

}  // namespace
}  // namespace oases::kernels::cpu
