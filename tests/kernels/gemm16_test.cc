// Products of 16-bit operands with fp32 accumulation (cpu/gemm16.h) by both paths, and the
// 16-bit linear layers of kernels.h, against fp64 references written here.
//
// Error bounds (u = 2^-8 for bf16, 2^-11 for f16; u32 = 2^-24):
//  - The operands are 16-bit values, exact in f32 and double; each product of two of them has
//    at most 2 x 11 significant bits, so it is exact in f32. C = C0 + bias + sum_k a_k b_k is
//    a sum of K + 2 exact terms formed in f32 in some order: |error| <= g * S with
//    g = (K + 2) u32 / (1 - (K + 2) u32) and S = |C0| + |bias| + sum_k |a_k||b_k| (Higham,
//    "Accuracy and Stability of Numerical Algorithms", 3.1).
//  - A 16-bit C adds one rounding of the f32 result: u * (|ref| + g S), plus half the
//    smallest subnormal (2^-25 for f16, 2^-134 for bf16) where the result is subnormal.
//  - Against the unrounded fp64 operands (a = a0 (1 + d), |d| <= u), each product moves by
//    at most (2u + u^2) |a0||b0|: the brief's "about 2u |A||B|" term.
#include "kernels/cpu/gemm16.h"

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace oases::kernels::cpu {
namespace {

template <class Half>
constexpr DType half_dtype = std::is_same_v<Half, BFloat16> ? DType::bf16 : DType::f16;

template <class Half>
constexpr double unit_roundoff = std::is_same_v<Half, BFloat16> ? 0x1p-8 : 0x1p-11;
template <class Half>
constexpr double half_subnormal = std::is_same_v<Half, BFloat16> ? 0x1p-134 : 0x1p-25;

double accumulation_factor(std::int64_t terms) {
  const double t = static_cast<double>(terms) * 0x1p-24;
  return t / (1 - t);
}

std::vector<Gemm16Path> available_paths(DType operands) {
  std::vector<Gemm16Path> paths;
  for (Gemm16Path path : {Gemm16Path::convert_sgemm, Gemm16Path::onednn})
    if (cpu::gemm16_available(path, operands).available) paths.push_back(path);
  return paths;
}

// Random doubles of mixed signs and magnitudes, and their 16-bit roundings.
template <class Half>
struct Operand {
  std::vector<double> original;
  std::vector<Half> half;
  Operand(std::size_t n, std::mt19937& rng, double scale) : original(n), half(n) {
    std::uniform_real_distribution<double> d(-1, 1);
    for (std::size_t i = 0; i < n; ++i) {
      original[i] = scale * d(rng) * std::exp2(3 * d(rng));
      half[i] = Half(static_cast<float>(original[i]));
    }
  }
  double value(std::size_t i) const { return static_cast<float>(half[i]); }
};

// op(X)[r, c] of a stored matrix with row stride ld.
double at(const std::vector<double>& x, Trans trans, std::int64_t ld, std::int64_t r,
          std::int64_t c) {
  return trans == Trans::no ? x[static_cast<std::size_t>(r * ld + c)]
                            : x[static_cast<std::size_t>(c * ld + r)];
}

template <class Half>
void check_gemm16(Gemm16Path path, Trans ta, Trans tb, std::int64_t M, std::int64_t N,
                  std::int64_t K, bool with_bias, bool accumulate, DType c_type) {
  SCOPED_TRACE(std::string(gemm16_path_name(path)) + " " +
               std::string(dtype_name(half_dtype<Half>)) + (ta == Trans::yes ? " A^T" : " A") +
               (tb == Trans::yes ? " B^T" : " B") + (with_bias ? " bias" : "") +
               (accumulate ? " accumulate" : "") + " into " + std::string(dtype_name(c_type)) +
               " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  std::mt19937 rng(static_cast<unsigned>(M * 131 + N * 17 + K));
  // Stored shapes with padded rows (strides above the minimum).
  const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
  const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
  const std::int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = N + 2;
  Operand<Half> a(static_cast<std::size_t>(a_rows * lda), rng, 1.0);
  Operand<Half> b(static_cast<std::size_t>(b_rows * ldb), rng, 2.0);
  Operand<Half> c0(static_cast<std::size_t>(M * ldc), rng, 4.0);
  std::vector<float> bias(static_cast<std::size_t>(N));
  for (std::int64_t j = 0; j < N; ++j)
    bias[static_cast<std::size_t>(j)] = 0.25f * static_cast<float>(j % 7) - 0.5f;
  std::vector<double> av(a.half.size()), bv(b.half.size());
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = a.value(i);
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = b.value(i);

  // C starts as c0 (read when accumulating); padding columns must stay untouched.
  std::vector<float> c32(static_cast<std::size_t>(M * ldc));
  std::vector<Half> c16(static_cast<std::size_t>(M * ldc));
  for (std::size_t i = 0; i < c32.size(); ++i) {
    c32[i] = static_cast<float>(c0.half[i]);
    c16[i] = c0.half[i];
  }
  void* c = c_type == DType::f32 ? static_cast<void*>(c32.data()) : static_cast<void*>(c16.data());
  gemm16<Half>(path, ta, tb, M, N, K, a.half.data(), lda, b.half.data(), ldb,
               with_bias ? bias.data() : nullptr, accumulate, c, c_type, ldc);

  const double u = c_type == DType::f32 ? 0 : unit_roundoff<Half>;
  const double g = accumulation_factor(K + 2);
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const std::size_t idx = static_cast<std::size_t>(i * ldc + j);
      const double got = c_type == DType::f32 ? c32[idx] : static_cast<float>(c16[idx]);
      if (j >= N) {
        ASSERT_EQ(got, c0.value(idx)) << "wrote into row padding";
        continue;
      }
      double ref = 0, S = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = at(av, ta, lda, i, k) * at(bv, tb, ldb, k, j);
        ref += p;
        S += std::fabs(p);
      }
      if (with_bias) {
        ref += bias[static_cast<std::size_t>(j)];
        S += std::fabs(bias[static_cast<std::size_t>(j)]);
      }
      if (accumulate) {
        ref += c0.value(idx);
        S += std::fabs(c0.value(idx));
      }
      const double bound =
          g * S + u * (std::fabs(ref) + g * S) + (u > 0 ? half_subnormal<Half> : 0.0);
      ASSERT_LE(std::fabs(got - ref), bound)
          << "at " << i << ", " << j << ": " << got << " vs " << ref;
    }
  }
}

template <class Half>
void check_all_layouts() {
  for (Gemm16Path path : available_paths(half_dtype<Half>)) {
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes})
        for (bool with_bias : {false, true})
          for (bool accumulate : {false, true})
            for (DType c_type : {DType::f32, half_dtype<Half>})
              check_gemm16<Half>(path, ta, tb, 13, 17, 29, with_bias, accumulate, c_type);
    // Several tiles (two across N, one of them partial) and a long K.
    check_gemm16<Half>(path, Trans::no, Trans::yes, 70, 520, 300, true, true, half_dtype<Half>);
    check_gemm16<Half>(path, Trans::yes, Trans::no, 300, 520, 37, false, true, DType::f32);
    // K = 0: C = C0 + bias (or bias alone).
    check_gemm16<Half>(path, Trans::no, Trans::no, 5, 6, 0, true, true, DType::f32);
  }
}

TEST(Gemm16, Bf16ProductsOfEveryLayoutWithinTheAccumulationBound) {
  check_all_layouts<BFloat16>();
}
TEST(Gemm16, F16ProductsOfEveryLayoutWithinTheAccumulationBound) {
  check_all_layouts<Float16>();
}

TEST(Gemm16, PathNamesRoundTrip) {
  for (Gemm16Path path : {Gemm16Path::convert_sgemm, Gemm16Path::onednn})
    EXPECT_EQ(gemm16_path_from_name(gemm16_path_name(path)), path);
  EXPECT_EQ(gemm16_path_from_name("onednn"), Gemm16Path::onednn);
  EXPECT_FALSE(gemm16_path_from_name("sbgemm").has_value());
}

TEST(Gemm16, ConvertPathIsAvailableEverywhere) {
  for (DType t : {DType::bf16, DType::f16}) {
    const Gemm16Availability a = cpu::gemm16_available(Gemm16Path::convert_sgemm, t);
    EXPECT_TRUE(a.available);
    EXPECT_FALSE(a.detail.empty());
    EXPECT_FALSE(cpu::gemm16_available(Gemm16Path::onednn, t).detail.empty());
  }
}

// The oneDNN path runs only where oneDNN has an optimised kernel; asking for it elsewhere is
// an error that names the implementation, never a silent reference loop.
TEST(Gemm16, UnavailableOneDnnPathIsAnError) {
  for (DType t : {DType::bf16, DType::f16}) {
    if (cpu::gemm16_available(Gemm16Path::onednn, t).available) continue;
    std::vector<Float16> a(4), b(4);
    std::vector<BFloat16> ab(4), bb(4);
    std::vector<float> c(4);
    if (t == DType::f16) {
      EXPECT_THROW(gemm16<Float16>(Gemm16Path::onednn, Trans::no, Trans::no, 2, 2, 2, a.data(), 2,
                                   b.data(), 2, nullptr, false, c.data(), DType::f32, 2),
                   InternalError);
    } else {
      EXPECT_THROW(gemm16<BFloat16>(Gemm16Path::onednn, Trans::no, Trans::no, 2, 2, 2, ab.data(), 2,
                                    bb.data(), 2, nullptr, false, c.data(), DType::f32, 2),
                   InternalError);
    }
  }
}

template <class Half>
void check_thread_count_independence() {
  for (Gemm16Path path : available_paths(half_dtype<Half>)) {
    std::mt19937 rng(3);
    const std::int64_t M = 300, N = 600, K = 96;
    Operand<Half> a(static_cast<std::size_t>(M * K), rng, 1.0),
        b(static_cast<std::size_t>(K * N), rng, 1.0);
    oases::testing::expect_independent_of_thread_count(std::string(gemm16_path_name(path)), [&] {
      std::vector<float> c(static_cast<std::size_t>(M * N), 1.0f);
      gemm16<Half>(path, Trans::no, Trans::no, M, N, K, a.half.data(), K, b.half.data(), N, nullptr,
                   true, c.data(), DType::f32, N);
      return c;
    });
  }
}

TEST(Gemm16, ResultsDoNotDependOnTheThreadCount) {
  check_thread_count_independence<BFloat16>();
  check_thread_count_independence<Float16>();
}

// A workspace only keeps primitives and scratch between calls: repeated products of several
// shapes (16-bit and f32 C, bias, accumulation, multi-tile and edge tiles) through one
// workspace, from several threads at once, give the bits of calls without one.
template <class Half>
void check_workspace_reuse() {
  for (Gemm16Path path : available_paths(half_dtype<Half>)) {
    SCOPED_TRACE(std::string(gemm16_path_name(path)));
    struct Case {
      Trans ta, tb;
      std::int64_t M, N, K;
      bool bias, accumulate;
      DType c_type;
    };
    const Case cases[] = {{Trans::no, Trans::no, 300, 600, 96, true, false, half_dtype<Half>},
                          {Trans::no, Trans::yes, 300, 600, 96, false, true, half_dtype<Half>},
                          {Trans::yes, Trans::no, 600, 300, 70, false, true, DType::f32},
                          {Trans::no, Trans::no, 13, 17, 29, true, true, DType::f32}};
    const std::shared_ptr<Gemm16Workspace> workspace = make_gemm16_workspace();
    for (const Case& c : cases) {
      std::mt19937 rng(5);
      Operand<Half> a(static_cast<std::size_t>(c.M * c.K), rng, 1.0),
          b(static_cast<std::size_t>(c.K * c.N), rng, 1.0),
          bias(static_cast<std::size_t>(c.N), rng, 1.0);
      std::vector<float> bias32(bias.half.size());
      for (std::size_t i = 0; i < bias32.size(); ++i) bias32[i] = static_cast<float>(bias.half[i]);
      const std::int64_t lda = c.ta == Trans::no ? c.K : c.M, ldb = c.tb == Trans::no ? c.N : c.K;
      const auto product = [&](Gemm16Workspace* w) {
        std::vector<float> c32(static_cast<std::size_t>(c.M * c.N), 0.5f);
        std::vector<Half> c16(c32.size(), Half(0.5f));
        void* out = c.c_type == DType::f32 ? static_cast<void*>(c32.data()) : c16.data();
        gemm16<Half>(path, c.ta, c.tb, c.M, c.N, c.K, a.half.data(), lda, b.half.data(), ldb,
                     c.bias ? bias32.data() : nullptr, c.accumulate, out, c.c_type, c.N, w);
        std::vector<float> result(c32.size());
        for (std::size_t i = 0; i < result.size(); ++i)
          result[i] = c.c_type == DType::f32 ? c32[i] : static_cast<float>(c16[i]);
        return result;
      };
      const std::vector<float> expected = product(nullptr);
      for (int repeat = 0; repeat < 2; ++repeat) EXPECT_EQ(product(workspace.get()), expected);
      constexpr int kThreads = 3;
      std::vector<std::vector<float>> results(kThreads);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back(
            [&, t] { results[static_cast<std::size_t>(t)] = product(workspace.get()); });
      for (std::thread& thread : threads) thread.join();
      for (const std::vector<float>& result : results) EXPECT_EQ(result, expected);
    }
  }
}

TEST(Gemm16, WorkspaceReuseKeepsTheBits) {
  check_workspace_reuse<BFloat16>();
  check_workspace_reuse<Float16>();
}

// The start-up choice: a valid, available path per format, the measured times behind it and
// a reason that names the format and the winner.
TEST(Gemm16, StartUpChoiceIsValidAndExplained) {
  const Gemm16PathsChoice choice = choose_gemm16_paths();
  for (const Gemm16Choice* c : {&choice.bf16, &choice.f16}) {
    SCOPED_TRACE(c->reason);
    EXPECT_TRUE(cpu::gemm16_available(c->path, c->operands).available);
    EXPECT_GT(c->convert_sgemm_seconds, 0);
    const std::string format(dtype_name(c->operands));
    EXPECT_EQ(c->reason.rfind(format + " GEMM: ", 0), 0u);
    EXPECT_NE(c->reason.find(std::string(gemm16_path_name(c->path))), std::string::npos);
    if (cpu::gemm16_available(Gemm16Path::onednn, c->operands).available) {
      EXPECT_GT(c->onednn_seconds, 0);
      EXPECT_EQ(c->path == Gemm16Path::onednn, c->onednn_seconds < c->convert_sgemm_seconds);
    } else {
      EXPECT_EQ(c->path, Gemm16Path::convert_sgemm);
      EXPECT_EQ(c->onednn_seconds, 0);
    }
  }
  EXPECT_EQ(choice.paths.bf16, choice.bf16.path);
  EXPECT_EQ(choice.paths.f16, choice.f16.path);
  EXPECT_EQ(choice.paths.for_dtype(DType::f16), choice.f16.path);
  std::printf("%s\n%s\n", choice.bf16.reason.c_str(), choice.f16.reason.c_str());
}

// ---- The 16-bit linear layers of kernels.h ---------------------------------------------------

template <class Half>
void check_linear(Gemm16Path path, kernels::WeightLayout layout, DType out_type) {
  SCOPED_TRACE(std::string(gemm16_path_name(path)) +
               (layout == kernels::WeightLayout::in_out ? " in_out" : " out_in") + " outputs " +
               std::string(dtype_name(out_type)));
  const std::int64_t n = 11, in = 19, out = 7;
  constexpr DType H = half_dtype<Half>;
  const double u = unit_roundoff<Half>;
  std::mt19937 rng(5);
  Operand<Half> x(static_cast<std::size_t>(n * in), rng, 1.0),
      w(static_cast<std::size_t>(in * out), rng, 0.5),
      bias(static_cast<std::size_t>(out), rng, 0.2),
      dy(static_cast<std::size_t>(n * out), rng, 1.0);
  const bool in_out = layout == kernels::WeightLayout::in_out;
  const auto W = [&](const std::vector<double>& v, std::int64_t i, std::int64_t o) {
    return in_out ? v[static_cast<std::size_t>(i * out + o)]
                  : v[static_cast<std::size_t>(o * in + i)];
  };
  std::vector<double> xv(x.half.size()), wv(w.half.size()), bv(bias.half.size()),
      dyv(dy.half.size());
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = x.value(i);
  for (std::size_t i = 0; i < wv.size(); ++i) wv[i] = w.value(i);
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = bias.value(i);
  for (std::size_t i = 0; i < dyv.size(); ++i) dyv[i] = dy.value(i);
  const Tensor xt = Tensor::of(x.half.data(), {n, in});
  const Tensor wt =
      in_out ? Tensor::of(w.half.data(), {in, out}) : Tensor::of(w.half.data(), {out, in});
  const Gemm16Paths paths{path, path, kernels::make_gemm16_workspace()};

  // Forward: y = x W + b, y in out_type; compared with the rounded operands (tight bound) and
  // with the unrounded fp64 operands (adds the 2u |x||W| + u |b| of rounding the operands).
  std::vector<float> y32(static_cast<std::size_t>(n * out));
  std::vector<Half> y16(static_cast<std::size_t>(n * out));
  const Tensor yt =
      out_type == DType::f32 ? Tensor::of(y32.data(), {n, out}) : Tensor::of(y16.data(), {n, out});
  kernels::linear_forward(xt, wt, layout, Tensor::of(bias.half.data(), {out}), yt, false, paths);
  const double uy = out_type == DType::f32 ? 0 : u;
  const double sub = out_type == DType::f32 ? 0 : half_subnormal<Half>;
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      double ref = bv[static_cast<std::size_t>(o)],
             ref0 = bias.original[static_cast<std::size_t>(o)];
      double S = std::fabs(ref), S0 = std::fabs(ref0);
      for (std::int64_t i = 0; i < in; ++i) {
        ref += xv[static_cast<std::size_t>(r * in + i)] * W(wv, i, o);
        ref0 += x.original[static_cast<std::size_t>(r * in + i)] * W(w.original, i, o);
        S += std::fabs(xv[static_cast<std::size_t>(r * in + i)] * W(wv, i, o));
        S0 += std::fabs(x.original[static_cast<std::size_t>(r * in + i)] * W(w.original, i, o));
      }
      const std::size_t idx = static_cast<std::size_t>(r * out + o);
      const double got = out_type == DType::f32 ? y32[idx] : static_cast<float>(y16[idx]);
      const double g = accumulation_factor(in + 1);
      EXPECT_LE(std::fabs(got - ref), g * S + uy * (std::fabs(ref) + g * S) + sub);
      EXPECT_LE(std::fabs(got - ref0),
                (2 * u + u * u) * S0 + g * S + uy * (std::fabs(ref) + g * S) + sub);
    }
  }

  // Backward: dx = dy W^T (overwritten), dw += x^T dy, db += column sums of dy; accumulators
  // start at 1 so that accumulation is visible.
  std::vector<float> dx32(static_cast<std::size_t>(n * in)),
      dw32(static_cast<std::size_t>(in * out), 1.0f), db32(static_cast<std::size_t>(out), 1.0f);
  std::vector<Half> dx16(dx32.size()), dw16(dw32.size(), Half(1.0f)), db16(db32.size(), Half(1.0f));
  const bool f32 = out_type == DType::f32;
  const Tensor dxt = f32 ? Tensor::of(dx32.data(), {n, in}) : Tensor::of(dx16.data(), {n, in});
  const Tensor dwt =
      f32 ? (in_out ? Tensor::of(dw32.data(), {in, out}) : Tensor::of(dw32.data(), {out, in}))
          : (in_out ? Tensor::of(dw16.data(), {in, out}) : Tensor::of(dw16.data(), {out, in}));
  const Tensor dbt = f32 ? Tensor::of(db32.data(), {out}) : Tensor::of(db16.data(), {out});
  kernels::linear_backward(Tensor::of(dy.half.data(), {n, out}), xt, wt, layout, dxt, false, dwt,
                           dbt, paths);
  const auto value = [&](const std::vector<float>& a, const std::vector<Half>& b, std::size_t i) {
    return f32 ? static_cast<double>(a[i]) : static_cast<double>(static_cast<float>(b[i]));
  };
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t i = 0; i < in; ++i) {
      double ref = 0, S = 0;
      for (std::int64_t o = 0; o < out; ++o) {
        ref += dyv[static_cast<std::size_t>(r * out + o)] * W(wv, i, o);
        S += std::fabs(dyv[static_cast<std::size_t>(r * out + o)] * W(wv, i, o));
      }
      const double g = accumulation_factor(out);
      EXPECT_LE(std::fabs(value(dx32, dx16, static_cast<std::size_t>(r * in + i)) - ref),
                g * S + uy * (std::fabs(ref) + g * S) + sub);
    }
  }
  for (std::int64_t i = 0; i < in; ++i) {
    for (std::int64_t o = 0; o < out; ++o) {
      double ref = 1, S = 1;
      for (std::int64_t r = 0; r < n; ++r) {
        ref +=
            xv[static_cast<std::size_t>(r * in + i)] * dyv[static_cast<std::size_t>(r * out + o)];
        S += std::fabs(xv[static_cast<std::size_t>(r * in + i)] *
                       dyv[static_cast<std::size_t>(r * out + o)]);
      }
      const std::size_t idx = static_cast<std::size_t>(in_out ? i * out + o : o * in + i);
      const double g = accumulation_factor(n + 1);
      EXPECT_LE(std::fabs(value(dw32, dw16, idx) - ref),
                g * S + uy * (std::fabs(ref) + g * S) + sub);
    }
  }
  for (std::int64_t o = 0; o < out; ++o) {
    // Column sums in double, rounded to f32 once and added to the accumulator (f32 rounding,
    // u32 twice), then rounded to the 16-bit accumulator's type when it is one.
    double ref = 1, S = 1;
    for (std::int64_t r = 0; r < n; ++r) {
      ref += dyv[static_cast<std::size_t>(r * out + o)];
      S += std::fabs(dyv[static_cast<std::size_t>(r * out + o)]);
    }
    const double e32 = 2 * 0x1p-24 * S;
    EXPECT_LE(std::fabs(value(db32, db16, static_cast<std::size_t>(o)) - ref),
              e32 + uy * (std::fabs(ref) + e32) + sub);
  }
  (void)H;
}

template <class Half>
void check_linear_all() {
  for (Gemm16Path path : available_paths(half_dtype<Half>))
    for (auto layout : {kernels::WeightLayout::in_out, kernels::WeightLayout::out_in})
      for (DType t : {DType::f32, half_dtype<Half>}) check_linear<Half>(path, layout, t);
}

TEST(Linear16, Bf16ForwardAndBackwardAgainstFp64) {
  check_linear_all<BFloat16>();
}
TEST(Linear16, F16ForwardAndBackwardAgainstFp64) {
  check_linear_all<Float16>();
}

TEST(Linear16, MixedOperandTypesAreRejected) {
  std::vector<BFloat16> x(6), w(6);
  std::vector<Float16> wf(6);
  std::vector<float> y(4);
  std::vector<double> yd(4);
  EXPECT_THROW(kernels::linear_forward(Tensor::of(x.data(), {2, 3}), Tensor::of(wf.data(), {3, 2}),
                                       kernels::WeightLayout::in_out, Tensor(),
                                       Tensor::of(y.data(), {2, 2})),
               InternalError);
  EXPECT_THROW(kernels::linear_forward(Tensor::of(x.data(), {2, 3}), Tensor::of(w.data(), {3, 2}),
                                       kernels::WeightLayout::in_out, Tensor(),
                                       Tensor::of(yd.data(), {2, 2})),
               InternalError);
}

}  // namespace
}  // namespace oases::kernels::cpu
