#include "kernels/cpu/attention.h"

#include "core/error.h"

#include "kernels/finite_difference.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::expect_gradient_matches;
using oases::testing::random_vector;

struct Shape {
  std::int64_t B, seq, heads, head_dim;
  std::int64_t C() const { return heads * head_dim; }
  std::size_t qkv_size() const { return static_cast<std::size_t>(B * seq * 3 * C()); }
  std::size_t out_size() const { return static_cast<std::size_t>(B * seq * C()); }
  std::size_t lse_size() const { return static_cast<std::size_t>(B * heads * seq); }
};

// The textbook computation: the whole [seq, seq] score matrix of each head, masked, softmaxed
// and multiplied by V, in double.
struct Reference {
  std::vector<double> out, lse;
};

Reference naive_forward(const std::vector<double>& qkv, const Shape& s) {
  const std::int64_t C = s.C(), ld = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  Reference ref{std::vector<double>(s.out_size()), std::vector<double>(s.lse_size())};
  std::vector<double> scores(static_cast<std::size_t>(s.seq));
  for (std::int64_t b = 0; b < s.B; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t i = 0; i < s.seq; ++i) {
        const double* q = &qkv[static_cast<std::size_t>((b * s.seq + i) * ld + h * s.head_dim)];
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          const double* k =
              &qkv[static_cast<std::size_t>((b * s.seq + j) * ld + C + h * s.head_dim)];
          double dot = 0;
          for (std::int64_t d = 0; d < s.head_dim; ++d) dot += q[d] * k[d];
          scores[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j)
          sum += std::exp(scores[static_cast<std::size_t>(j)] - mx);
        ref.lse[static_cast<std::size_t>((b * s.heads + h) * s.seq + i)] = mx + std::log(sum);
        double* o = &ref.out[static_cast<std::size_t>((b * s.seq + i) * C + h * s.head_dim)];
        for (std::int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(scores[static_cast<std::size_t>(j)] - mx) / sum;
          const double* v =
              &qkv[static_cast<std::size_t>((b * s.seq + j) * ld + 2 * C + h * s.head_dim)];
          for (std::int64_t d = 0; d < s.head_dim; ++d) o[d] += p * v[d];
        }
      }
    }
  }
  return ref;
}

// The textbook backward pass on the full probability matrix, in double:
//   dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q.
std::vector<double> naive_backward(const std::vector<double>& dout, const std::vector<double>& qkv,
                                   const Shape& s) {
  const std::int64_t C = s.C(), ld = 3 * C, n = s.seq, hd = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> dqkv(s.qkv_size(), 0.0);
  std::vector<double> P(static_cast<std::size_t>(n * n)), dP(P.size());
  auto at = [](std::vector<double>& m, std::int64_t cols, std::int64_t i,
               std::int64_t j) -> double& { return m[static_cast<std::size_t>(i * cols + j)]; };
  for (std::int64_t b = 0; b < s.B; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      auto q = [&](std::int64_t i, std::int64_t d) {
        return qkv[static_cast<std::size_t>((b * n + i) * ld + h * hd + d)];
      };
      auto k = [&](std::int64_t i, std::int64_t d) {
        return qkv[static_cast<std::size_t>((b * n + i) * ld + C + h * hd + d)];
      };
      auto v = [&](std::int64_t i, std::int64_t d) {
        return qkv[static_cast<std::size_t>((b * n + i) * ld + 2 * C + h * hd + d)];
      };
      auto g = [&](std::int64_t i, std::int64_t d) {
        return dout[static_cast<std::size_t>((b * n + i) * C + h * hd + d)];
      };
      auto grad = [&](std::int64_t part, std::int64_t i, std::int64_t d) -> double& {
        return dqkv[static_cast<std::size_t>((b * n + i) * ld + part * C + h * hd + d)];
      };
      std::fill(P.begin(), P.end(), 0.0);
      for (std::int64_t i = 0; i < n; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d) dot += q(i, d) * k(j, d);
          at(P, n, i, j) = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j)
          sum += (at(P, n, i, j) = std::exp(at(P, n, i, j) - mx));
        for (std::int64_t j = 0; j <= i; ++j) at(P, n, i, j) /= sum;
      }
      for (std::int64_t i = 0; i < n; ++i) {
        double row = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d) dot += g(i, d) * v(j, d);
          at(dP, n, i, j) = dot;
          row += dot * at(P, n, i, j);
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double ds = at(P, n, i, j) * (at(dP, n, i, j) - row);
          for (std::int64_t d = 0; d < hd; ++d) {
            grad(0, i, d) += scale * ds * k(j, d);
            grad(1, j, d) += scale * ds * q(i, d);
            grad(2, j, d) += at(P, n, i, j) * g(i, d);
          }
        }
      }
    }
  }
  return dqkv;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Score magnitudes up to a few units (inputs in [-2, 2], head_dim up to 16) make the
// softmax peaked enough that a wrong running max or rescale would show.
std::vector<double> random_qkv(const Shape& s, std::uint64_t seed) {
  return random_vector(s.qkv_size(), seed, -2.0, 2.0);
}

const Shape kForwardShapes[] = {
    {1, 1, 1, 3},   {2, 7, 2, 3},    {1, 63, 1, 16}, {1, 64, 4, 16},
    {1, 65, 4, 16}, {2, 100, 3, 16}, {2, 130, 2, 5},
};

TEST(AttentionForward, MatchesNaiveReferenceInDouble) {
  // Block 0 stands for the public entry point (its tuned block); the others force many
  // blocks, partial last blocks and blocks that do not divide seq.
  for (const Shape& s : kForwardShapes) {
    for (std::int64_t block :
         {std::int64_t{0}, std::int64_t{1}, std::int64_t{4}, std::int64_t{7}, std::int64_t{16}}) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.B << " seq=" << s.seq << " heads=" << s.heads
                                        << " head_dim=" << s.head_dim << " block=" << block);
      const std::vector<double> qkv = random_qkv(s, 1 + static_cast<std::uint64_t>(s.seq));
      const Reference ref = naive_forward(qkv, s);
      std::vector<double> out(s.out_size(), -7.0), lse(s.lse_size(), -7.0);
      if (block == 0) {
        attention_forward(qkv.data(), out.data(), lse.data(), s.B, s.seq, s.heads, s.head_dim);
      } else {
        detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s.B, s.seq, s.heads,
                                          s.head_dim, block);
      }
      for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref.out[i], 1e-12) << i;
      for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref.lse[i], 1e-12) << i;
    }
  }
}

TEST(AttentionForward, FloatIsCloseToDoubleReference) {
  // Float inputs are the double inputs rounded; the outputs are softmax-weighted averages of
  // values in [-2, 2] and the lse is O(1..10), so 2e-5 absolute is a few hundred float ulps
  // of headroom over the rounding of score sums of 16 products and the ~1e-7 relative
  // error of the vectorised exp.
  for (const Shape& s : kForwardShapes) {
    SCOPED_TRACE(::testing::Message() << "seq=" << s.seq << " head_dim=" << s.head_dim);
    const std::vector<double> qkv = random_qkv(s, 99);
    const Reference ref = naive_forward(qkv, s);
    const std::vector<float> qkv_f = to_float(qkv);
    std::vector<float> out(s.out_size()), lse(s.lse_size());
    attention_forward(qkv_f.data(), out.data(), lse.data(), s.B, s.seq, s.heads, s.head_dim);
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref.out[i], 2e-5) << i;
    for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref.lse[i], 2e-5) << i;
  }
}

TEST(AttentionForward, ExtremeScoresStayFinite) {
  // Inputs in [-15, 15] with head_dim 4 give scaled scores of up to 450: exp without the
  // running max would overflow. Float rounds such scores with an absolute error of about
  // 450 * 6e-8 = 3e-5, which is a relative error of that size in every softmax weight; the
  // values are up to 15 in magnitude, hence 2e-3 on out and 1e-4 on lse.
  const Shape s{1, 70, 2, 4};
  std::vector<double> qkv = random_vector(s.qkv_size(), 5, -15.0, 15.0);
  const Reference ref = naive_forward(qkv, s);
  const std::vector<float> qkv_f = to_float(qkv);
  std::vector<float> out(s.out_size()), lse(s.lse_size());
  attention_forward(qkv_f.data(), out.data(), lse.data(), s.B, s.seq, s.heads, s.head_dim);
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << i;
    ASSERT_NEAR(out[i], ref.out[i], 2e-3) << i;
  }
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref.lse[i], 1e-4) << i;
}

// Finite differences call the kernel thousands of times on tiny shapes. One thread keeps
// that fast on a busy machine (idle OpenMP threads spin at every region's barrier); thread
// independence is tested separately.
class SingleThreaded {
 public:
  SingleThreaded() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreaded() { omp_set_num_threads(saved_); }
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;

 private:
  int saved_;
};

// L(qkv) = sum w * out(qkv), so dL/dout = w: the backward pass given w must match central
// differences of L.
void check_backward_by_finite_differences(const Shape& s, std::int64_t block) {
  const SingleThreaded single_threaded;
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " seq=" << s.seq << " heads=" << s.heads
                                    << " head_dim=" << s.head_dim << " block=" << block);
  std::vector<double> qkv = random_vector(s.qkv_size(), 11, -1.0, 1.0);
  const std::vector<double> w = random_vector(s.out_size(), 12, -1.0, 1.0);
  std::vector<double> out(s.out_size()), lse(s.lse_size());
  auto forward = [&] {
    detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s.B, s.seq, s.heads,
                                      s.head_dim, block);
  };
  forward();
  std::vector<double> dqkv(s.qkv_size(), 123.0);  // must be overwritten, not accumulated
  detail::attention_backward_blocked(w.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), s.B,
                                     s.seq, s.heads, s.head_dim, block);
  expect_gradient_matches("dqkv", qkv, dqkv, [&] {
    forward();
    return oases::testing::dot(w, out);
  });
}

TEST(AttentionBackward, MatchesFiniteDifferencesWithSmallBlocks) {
  check_backward_by_finite_differences({2, 1, 2, 3}, 4);
  check_backward_by_finite_differences({2, 7, 2, 3}, 4);   // one full and one partial block
  check_backward_by_finite_differences({2, 20, 2, 3}, 8);  // three blocks, last partial
  check_backward_by_finite_differences({2, 9, 2, 3}, 1);   // every tile 1x1
}

TEST(AttentionBackward, MatchesFiniteDifferencesWithPublicBlock) {
  // seq = 70 spans two tuned blocks, the second partial.
  check_backward_by_finite_differences({2, 70, 1, 3}, kAttentionBlock);
}

TEST(AttentionBackward, MatchesNaiveBackwardOnLargerShapes) {
  for (const Shape& s : {Shape{2, 130, 2, 16}, Shape{1, 65, 4, 5}, Shape{1, 64, 1, 16}}) {
    SCOPED_TRACE(::testing::Message() << "seq=" << s.seq << " head_dim=" << s.head_dim);
    const std::vector<double> qkv = random_qkv(s, 21);
    const std::vector<double> dout = random_vector(s.out_size(), 22);
    const std::vector<double> expected = naive_backward(dout, qkv, s);

    std::vector<double> out(s.out_size()), lse(s.lse_size()), dqkv(s.qkv_size());
    attention_forward(qkv.data(), out.data(), lse.data(), s.B, s.seq, s.heads, s.head_dim);
    attention_backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), s.B, s.seq,
                       s.heads, s.head_dim);
    for (std::size_t i = 0; i < dqkv.size(); ++i) ASSERT_NEAR(dqkv[i], expected[i], 1e-11) << i;

    // Float against the double reference. Gradients here are O(1); 1e-4 absolute allows
    // for the float rounding of the forward quantities (out, lse) the backward pass uses.
    const std::vector<float> qkv_f = to_float(qkv), dout_f = to_float(dout);
    std::vector<float> out_f(s.out_size()), lse_f(s.lse_size()), dqkv_f(s.qkv_size());
    attention_forward(qkv_f.data(), out_f.data(), lse_f.data(), s.B, s.seq, s.heads, s.head_dim);
    attention_backward(dout_f.data(), qkv_f.data(), out_f.data(), lse_f.data(), dqkv_f.data(), s.B,
                       s.seq, s.heads, s.head_dim);
    for (std::size_t i = 0; i < dqkv_f.size(); ++i) {
      ASSERT_NEAR(dqkv_f[i], expected[i], 1e-4) << i;
    }
  }
}

TEST(Attention, IsBitwiseDeterministicAndIndependentOfThreadCount) {
  const Shape s{2, 150, 3, 16};
  const std::vector<float> qkv = to_float(random_qkv(s, 31));
  const std::vector<float> dout = to_float(random_vector(s.out_size(), 32));
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> out(s.out_size()), lse(s.lse_size()), dqkv(s.qkv_size());
    attention_forward(qkv.data(), out.data(), lse.data(), s.B, s.seq, s.heads, s.head_dim);
    attention_backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), s.B, s.seq,
                       s.heads, s.head_dim);
    omp_set_num_threads(saved);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  const std::vector<float> first = run(2);
  const std::vector<float> second = run(2);
  const std::vector<float> single = run(1);
  ASSERT_EQ(first.size(), second.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    ASSERT_EQ(first[i], second[i]) << i;  // exact: same thread count
    ASSERT_EQ(first[i], single[i]) << i;  // exact: each task's work is thread-independent
  }
}

TEST(Attention, InvalidShapesAreInternalErrors) {
  std::vector<float> qkv(3 * 4), out(4), lse(1), dqkv(3 * 4);
  EXPECT_THROW(attention_forward(qkv.data(), out.data(), lse.data(), 1, 1, 1, 0), InternalError);
  EXPECT_THROW(detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), 1, 1, 1, 4, 0),
               InternalError);
  EXPECT_THROW(
      attention_backward(out.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), 1, -1, 1, 4),
      InternalError);
}

}  // namespace
}  // namespace oases::kernels::cpu
