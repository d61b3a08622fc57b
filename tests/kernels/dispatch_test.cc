// The Tensor-level kernel API (kernels/kernels.h): each call reaches the CPU kernel of the
// tensors' element type with their shapes and strides, and arguments that disagree (element
// types, devices, shapes) are engine bugs reported as InternalError.
#include "kernels/kernels.h"

#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm16.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace oases::kernels {
namespace {

template <class T>
std::vector<T> ramp(std::size_t n, double scale) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(scale * std::sin(0.7 * static_cast<double>(i) + 0.3));
  return v;
}

// y = x W + b through the Tensor API equals the typed CPU kernel, for both element types, both
// weight layouts and an output written into a column block of a wider matrix.
template <class T>
void check_linear() {
  const std::int64_t n = 5, in = 7, out = 3, wide = 11, offset = 4;
  auto x = ramp<T>(n * in, 1.0), w = ramp<T>(in * out, 0.5), b = ramp<T>(out, 0.1);
  for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
    std::vector<T> y(n * wide, T(7)), want(n * out);
    const Tensor wt = layout == WeightLayout::in_out ? Tensor::of(w.data(), {in, out})
                                                     : Tensor::of(w.data(), {out, in});
    linear_forward(Tensor::of(x.data(), {n, in}), wt, layout, Tensor::of(b.data(), {out}),
                   Tensor::of(y.data(), {n, wide}).columns(offset, offset + out));
    cpu::linear_forward<T>(x.data(), in, w.data(),
                           layout == WeightLayout::in_out ? cpu::WeightLayout::in_out
                                                          : cpu::WeightLayout::out_in,
                           b.data(), want.data(), out, n, in, out);
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t c = 0; c < wide; ++c) {
        const T got = y[static_cast<std::size_t>(r * wide + c)];
        if (c >= offset && c < offset + out)
          EXPECT_EQ(got, want[static_cast<std::size_t>(r * out + c - offset)]);
        else
          EXPECT_EQ(got, T(7)) << "wrote outside its column block";
      }
    }
  }
}

TEST(Dispatch, LinearReachesTheTypedKernelWithStrides) {
  check_linear<float>();
  check_linear<double>();
}

TEST(Dispatch, DisagreeingArgumentsAreInternalErrors) {
  std::vector<float> a(6, 1.0f);
  std::vector<double> b(6, 1.0);
  EXPECT_THROW(add(Tensor::of(a.data(), {6}), Tensor::of(b.data(), {6}), Tensor::of(a.data(), {6})),
               InternalError);
  EXPECT_THROW(add(Tensor::of(a.data(), {6}), Tensor::of(a.data(), {5}), Tensor::of(a.data(), {6})),
               InternalError);
  // A tensor on another device: this build has no kernel for it.
  const Tensor remote(a.data(), DType::f32, {6}, Device::cuda(0));
  try {
    scale(remote, 2.0);
    FAIL() << "a kernel ran on cuda:0 memory";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("no kernel for tensors on cuda:0"), std::string::npos);
  }
  // Integer types have no floating-point kernels.
  std::vector<std::uint16_t> half(6);
  EXPECT_THROW(scale(Tensor(half.data(), DType::u16, {6}), 2.0), InternalError);
}

TEST(Dispatch, ConvertsBetweenStorageAndComputeTypes) {
  const std::vector<float> values{1.0f, -2.5f, 3.140625f, 65504.0f, 1e-3f, 0.0f};
  std::vector<std::uint16_t> bf16(values.size()), f16(values.size());
  std::vector<double> back(values.size());
  convert(Tensor::of(values.data(), {6}), Tensor(bf16.data(), DType::bf16, {6}));
  convert(Tensor(bf16.data(), DType::bf16, {6}), Tensor::of(back.data(), {6}));
  for (std::size_t i = 0; i < values.size(); ++i)
    EXPECT_NEAR(back[i], values[i], std::abs(values[i]) * 0x1p-8) << i;  // 8 significant bits
  EXPECT_EQ(back[0], 1.0);
  EXPECT_EQ(back[1], -2.5);
  convert(Tensor::of(values.data(), {6}), Tensor(f16.data(), DType::f16, {6}));
  convert(Tensor(f16.data(), DType::f16, {6}), Tensor::of(back.data(), {6}));
  EXPECT_EQ(back[2], 3.140625);   // exact in f16's 11 bits
  EXPECT_EQ(back[3], 65504.0);    // f16's largest finite value
  EXPECT_NEAR(back[4], 1e-3, 1e-3 * 0x1p-11);
}

// A rank whose vocabulary block holds only padding (more ranks than real tokens per block)
// contributes -inf maxima, zero sums and a zero gradient, and still reports the group's loss.
TEST(Dispatch, AShardWithoutRealTokensContributesNothing) {
  const std::int64_t n = 3, ld = 4;
  std::vector<double> logits(n * ld, 5.0), row_max(n), sums(2 * n), losses(n);
  const std::vector<std::int32_t> targets{1, -1, 7};
  const Tensor l = Tensor::of(logits.data(), {n, ld});
  cross_entropy_shard_max(l, 0, Tensor::of(row_max.data(), {n}));
  for (double m : row_max) EXPECT_EQ(m, -std::numeric_limits<double>::infinity());
  cross_entropy_shard_sums(l, 0, targets.data(), 8, Tensor::of(row_max.data(), {n}),
                           Tensor::of(sums.data(), {n}), Tensor::of(sums.data() + n, {n}));
  for (double s : sums) EXPECT_EQ(s, 0.0);
  // As if the group's reductions had happened: max 2, sum of exponentials 3, target logit 1.
  std::fill(row_max.begin(), row_max.end(), 2.0);
  std::fill(sums.begin(), sums.begin() + n, 3.0);
  std::fill(sums.begin() + n, sums.end(), 1.0);
  cross_entropy_shard_finish(l, 0, targets.data(), 8, Tensor::of(row_max.data(), {n}),
                             Tensor::of(sums.data(), {n}), Tensor::of(sums.data() + n, {n}), 0.5,
                             Tensor::of(losses.data(), {n}), true);
  EXPECT_DOUBLE_EQ(losses[0], std::log(3.0) + 2.0 - 1.0);
  EXPECT_EQ(losses[1], 0.0);  // an ignored target
  for (double g : logits) EXPECT_EQ(g, 0.0);
}

// The reductions of the Tensor API (the loss sum, the squared norm) and a linear layer's
// gradients through it are bitwise equal at 1, 2 and 3 threads.
TEST(Dispatch, ReductionsAreBitwiseIndependentOfThreadCount) {
  const std::int64_t n = 600, in = 300, out = 520;
  const auto x = ramp<float>(n * in, 1.0), w = ramp<float>(out * in, 0.5),
             dy = ramp<float>(n * out, 0.25);
  oases::testing::expect_independent_of_thread_count("dispatch", [&] {
    std::vector<float> dx(n * in), dw(out * in, 0.0f), db(out, 0.0f);
    linear_backward(Tensor::of(dy.data(), {n, out}), Tensor::of(x.data(), {n, in}),
                    Tensor::of(w.data(), {out, in}), WeightLayout::out_in,
                    Tensor::of(dx.data(), {n, in}), false, Tensor::of(dw.data(), {out, in}),
                    Tensor::of(db.data(), {out}));
    const double sums[] = {sum(Tensor::of(dx.data(), {n * in})),
                           sum_of_squares(Tensor::of(dw.data(), {out * in}))};
    const auto* bits = reinterpret_cast<const unsigned char*>(sums);
    std::vector<unsigned char> all(bits, bits + sizeof(sums));
    for (const auto* part : {&dx, &dw, &db}) {
      const auto* p = reinterpret_cast<const unsigned char*>(part->data());
      all.insert(all.end(), p, p + part->size() * sizeof(float));
    }
    return all;
  });
}

// The optimizer updates through the Tensor API give the typed CPU kernels' bits, for both
// element types, AdamW with and without decay, and SGD with no, heavy-ball and Nesterov
// momentum.
template <class T>
void check_optimizers() {
  const std::int64_t n = 1000;
  const auto grad = ramp<T>(n, 0.3);
  const auto start = ramp<T>(n, 1.0);
  for (double decay : {0.0, 0.1}) {
    const AdamWStep step{1e-3, 0.9, 0.95, 1e-8, decay, 3};
    auto p = start, m = ramp<T>(n, 0.01), v = ramp<T>(n, 0.05);
    for (T& x : v) x = x * x;
    auto want_p = p, want_m = m, want_v = v;
    adamw_update(Tensor::of(p.data(), {n}), Tensor::of(grad.data(), {n}),
                 Tensor::of(m.data(), {n}), Tensor::of(v.data(), {n}), step);
    cpu::adamw_update<T>(want_p.data(), grad.data(), want_m.data(), want_v.data(), n, step);
    EXPECT_EQ(p, want_p);
    EXPECT_EQ(m, want_m);
    EXPECT_EQ(v, want_v);
  }
  for (const SgdStep& step : {SgdStep{0.1, 0.0, false, 0.01}, SgdStep{0.1, 0.9, false, 0.0},
                              SgdStep{0.1, 0.9, true, 0.01}}) {
    auto p = start, buffer = ramp<T>(n, 0.2);
    auto want_p = p, want_buffer = buffer;
    const bool momentum = step.momentum > 0;
    sgd_update(Tensor::of(p.data(), {n}), Tensor::of(grad.data(), {n}),
               momentum ? Tensor::of(buffer.data(), {n}) : Tensor(), step);
    cpu::sgd_update<T>(want_p.data(), grad.data(), momentum ? want_buffer.data() : nullptr, n,
                       step);
    EXPECT_EQ(p, want_p);
    EXPECT_EQ(buffer, want_buffer);
  }
}

TEST(Dispatch, OptimizerUpdatesReachTheTypedKernels) {
  check_optimizers<float>();
  check_optimizers<double>();
  for (double norm : {0.5, 2.0, std::numeric_limits<double>::infinity()})
    EXPECT_EQ(clip_coefficient(norm, 1.0), cpu::clip_coefficient(norm, 1.0)) << norm;
  EXPECT_TRUE(std::isnan(clip_coefficient(std::nan(""), 1.0)));
}

TEST(Dispatch, OptimizerArgumentsThatDisagreeAreInternalErrors) {
  std::vector<float> a(8, 1.0f), b(7, 1.0f);
  std::vector<double> d(8, 1.0);
  const Tensor t = Tensor::of(a.data(), {8});
  EXPECT_THROW(adamw_update(t, Tensor::of(b.data(), {7}), t, t, AdamWStep{}), InternalError);
  EXPECT_THROW(adamw_update(t, Tensor::of(d.data(), {8}), t, t, AdamWStep{}), InternalError);
  // Momentum needs its buffer; a buffer of another length is a bug.
  EXPECT_THROW(sgd_update(t, t, Tensor(), SgdStep{0.1, 0.9}), InternalError);
  EXPECT_THROW(sgd_update(t, t, Tensor::of(b.data(), {7}), SgdStep{0.1, 0.9}), InternalError);
  std::vector<std::uint16_t> half(8);
  const Tensor h(half.data(), DType::bf16, {8});
  EXPECT_THROW(adamw_update(h, h, h, h, AdamWStep{}), InternalError);
}

// The host evaluation of the dropout rule is the CPU kernel's, and the masks dropout_apply
// draws keep exactly the elements it keeps.
TEST(Dispatch, DropoutKeepIsTheRuleTheKernelsDraw) {
  const DropoutSite site{99, 4, 2, 5};
  const std::int64_t B = 2, seq = 3, F = 40;
  const DropoutSlice slice{6, 100, 0};
  std::vector<float> x(B * seq * F, 1.0f), y(x.size());
  dropout_apply(Tensor::of(x.data(), {B * seq * F}), Tensor::of(y.data(), {B * seq * F}), B, seq,
                0.3, site, slice);
  int dropped = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < seq; ++t)
      for (std::int64_t f = 0; f < F; ++f) {
        const bool keep = dropout_keep(site, 0.3, b + slice.sample_offset, t, f + slice.feature_offset);
        ASSERT_EQ(keep, cpu::dropout_keep(site, 0.3, b + slice.sample_offset, t,
                                          f + slice.feature_offset));
        ASSERT_EQ(keep, y[static_cast<std::size_t>((b * seq + t) * F + f)] != 0.0f);
        dropped += keep ? 0 : 1;
      }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, B * seq * F);
}

TEST(Dispatch, ProcessLevelFunctionsReachTheCpu) {
  for (DType t : {DType::bf16, DType::f16})
    for (Gemm16Path path : {Gemm16Path::convert_sgemm, Gemm16Path::onednn}) {
      const Gemm16Availability front = gemm16_available(path, t);
      const Gemm16Availability cpu_side = cpu::gemm16_available(path, t);
      EXPECT_EQ(front.available, cpu_side.available);
      EXPECT_EQ(front.detail, cpu_side.detail);
    }
  EXPECT_GT(measure_peak_flops(64, 0.01), 0.0);
  EXPECT_THROW(measure_peak_flops(64, 0.01, Device::cuda(0)), InternalError);
  EXPECT_FALSE(blas_kernels_name().empty());
  const int threads = omp_get_max_threads();
  set_host_threads(threads + 1);
  EXPECT_EQ(omp_get_max_threads(), threads + 1);
  set_host_threads(threads);
  EXPECT_THROW(set_host_threads(0), InternalError);
}

}  // namespace
}  // namespace oases::kernels
