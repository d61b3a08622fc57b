#include "optim/clip.h"

#include "core/error.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"
#include "optim/flat_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace oases::optim {
namespace {

using oases::testing::random_vector;

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  const auto values = random_vector(n, seed, -3.0, 3.0);
  return std::vector<T>(values.begin(), values.end());
}

template <class T>
Tensor flat_tensor(std::vector<T>& flat) {
  return Tensor::of(flat.data(), {static_cast<std::int64_t>(flat.size())});
}

TEST(ClipCoefficient, IsOneWhenTheNormIsWithinTheLimit) {
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.999, 1.0), 1.0);
}

TEST(ClipCoefficient, ScalesTheNormDownToTheLimitAsClipGradNorm) {
  // max_norm / (total_norm + 1e-6), as torch.nn.utils.clip_grad_norm_.
  EXPECT_EQ(clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_coefficient(10.0, 1.0), 0.09999999000000101);
  EXPECT_EQ(clip_coefficient(4.0, 2.0), 2.0 / (4.0 + 1e-6));
  // At the limit the 1e-6 tips it just below one.
  EXPECT_LT(clip_coefficient(1.0, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0);
}

TEST(ClipCoefficient, ANaNNormGivesNaN) {
  EXPECT_TRUE(std::isnan(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  // Scaling by it makes every gradient NaN: a non-finite gradient is not hidden.
  std::vector<float> grads = {1.0f, -2.0f, 0.0f};
  scale(flat_tensor(grads), clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0));
  for (const float g : grads) EXPECT_TRUE(std::isnan(g));
}

template <class T>
class ClipTest : public ::testing::Test {};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ClipTest, Floats);

TYPED_TEST(ClipTest, SumOfSquaresOfARange) {
  using T = TypeParam;
  std::vector<T> small = {T(1), T(2), T(3), T(4), T(-5)};
  EXPECT_EQ(sum_of_squares(flat_tensor(small), 1, 3), 13.0);
  EXPECT_EQ(sum_of_squares(flat_tensor(small), 0, 5), 55.0);
  EXPECT_EQ(sum_of_squares(flat_tensor(small), 2, 2), 0.0);
  // Large enough for the kernel's blocked, threaded sum: the same bits as the kernel over the
  // same elements, whatever the range's position.
  std::vector<T> large = random_values<T>(200000, 7);
  const double sum = sum_of_squares(flat_tensor(large), 1234, 190001);
  EXPECT_EQ(sum, kernels::cpu::sum_of_squares(large.data() + 1234, 190001 - 1234));
  double reference = 0;
  for (std::size_t i = 1234; i < 190001; ++i)
    reference += static_cast<double>(large[i]) * static_cast<double>(large[i]);
  EXPECT_NEAR(sum, reference, 1e-12 * reference);
}

// The norm's partial sums over ranges (which cut through the kernel's blocks anywhere) and the
// scaling are bitwise equal at 1, 2 and 3 threads.
TYPED_TEST(ClipTest, SumOfSquaresAndScaleAreBitwiseIndependentOfThreadCount) {
  using T = TypeParam;
  const std::vector<T> grads = random_values<T>(700001, 10);
  oases::testing::expect_independent_of_thread_count("clip", [&] {
    std::vector<T> scaled = grads;
    std::vector<double> squares;
    for (const auto& [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, 700001},
                                     {1234, 190001}, {190001, 654321}, {17, 33000}})
      squares.push_back(sum_of_squares(flat_tensor(scaled), begin, end));
    scale(flat_tensor(scaled), 0.3);
    const auto* bits = reinterpret_cast<const unsigned char*>(squares.data());
    std::vector<unsigned char> all(bits, bits + squares.size() * sizeof(double));
    const auto* scaled_bits = reinterpret_cast<const unsigned char*>(scaled.data());
    all.insert(all.end(), scaled_bits, scaled_bits + scaled.size() * sizeof(T));
    return all;
  });
}

TYPED_TEST(ClipTest, ScaleRoundsTheFactorToTheTensorTypeOnce) {
  using T = TypeParam;
  std::vector<T> values = random_values<T>(1000, 8);
  const std::vector<T> before = values;
  const double factor = 0.1;  // not exact in binary: float(0.1) != 0.1
  scale(flat_tensor(values), factor);
  const T rounded = static_cast<T>(factor);
  bool differs_from_double_product = false;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const T expected = before[i] * rounded;
    EXPECT_EQ(std::memcmp(&values[i], &expected, sizeof(T)), 0) << "element " << i;
    differs_from_double_product |= values[i] != static_cast<T>(before[i] * factor);
  }
  // In f32 that is not the product formed in double and rounded: the factor really is rounded
  // first, as the engine did (static_cast<float>(coefficient)).
  if constexpr (std::is_same_v<T, float>) {
    EXPECT_TRUE(differs_from_double_product);
  }
}

// The engine's clipping on one process before optim/ existed (src/train/engine.cc,
// TrainingEngine::clip_gradients with tp = 1): the composition of sum_of_squares, scale and
// clip_coefficient described in clip.h gives the same norm and gradients, bitwise.
TEST(Clip, TheComposedClippingMatchesTheOldEngineBitwise) {
  FlatLayout layout;
  layout.params = {{"a", 0, {300, 100}, true}, {"b", 30016, {77}, false}, {"c", 30100, {9}, true}};
  layout.total_numel = 30112;
  std::vector<float> grads = random_values<float>(30112, 9);
  std::vector<float> old_grads = grads;
  const double max_norm = 1.0;

  double replicated = 0;
  for (const ParamSlot& p : layout.params)
    replicated += kernels::cpu::sum_of_squares(old_grads.data() + p.offset, p.numel());
  const double old_norm = std::sqrt(0.0 + replicated);
  const auto factor = static_cast<float>(kernels::cpu::clip_coefficient(old_norm, max_norm));
  kernels::cpu::scale_in_place(old_grads.data(), layout.total_numel, factor);

  double squares = 0;
  for (const ParamSlot& p : layout.params)
    squares += sum_of_squares(flat_tensor(grads), p.offset, p.end());
  const double norm = std::sqrt(squares);
  scale(flat_tensor(grads), clip_coefficient(norm, max_norm));

  EXPECT_EQ(norm, old_norm);
  ASSERT_GT(norm, max_norm);  // the test clips
  EXPECT_EQ(std::memcmp(grads.data(), old_grads.data(), grads.size() * sizeof(float)), 0);
}

TEST(Clip, OtherDTypesAndRangesOutsideTheTensorAreInternalErrors) {
  std::vector<std::int32_t> ints = {1, 2, 3};
  EXPECT_THROW(sum_of_squares(flat_tensor(ints), 0, 3), InternalError);
  EXPECT_THROW(scale(flat_tensor(ints), 0.5), InternalError);
  std::vector<float> values = {1.0f, 2.0f, 3.0f};
  EXPECT_THROW(sum_of_squares(flat_tensor(values), 0, 4), InternalError);
  EXPECT_THROW(sum_of_squares(flat_tensor(values), 2, 1), InternalError);
  EXPECT_THROW(sum_of_squares(flat_tensor(values), -1, 1), InternalError);
}

}  // namespace
}  // namespace oases::optim
