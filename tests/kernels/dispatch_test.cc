// The Tensor-level kernel API (kernels/kernels.h): each call reaches the CPU kernel of the
// tensors' element type with their shapes and strides, and arguments that disagree (element
// types, devices, shapes) are engine bugs reported as InternalError.
#include "kernels/kernels.h"

#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace oases::kernels
