#include "kernels/cpu/dropout.h"

#include "core/error.h"
#include "core/philox.h"
#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_gradient_matches;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::random_vector;

constexpr DropoutSite kSite{.seed = 1234, .step = 7, .layer = 3, .site = 1};

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Copies features [f0, f0 + width) of a [rows, F] tensor into a contiguous [rows, width] one.
template <class T>
std::vector<T> feature_slice(const std::vector<T>& full, std::int64_t rows, std::int64_t F,
                             std::int64_t f0, std::int64_t width) {
  std::vector<T> out(static_cast<std::size_t>(rows * width));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t f = 0; f < width; ++f) out[r * width + f] = full[r * F + f0 + f];
  return out;
}

// Which elements of a [B, seq, F] tensor are kept, derived from dropout_apply on ones.
std::vector<bool> mask_of(const DropoutSite& site, double p, std::int64_t B, std::int64_t seq,
                          std::int64_t F) {
  const std::vector<double> ones(B * seq * F, 1.0);
  std::vector<double> y(ones.size());
  dropout_apply(ones.data(), y.data(), B, seq, F, p, site);
  std::vector<bool> kept(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) kept[i] = y[i] != 0.0;
  return kept;
}

TEST(Dropout, ZeroProbabilityIsExactIdentity) {
  const std::int64_t B = 2, seq = 3, F = 5;
  const auto x = to_float(random_vector(B * seq * F, 1));
  std::vector<float> y(x.size(), -1.0f);
  dropout_apply(x.data(), y.data(), B, seq, F, 0.0, kSite);
  EXPECT_EQ(y, x);
  auto in_place = x;
  dropout_apply(in_place.data(), in_place.data(), B, seq, F, 0.0, kSite);
  EXPECT_EQ(in_place, x);
  EXPECT_TRUE(dropout_keep(kSite, 0.0, 0, 0, 0));

  const auto bias = to_float(random_vector(F, 2)), residual = to_float(random_vector(x.size(), 3));
  std::vector<float> out(x.size());
  bias_dropout_add_forward(x.data(), bias.data(), residual.data(), out.data(), B, seq, F, 0.0,
                           kSite);
  for (std::int64_t i = 0; i < B * seq * F; ++i)
    EXPECT_EQ(out[i], residual[i] + (x[i] + bias[i % F])) << i;
  std::vector<float> dx(x.size()), dbias(F, 0.0f);
  bias_dropout_add_backward(residual.data(), dx.data(), dbias.data(), B, seq, F, 0.0, kSite);
  EXPECT_EQ(dx, residual);
}

TEST(Dropout, RejectsProbabilityOutsideUnitInterval) {
  std::vector<float> x(6);
  EXPECT_THROW(dropout_apply(x.data(), x.data(), 1, 2, 3, 1.0, kSite), InternalError);
  EXPECT_THROW(dropout_apply(x.data(), x.data(), 1, 2, 3, -0.1, kSite), InternalError);
  EXPECT_THROW(dropout_keep(kSite, 1.5, 0, 0, 0), InternalError);
}

// Kept elements are x * (1 / (1 - p)) exactly, dropped ones exactly 0, the decision agrees with
// dropout_keep, and the dropped fraction is p within five standard deviations.
TEST(Dropout, DropsFractionPAndScalesKeptElements) {
  const std::int64_t B = 4, seq = 64, F = 256;
  const std::int64_t n = B * seq * F;
  const auto x = to_float(random_vector(n, 4, 0.5, 1.5));  // never 0, so 0 means dropped
  for (double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE(p);
    std::vector<float> y(n);
    dropout_apply(x.data(), y.data(), B, seq, F, p, kSite);
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    std::int64_t dropped = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t b = i / (seq * F), t = (i / F) % seq, f = i % F;
      const bool keep = dropout_keep(kSite, p, b, t, f);
      if (y[i] == 0.0f) ++dropped;
      ASSERT_EQ(y[i], keep ? x[i] * scale : 0.0f) << "element " << i;
    }
    const double fraction = static_cast<double>(dropped) / static_cast<double>(n);
    EXPECT_NEAR(fraction, p, 5 * std::sqrt(p * (1 - p) / static_cast<double>(n)));
  }
}

// The promise behind layout invariance: a shard that passes its offsets draws exactly the
// elements of the full tensor's mask, whether split along the batch or the features.
TEST(Dropout, SlicesAlongBatchAndFeaturesReproduceTheFullTensor) {
  const std::int64_t B = 4, seq = 6, F = 10;
  const double p = 0.3;
  const auto x = to_float(random_vector(B * seq * F, 5));
  std::vector<float> full(x.size());
  dropout_apply(x.data(), full.data(), B, seq, F, p, kSite);

  // Batch split: samples [0, 1) and [1, 4).
  const std::int64_t row_elems = seq * F;
  std::vector<float> batch_split(x.size());
  dropout_apply(x.data(), batch_split.data(), 1, seq, F, p, kSite, {.sample_offset = 0});
  dropout_apply(x.data() + row_elems, batch_split.data() + row_elems, B - 1, seq, F, p, kSite,
                {.sample_offset = 1});
  EXPECT_EQ(batch_split, full);

  // Feature split (as a tensor-parallel shard sees it): features [0, 3), [3, 7), [7, 10).
  const std::int64_t rows = B * seq;
  const std::int64_t cuts[] = {0, 3, 7, 10};
  for (int s = 0; s < 3; ++s) {
    const std::int64_t f0 = cuts[s], width = cuts[s + 1] - cuts[s];
    const auto local_x = feature_slice(x, rows, F, f0, width);
    std::vector<float> local_y(local_x.size());
    dropout_apply(local_x.data(), local_y.data(), B, seq, width, p, kSite,
                  {.sample_offset = 0, .feature_offset = f0});
    EXPECT_EQ(local_y, feature_slice(full, rows, F, f0, width)) << "feature shard " << s;
  }

  // Both at once, for the fused epilogue with its bias sliced too.
  const auto bias = to_float(random_vector(F, 6)), residual = to_float(random_vector(x.size(), 7));
  std::vector<float> fused(x.size());
  bias_dropout_add_forward(x.data(), bias.data(), residual.data(), fused.data(), B, seq, F, p,
                           kSite);
  const std::int64_t f0 = 4, width = 5, b0 = 2;
  const auto local_x = feature_slice(x, rows, F, f0, width);
  const auto local_r = feature_slice(residual, rows, F, f0, width);
  const std::vector<float> local_bias(bias.begin() + f0, bias.begin() + f0 + width);
  std::vector<float> local_out(local_x.size());
  bias_dropout_add_forward(local_x.data() + b0 * seq * width, local_bias.data(),
                           local_r.data() + b0 * seq * width, local_out.data(), B - b0, seq, width,
                           p, kSite, {.sample_offset = b0, .feature_offset = f0});
  const auto expected = feature_slice(fused, rows, F, f0, width);
  const std::vector<float> expected_tail(expected.begin() + b0 * seq * width, expected.end());
  local_out.resize(expected_tail.size());
  EXPECT_EQ(local_out, expected_tail);
}

// Pins the bits the header documents, which the CUDA kernel and checkpoints of RNG state rely
// on: a change to the key or counter layout must show up here, not as a silent new mask.
TEST(Dropout, MaskFollowsTheDocumentedPhiloxFormula) {
  const double p = 0.37;
  const DropoutSite site{.seed = 0xfeedbeefcafeull, .step = 123, .layer = 5, .site = 2};
  const PhiloxKey key = philox_key(site.seed, ((std::uint64_t{site.layer} << 32) | site.site) + 1);
  std::int64_t checked = 0;
  for (std::int64_t sample : {0, 1, 77}) {
    for (std::int64_t t : {0, 3, 1023}) {
      for (std::int64_t f : {0, 1, 4095, 100000}) {
        const auto r = philox4x32({static_cast<std::uint32_t>(f), static_cast<std::uint32_t>(t),
                                   static_cast<std::uint32_t>(sample), site.step},
                                  key);
        const bool expected = (r[0] >> 8) + 1.0 > p * 16777216.0;
        EXPECT_EQ(dropout_keep(site, p, sample, t, f), expected) << sample << "," << t << "," << f;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 36);
}

TEST(Dropout, SameSiteGivesSameMaskAndEveryKeyFieldChangesIt) {
  const std::int64_t B = 2, seq = 8, F = 32;
  const double p = 0.5;
  const auto base = mask_of(kSite, p, B, seq, F);
  EXPECT_EQ(mask_of(kSite, p, B, seq, F), base);  // recomputation redraws the same mask
  auto differs = [&](DropoutSite other) {
    const auto mask = mask_of(other, p, B, seq, F);
    std::int64_t changed = 0;
    for (std::size_t i = 0; i < mask.size(); ++i) changed += mask[i] != base[i];
    // Independent masks disagree on about half of the elements.
    return changed > static_cast<std::int64_t>(mask.size()) / 4;
  };
  DropoutSite s = kSite;
  s.step += 1;
  EXPECT_TRUE(differs(s)) << "step";
  s = kSite;
  s.layer += 1;
  EXPECT_TRUE(differs(s)) << "layer";
  s = kSite;
  s.site += 1;
  EXPECT_TRUE(differs(s)) << "site";
  s = kSite;
  s.seed += 1;
  EXPECT_TRUE(differs(s)) << "seed";
  // Layer and site are not interchangeable.
  s = kSite;
  std::swap(s.layer, s.site);
  EXPECT_TRUE(differs(s)) << "layer <-> site";
}

// The backward pass regenerates the forward mask: the gradient is zero exactly where the
// output was dropped, and is the scaled output gradient elsewhere.
TEST(Dropout, BackwardUsesTheForwardMask) {
  const std::int64_t B = 3, seq = 4, F = 6;
  const double p = 0.4;
  const auto x = random_vector(B * seq * F, 8, 0.5, 1.5);
  const auto dout = random_vector(B * seq * F, 9, 0.5, 1.5);
  const std::vector<double> zeros(x.size(), 0.0);
  std::vector<double> y(x.size());
  bias_dropout_add_forward(x.data(), nullptr, zeros.data(), y.data(), B, seq, F, p, kSite);
  std::vector<double> dx(x.size()), dx_plain(x.size());
  bias_dropout_add_backward(dout.data(), dx.data(), nullptr, B, seq, F, p, kSite);
  dropout_apply(dout.data(), dx_plain.data(), B, seq, F, p, kSite);
  EXPECT_EQ(dx, dx_plain);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i] == 0.0, dx[i] == 0.0) << i;

  auto in_place = dout;
  bias_dropout_add_backward(in_place.data(), in_place.data(), nullptr, B, seq, F, p, kSite);
  EXPECT_EQ(in_place, dx);
}

// With the mask fixed the epilogue is linear in x, bias and residual; check all three
// gradients, dbias accumulating onto a nonzero value.
TEST(Dropout, BiasDropoutAddBackwardMatchesFiniteDifferences) {
  const std::int64_t B = 2, seq = 3, F = 5;
  const double p = 0.3;
  const DropoutSlice slice{.sample_offset = 5, .feature_offset = 11};
  auto x = random_vector(B * seq * F, 10), bias = random_vector(F, 11),
       residual = random_vector(B * seq * F, 12);
  const auto dout = random_vector(B * seq * F, 13);
  const auto dbias0 = random_vector(F, 14);
  std::vector<double> dx(x.size(), 1e30), dbias = dbias0;
  bias_dropout_add_backward(dout.data(), dx.data(), dbias.data(), B, seq, F, p, kSite, slice);
  std::vector<double> out(x.size());
  auto loss = [&] {
    bias_dropout_add_forward(x.data(), bias.data(), residual.data(), out.data(), B, seq, F, p,
                             kSite, slice);
    return oases::testing::dot(out, dout);
  };
  for (std::int64_t f = 0; f < F; ++f) dbias[f] -= dbias0[f];
  expect_gradient_matches("dx", x, dx, loss);
  expect_gradient_matches("dbias", bias, dbias, loss);
  expect_gradient_matches("dresidual", residual, dout, loss);
}

TEST(Dropout, BiasDropoutAddMayWriteIntoResidualOrX) {
  const std::int64_t B = 2, seq = 3, F = 4;
  const double p = 0.25;
  const auto x = to_float(random_vector(B * seq * F, 15)), bias = to_float(random_vector(F, 16)),
             residual = to_float(random_vector(B * seq * F, 17));
  std::vector<float> expected(x.size());
  bias_dropout_add_forward(x.data(), bias.data(), residual.data(), expected.data(), B, seq, F, p,
                           kSite);
  auto into_residual = residual;
  bias_dropout_add_forward(x.data(), bias.data(), into_residual.data(), into_residual.data(), B,
                           seq, F, p, kSite);
  EXPECT_EQ(into_residual, expected);
  auto into_x = x;
  bias_dropout_add_forward(into_x.data(), bias.data(), residual.data(), into_x.data(), B, seq, F, p,
                           kSite);
  EXPECT_EQ(into_x, expected);
}

// A sequence-parallel shard holds a run of positions of one sample: called on that run with
// position_offset, every kernel gives exactly the elements of the whole call there.
TEST(Dropout, PositionSliceGivesTheWholeCallsElements) {
  const std::int64_t B = 2, seq = 12, F = 6;
  const double p = 0.4;
  const DropoutSlice whole_slice{.sample_offset = 3, .feature_offset = 7};
  const auto x = random_vector(B * seq * F, 31), bias = random_vector(F, 32),
             residual = random_vector(B * seq * F, 33);
  std::vector<double> whole(x.size()), whole_out(x.size());
  dropout_apply(x.data(), whole.data(), B, seq, F, p, kSite, whole_slice);
  bias_dropout_add_forward(x.data(), bias.data(), residual.data(), whole_out.data(), B, seq, F, p,
                           kSite, whole_slice);
  for (std::int64_t b = 0; b < B; ++b) {
    for (const auto& [p0, p1] : {std::pair<std::int64_t, std::int64_t>{0, 5}, {5, 12}, {3, 4}}) {
      const std::int64_t first = (b * seq + p0) * F, count = (p1 - p0) * F;
      const DropoutSlice run{.sample_offset = 3 + b, .feature_offset = 7, .position_offset = p0};
      std::vector<double> part(static_cast<std::size_t>(count)), part_out(part.size());
      dropout_apply(x.data() + first, part.data(), 1, p1 - p0, F, p, kSite, run);
      bias_dropout_add_forward(x.data() + first, bias.data(), residual.data() + first,
                               part_out.data(), 1, p1 - p0, F, p, kSite, run);
      for (std::int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(part[i], whole[first + i]) << "sample " << b << " positions " << p0 << ".." << p1;
        ASSERT_EQ(part_out[i], whole_out[first + i]);
      }
    }
  }
}

TEST(Dropout, AddSumsElementwise) {
  const std::vector<double> a = {1, 2, 3}, b = {0.5, -2, 4};
  std::vector<double> out(3);
  add(a.data(), b.data(), out.data(), 3);
  EXPECT_EQ(out, (std::vector<double>{1.5, 0, 7}));
  auto in_place = a;
  add(in_place.data(), b.data(), in_place.data(), 3);
  EXPECT_EQ(in_place, out);
}

// Masks, outputs and the bias gradient (column sums over rows) are bitwise equal at 1, 2 and 3
// threads, with and without dropout, for a shape that goes parallel and splits unevenly.
TEST(Dropout, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t B = 3, seq = 70, F = 190;
  const DropoutSlice slice{.sample_offset = 5, .feature_offset = 64};
  const auto x = to_float(random_vector(B * seq * F, 18)), bias = to_float(random_vector(F, 19)),
             residual = to_float(random_vector(B * seq * F, 20));
  for (const double p : {0.0, 0.1}) {
    expect_independent_of_thread_count("p = " + std::to_string(p), [&] {
      std::vector<float> y(x.size()), out(x.size()), dx(x.size()), sum(x.size());
      std::vector<float> dbias(F, 0.25f);
      dropout_apply(x.data(), y.data(), B, seq, F, p, kSite, slice);
      bias_dropout_add_forward(x.data(), bias.data(), residual.data(), out.data(), B, seq, F, p,
                               kSite, slice);
      bias_dropout_add_backward(residual.data(), dx.data(), dbias.data(), B, seq, F, p, kSite,
                                slice);
      add(x.data(), residual.data(), sum.data(), B * seq * F);
      for (const auto* part : {&out, &dx, &dbias, &sum}) append(y, *part);
      return y;
    });
  }
}

}  // namespace
}  // namespace oases::kernels::cpu
