#include "kernels/cpu/optimizer.h"

#include "core/error.h"
#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::random_vector;

// AdamW written out in the textbook form (Loshchilov & Hutter, with PyTorch's placement of
// the decay and of eps), all in double, one element at a time.
struct ReferenceAdamW {
  std::vector<double> param, m, v;

  void step(const std::vector<double>& grad, double lr, double beta1, double beta2, double eps,
            double weight_decay, int t) {
    for (std::size_t i = 0; i < param.size(); ++i) {
      param[i] -= lr * weight_decay * param[i];
      m[i] = beta1 * m[i] + (1 - beta1) * grad[i];
      v[i] = beta2 * v[i] + (1 - beta2) * grad[i] * grad[i];
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      param[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

template <class T>
class AdamWTest : public ::testing::Test {};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(AdamWTest, Floats);

TYPED_TEST(AdamWTest, MatchesReferenceOverFiveSteps) {
  using T = TypeParam;
  const std::int64_t n = 23;
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  for (double weight_decay : {0.0, 0.1}) {
    SCOPED_TRACE(::testing::Message() << "weight_decay=" << weight_decay);
    const auto init = random_vector(n, 1);
    // Start from values T can hold exactly, so the reference and the kernel see one input.
    const std::vector<T> param0(init.begin(), init.end());
    std::vector<T> param = param0, m(n, T(0)), v(n, T(0));
    ReferenceAdamW ref{std::vector<double>(param0.begin(), param0.end()),
                       std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    for (int t = 1; t <= 5; ++t) {
      const auto g = random_vector(n, 100 + static_cast<std::uint64_t>(t), -2.0, 2.0);
      const std::vector<T> grad(g.begin(), g.end());
      AdamWStep hp;
      hp.lr = 1e-2;
      hp.beta1 = 0.9;
      hp.beta2 = 0.95;
      hp.eps = 1e-8;
      hp.weight_decay = weight_decay;
      hp.step = t;
      adamw_update(param.data(), grad.data(), m.data(), v.data(), n, hp);
      ref.step(std::vector<double>(grad.begin(), grad.end()), hp.lr, hp.beta1, hp.beta2, hp.eps,
               weight_decay, t);
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(param[i], ref.param[i], tol * (1 + std::abs(ref.param[i])))
            << "step " << t << " element " << i;
        ASSERT_NEAR(m[i], ref.m[i], tol * (1 + std::abs(ref.m[i]))) << "step " << t;
        ASSERT_NEAR(v[i], ref.v[i], tol * (1 + std::abs(ref.v[i]))) << "step " << t;
      }
    }
  }
}

TEST(AdamW, FirstStepMovesEveryParameterByAboutLr) {
  // After one step m_hat / sqrt(v_hat) = sign(g): the classic sanity check of bias correction.
  std::vector<double> param = {0.5, -0.25, 2.0}, m(3), v(3);
  const std::vector<double> grad = {3.0, -0.01, 1e-3};
  AdamWStep hp;
  hp.lr = 0.1;
  adamw_update(param.data(), grad.data(), m.data(), v.data(), 3, hp);
  EXPECT_NEAR(param[0], 0.4, 1e-9);
  EXPECT_NEAR(param[1], -0.15, 1e-6);
  EXPECT_NEAR(param[2], 1.9, 1e-5);
}

TEST(AdamW, RejectsStepZero) {
  std::vector<float> x(2);
  AdamWStep hp;
  hp.step = 0;
  EXPECT_THROW(adamw_update(x.data(), x.data(), x.data(), x.data(), 2, hp), InternalError);
}

TEST(SumOfSquares, MatchesNaiveSum) {
  for (std::int64_t n : std::vector<std::int64_t>{0, 1, 7, 8, 9, 100003, (1 << 14) * 300 + 5}) {
    SCOPED_TRACE(n);
    // The largest size takes the capped block count with a ragged last block. A cheap
    // deterministic sequence stands in for Philox there, to keep sanitizer builds quick.
    auto x = random_vector(static_cast<std::size_t>(std::min<std::int64_t>(n, 100003)), 2, -3.0,
                           3.0);
    for (std::int64_t i = static_cast<std::int64_t>(x.size()); i < n; ++i)
      x.push_back(3.0 * std::sin(0.7 * static_cast<double>(i)));
    double naive = 0;
    for (double e : x) naive += e * e;
    EXPECT_NEAR(sum_of_squares(x.data(), n), naive, 1e-12 * naive);
    const std::vector<float> xf(x.begin(), x.end());
    double naive_f = 0;
    for (float e : xf) naive_f += static_cast<double>(e) * static_cast<double>(e);
    EXPECT_NEAR(sum_of_squares(xf.data(), n), naive_f, 1e-12 * naive_f);
  }
}

// The blocked sum, the AdamW update and the scaling give bitwise-equal results at 1, 2 and 3
// threads, on lengths that go parallel and split unevenly.
TYPED_TEST(AdamWTest, SumOfSquaresUpdateAndScaleAreBitwiseIndependentOfThreadCount) {
  using T = TypeParam;
  const std::int64_t n = (std::int64_t{1} << 14) * 40 + 17;
  const auto xd = random_vector(static_cast<std::size_t>(n), 3);
  const auto gd = random_vector(static_cast<std::size_t>(n), 4, -2.0, 2.0);
  const std::vector<T> x(xd.begin(), xd.end()), grad(gd.begin(), gd.end());
  AdamWStep hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.1;
  hp.step = 3;
  expect_independent_of_thread_count("optimizer kernels", [&] {
    std::vector<T> param = x, m(n, T(0.01)), v(n, T(0.02));
    const double squares = sum_of_squares(grad.data(), n);
    adamw_update(param.data(), grad.data(), m.data(), v.data(), n, hp);
    scale_in_place(param.data(), n, T(0.75));
    append(param, m);
    append(param, v);
    T squares_bits[sizeof(double) / sizeof(T)];  // the double's bits, compared as they are
    std::memcpy(squares_bits, &squares, sizeof(double));
    param.insert(param.end(), std::begin(squares_bits), std::end(squares_bits));
    return param;
  });
}

TEST(ScaleInPlace, MultipliesEveryElement) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f};
  scale_in_place(x.data(), 3, 0.25f);
  EXPECT_EQ(x, (std::vector<float>{0.25f, -0.5f, 0.125f}));
}

TEST(ClipCoefficient, FollowsClipGradNorm) {
  EXPECT_EQ(clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(3.0, 2.5), 2.5 / (3.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
  // The norm equal to max_norm still scales by slightly less than 1, because of the 1e-6.
  EXPECT_LT(clip_coefficient(1.0, 1.0), 1.0);
  EXPECT_TRUE(std::isnan(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0);
}

// torch.optim.SGD's single-tensor step written out per element in double: the kernel in fp64
// gives the same numbers, with and without momentum and Nesterov's variant, and leaves no
// buffer behind without momentum.
TEST(Sgd, FollowsTorchsAlgorithmElementByElement) {
  struct Case {
    double momentum;
    bool nesterov;
    double weight_decay;
  };
  for (const Case c :
       {Case{0, false, 0}, Case{0, false, 0.1}, Case{0.9, false, 0.1}, Case{0.9, true, 0}}) {
    const std::int64_t n = 40000;  // above the parallel threshold
    std::vector<double> param = random_vector(n, 1), expected = param;
    std::vector<double> buffer(n, 0.0), expected_buffer(n, 0.0);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const std::vector<double> grad = random_vector(n, 10 + static_cast<std::uint64_t>(step));
      const SgdStep hp{0.05, c.momentum, c.nesterov, c.weight_decay};
      sgd_update(param.data(), grad.data(), c.momentum > 0 ? buffer.data() : nullptr, n, hp);
      for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
        double d = grad[i] + c.weight_decay * expected[i];
        if (c.momentum > 0) {
          expected_buffer[i] = step == 1 ? d : c.momentum * expected_buffer[i] + d;
          d = c.nesterov ? d + c.momentum * expected_buffer[i] : expected_buffer[i];
        }
        expected[i] -= 0.05 * d;
      }
    }
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); i += 997) {
      EXPECT_NEAR(param[i], expected[i], 1e-14 * std::max(1.0, std::abs(expected[i]))) << i;
      EXPECT_NEAR(buffer[i], expected_buffer[i],
                  1e-14 * std::max(1.0, std::abs(expected_buffer[i])));
    }
  }
}

TEST(Sgd, IsBitwiseIndependentOfThreadCount) {
  const std::int64_t n = 50001;
  expect_independent_of_thread_count("sgd_update", [&] {
    std::vector<float> param(n), buffer(n, 0.0f), grad(n);
    const auto p = random_vector(n, 3), g = random_vector(n, 4);
    std::copy(p.begin(), p.end(), param.begin());
    std::copy(g.begin(), g.end(), grad.begin());
    for (int step = 0; step < 2; ++step)
      sgd_update(param.data(), grad.data(), buffer.data(), n, SgdStep{0.1, 0.9, true, 0.01});
    param.insert(param.end(), buffer.begin(), buffer.end());
    return param;
  });
}

TEST(Sgd, MomentumWithoutABufferIsAnInternalError) {
  std::vector<double> p(4, 1.0), g(4, 1.0);
  EXPECT_THROW(
      sgd_update(p.data(), g.data(), static_cast<double*>(nullptr), 4, SgdStep{0.1, 0.9, false, 0}),
      InternalError);
}

}  // namespace
}  // namespace oases::kernels::cpu
