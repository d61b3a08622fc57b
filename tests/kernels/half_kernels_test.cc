// Every kernel of kernels.h in bf16 and f16 against an fp64 reference written here.
//
// How each output is checked. A 16-bit call widens its inputs exactly, runs the f32 kernel and
// rounds each 16-bit output once. So for every output element, with ref the fp64 value from the
// same (16-bit) inputs and y32 the f32 kernel's result on the same values:
//   (a) |y32 - ref| <= e32, the f32 kernel's own error, stated per kernel below as a few f32
//       rounding units (u32 = 2^-24) of the magnitudes involved (plus exp_approx's 3e-7
//       relative where a kernel uses it, and the length of its f32 sums);
//   (b) the 16-bit output is exactly y32 rounded to nearest even (bitwise);
//   (c) hence |y16 - ref| <= u (|ref| + e32) + e32 + eta / 2, with the format's unit roundoff
//       u = 2^-8 (bf16) or 2^-11 (f16) and eta its smallest subnormal (2^-133 or 2^-24: below
//       the normal range rounding is absolute, half a subnormal step): the bound asserted
//       against fp64.
// Outputs that stay f32 in a 16-bit call (statistics, losses, f32 accumulators) must equal the
// f32 call's bits and lie within e32 of the reference.
#include "kernels/kernels.h"

#include "core/error.h"
#include "kernels/cpu/dropout.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>

namespace oases::kernels {
namespace {

constexpr double kU32 = 0x1p-24;
constexpr double kExpApprox = 3e-7;  // relative error of exp_approx (cpu/fast_exp.h)

template <class Half>
constexpr DType kHalf = std::is_same_v<Half, BFloat16> ? DType::bf16 : DType::f16;
template <class Half>
constexpr double kUnit = std::is_same_v<Half, BFloat16> ? 0x1p-8 : 0x1p-11;
// Half the smallest subnormal: the rounding error below the normal range.
template <class Half>
constexpr double kHalfSubnormal = std::is_same_v<Half, BFloat16> ? 0x1p-134 : 0x1p-25;

// Values held three ways: 16-bit, their exact f32 widening, their exact fp64 value.
template <class Half>
struct Values {
  std::vector<Half> h;
  std::vector<float> f;
  std::vector<double> d;

  Values() = default;
  Values(std::size_t n, std::mt19937& rng, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (std::size_t i = 0; i < n; ++i) push(dist(rng));
  }
  void push(double v) {
    h.push_back(Half(static_cast<float>(v)));
    f.push_back(static_cast<float>(h.back()));
    d.push_back(f.back());
  }
  std::size_t size() const { return h.size(); }
  Tensor t16(Shape s) { return Tensor::of(h.data(), s); }
  Tensor t32(Shape s) { return Tensor::of(f.data(), s); }
};

// Checks (a), (b), (c) for a 16-bit output.
template <class Half>
void check_half_output(const char* what, const std::vector<Half>& y16,
                       const std::vector<float>& y32, const std::vector<double>& ref,
                       const std::vector<double>& e32) {
  ASSERT_EQ(y16.size(), ref.size());
  ASSERT_EQ(y32.size(), ref.size());
  const double u = kUnit<Half>;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_LE(std::fabs(y32[i] - ref[i]), e32[i]) << what << " f32 at " << i;
    ASSERT_EQ(y16[i].bits, Half(y32[i]).bits) << what << " not y32 rounded once, at " << i;
    ASSERT_LE(std::fabs(static_cast<float>(y16[i]) - ref[i]),
              u * (std::fabs(ref[i]) + e32[i]) + e32[i] + kHalfSubnormal<Half>)
        << what << " at " << i << ": " << static_cast<float>(y16[i]) << " vs " << ref[i];
  }
}

// An f32 output of a 16-bit call: the f32 call's bits, within e32 of the reference.
void check_f32_output(const char* what, const std::vector<float>& got,
                      const std::vector<float>& y32, const std::vector<double>& ref,
                      const std::vector<double>& e32) {
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(y32[i]))
        << what << " at " << i;
    ASSERT_LE(std::fabs(got[i] - ref[i]), e32[i])
        << what << " at " << i << ": " << got[i] << " vs " << ref[i];
  }
}

std::vector<double> relative(const std::vector<double>& magnitude, double factor,
                             double floor = 1e-30) {
  std::vector<double> e(magnitude.size());
  for (std::size_t i = 0; i < e.size(); ++i) e[i] = factor * magnitude[i] + floor;
  return e;
}

template <class Half>
std::vector<float> widened(const std::vector<Half>& h) {
  std::vector<float> f(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) f[i] = h[i];
  return f;
}

template <class Half>
class Half16Test : public ::testing::Test {};
using HalfTypes = ::testing::Types<BFloat16, Float16>;
TYPED_TEST_SUITE(Half16Test, HalfTypes);

// ---- Norms ---------------------------------------------------------------------------------

// LayerNorm: statistics in fp32 (mean, rstd f32 tensors), gamma/beta and their gradients f32
// here (master parameters); y and dx 16-bit. e32 (y): 16 u32 of ((|xhat| + |mean| rstd + 1)|gamma|
// + |beta|): f32 statistics rounded once, x - mean and the affine map in f32. e32 (dx): 64 u32
// rstd (|g| + mean|g| + |xhat| mean|g xhat|) with g = dy gamma: the two row means in f32.
// dgamma, dbeta: row sums in double of f32 products, 4 u32 of the sums of magnitudes.
TYPED_TEST(Half16Test, LayerNormForwardAndBackward) {
  using Half = TypeParam;
  const std::int64_t n = 6, C = 40;
  const double eps = 1e-5;
  std::mt19937 rng(1);
  Values<Half> x(n * C, rng, -2, 3), dy(n * C, rng, -1, 1);
  std::vector<float> gamma(C), beta(C);
  for (std::int64_t c = 0; c < C; ++c) {
    gamma[c] = 0.5f + 0.03f * static_cast<float>(c);
    beta[c] = -0.2f + 0.01f * static_cast<float>(c);
  }
  std::vector<Half> y16(n * C), dx16(n * C);
  std::vector<float> y32(n * C), dx32(n * C), mean16(n), rstd16(n), mean32(n), rstd32(n);
  std::vector<float> dg16(C, 0.5f), db16(C, 0.5f), dg32(C, 0.5f), db32(C, 0.5f);
  const Tensor g = Tensor::of(gamma.data(), {C}), b = Tensor::of(beta.data(), {C});
  layernorm_forward(x.t16({n, C}), g, b, Tensor::of(y16.data(), {n, C}),
                    Tensor::of(mean16.data(), {n}), Tensor::of(rstd16.data(), {n}), eps);
  layernorm_forward(x.t32({n, C}), g, b, Tensor::of(y32.data(), {n, C}),
                    Tensor::of(mean32.data(), {n}), Tensor::of(rstd32.data(), {n}), eps);
  layernorm_backward(dy.t16({n, C}), x.t16({n, C}), g, Tensor::of(mean16.data(), {n}),
                     Tensor::of(rstd16.data(), {n}), Tensor::of(dx16.data(), {n, C}),
                     Tensor::of(dg16.data(), {C}), Tensor::of(db16.data(), {C}));
  layernorm_backward(dy.t32({n, C}), x.t32({n, C}), g, Tensor::of(mean32.data(), {n}),
                     Tensor::of(rstd32.data(), {n}), Tensor::of(dx32.data(), {n, C}),
                     Tensor::of(dg32.data(), {C}), Tensor::of(db32.data(), {C}));

  std::vector<double> y_ref(n * C), y_e(n * C), dx_ref(n * C), dx_e(n * C), mean_ref(n), mean_e(n),
      rstd_ref(n), rstd_e(n), dg_ref(C, 0.5), db_ref(C, 0.5), dg_mag(C, 0.5), db_mag(C, 0.5);
  for (std::int64_t i = 0; i < n; ++i) {
    double mu = 0, var = 0;
    for (std::int64_t c = 0; c < C; ++c) mu += x.d[i * C + c];
    mu /= C;
    for (std::int64_t c = 0; c < C; ++c) var += (x.d[i * C + c] - mu) * (x.d[i * C + c] - mu);
    var /= C;
    const double r = 1 / std::sqrt(var + eps);
    mean_ref[i] = mu;
    rstd_ref[i] = r;
    mean_e[i] = 4 * kU32 * (std::fabs(mu) + 1e-3);
    rstd_e[i] = 4 * kU32 * r;
    double mg = 0, mgx = 0, mag_g = 0, mag_gx = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double xhat = (x.d[i * C + c] - mu) * r, gv = dy.d[i * C + c] * gamma[c];
      y_ref[i * C + c] = xhat * gamma[c] + beta[c];
      y_e[i * C + c] =
          16 * kU32 *
          ((std::fabs(xhat) + std::fabs(mu) * r + 1) * std::fabs(gamma[c]) + std::fabs(beta[c]));
      mg += gv / C;
      mgx += gv * xhat / C;
      mag_g += std::fabs(gv) / C;
      mag_gx += std::fabs(gv * xhat) / C;
      dg_ref[c] += dy.d[i * C + c] * xhat;
      db_ref[c] += dy.d[i * C + c];
      dg_mag[c] += std::fabs(dy.d[i * C + c] * xhat);
      db_mag[c] += std::fabs(dy.d[i * C + c]);
    }
    for (std::int64_t c = 0; c < C; ++c) {
      const double xhat = (x.d[i * C + c] - mu) * r, gv = dy.d[i * C + c] * gamma[c];
      dx_ref[i * C + c] = r * (gv - mg - xhat * mgx);
      dx_e[i * C + c] = 64 * kU32 * r * (std::fabs(gv) + mag_g + (std::fabs(xhat) + 1) * mag_gx);
    }
  }
  check_half_output("layernorm y", y16, y32, y_ref, y_e);
  check_f32_output("layernorm mean", mean16, mean32, mean_ref, mean_e);
  check_f32_output("layernorm rstd", rstd16, rstd32, rstd_ref, rstd_e);
  check_half_output("layernorm dx", dx16, dx32, dx_ref, dx_e);
  check_f32_output("layernorm dgamma", dg16, dg32, dg_ref, relative(dg_mag, 16 * kU32));
  check_f32_output("layernorm dbeta", db16, db32, db_ref, relative(db_mag, 4 * kU32));

  // 16-bit parameters and accumulators are allowed too: gamma as Half, dgamma accumulated in
  // Half (each call's contribution formed in f32 and rounded once onto the accumulator).
  std::vector<Half> gamma16(C), beta16(C), dgh(C, Half(0.5f)), dbh(C, Half(0.5f));
  for (std::int64_t c = 0; c < C; ++c) {
    gamma16[c] = Half(gamma[c]);
    beta16[c] = Half(beta[c]);
  }
  const std::vector<float> gw = widened(gamma16), bw = widened(beta16);
  std::vector<Half> y16b(n * C), dx16b(n * C);
  std::vector<float> y32b(n * C), dx32b(n * C), dg32b(C, 0.5f), db32b(C, 0.5f);
  layernorm_forward(x.t16({n, C}), Tensor::of(gamma16.data(), {C}), Tensor::of(beta16.data(), {C}),
                    Tensor::of(y16b.data(), {n, C}), Tensor::of(mean16.data(), {n}),
                    Tensor::of(rstd16.data(), {n}), eps);
  layernorm_forward(x.t32({n, C}), Tensor::of(gw.data(), {C}), Tensor::of(bw.data(), {C}),
                    Tensor::of(y32b.data(), {n, C}), Tensor::of(mean32.data(), {n}),
                    Tensor::of(rstd32.data(), {n}), eps);
  layernorm_backward(dy.t16({n, C}), x.t16({n, C}), Tensor::of(gamma16.data(), {C}),
                     Tensor::of(mean16.data(), {n}), Tensor::of(rstd16.data(), {n}),
                     Tensor::of(dx16b.data(), {n, C}), Tensor::of(dgh.data(), {C}),
                     Tensor::of(dbh.data(), {C}));
  layernorm_backward(dy.t32({n, C}), x.t32({n, C}), Tensor::of(gw.data(), {C}),
                     Tensor::of(mean32.data(), {n}), Tensor::of(rstd32.data(), {n}),
                     Tensor::of(dx32b.data(), {n, C}), Tensor::of(dg32b.data(), {C}),
                     Tensor::of(db32b.data(), {C}));
  for (std::int64_t i = 0; i < n * C; ++i) {
    ASSERT_EQ(y16b[i].bits, Half(y32b[i]).bits);
    ASSERT_EQ(dx16b[i].bits, Half(dx32b[i]).bits);
  }
  for (std::int64_t c = 0; c < C; ++c) {
    ASSERT_EQ(dgh[c].bits, Half(dg32b[c]).bits);
    ASSERT_EQ(dbh[c].bits, Half(db32b[c]).bits);
  }
}

// RMSNorm: rstd f32; weight f32; y and dx 16-bit. e32 (y): 8 u32 |x rstd w|; e32 (dx): 64 u32
// rstd (|g| + (|xhat| + 1) mean|g xhat|); dweight: 16 u32 of the sum of magnitudes.
TYPED_TEST(Half16Test, RmsNormForwardAndBackward) {
  using Half = TypeParam;
  const std::int64_t n = 5, C = 48;
  const double eps = 1e-6;
  std::mt19937 rng(2);
  Values<Half> x(n * C, rng, -2, 2), dy(n * C, rng, -1, 1);
  std::vector<float> w(C);
  for (std::int64_t c = 0; c < C; ++c) w[c] = 0.7f + 0.02f * static_cast<float>(c % 11);
  const Tensor wt = Tensor::of(w.data(), {C});
  std::vector<Half> y16(n * C), dx16(n * C);
  std::vector<float> y32(n * C), dx32(n * C), r16(n), r32(n), dw16(C, 0.0f), dw32(C, 0.0f);
  rmsnorm_forward(x.t16({n, C}), wt, Tensor::of(y16.data(), {n, C}), Tensor::of(r16.data(), {n}),
                  eps);
  rmsnorm_forward(x.t32({n, C}), wt, Tensor::of(y32.data(), {n, C}), Tensor::of(r32.data(), {n}),
                  eps);
  rmsnorm_backward(dy.t16({n, C}), x.t16({n, C}), wt, Tensor::of(r16.data(), {n}),
                   Tensor::of(dx16.data(), {n, C}), Tensor::of(dw16.data(), {C}));
  rmsnorm_backward(dy.t32({n, C}), x.t32({n, C}), wt, Tensor::of(r32.data(), {n}),
                   Tensor::of(dx32.data(), {n, C}), Tensor::of(dw32.data(), {C}));
  std::vector<double> y_ref(n * C), y_e(n * C), dx_ref(n * C), dx_e(n * C), r_ref(n), r_e(n),
      dw_ref(C, 0), dw_mag(C, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    double ms = 0;
    for (std::int64_t c = 0; c < C; ++c) ms += x.d[i * C + c] * x.d[i * C + c] / C;
    const double r = 1 / std::sqrt(ms + eps);
    r_ref[i] = r;
    r_e[i] = 4 * kU32 * r;
    double mgx = 0, mag = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double xhat = x.d[i * C + c] * r, gv = dy.d[i * C + c] * w[c];
      y_ref[i * C + c] = xhat * w[c];
      y_e[i * C + c] = 8 * kU32 * std::fabs(xhat * w[c]) + 1e-30;
      mgx += gv * xhat / C;
      mag += std::fabs(gv * xhat) / C;
      dw_ref[c] += dy.d[i * C + c] * xhat;
      dw_mag[c] += std::fabs(dy.d[i * C + c] * xhat);
    }
    for (std::int64_t c = 0; c < C; ++c) {
      const double xhat = x.d[i * C + c] * r, gv = dy.d[i * C + c] * w[c];
      dx_ref[i * C + c] = r * (gv - xhat * mgx);
      dx_e[i * C + c] = 64 * kU32 * r * (std::fabs(gv) + (std::fabs(xhat) + 1) * mag);
    }
  }
  check_half_output("rmsnorm y", y16, y32, y_ref, y_e);
  check_f32_output("rmsnorm rstd", r16, r32, r_ref, r_e);
  check_half_output("rmsnorm dx", dx16, dx32, dx_ref, dx_e);
  check_f32_output("rmsnorm dweight", dw16, dw32, dw_ref, relative(dw_mag, 16 * kU32));
}

// ---- Element-wise --------------------------------------------------------------------------

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad(double x) {
  const double u = std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1 + t) +
         0.5 * x * (1 - t * t) * std::sqrt(2 / std::numbers::pi) * (1 + 3 * 0.044715 * x * x);
}
double gelu_erf(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_erf_grad(double x) {
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-x * x / 2) / std::sqrt(2 * std::numbers::pi);
}

// GeLU, both forms. e32: the f32 kernels' stated accuracy, 1e-6 (|x| + 1) absolute (exp_approx
// or erff, a few f32 ulps, scaled by x), on y and on dx (times |dy|).
TYPED_TEST(Half16Test, GeluBothForms) {
  using Half = TypeParam;
  const std::int64_t n = 301;
  std::mt19937 rng(3);
  Values<Half> x(n, rng, -6, 6), dy(n, rng, -2, 2);
  for (GeluForm form : {GeluForm::tanh, GeluForm::erf}) {
    std::vector<Half> y16(n), dx16(n);
    std::vector<float> y32(n), dx32(n);
    gelu_forward(x.t16({n}), Tensor::of(y16.data(), {n}), form);
    gelu_forward(x.t32({n}), Tensor::of(y32.data(), {n}), form);
    gelu_backward(x.t16({n}), dy.t16({n}), Tensor::of(dx16.data(), {n}), form);
    gelu_backward(x.t32({n}), dy.t32({n}), Tensor::of(dx32.data(), {n}), form);
    std::vector<double> y_ref(n), y_e(n), dx_ref(n), dx_e(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const double xi = x.d[i];
      y_ref[i] = form == GeluForm::tanh ? gelu_tanh(xi) : gelu_erf(xi);
      dx_ref[i] = dy.d[i] * (form == GeluForm::tanh ? gelu_tanh_grad(xi) : gelu_erf_grad(xi));
      y_e[i] = 1e-6 * (std::fabs(xi) + 1);
      dx_e[i] = 1e-6 * (std::fabs(xi) + 1) * std::fabs(dy.d[i]) + 1e-30;
    }
    check_half_output("gelu y", y16, y32, y_ref, y_e);
    check_half_output("gelu dx", dx16, dx32, dx_ref, dx_e);
  }
}

// SwiGLU with gate and up as the two halves of one fused [n, 2F] matrix (strided views) and
// their gradients into the halves of another. e32: 1e-6 relative of each term's magnitude
// (exp_approx in the sigmoid, a few products).
TYPED_TEST(Half16Test, SwiGluOnFusedHalves) {
  using Half = TypeParam;
  const std::int64_t n = 7, F = 19;
  std::mt19937 rng(4);
  Values<Half> fused(n * 2 * F, rng, -5, 5), dout(n * F, rng, -1, 1);
  std::vector<Half> out16(n * F), grad16(n * 2 * F);
  std::vector<float> out32(n * F), grad32(n * 2 * F);
  const Tensor f16t = fused.t16({n, 2 * F}), f32t = fused.t32({n, 2 * F});
  swiglu_forward(f16t.columns(0, F), f16t.columns(F, 2 * F), Tensor::of(out16.data(), {n, F}));
  swiglu_forward(f32t.columns(0, F), f32t.columns(F, 2 * F), Tensor::of(out32.data(), {n, F}));
  const Tensor g16 = Tensor::of(grad16.data(), {n, 2 * F}),
               g32 = Tensor::of(grad32.data(), {n, 2 * F});
  swiglu_backward(f16t.columns(0, F), f16t.columns(F, 2 * F), dout.t16({n, F}), g16.columns(0, F),
                  g16.columns(F, 2 * F));
  swiglu_backward(f32t.columns(0, F), f32t.columns(F, 2 * F), dout.t32({n, F}), g32.columns(0, F),
                  g32.columns(F, 2 * F));
  std::vector<double> out_ref(n * F), out_e(n * F), grad_ref(n * 2 * F), grad_e(n * 2 * F);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < F; ++j) {
      const double g = fused.d[i * 2 * F + j], u = fused.d[i * 2 * F + F + j],
                   d = dout.d[i * F + j];
      const double s = 1 / (1 + std::exp(-g));
      out_ref[i * F + j] = g * s * u;
      out_e[i * F + j] = 1e-6 * std::fabs(g * s * u) + 1e-30;
      grad_ref[i * 2 * F + j] = d * u * s * (1 + g * (1 - s));
      // s is within 3e-7 s (1 - s) + u32 s (exp_approx, then the division), so 1 - s is
      // within about u32 absolute: hence the second term.
      grad_e[i * 2 * F + j] =
          std::fabs(d * u) * s *
              (1e-6 * (1 + std::fabs(g) * (1 - s)) + 4 * kU32 * (1 + std::fabs(g))) +
          1e-30;
      grad_ref[i * 2 * F + F + j] = d * g * s;
      grad_e[i * 2 * F + F + j] = 1e-6 * std::fabs(d * g * s) + 1e-30;
    }
  }
  check_half_output("swiglu out", out16, out32, out_ref, out_e);
  check_half_output("swiglu grads", grad16, grad32, grad_ref, grad_e);
}

// Dropout and the residual epilogue: the mask is cpu::dropout_keep's (the same bits as in f32),
// kept values scaled by 1 / (1 - p) in f32. e32: 2 u32 of the magnitudes (one product, one sum
// and the rounding of the f32 scale). dbias f32: column sums in double, 4 u32.
TYPED_TEST(Half16Test, DropoutAndBiasDropoutAdd) {
  using Half = TypeParam;
  const std::int64_t B = 2, seq = 5, F = 12;
  const std::int64_t N = B * seq * F;
  const double p = 0.3;
  const DropoutSite site{42, 3, 1, 2};
  const DropoutSlice slice{4, 8, 0};
  std::mt19937 rng(5);
  Values<Half> x(N, rng, -3, 3), residual(N, rng, -3, 3), bias(F, rng, -1, 1);
  const double scale = static_cast<double>(static_cast<float>(1 / (1 - p)));
  std::vector<Half> y16(N), out16(N), dx16(N);
  std::vector<float> y32(N), out32(N), dx32(N), dbias16(F, 0.25f), dbias32(F, 0.25f);
  dropout_apply(x.t16({N}), Tensor::of(y16.data(), {N}), B, seq, p, site, slice);
  dropout_apply(x.t32({N}), Tensor::of(y32.data(), {N}), B, seq, p, site, slice);
  bias_dropout_add_forward(x.t16({N}), bias.t16({F}), residual.t16({N}),
                           Tensor::of(out16.data(), {N}), B, seq, p, site, slice);
  bias_dropout_add_forward(x.t32({N}), bias.t32({F}), residual.t32({N}),
                           Tensor::of(out32.data(), {N}), B, seq, p, site, slice);
  bias_dropout_add_backward(residual.t16({N}), Tensor::of(dx16.data(), {N}),
                            Tensor::of(dbias16.data(), {F}), B, seq, p, site, slice);
  bias_dropout_add_backward(residual.t32({N}), Tensor::of(dx32.data(), {N}),
                            Tensor::of(dbias32.data(), {F}), B, seq, p, site, slice);
  std::vector<double> y_ref(N), y_e(N), out_ref(N), out_e(N), dx_ref(N), dx_e(N), db_ref(F, 0.25),
      db_mag(F, 0.25);
  int kept = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      for (std::int64_t f = 0; f < F; ++f) {
        const std::int64_t i = (b * seq + t) * F + f;
        const bool keep =
            cpu::dropout_keep(site, p, slice.sample_offset + b, t, slice.feature_offset + f);
        kept += keep;
        const double m = keep ? scale : 0.0;
        y_ref[i] = x.d[i] * m;
        y_e[i] = 2 * kU32 * std::fabs(y_ref[i]) + 1e-30;
        out_ref[i] = residual.d[i] + (x.d[i] + bias.d[f]) * m;
        out_e[i] =
            4 * kU32 * (std::fabs(residual.d[i]) + (std::fabs(x.d[i]) + std::fabs(bias.d[f])) * m) +
            1e-30;
        dx_ref[i] = residual.d[i] * m;
        dx_e[i] = 2 * kU32 * std::fabs(dx_ref[i]) + 1e-30;
        db_ref[f] += dx_ref[i];
        db_mag[f] += std::fabs(dx_ref[i]);
      }
    }
  }
  EXPECT_GT(kept, N / 2);
  EXPECT_LT(kept, N);
  check_half_output("dropout y", y16, y32, y_ref, y_e);
  check_half_output("bias_dropout_add out", out16, out32, out_ref, out_e);
  check_half_output("bias_dropout_add dx", dx16, dx32, dx_ref, dx_e);
  check_f32_output("bias_dropout_add dbias", dbias16, dbias32, db_ref, relative(db_mag, 4 * kU32));
}

// add and scale, sum and sum_of_squares: e32 one f32 rounding; the sums are formed in double
// from exactly widened values, so they equal the f32 call's to the bit.
TYPED_TEST(Half16Test, AddScaleAndSums) {
  using Half = TypeParam;
  const std::int64_t n = 257;
  std::mt19937 rng(6);
  Values<Half> a(n, rng, -4, 4), b(n, rng, -4, 4);
  std::vector<Half> s16(n);
  std::vector<float> s32(n);
  add(a.t16({n}), b.t16({n}), Tensor::of(s16.data(), {n}));
  add(a.t32({n}), b.t32({n}), Tensor::of(s32.data(), {n}));
  std::vector<double> s_ref(n), s_e(n);
  for (std::int64_t i = 0; i < n; ++i) {
    s_ref[i] = a.d[i] + b.d[i];
    s_e[i] = kU32 * std::fabs(s_ref[i]);
  }
  check_half_output("add", s16, s32, s_ref, s_e);
  double total = 0, squares = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    total += a.d[i];
    squares += a.d[i] * a.d[i];
  }
  EXPECT_EQ(sum(a.t16({n})), sum(a.t32({n})));
  EXPECT_NEAR(sum(a.t16({n})), total, 1e-12);
  EXPECT_EQ(sum_of_squares(a.t16({n})), sum_of_squares(a.t32({n})));
  EXPECT_NEAR(sum_of_squares(a.t16({n})), squares, 1e-12 * squares);
  std::vector<Half> scaled = a.h;
  std::vector<float> scaled32 = a.f;
  scale(Tensor::of(scaled.data(), {n}), 0.3);
  scale(Tensor::of(scaled32.data(), {n}), 0.3);
  std::vector<double> sc_ref(n), sc_e(n);
  for (std::int64_t i = 0; i < n; ++i) {
    sc_ref[i] = a.d[i] * 0.3;
    sc_e[i] = 2 * kU32 * std::fabs(sc_ref[i]);  // the factor rounded to f32, then the product
  }
  check_half_output("scale", scaled, scaled32, sc_ref, sc_e);
}

// The element- and row-wise 16-bit kernels convert piece by piece in the cache (pieces of 2^14
// f32 elements per operand, shared among the threads; half_kernels.cc). On shapes of several
// pieces with ragged ends (rows that do not divide into pieces, features split across pieces
// of a sequence, positions split within a sequence), every 16-bit output is still the f32
// kernel's result on the widened values, rounded once, and every f32 output (statistics) is
// the f32 call's, bit for bit: the pieces change where work is done, never what is computed.
// Masks too: dropout is drawn by global (sample, position, feature), so the pieces draw the
// whole call's mask.
template <class Half>
void expect_rounded_from(const char* what, const std::vector<Half>& y16,
                         const std::vector<float>& y32) {
  ASSERT_EQ(y16.size(), y32.size());
  for (std::size_t i = 0; i < y16.size(); ++i)
    ASSERT_EQ(y16[i].bits, Half(y32[i]).bits) << what << " at " << i;
}

TYPED_TEST(Half16Test, PiecesGiveTheWholeCallsBits) {
  using Half = TypeParam;
  std::mt19937 rng(21);
  {  // flat: gelu (both forms, both passes), add, scale over 3.4 pieces
    const std::int64_t n = 3 * (std::int64_t{1} << 14) + 6007;
    Values<Half> x(n, rng, -6, 6), g(n, rng, -2, 2);
    for (GeluForm form : {GeluForm::tanh, GeluForm::erf}) {
      std::vector<Half> y16(n), dx16(n);
      std::vector<float> y32(n), dx32(n);
      gelu_forward(x.t16({n}), Tensor::of(y16.data(), {n}), form);
      gelu_forward(x.t32({n}), Tensor::of(y32.data(), {n}), form);
      expect_rounded_from("gelu", y16, y32);
      gelu_backward(x.t16({n}), g.t16({n}), Tensor::of(dx16.data(), {n}), form);
      gelu_backward(x.t32({n}), g.t32({n}), Tensor::of(dx32.data(), {n}), form);
      expect_rounded_from("gelu backward", dx16, dx32);
    }
    std::vector<Half> s16(n);
    std::vector<float> s32(n);
    add(x.t16({n}), g.t16({n}), Tensor::of(s16.data(), {n}));
    add(x.t32({n}), g.t32({n}), Tensor::of(s32.data(), {n}));
    expect_rounded_from("add", s16, s32);
    std::vector<Half> sc16 = x.h;
    std::vector<float> sc32 = x.f;
    scale(Tensor::of(sc16.data(), {n}), 0.7);
    scale(Tensor::of(sc32.data(), {n}), 0.7);
    expect_rounded_from("scale", sc16, sc32);
  }
  {  // rows: swiglu on fused halves, layernorm and rmsnorm forward
    const std::int64_t n = 301, F = 333;  // 49 rows a piece: 6 full pieces and a ragged one
    Values<Half> fused(n * 2 * F, rng, -5, 5), dout(n * F, rng, -1, 1);
    std::vector<Half> out16(n * F), grad16(n * 2 * F);
    std::vector<float> out32(n * F), grad32(n * 2 * F);
    const Tensor f16t = fused.t16({n, 2 * F}), f32t = fused.t32({n, 2 * F});
    swiglu_forward(f16t.columns(0, F), f16t.columns(F, 2 * F), Tensor::of(out16.data(), {n, F}));
    swiglu_forward(f32t.columns(0, F), f32t.columns(F, 2 * F), Tensor::of(out32.data(), {n, F}));
    expect_rounded_from("swiglu", out16, out32);
    const Tensor g16 = Tensor::of(grad16.data(), {n, 2 * F}),
                 g32 = Tensor::of(grad32.data(), {n, 2 * F});
    swiglu_backward(f16t.columns(0, F), f16t.columns(F, 2 * F), dout.t16({n, F}), g16.columns(0, F),
                    g16.columns(F, 2 * F));
    swiglu_backward(f32t.columns(0, F), f32t.columns(F, 2 * F), dout.t32({n, F}), g32.columns(0, F),
                    g32.columns(F, 2 * F));
    expect_rounded_from("swiglu backward", grad16, grad32);

    Values<Half> x(n * F, rng, -3, 5), gamma(F, rng, 0.5, 1.5), beta(F, rng, -1, 1);
    std::vector<Half> y16(n * F);
    std::vector<float> y32(n * F), mean16(n), mean32(n), rstd16(n), rstd32(n);
    layernorm_forward(x.t16({n, F}), gamma.t32({F}), beta.t32({F}), Tensor::of(y16.data(), {n, F}),
                      Tensor::of(mean16.data(), {n}), Tensor::of(rstd16.data(), {n}), 1e-5);
    layernorm_forward(x.t32({n, F}), gamma.t32({F}), beta.t32({F}), Tensor::of(y32.data(), {n, F}),
                      Tensor::of(mean32.data(), {n}), Tensor::of(rstd32.data(), {n}), 1e-5);
    expect_rounded_from("layernorm", y16, y32);
    EXPECT_EQ(mean16, mean32);
    EXPECT_EQ(rstd16, rstd32);
    rmsnorm_forward(x.t16({n, F}), gamma.t16({F}), Tensor::of(y16.data(), {n, F}),
                    Tensor::of(rstd16.data(), {n}), 1e-5);
    rmsnorm_forward(x.t32({n, F}), gamma.t32({F}), Tensor::of(y32.data(), {n, F}),
                    Tensor::of(rstd32.data(), {n}), 1e-5);
    expect_rounded_from("rmsnorm", y16, y32);
    EXPECT_EQ(rstd16, rstd32);
  }
  {  // rotary: 3 sequences of 300 positions, 4 heads of 64 in a strided q|k|v block (64 rows
     // a piece: each sequence in 5 pieces, the last ragged)
    const std::int64_t B = 3, seq = 300, heads = 4, hd = 64, ld = 3 * heads * hd;
    Values<Half> qkv(B * seq * ld, rng, -2, 2);
    std::vector<float> cos32(seq * hd / 2), sin32(seq * hd / 2);
    rotary_tables(seq, rotary_inverse_frequencies(hd, 10000),
                  Tensor::of(cos32.data(), {seq, hd / 2}), Tensor::of(sin32.data(), {seq, hd / 2}));
    for (bool inverse : {false, true}) {
      std::vector<Half> x16 = qkv.h;
      std::vector<float> x32 = qkv.f;
      rotary_apply(Tensor::of(x16.data(), {B * seq, ld}).columns(0, heads * hd), B, seq, heads, hd,
                   Tensor::of(cos32.data(), {seq, hd / 2}), Tensor::of(sin32.data(), {seq, hd / 2}),
                   inverse);
      rotary_apply(Tensor::of(x32.data(), {B * seq, ld}).columns(0, heads * hd), B, seq, heads, hd,
                   Tensor::of(cos32.data(), {seq, hd / 2}), Tensor::of(sin32.data(), {seq, hd / 2}),
                   inverse);
      expect_rounded_from("rotary", x16, x32);
    }
  }
  {  // dropout and bias-dropout-add with a mask: 3 samples of 37 positions, 700 features (a
     // sequence's features in pieces of 432, the last ragged), a slice of a larger batch
    const std::int64_t B = 3, seq = 37, F = 700, N = B * seq * F;
    const double p = 0.25;
    const DropoutSite site{7, 2, 3, 1};
    const DropoutSlice slice{5, 96, 0};
    Values<Half> x(N, rng, -3, 3), residual(N, rng, -3, 3), bias(F, rng, -1, 1);
    std::vector<Half> y16(N), out16(N);
    std::vector<float> y32(N), out32(N);
    dropout_apply(x.t16({N}), Tensor::of(y16.data(), {N}), B, seq, p, site, slice);
    dropout_apply(x.t32({N}), Tensor::of(y32.data(), {N}), B, seq, p, site, slice);
    expect_rounded_from("dropout", y16, y32);
    bias_dropout_add_forward(x.t16({N}), bias.t16({F}), residual.t16({N}),
                             Tensor::of(out16.data(), {N}), B, seq, p, site, slice);
    bias_dropout_add_forward(x.t32({N}), bias.t32({F}), residual.t32({N}),
                             Tensor::of(out32.data(), {N}), B, seq, p, site, slice);
    expect_rounded_from("bias_dropout_add", out16, out32);
  }
}

// ---- Embedding and rotary ------------------------------------------------------------------

// Embedding of a vocab-parallel shard: out = wte[token - begin] + wpe[t] (zero rows for tokens
// outside the shard), e32 one f32 addition; backward into f32 accumulators (the f32 call's
// bits; sums of at most B * seq terms, 4 u32) and into 16-bit ones (rounded once per call).
TYPED_TEST(Half16Test, EmbeddingForwardAndBackward) {
  using Half = TypeParam;
  const std::int64_t B = 2, seq = 6, C = 10, V = 9;
  const VocabRange range{3, 8};
  const std::int64_t rows = range.end - range.begin;
  std::mt19937 rng(7);
  Values<Half> wte(rows * C, rng, -1, 1), wpe(seq * C, rng, -1, 1), dout(B * seq * C, rng, -1, 1);
  std::vector<std::int32_t> tokens(B * seq);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 5 + 1) % V);
  std::vector<Half> out16(B * seq * C);
  std::vector<float> out32(B * seq * C);
  embedding_forward(tokens.data(), wte.t16({rows, C}), wpe.t16({seq, C}),
                    Tensor::of(out16.data(), {B * seq, C}), B, seq, range);
  embedding_forward(tokens.data(), wte.t32({rows, C}), wpe.t32({seq, C}),
                    Tensor::of(out32.data(), {B * seq, C}), B, seq, range);
  std::vector<double> ref(B * seq * C), e(B * seq * C);
  std::vector<double> dwte_ref(rows * C, 0), dwte_mag(rows * C, 0), dwpe_ref(seq * C, 0),
      dwpe_mag(seq * C, 0);
  for (std::int64_t r = 0; r < B * seq; ++r) {
    const std::int64_t token = tokens[r], t = r % seq;
    const bool held = token >= range.begin && token < range.end;
    for (std::int64_t c = 0; c < C; ++c) {
      const double w = held ? wte.d[(token - range.begin) * C + c] : 0.0;
      ref[r * C + c] = w + wpe.d[t * C + c];
      e[r * C + c] = kU32 * std::fabs(ref[r * C + c]);
      if (held) {
        dwte_ref[(token - range.begin) * C + c] += dout.d[r * C + c];
        dwte_mag[(token - range.begin) * C + c] += std::fabs(dout.d[r * C + c]);
      }
      dwpe_ref[t * C + c] += dout.d[r * C + c];
      dwpe_mag[t * C + c] += std::fabs(dout.d[r * C + c]);
    }
  }
  check_half_output("embedding out", out16, out32, ref, e);
  std::vector<float> dwte16(rows * C, 0.0f), dwpe16(seq * C, 0.0f), dwte32(rows * C, 0.0f),
      dwpe32(seq * C, 0.0f);
  embedding_backward(dout.t16({B * seq, C}), tokens.data(), Tensor::of(dwte16.data(), {rows, C}),
                     Tensor::of(dwpe16.data(), {seq, C}), B, seq, range);
  embedding_backward(dout.t32({B * seq, C}), tokens.data(), Tensor::of(dwte32.data(), {rows, C}),
                     Tensor::of(dwpe32.data(), {seq, C}), B, seq, range);
  check_f32_output("embedding dwte", dwte16, dwte32, dwte_ref,
                   relative(dwte_mag, 4 * B * seq * kU32));
  check_f32_output("embedding dwpe", dwpe16, dwpe32, dwpe_ref, relative(dwpe_mag, 4 * B * kU32));
  std::vector<Half> dwte_h(rows * C, Half(0.0f));
  embedding_backward(dout.t16({B * seq, C}), tokens.data(), Tensor::of(dwte_h.data(), {rows, C}),
                     Tensor(), B, seq, range);
  check_half_output("embedding dwte (16-bit)", dwte_h, dwte32, dwte_ref,
                    relative(dwte_mag, 4 * B * seq * kU32));
  // Token-type embeddings added onto the output.
  std::vector<std::int32_t> types(B * seq);
  for (std::size_t i = 0; i < types.size(); ++i) types[i] = static_cast<std::int32_t>(i % 2);
  Values<Half> table(2 * C, rng, -1, 1);
  std::vector<Half> acc16 = out16;
  std::vector<float> acc32 = widened(out16);
  embedding_accumulate(types.data(), table.t16({2, C}), Tensor::of(acc16.data(), {B * seq, C}), B,
                       seq);
  embedding_accumulate(types.data(), table.t32({2, C}), Tensor::of(acc32.data(), {B * seq, C}), B,
                       seq);
  std::vector<double> acc_ref(B * seq * C), acc_e(B * seq * C);
  for (std::int64_t r = 0; r < B * seq; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      acc_ref[r * C + c] =
          static_cast<double>(static_cast<float>(out16[r * C + c])) + table.d[types[r] * C + c];
      acc_e[r * C + c] = kU32 * std::fabs(acc_ref[r * C + c]);
    }
  check_half_output("embedding_accumulate", acc16, acc32, acc_ref, acc_e);
  std::vector<float> dtable16(2 * C, 0.0f), dtable32(2 * C, 0.0f);
  embedding_accumulate_backward(dout.t16({B * seq, C}), types.data(),
                                Tensor::of(dtable16.data(), {2, C}), B, seq);
  embedding_accumulate_backward(dout.t32({B * seq, C}), types.data(),
                                Tensor::of(dtable32.data(), {2, C}), B, seq);
  std::vector<double> dt_ref(2 * C, 0), dt_mag(2 * C, 0);
  for (std::int64_t r = 0; r < B * seq; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      dt_ref[types[r] * C + c] += dout.d[r * C + c];
      dt_mag[types[r] * C + c] += std::fabs(dout.d[r * C + c]);
    }
  check_f32_output("embedding_accumulate_backward", dtable16, dtable32, dt_ref,
                   relative(dt_mag, 4 * B * seq * kU32));
}

// Rotary embedding of the q block of a fused qkv matrix (strided), forward then inverse, with
// f32 tables and with 16-bit tables (rounded once from double). e32: 4 u32 (|x1| + |x2|) (two
// products and a sum in f32 with f32 table entries).
TYPED_TEST(Half16Test, RotaryOnAStridedBlock) {
  using Half = TypeParam;
  const std::int64_t B = 2, seq = 5, heads = 2, hd = 8, ld = 3 * heads * hd;
  const double theta = 10000;
  std::mt19937 rng(8);
  Values<Half> qkv(B * seq * ld, rng, -2, 2);
  std::vector<float> cos32(seq * hd / 2), sin32(seq * hd / 2);
  rotary_tables(seq, rotary_inverse_frequencies(hd, theta), Tensor::of(cos32.data(), {seq, hd / 2}),
                Tensor::of(sin32.data(), {seq, hd / 2}));
  std::vector<Half> cos16(seq * hd / 2), sin16(seq * hd / 2);
  rotary_tables(seq, rotary_inverse_frequencies(hd, theta), Tensor::of(cos16.data(), {seq, hd / 2}),
                Tensor::of(sin16.data(), {seq, hd / 2}));
  for (std::size_t i = 0; i < cos16.size(); ++i) {
    const std::int64_t t = static_cast<std::int64_t>(i) / (hd / 2),
                       k = static_cast<std::int64_t>(i) % (hd / 2);
    const double angle =
        static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(k) / hd);
    // No table value here lies within a float step of a 16-bit tie, so rounding through
    // float gives the correctly rounded entry.
    EXPECT_EQ(cos16[i].bits, Half(static_cast<float>(std::cos(angle))).bits);
    EXPECT_EQ(sin16[i].bits, Half(static_cast<float>(std::sin(angle))).bits);
  }
  for (bool inverse : {false, true}) {
    std::vector<Half> x16 = qkv.h;
    std::vector<float> x32 = qkv.f;
    rotary_apply(Tensor::of(x16.data(), {B * seq, ld}), B, seq, heads, hd,
                 Tensor::of(cos32.data(), {seq, hd / 2}), Tensor::of(sin32.data(), {seq, hd / 2}),
                 inverse);
    rotary_apply(Tensor::of(x32.data(), {B * seq, ld}), B, seq, heads, hd,
                 Tensor::of(cos32.data(), {seq, hd / 2}), Tensor::of(sin32.data(), {seq, hd / 2}),
                 inverse);
    std::vector<double> ref(qkv.size()), e(qkv.size());
    for (std::int64_t r = 0; r < B * seq; ++r) {
      const std::int64_t t = r % seq;
      for (std::int64_t c = 0; c < ld; ++c) {
        const std::size_t i = static_cast<std::size_t>(r * ld + c);
        ref[i] = qkv.d[i];
        e[i] = 0;
        if (c >= heads * hd) continue;  // k and v columns untouched
        const std::int64_t h = c / hd, j = c % hd, k = j % (hd / 2);
        const double angle =
            static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(k) / hd);
        const double s = inverse ? -std::sin(angle) : std::sin(angle), co = std::cos(angle);
        const double x1 = qkv.d[r * ld + h * hd + k], x2 = qkv.d[r * ld + h * hd + k + hd / 2];
        ref[i] = j < hd / 2 ? x1 * co - x2 * s : x2 * co + x1 * s;
        e[i] = 4 * kU32 * (std::fabs(x1) + std::fabs(x2));
      }
    }
    check_half_output(inverse ? "rotary inverse" : "rotary", x16, x32, ref, e);
    // 16-bit tables: each entry off by at most u |entry| more, so |x1| u + |x2| u more.
    std::vector<Half> xt = qkv.h;
    rotary_apply(Tensor::of(xt.data(), {B * seq, ld}), B, seq, heads, hd,
                 Tensor::of(cos16.data(), {seq, hd / 2}), Tensor::of(sin16.data(), {seq, hd / 2}),
                 inverse);
    const double u = kUnit<Half>;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const std::int64_t c = static_cast<std::int64_t>(i) % ld;
      const double mag = e[i] / (4 * kU32);
      const double bound = c >= heads * hd ? 0
                                           : u * (std::fabs(ref[i]) + 2 * mag) + 2 * u * mag +
                                                 e[i] + kHalfSubnormal<Half>;
      ASSERT_LE(std::fabs(static_cast<float>(xt[i]) - ref[i]), bound) << i;
    }
  }
}

// ---- Attention ---------------------------------------------------------------------------

struct AttentionReference {
  std::vector<double> out, lse, dqkv, out_mag, lse_err, dqkv_mag;
  // sum_j p_j sum_c |dout||out| |k or q| / sqrt(hd): how far an error in the stored out moves
  // dq and dk (through D = dout . out), per unit of relative error.
  std::vector<double> dqkv_out_sensitivity;
};

// Naive fp64 attention over the qkv layout of cpu/attention.h, with grouped-query heads, and
// magnitudes for the bounds: out_mag = sum_j p_j |v_j|, dqkv_mag = the same sums of absolute
// terms as the gradient's.
AttentionReference attention_reference(const std::vector<double>& qkv,
                                       const std::vector<double>& dout, const AttentionShape& s) {
  const std::int64_t H = s.heads, G = s.kv_heads, hd = s.head_dim, T = s.seq;
  const std::int64_t ld = (H + 2 * G) * hd, group = H / G;
  const double scale = 1 / std::sqrt(static_cast<double>(hd));
  AttentionReference r;
  r.out.assign(s.batch * T * H * hd, 0);
  r.out_mag.assign(r.out.size(), 0);
  r.lse.assign(s.batch * H * T, 0);
  r.lse_err.assign(r.lse.size(), 0);
  r.dqkv.assign(qkv.size(), 0);
  r.dqkv_mag.assign(qkv.size(), 0);
  r.dqkv_out_sensitivity.assign(qkv.size(), 0);
  const auto q = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t c) {
    return (b * T + t) * ld + h * hd + c;
  };
  const auto k = [&](std::int64_t b, std::int64_t t, std::int64_t g, std::int64_t c) {
    return (b * T + t) * ld + (H + g) * hd + c;
  };
  const auto v = [&](std::int64_t b, std::int64_t t, std::int64_t g, std::int64_t c) {
    return (b * T + t) * ld + (H + G + g) * hd + c;
  };
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t last = s.causal ? i : T - 1;
        std::vector<double> score(last + 1), p(last + 1);
        double m = -HUGE_VAL, score_err = 0;
        for (std::int64_t j = 0; j <= last; ++j) {
          double dot = 0, mag = 0;
          for (std::int64_t c = 0; c < hd; ++c) {
            dot += qkv[q(b, i, h, c)] * qkv[k(b, j, g, c)];
            mag += std::fabs(qkv[q(b, i, h, c)] * qkv[k(b, j, g, c)]);
          }
          score[j] = dot * scale;
          score_err = std::max(score_err, (hd + 2) * 0x1p-24 * mag * scale);
          m = std::max(m, score[j]);
        }
        double z = 0;
        for (std::int64_t j = 0; j <= last; ++j) z += std::exp(score[j] - m);
        for (std::int64_t j = 0; j <= last; ++j) p[j] = std::exp(score[j] - m) / z;
        const std::size_t li = static_cast<std::size_t>((b * H + h) * T + i);
        r.lse[li] = m + std::log(z);
        // Relative error of each probability in f32: the score error (twice: the score and
        // the max or lse it is measured against), exp_approx, and f32 sums over the row.
        const double eps_p = 2 * score_err + 8 * kExpApprox + 8 * (T + hd) * 0x1p-24;
        r.lse_err[li] = eps_p + 4 * 0x1p-24 * std::fabs(r.lse[li]);
        double D = 0, D_mag = 0;
        for (std::int64_t c = 0; c < hd; ++c) {
          const std::size_t oi = static_cast<std::size_t>((b * T + i) * H * hd + h * hd + c);
          for (std::int64_t j = 0; j <= last; ++j) {
            r.out[oi] += p[j] * qkv[v(b, j, g, c)];
            r.out_mag[oi] += p[j] * std::fabs(qkv[v(b, j, g, c)]);
          }
          D += dout[oi] * r.out[oi];
          D_mag += std::fabs(dout[oi]) * r.out_mag[oi];
          r.out_mag[oi] *= eps_p;
        }
        for (std::int64_t j = 0; j <= last; ++j) {
          double dp = 0, dp_mag = 0;
          for (std::int64_t c = 0; c < hd; ++c) {
            const std::size_t oi = static_cast<std::size_t>((b * T + i) * H * hd + h * hd + c);
            dp += dout[oi] * qkv[v(b, j, g, c)];
            dp_mag += std::fabs(dout[oi] * qkv[v(b, j, g, c)]);
            r.dqkv[v(b, j, g, c)] += p[j] * dout[oi];
            r.dqkv_mag[v(b, j, g, c)] += eps_p * p[j] * std::fabs(dout[oi]);
          }
          const double ds = p[j] * (dp - D), ds_mag = p[j] * (dp_mag + D_mag);
          for (std::int64_t c = 0; c < hd; ++c) {
            r.dqkv[q(b, i, h, c)] += ds * qkv[k(b, j, g, c)] * scale;
            r.dqkv[k(b, j, g, c)] += ds * qkv[q(b, i, h, c)] * scale;
            r.dqkv_mag[q(b, i, h, c)] += 2 * eps_p * ds_mag * std::fabs(qkv[k(b, j, g, c)]) * scale;
            r.dqkv_mag[k(b, j, g, c)] += 2 * eps_p * ds_mag * std::fabs(qkv[q(b, i, h, c)]) * scale;
            r.dqkv_out_sensitivity[q(b, i, h, c)] +=
                p[j] * D_mag * std::fabs(qkv[k(b, j, g, c)]) * scale;
            r.dqkv_out_sensitivity[k(b, j, g, c)] +=
                p[j] * D_mag * std::fabs(qkv[q(b, i, h, c)]) * scale;
          }
        }
      }
    }
  }
  return r;
}

// Attention forward and backward, causal with grouped-query heads and bidirectional. lse is
// f32; out and dqkv 16-bit. e32 per element: eps_p (the relative error of the probabilities:
// twice the f32 score error (hd + 2) u32 |q||k| / sqrt(hd), 8 exp_approx errors, 8 (seq + hd)
// u32 for the f32 sums of the online softmax) times the element's sum of absolute terms.
TYPED_TEST(Half16Test, AttentionForwardAndBackward) {
  using Half = TypeParam;
  for (const AttentionShape s :
       {AttentionShape{2, 9, 4, 2, 8, true}, AttentionShape{1, 7, 2, 2, 4, false}}) {
    SCOPED_TRACE(s.causal ? "causal, grouped" : "bidirectional");
    const std::int64_t ld = (s.heads + 2 * s.kv_heads) * s.head_dim, rows = s.batch * s.seq;
    const std::int64_t width = s.heads * s.head_dim;
    std::mt19937 rng(9);
    Values<Half> qkv(rows * ld, rng, -1.5, 1.5), dout(rows * width, rng, -1, 1);
    std::vector<Half> out16(rows * width), dqkv16(rows * ld);
    std::vector<float> out32(rows * width), dqkv32(rows * ld), lse16(s.batch * s.heads * s.seq),
        lse32(s.batch * s.heads * s.seq);
    attention_forward(qkv.t16({rows, ld}), Tensor::of(out16.data(), {rows, width}),
                      Tensor::of(lse16.data(), {s.batch, s.heads, s.seq}), s);
    attention_forward(qkv.t32({rows, ld}), Tensor::of(out32.data(), {rows, width}),
                      Tensor::of(lse32.data(), {s.batch, s.heads, s.seq}), s);
    attention_backward(dout.t16({rows, width}), qkv.t16({rows, ld}),
                       Tensor::of(out16.data(), {rows, width}),
                       Tensor::of(lse16.data(), {s.batch, s.heads, s.seq}),
                       Tensor::of(dqkv16.data(), {rows, ld}), s);
    // The f32 backward reads the same (16-bit) out the 16-bit backward reads.
    const std::vector<float> out_as_stored = widened(out16);
    attention_backward(dout.t32({rows, width}), qkv.t32({rows, ld}),
                       Tensor::of(out_as_stored.data(), {rows, width}),
                       Tensor::of(lse32.data(), {s.batch, s.heads, s.seq}),
                       Tensor::of(dqkv32.data(), {rows, ld}), s);
    const AttentionReference ref = attention_reference(qkv.d, dout.d, s);
    std::vector<double> out_e(ref.out_mag.size()), dq_e(ref.dqkv_mag.size());
    for (std::size_t i = 0; i < out_e.size(); ++i) out_e[i] = ref.out_mag[i] + 1e-30;
    // The backward (both calls) uses D = dout . out with out as stored in 16 bits, off the
    // exact out by at most u (|out| + e32) + e32 elementwise (checked just above): that moves
    // dS_j by p_j |dout| that much, hence dq and dk by up to 2u times their out sensitivity.
    const double u = kUnit<Half>;
    for (std::size_t i = 0; i < dq_e.size(); ++i)
      dq_e[i] = ref.dqkv_mag[i] + 2 * u * ref.dqkv_out_sensitivity[i] + 1e-30;
    check_half_output("attention out", out16, out32, ref.out, out_e);
    check_f32_output("attention lse", lse16, lse32, ref.lse, ref.lse_err);
    check_half_output("attention dqkv", dqkv16, dqkv32, ref.dqkv, dq_e);
  }
}

// Attention dropout under 16-bit storage: the f32 kernel on the widened inputs with the same
// mask, rounded once (out, dqkv) or as computed (lse); and the mask does drop something.
TYPED_TEST(Half16Test, AttentionDropoutIsTheF32KernelOnTheWidenedValues) {
  using Half = TypeParam;
  const AttentionShape s{2, 9, 4, 2, 8, true};
  const AttentionDropout dropout{0.3, cpu::DropoutSite{5, 2, 1, 6}, 3, 4};
  const std::int64_t ld = (s.heads + 2 * s.kv_heads) * s.head_dim, rows = s.batch * s.seq;
  const std::int64_t width = s.heads * s.head_dim;
  const std::int64_t lse_n = s.batch * s.heads * s.seq;
  std::mt19937 rng(19);
  Values<Half> qkv(rows * ld, rng, -1.5, 1.5), dout(rows * width, rng, -1, 1);
  std::vector<Half> out16(rows * width), dqkv16(rows * ld), plain16(rows * width);
  std::vector<float> out32(rows * width), dqkv32(rows * ld), lse16(lse_n), lse32(lse_n);
  attention_forward(qkv.t16({rows, ld}), Tensor::of(out16.data(), {rows, width}),
                    Tensor::of(lse16.data(), {s.batch, s.heads, s.seq}), s, dropout);
  attention_forward(qkv.t32({rows, ld}), Tensor::of(out32.data(), {rows, width}),
                    Tensor::of(lse32.data(), {s.batch, s.heads, s.seq}), s, dropout);
  attention_backward(dout.t16({rows, width}), qkv.t16({rows, ld}),
                     Tensor::of(out16.data(), {rows, width}),
                     Tensor::of(lse16.data(), {s.batch, s.heads, s.seq}),
                     Tensor::of(dqkv16.data(), {rows, ld}), s, dropout);
  const std::vector<float> out_as_stored = widened(out16);
  attention_backward(dout.t32({rows, width}), qkv.t32({rows, ld}),
                     Tensor::of(out_as_stored.data(), {rows, width}),
                     Tensor::of(lse32.data(), {s.batch, s.heads, s.seq}),
                     Tensor::of(dqkv32.data(), {rows, ld}), s, dropout);
  for (std::size_t i = 0; i < out16.size(); ++i)
    ASSERT_EQ(out16[i].bits, Half(out32[i]).bits) << "out at " << i;
  for (std::size_t i = 0; i < lse16.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(lse16[i]), std::bit_cast<std::uint32_t>(lse32[i]))
        << "lse at " << i;
  for (std::size_t i = 0; i < dqkv16.size(); ++i)
    ASSERT_EQ(dqkv16[i].bits, Half(dqkv32[i]).bits) << "dqkv at " << i;
  std::vector<float> plain_lse(lse_n);
  attention_forward(qkv.t16({rows, ld}), Tensor::of(plain16.data(), {rows, width}),
                    Tensor::of(plain_lse.data(), {s.batch, s.heads, s.seq}), s);
  EXPECT_NE(widened(plain16), widened(out16));
  EXPECT_EQ(plain_lse, lse16);  // the log-sum-exp is taken before dropout
}

// ---- Cross-entropy ---------------------------------------------------------------------------

// Softmax cross-entropy over 16-bit logits [n, ld] (padding columns past V), losses f32, the
// gradient written over the logits in 16 bits. e32 (loss): (V + 8) u32 + 2 exp_approx for the
// log of the f32 sum, plus 4 u32 (|max| + |target logit| + |loss|); e32 (gradient): grad_scale
// (p_j ((V + 8) u32 + 2 exp_approx) + u32). The vocab-parallel steps over two shards give the
// same losses and gradients.
TYPED_TEST(Half16Test, CrossEntropyWholeAndSharded) {
  using Half = TypeParam;
  const std::int64_t n = 6, V = 37, ld = 40;
  const double grad_scale = 0.25;
  std::mt19937 rng(10);
  Values<Half> logits(n * ld, rng, -8, 8);
  std::vector<std::int32_t> targets = {3, 0, 36, -100, 17, 5};
  std::vector<double> loss_ref(n), loss_e(n), grad_ref(n * ld, 0), grad_e(n * ld, 1e-30);
  for (std::int64_t i = 0; i < n; ++i) {
    double m = -HUGE_VAL;
    for (std::int64_t j = 0; j < V; ++j) m = std::max(m, logits.d[i * ld + j]);
    double z = 0;
    for (std::int64_t j = 0; j < V; ++j) z += std::exp(logits.d[i * ld + j] - m);
    const double lse = m + std::log(z);
    const double sum_err = (V + 8) * kU32 + 2 * kExpApprox;
    if (targets[i] < 0) {
      loss_ref[i] = 0;
      loss_e[i] = 0;
      continue;
    }
    const double xt = logits.d[i * ld + targets[i]];
    loss_ref[i] = lse - xt;
    loss_e[i] = sum_err + 4 * kU32 * (std::fabs(m) + std::fabs(xt) + std::fabs(loss_ref[i]));
    for (std::int64_t j = 0; j < V; ++j) {
      const double p = std::exp(logits.d[i * ld + j] - lse);
      grad_ref[i * ld + j] = grad_scale * (p - (j == targets[i] ? 1 : 0));
      grad_e[i * ld + j] = grad_scale * (p * sum_err + kU32);
    }
  }
  // Whole vocabulary.
  std::vector<Half> g16 = logits.h;
  std::vector<float> g32 = logits.f, l16(n), l32(n), lf16(n), lf32(n);
  cross_entropy_forward(logits.t16({n, ld}), V, targets.data(), Tensor::of(lf16.data(), {n}));
  cross_entropy_forward(logits.t32({n, ld}), V, targets.data(), Tensor::of(lf32.data(), {n}));
  cross_entropy_forward_backward(Tensor::of(g16.data(), {n, ld}), V, targets.data(),
                                 Tensor::of(l16.data(), {n}), grad_scale);
  cross_entropy_forward_backward(Tensor::of(g32.data(), {n, ld}), V, targets.data(),
                                 Tensor::of(l32.data(), {n}), grad_scale);
  check_f32_output("cross-entropy loss", l16, l32, loss_ref, loss_e);
  check_f32_output("cross-entropy forward loss", lf16, lf32, loss_ref, loss_e);
  check_half_output("cross-entropy gradient", g16, g32, grad_ref, grad_e);

  // Two shards: columns [0, 20) and [20, 37) of the same rows (each rank's [n, 20] block).
  const std::int64_t split = 20;
  std::vector<std::vector<Half>> shard(2);
  std::vector<std::int64_t> begin = {0, split}, width = {split, V - split};
  for (int r = 0; r < 2; ++r)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < split; ++j)
        shard[r].push_back(j < width[r] ? logits.h[i * ld + begin[r] + j] : Half(0.0f));
  std::vector<float> max0(n), max1(n), sum0(n), sum1(n), t0(n), t1(n);
  cross_entropy_shard_max(Tensor::of(shard[0].data(), {n, split}), width[0],
                          Tensor::of(max0.data(), {n}));
  cross_entropy_shard_max(Tensor::of(shard[1].data(), {n, split}), width[1],
                          Tensor::of(max1.data(), {n}));
  for (std::int64_t i = 0; i < n; ++i)
    max0[i] = max1[i] = std::max(max0[i], max1[i]);  // all-reduce max
  cross_entropy_shard_sums(Tensor::of(shard[0].data(), {n, split}), width[0], targets.data(),
                           begin[0], Tensor::of(max0.data(), {n}), Tensor::of(sum0.data(), {n}),
                           Tensor::of(t0.data(), {n}));
  cross_entropy_shard_sums(Tensor::of(shard[1].data(), {n, split}), width[1], targets.data(),
                           begin[1], Tensor::of(max1.data(), {n}), Tensor::of(sum1.data(), {n}),
                           Tensor::of(t1.data(), {n}));
  for (std::int64_t i = 0; i < n; ++i) {  // all-reduce sums
    sum0[i] = sum1[i] = sum0[i] + sum1[i];
    t0[i] = t1[i] = t0[i] + t1[i];
  }
  std::vector<float> ls0(n), ls1(n);
  cross_entropy_shard_finish(Tensor::of(shard[0].data(), {n, split}), width[0], targets.data(),
                             begin[0], Tensor::of(max0.data(), {n}), Tensor::of(sum0.data(), {n}),
                             Tensor::of(t0.data(), {n}), grad_scale, Tensor::of(ls0.data(), {n}),
                             true);
  cross_entropy_shard_finish(Tensor::of(shard[1].data(), {n, split}), width[1], targets.data(),
                             begin[1], Tensor::of(max1.data(), {n}), Tensor::of(sum1.data(), {n}),
                             Tensor::of(t1.data(), {n}), grad_scale, Tensor::of(ls1.data(), {n}),
                             true);
  const double u = kUnit<Half>;
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(ls0[i], ls1[i]);
    EXPECT_LE(std::fabs(ls0[i] - loss_ref[i]), loss_e[i]) << i;
    for (int r = 0; r < 2; ++r) {
      for (std::int64_t j = 0; j < split; ++j) {
        const double got = static_cast<float>(shard[r][i * split + j]);
        if (j >= width[r]) {
          EXPECT_EQ(got, 0.0) << "padding column takes no gradient";
          continue;
        }
        const std::int64_t col = begin[r] + j;
        EXPECT_LE(std::fabs(got - grad_ref[i * ld + col]),
                  u * (std::fabs(grad_ref[i * ld + col]) + grad_e[i * ld + col]) +
                      grad_e[i * ld + col] + kHalfSubnormal<Half>)
            << i << ", " << col;
      }
    }
  }
}

// ---- Argument rules --------------------------------------------------------------------------

TEST(Half16, StatisticsMustBeF32AndOperandsOneType) {
  std::vector<BFloat16> x(8), y(8), g(4), b(4), stats16(2);
  std::vector<Float16> yf(8);
  std::vector<float> stats(2);
  const Tensor xt = Tensor::of(x.data(), {2, 4});
  // mean and rstd in 16 bits: rejected.
  EXPECT_THROW(layernorm_forward(xt, Tensor::of(g.data(), {4}), Tensor::of(b.data(), {4}),
                                 Tensor::of(y.data(), {2, 4}), Tensor::of(stats16.data(), {2}),
                                 Tensor::of(stats16.data(), {2}), 1e-5),
               InternalError);
  // A bf16 input with an f16 output: rejected.
  EXPECT_THROW(gelu_forward(xt, Tensor::of(yf.data(), {2, 4}), GeluForm::tanh), InternalError);
  // Cached attention has no 16-bit kernel.
  std::vector<BFloat16> cache(2 * 4 * 2);
  EXPECT_THROW(cached_attention_forward(
                   Tensor::of(x.data(), {1, 8}), Tensor::of(cache.data(), {1, 4, 2}),
                   Tensor::of(cache.data(), {1, 4, 2}), Tensor::of(y.data(), {1, 2}), 0),
               InternalError);
  (void)stats;
}

}  // namespace
}  // namespace oases::kernels
