#include "kernels/cpu/swiglu.h"

#include "core/error.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::expect_gradient_matches;
using oases::testing::random_vector;

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}
double silu_slope(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s + g * s * (1.0 - s);
}

// gate and up as the two halves of one fused [n, 2F + pad] projection output, out rows at a
// stride with padding that must stay untouched.
struct Fused {
  std::int64_t n, F, ld_in, ld_out;
  std::vector<double> in;
  Fused(std::int64_t rows, std::int64_t width, std::uint64_t seed, double lo, double hi)
      : n(rows),
        F(width),
        ld_in(2 * width + 1),
        ld_out(width + 3),
        in(random_vector(static_cast<std::size_t>(rows * ld_in), seed, lo, hi)) {}
  double gate(std::int64_t i, std::int64_t j) const {
    return in[static_cast<std::size_t>(i * ld_in + j)];
  }
  double up(std::int64_t i, std::int64_t j) const {
    return in[static_cast<std::size_t>(i * ld_in + F + j)];
  }
};

TEST(SwiGlu, ForwardMatchesDefinitionOnFusedStridedRows) {
  const Fused f(5, 13, 1, -8.0, 8.0);
  std::vector<double> out(static_cast<std::size_t>(f.n * f.ld_out), -3.0);
  swiglu_forward(f.in.data(), f.in.data() + f.F, f.ld_in, out.data(), f.ld_out, f.n, f.F);
  const std::vector<float> in_f(f.in.begin(), f.in.end());
  std::vector<float> out_f(out.size(), -3.0f);
  swiglu_forward(in_f.data(), in_f.data() + f.F, f.ld_in, out_f.data(), f.ld_out, f.n, f.F);
  for (std::int64_t i = 0; i < f.n; ++i) {
    for (std::int64_t j = 0; j < f.ld_out; ++j) {
      const auto k = static_cast<std::size_t>(i * f.ld_out + j);
      if (j >= f.F) {
        ASSERT_EQ(out[k], -3.0) << "padding " << i << "," << j;
        ASSERT_EQ(out_f[k], -3.0f) << "padding " << i << "," << j;
        continue;
      }
      const double expected = silu(f.gate(i, j)) * f.up(i, j);
      ASSERT_NEAR(out[k], expected, 1e-15 * (1 + std::abs(expected))) << i << "," << j;
      // Float against the double definition on the float-rounded inputs.
      const double g = static_cast<float>(f.gate(i, j)), u = static_cast<float>(f.up(i, j));
      const double expected_f = silu(g) * u;
      ASSERT_NEAR(out_f[k], expected_f, 1e-6 * std::abs(expected_f) + 1e-30) << i << "," << j;
    }
  }
}

// Far outside the range where exp is exact or finite: results stay finite and close to the
// limits silu(g) -> g for large g and -> 0 for very negative g.
TEST(SwiGlu, ExtremeGatesStayFinite) {
  const std::vector<double> gate = {-1000.0, -100.0, -88.5, -87.0, 0.0, 87.0, 100.0, 1000.0};
  const std::int64_t F = static_cast<std::int64_t>(gate.size());
  const std::vector<double> up(gate.size(), 2.0), dout(gate.size(), 1.0);
  std::vector<double> out(gate.size()), dgate(gate.size()), dup(gate.size());
  swiglu_forward(gate.data(), up.data(), F, out.data(), F, 1, F);
  swiglu_backward(gate.data(), up.data(), F, dout.data(), F, dgate.data(), dup.data(), F, 1, F);
  const std::vector<float> gate_f(gate.begin(), gate.end()), up_f(up.begin(), up.end()),
      dout_f(dout.begin(), dout.end());
  std::vector<float> out_f(gate.size()), dgate_f(gate.size()), dup_f(gate.size());
  swiglu_forward(gate_f.data(), up_f.data(), F, out_f.data(), F, 1, F);
  swiglu_backward(gate_f.data(), up_f.data(), F, dout_f.data(), F, dgate_f.data(), dup_f.data(), F,
                  1, F);
  for (std::size_t j = 0; j < gate.size(); ++j) {
    const double g = gate[j];
    const double expected = g > 0 ? 2.0 * silu(g) : 0.0;
    const double expected_slope = g > 0 ? 2.0 * silu_slope(g) : (g == 0 ? 1.0 : 0.0);
    ASSERT_TRUE(std::isfinite(out[j]) && std::isfinite(dgate[j]) && std::isfinite(dup[j])) << g;
    ASSERT_TRUE(std::isfinite(out_f[j]) && std::isfinite(dgate_f[j]) && std::isfinite(dup_f[j]))
        << g;
    EXPECT_NEAR(out[j], expected, 1e-13 * std::abs(g) + 1e-30) << g;
    EXPECT_NEAR(dgate[j], expected_slope, 1e-13) << g;
    EXPECT_NEAR(out_f[j], expected, 1e-6 * std::abs(g) + 1e-30) << g;
    EXPECT_NEAR(dgate_f[j], expected_slope, 1e-6) << g;
    EXPECT_NEAR(dup_f[j], out_f[j] / 2, 1e-6 * std::abs(g) + 1e-30) << g;
  }
}

TEST(SwiGlu, ForwardInPlaceOverGate) {
  const std::int64_t n = 3, F = 7, ld = 2 * F;
  const auto in = random_vector(static_cast<std::size_t>(n * ld), 2, -4.0, 4.0);
  std::vector<double> expected(static_cast<std::size_t>(n * ld), 0.0), in_place = in;
  swiglu_forward(in.data(), in.data() + F, ld, expected.data(), ld, n, F);
  swiglu_forward(in_place.data(), in_place.data() + F, ld, in_place.data(), ld, n, F);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < F; ++j) ASSERT_EQ(in_place[i * ld + j], expected[i * ld + j]);
}

// L = sum(w * out), gradients into one fused [n, 2F + 2] buffer (dgate then dup).
TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  Fused f(3, 5, 3, -5.0, 5.0);
  const std::int64_t ld_grad = 2 * f.F + 2;
  const auto w = random_vector(static_cast<std::size_t>(f.n * f.ld_out), 4);
  std::vector<double> grad(static_cast<std::size_t>(f.n * ld_grad), 1e30);
  swiglu_backward(f.in.data(), f.in.data() + f.F, f.ld_in, w.data(), f.ld_out, grad.data(),
                  grad.data() + f.F, ld_grad, f.n, f.F);
  // The analytic gradient in the layout of f.in (the unused column gets 0).
  std::vector<double> analytic(f.in.size(), 0.0);
  for (std::int64_t i = 0; i < f.n; ++i)
    for (std::int64_t j = 0; j < 2 * f.F; ++j) analytic[i * f.ld_in + j] = grad[i * ld_grad + j];
  for (std::int64_t i = 0; i < f.n; ++i)
    for (std::int64_t j = 2 * f.F; j < ld_grad; ++j) EXPECT_EQ(grad[i * ld_grad + j], 1e30);
  std::vector<double> out(w.size(), 0.0);
  expect_gradient_matches("d(gate, up)", f.in, analytic, [&] {
    swiglu_forward(f.in.data(), f.in.data() + f.F, f.ld_in, out.data(), f.ld_out, f.n, f.F);
    double total = 0;
    for (std::int64_t i = 0; i < f.n; ++i)
      for (std::int64_t j = 0; j < f.F; ++j) total += w[i * f.ld_out + j] * out[i * f.ld_out + j];
    return total;
  });
}

TEST(SwiGlu, FloatBackwardTracksDouble) {
  const std::int64_t n = 4, F = 65;
  const auto gate = random_vector(n * F, 5, -12.0, 12.0), up = random_vector(n * F, 6),
             dout = random_vector(n * F, 7);
  // The float kernel sees rounded inputs; the double reference gets the same rounded values.
  const std::vector<float> gf(gate.begin(), gate.end()), uf(up.begin(), up.end()),
      df(dout.begin(), dout.end());
  const std::vector<double> g(gf.begin(), gf.end()), u(uf.begin(), uf.end()),
      d(df.begin(), df.end());
  std::vector<double> dg(n * F), du(n * F);
  std::vector<float> dgf(n * F), duf(n * F);
  swiglu_backward(g.data(), u.data(), F, d.data(), F, dg.data(), du.data(), F, n, F);
  swiglu_backward(gf.data(), uf.data(), F, df.data(), F, dgf.data(), duf.data(), F, n, F);
  for (std::int64_t k = 0; k < n * F; ++k) {
    ASSERT_NEAR(dgf[k], dg[k], 1e-6 * std::abs(dg[k]) + 1e-12) << "gate " << g[k];
    ASSERT_NEAR(duf[k], du[k], 1e-6 * std::abs(du[k]) + 1e-12) << "gate " << g[k];
  }
}

TEST(SwiGlu, StrideBelowWidthIsAnInternalError) {
  std::vector<float> a(16), b(16), c(16);
  EXPECT_THROW(swiglu_forward(a.data(), b.data(), 3, c.data(), 4, 2, 4), InternalError);
  EXPECT_THROW(swiglu_backward(a.data(), b.data(), 4, c.data(), 4, a.data(), b.data(), 3, 2, 4),
               InternalError);
}

// Forward and backward over strided rows are bitwise equal at 1, 2 and 3 threads.
TEST(SwiGlu, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t n = 301, F = 130, ld = 2 * F;  // gate | up fused in one row
  const auto fused_d = random_vector(n * ld, 51, -4.0, 4.0), dout_d = random_vector(n * F, 52);
  const std::vector<float> fused(fused_d.begin(), fused_d.end()),
      dout(dout_d.begin(), dout_d.end());
  expect_independent_of_thread_count("swiglu", [&] {
    std::vector<float> out(n * F), grad(n * ld);
    swiglu_forward(fused.data(), fused.data() + F, ld, out.data(), F, n, F);
    swiglu_backward(fused.data(), fused.data() + F, ld, dout.data(), F, grad.data(),
                    grad.data() + F, ld, n, F);
    append(out, grad);
    return out;
  });
}

}  // namespace
}  // namespace oases::kernels::cpu
