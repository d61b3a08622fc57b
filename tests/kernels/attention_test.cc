#include "kernels/cpu/attention.h"

#include "core/error.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
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

AttentionShape causal_mha(const Shape& s) {
  return {s.B, s.seq, s.heads, s.heads, s.head_dim, true};
}

std::size_t qkv_size(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.seq * (s.heads + 2 * s.kv_heads) * s.head_dim);
}
std::size_t out_size(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.seq * s.heads * s.head_dim);
}
std::size_t lse_size(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.heads * s.seq);
}

// Element accessors of the textbook computation: q head h reads kv head h / group.
struct NaiveLayout {
  explicit NaiveLayout(const AttentionShape& s)
      : shape(s),
        ld((s.heads + 2 * s.kv_heads) * s.head_dim),
        C(s.heads * s.head_dim),
        group(s.heads / s.kv_heads) {}
  std::size_t q(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return static_cast<std::size_t>((b * shape.seq + i) * ld + h * shape.head_dim + d);
  }
  std::size_t k(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return static_cast<std::size_t>((b * shape.seq + i) * ld + C + (h / group) * shape.head_dim +
                                    d);
  }
  std::size_t v(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return k(b, h, i, d) + static_cast<std::size_t>(shape.kv_heads * shape.head_dim);
  }
  std::size_t o(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return static_cast<std::size_t>((b * shape.seq + i) * C + h * shape.head_dim + d);
  }
  // Keys that query i sees: [0, key_end(i)).
  std::int64_t key_end(std::int64_t i) const { return shape.causal ? i + 1 : shape.seq; }
  AttentionShape shape;
  std::int64_t ld, C, group;
};

// The factor attention dropout applies to probability (i, j) of head h of row b: 1 / (1 - p)
// where attention_probability_keep keeps it, else 0 (1 without dropout).
double dropout_factor(const AttentionDropout& dropout, std::int64_t b, std::int64_t h,
                      std::int64_t i, std::int64_t j) {
  if (dropout.p == 0) return 1.0;
  return attention_probability_keep(dropout.site, dropout.p, dropout.sample_offset + b,
                                    dropout.head_offset + h, i, j)
             ? 1.0 / (1.0 - dropout.p)
             : 0.0;
}

// The textbook computation: the whole [seq, seq] score matrix of each head, masked, softmaxed
// (and dropped out) and multiplied by V, in double.
struct Reference {
  std::vector<double> out, lse;
};

Reference naive_forward(const std::vector<double>& qkv, const AttentionShape& s,
                        const AttentionDropout& dropout = {}) {
  const NaiveLayout at(s);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  Reference ref{std::vector<double>(out_size(s)), std::vector<double>(lse_size(s))};
  std::vector<double> scores(static_cast<std::size_t>(s.seq));
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t i = 0; i < s.seq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < at.key_end(i); ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < s.head_dim; ++d)
            dot += qkv[at.q(b, h, i, d)] * qkv[at.k(b, h, j, d)];
          scores[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < at.key_end(i); ++j)
          sum += std::exp(scores[static_cast<std::size_t>(j)] - mx);
        ref.lse[static_cast<std::size_t>((b * s.heads + h) * s.seq + i)] = mx + std::log(sum);
        for (std::int64_t j = 0; j < at.key_end(i); ++j) {
          const double p = std::exp(scores[static_cast<std::size_t>(j)] - mx) / sum *
                           dropout_factor(dropout, b, h, i, j);
          for (std::int64_t d = 0; d < s.head_dim; ++d)
            ref.out[at.o(b, h, i, d)] += p * qkv[at.v(b, h, j, d)];
        }
      }
    }
  }
  return ref;
}

Reference naive_forward(const std::vector<double>& qkv, const Shape& s) {
  return naive_forward(qkv, causal_mha(s));
}

// The textbook backward pass on the full probability matrix, in double:
//   dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q
// (a kv head's gradients summing over the q heads of its group). With dropout factors M,
// dV = (M * P)^T dO and dP = M * (dO V^T).
std::vector<double> naive_backward(const std::vector<double>& dout, const std::vector<double>& qkv,
                                   const AttentionShape& s, const AttentionDropout& dropout = {}) {
  const NaiveLayout at(s);
  const std::int64_t n = s.seq, hd = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> dqkv(qkv_size(s), 0.0);
  std::vector<double> P(static_cast<std::size_t>(n * n)), dP(P.size());
  auto cell = [n](std::vector<double>& m, std::int64_t i, std::int64_t j) -> double& {
    return m[static_cast<std::size_t>(i * n + j)];
  };
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      std::fill(P.begin(), P.end(), 0.0);
      for (std::int64_t i = 0; i < n; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < at.key_end(i); ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d)
            dot += qkv[at.q(b, h, i, d)] * qkv[at.k(b, h, j, d)];
          cell(P, i, j) = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < at.key_end(i); ++j)
          sum += (cell(P, i, j) = std::exp(cell(P, i, j) - mx));
        for (std::int64_t j = 0; j < at.key_end(i); ++j) cell(P, i, j) /= sum;
      }
      for (std::int64_t i = 0; i < n; ++i) {
        double row = 0;
        for (std::int64_t j = 0; j < at.key_end(i); ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d)
            dot += dout[at.o(b, h, i, d)] * qkv[at.v(b, h, j, d)];
          cell(dP, i, j) = dot * dropout_factor(dropout, b, h, i, j);
          row += cell(dP, i, j) * cell(P, i, j);
        }
        for (std::int64_t j = 0; j < at.key_end(i); ++j) {
          const double ds = cell(P, i, j) * (cell(dP, i, j) - row);
          for (std::int64_t d = 0; d < hd; ++d) {
            dqkv[at.q(b, h, i, d)] += scale * ds * qkv[at.k(b, h, j, d)];
            dqkv[at.k(b, h, j, d)] += scale * ds * qkv[at.q(b, h, i, d)];
            dqkv[at.v(b, h, j, d)] +=
                cell(P, i, j) * dropout_factor(dropout, b, h, i, j) * dout[at.o(b, h, i, d)];
          }
        }
      }
    }
  }
  return dqkv;
}

std::vector<double> naive_backward(const std::vector<double>& dout, const std::vector<double>& qkv,
                                   const Shape& s) {
  return naive_backward(dout, qkv, causal_mha(s));
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
  // Exact: each task's work is the same whichever thread runs it.
  oases::testing::expect_independent_of_thread_count("attention", [&] {
    std::vector<float> out(s.out_size()), lse(s.lse_size()), dqkv(s.qkv_size());
    attention_forward(qkv.data(), out.data(), lse.data(), s.B, s.seq, s.heads, s.head_dim);
    attention_backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), s.B, s.seq,
                       s.heads, s.head_dim);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  });
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

std::string describe(const AttentionShape& s) {
  return ::testing::PrintToString(
             std::vector<std::int64_t>{s.batch, s.seq, s.heads, s.kv_heads, s.head_dim}) +
         (s.causal ? " causal" : " bidirectional");
}

// Grouped-query (including one kv head for all q heads), multi-head, causal and
// bidirectional, with seq not a multiple of the blocks.
const AttentionShape kGeneralShapes[] = {
    {2, 7, 4, 2, 3, true},    {2, 7, 4, 2, 3, false},   {1, 65, 6, 2, 16, true},
    {1, 65, 6, 2, 16, false}, {2, 33, 4, 1, 5, true},   {2, 33, 4, 1, 5, false},
    {1, 20, 3, 3, 4, false},  {1, 130, 2, 2, 8, false},
};

TEST(AttentionGeneral, ForwardMatchesNaiveReference) {
  for (const AttentionShape& s : kGeneralShapes) {
    for (std::int64_t block :
         {std::int64_t{0}, std::int64_t{1}, std::int64_t{4}, std::int64_t{7}}) {
      SCOPED_TRACE(describe(s) + " block=" + std::to_string(block));
      const std::vector<double> qkv = random_vector(qkv_size(s), 41 + s.seq, -2.0, 2.0);
      const Reference ref = naive_forward(qkv, s);
      std::vector<double> out(out_size(s), -7.0), lse(lse_size(s), -7.0);
      if (block == 0) {
        attention_forward(qkv.data(), out.data(), lse.data(), s);
      } else {
        detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s, block);
      }
      for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref.out[i], 1e-12) << i;
      for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref.lse[i], 1e-12) << i;

      // Float within the tolerance of AttentionForward.FloatIsCloseToDoubleReference.
      const std::vector<float> qkv_f = to_float(qkv);
      std::vector<float> out_f(out_size(s)), lse_f(lse_size(s));
      detail::attention_forward_blocked(qkv_f.data(), out_f.data(), lse_f.data(), s,
                                        block == 0 ? kAttentionBlock : block);
      for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out_f[i], ref.out[i], 2e-5) << i;
      for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse_f[i], ref.lse[i], 2e-5) << i;
    }
  }
}

TEST(AttentionGeneral, BackwardMatchesNaiveReference) {
  for (const AttentionShape& s : kGeneralShapes) {
    SCOPED_TRACE(describe(s));
    const std::vector<double> qkv = random_vector(qkv_size(s), 51, -2.0, 2.0);
    const std::vector<double> dout = random_vector(out_size(s), 52);
    const std::vector<double> expected = naive_backward(dout, qkv, s);
    for (std::int64_t block : {std::int64_t{3}, kAttentionBlock}) {
      std::vector<double> out(out_size(s)), lse(lse_size(s)), dqkv(qkv_size(s), 5.0);
      detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s, block);
      detail::attention_backward_blocked(dout.data(), qkv.data(), out.data(), lse.data(),
                                         dqkv.data(), s, block);
      for (std::size_t i = 0; i < dqkv.size(); ++i)
        ASSERT_NEAR(dqkv[i], expected[i], 1e-11) << "block " << block << " element " << i;
    }
    // Float against the double reference, as in AttentionBackward.MatchesNaiveBackwardOnLarger-
    // Shapes; a kv head sums the gradients of its group, hence the wider bound.
    const std::vector<float> qkv_f = to_float(qkv), dout_f = to_float(dout);
    std::vector<float> out_f(out_size(s)), lse_f(lse_size(s)), dqkv_f(qkv_size(s));
    attention_forward(qkv_f.data(), out_f.data(), lse_f.data(), s);
    attention_backward(dout_f.data(), qkv_f.data(), out_f.data(), lse_f.data(), dqkv_f.data(), s);
    for (std::size_t i = 0; i < dqkv_f.size(); ++i) ASSERT_NEAR(dqkv_f[i], expected[i], 3e-4) << i;
  }
}

void check_general_backward_by_finite_differences(const AttentionShape& s, std::int64_t block) {
  const SingleThreaded single_threaded;
  SCOPED_TRACE(describe(s) + " block=" + std::to_string(block));
  std::vector<double> qkv = random_vector(qkv_size(s), 61, -1.0, 1.0);
  const std::vector<double> w = random_vector(out_size(s), 62, -1.0, 1.0);
  std::vector<double> out(out_size(s)), lse(lse_size(s));
  auto forward = [&] {
    detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s, block);
  };
  forward();
  std::vector<double> dqkv(qkv_size(s), 123.0);  // must be overwritten, not accumulated
  detail::attention_backward_blocked(w.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), s,
                                     block);
  expect_gradient_matches("dqkv", qkv, dqkv, [&] {
    forward();
    return oases::testing::dot(w, out);
  });
}

TEST(AttentionGeneral, BackwardMatchesFiniteDifferences) {
  for (bool causal : {true, false}) {
    check_general_backward_by_finite_differences({2, 7, 4, 2, 3, causal}, 4);
    check_general_backward_by_finite_differences({1, 9, 3, 1, 3, causal}, 2);
    check_general_backward_by_finite_differences({1, 5, 2, 2, 3, causal}, 1);
  }
}

// Grouped-query attention is multi-head attention with each kv head repeated for its group
// (Hugging Face's repeat_kv): same outputs, and a kv head's gradient is the sum of its copies'.
TEST(AttentionGeneral, GroupedQueryEqualsMultiHeadWithRepeatedKeysAndValues) {
  for (bool causal : {true, false}) {
    const AttentionShape gqa{2, 37, 6, 2, 5, causal};
    const AttentionShape mha{2, 37, 6, 6, 5, causal};
    SCOPED_TRACE(describe(gqa));
    const std::int64_t hd = gqa.head_dim, group = 3;
    const std::int64_t ld_g = (6 + 4) * hd, ld_m = 18 * hd;
    const std::vector<double> qkv_g = random_vector(qkv_size(gqa), 71, -2.0, 2.0);
    std::vector<double> qkv_m(qkv_size(mha));
    for (std::int64_t row = 0; row < gqa.batch * gqa.seq; ++row) {
      for (std::int64_t h = 0; h < 6; ++h) {
        for (std::int64_t d = 0; d < hd; ++d) {
          const auto g = static_cast<std::size_t>(row * ld_g);
          const auto m = static_cast<std::size_t>(row * ld_m);
          const auto kv = static_cast<std::size_t>((h / group) * hd + d);
          const auto col = static_cast<std::size_t>(h * hd + d);
          qkv_m[m + col] = qkv_g[g + col];
          qkv_m[m + 6 * hd + col] = qkv_g[g + 6 * hd + kv];
          qkv_m[m + 12 * hd + col] = qkv_g[g + 8 * hd + kv];
        }
      }
    }
    const std::vector<double> dout = random_vector(out_size(gqa), 72);
    std::vector<double> out_g(out_size(gqa)), lse_g(lse_size(gqa)), dqkv_g(qkv_size(gqa));
    std::vector<double> out_m(out_size(mha)), lse_m(lse_size(mha)), dqkv_m(qkv_size(mha));
    attention_forward(qkv_g.data(), out_g.data(), lse_g.data(), gqa);
    attention_backward(dout.data(), qkv_g.data(), out_g.data(), lse_g.data(), dqkv_g.data(), gqa);
    attention_forward(qkv_m.data(), out_m.data(), lse_m.data(), mha);
    attention_backward(dout.data(), qkv_m.data(), out_m.data(), lse_m.data(), dqkv_m.data(), mha);
    for (std::size_t i = 0; i < out_g.size(); ++i) ASSERT_NEAR(out_g[i], out_m[i], 1e-13) << i;
    for (std::size_t i = 0; i < lse_g.size(); ++i) ASSERT_NEAR(lse_g[i], lse_m[i], 1e-13) << i;
    for (std::int64_t row = 0; row < gqa.batch * gqa.seq; ++row) {
      const auto g = static_cast<std::size_t>(row * ld_g);
      const auto m = static_cast<std::size_t>(row * ld_m);
      for (std::size_t col = 0; col < static_cast<std::size_t>(6 * hd); ++col)
        ASSERT_NEAR(dqkv_g[g + col], dqkv_m[m + col], 1e-12) << "dq row " << row;
      for (std::int64_t kv = 0; kv < 2; ++kv) {
        for (std::int64_t d = 0; d < hd; ++d) {
          double dk = 0, dv = 0;
          for (std::int64_t r = 0; r < group; ++r) {
            const auto col = static_cast<std::size_t>((kv * group + r) * hd + d);
            dk += dqkv_m[m + 6 * static_cast<std::size_t>(hd) + col];
            dv += dqkv_m[m + 12 * static_cast<std::size_t>(hd) + col];
          }
          const auto col = static_cast<std::size_t>(kv * hd + d);
          ASSERT_NEAR(dqkv_g[g + 6 * static_cast<std::size_t>(hd) + col], dk, 1e-12) << row;
          ASSERT_NEAR(dqkv_g[g + 8 * static_cast<std::size_t>(hd) + col], dv, 1e-12) << row;
        }
      }
    }
  }
}

// The multi-head signatures are the general functions with kv_heads == heads, causal.
TEST(AttentionGeneral, MultiHeadSignaturesAreTheCausalSpecialCase) {
  const Shape s{2, 70, 3, 8};
  const std::vector<float> qkv = to_float(random_qkv(s, 81));
  const std::vector<float> dout = to_float(random_vector(s.out_size(), 82));
  std::vector<float> out_a(s.out_size()), lse_a(s.lse_size()), dqkv_a(s.qkv_size());
  std::vector<float> out_b(s.out_size()), lse_b(s.lse_size()), dqkv_b(s.qkv_size());
  attention_forward(qkv.data(), out_a.data(), lse_a.data(), s.B, s.seq, s.heads, s.head_dim);
  attention_backward(dout.data(), qkv.data(), out_a.data(), lse_a.data(), dqkv_a.data(), s.B, s.seq,
                     s.heads, s.head_dim);
  attention_forward(qkv.data(), out_b.data(), lse_b.data(), causal_mha(s));
  attention_backward(dout.data(), qkv.data(), out_b.data(), lse_b.data(), dqkv_b.data(),
                     causal_mha(s));
  EXPECT_EQ(out_a, out_b);
  EXPECT_EQ(lse_a, lse_b);
  EXPECT_EQ(dqkv_a, dqkv_b);
}

TEST(AttentionGeneral, IsBitwiseDeterministicAndIndependentOfThreadCount) {
  for (bool causal : {true, false}) {
    const AttentionShape s{2, 150, 4, 2, 16, causal};
    const std::vector<float> qkv = to_float(random_vector(qkv_size(s), 91, -2.0, 2.0));
    const std::vector<float> dout = to_float(random_vector(out_size(s), 92));
    oases::testing::expect_independent_of_thread_count(causal ? "causal" : "bidirectional", [&] {
      std::vector<float> out(out_size(s)), lse(lse_size(s)), dqkv(qkv_size(s));
      attention_forward(qkv.data(), out.data(), lse.data(), s);
      attention_backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), s);
      out.insert(out.end(), lse.begin(), lse.end());
      out.insert(out.end(), dqkv.begin(), dqkv.end());
      return out;
    });
  }
}

TEST(AttentionGeneral, HeadsNotDivisibleByKvHeadsAreInternalErrors) {
  std::vector<float> qkv(64), out(64), lse(64), dqkv(64);
  EXPECT_THROW(attention_forward(qkv.data(), out.data(), lse.data(), AttentionShape{1, 1, 3, 2, 2}),
               InternalError);
  EXPECT_THROW(attention_forward(qkv.data(), out.data(), lse.data(), AttentionShape{1, 1, 2, 0, 2}),
               InternalError);
  EXPECT_THROW(attention_backward(out.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                                  AttentionShape{1, 1, 2, 4, 2}),
               InternalError);
}

// Attention dropout: a quarter of the probabilities dropped, at offsets into a larger batch
// and head range so that the global indices matter.
AttentionDropout some_dropout(double p = 0.25) {
  return {p, DropoutSite{1234, 7, 3, 6}, 5, 2};
}

TEST(AttentionDropout, ForwardMatchesNaiveReferenceWithTheMask) {
  const AttentionDropout dropout = some_dropout();
  for (const AttentionShape& s : kGeneralShapes) {
    for (std::int64_t block : {std::int64_t{1}, std::int64_t{3}, kAttentionBlock}) {
      SCOPED_TRACE(describe(s) + " block=" + std::to_string(block));
      const std::vector<double> qkv = random_vector(qkv_size(s), 101 + s.seq, -2.0, 2.0);
      const Reference ref = naive_forward(qkv, s, dropout);
      std::vector<double> out(out_size(s), -7.0), lse(lse_size(s), -7.0);
      detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s, block, dropout);
      for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref.out[i], 1e-12) << i;
      // The log-sum-exp is that of the probabilities before dropout.
      for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref.lse[i], 1e-12) << i;
    }
  }
}

TEST(AttentionDropout, BackwardMatchesNaiveReferenceWithTheMask) {
  const AttentionDropout dropout = some_dropout();
  for (const AttentionShape& s : kGeneralShapes) {
    SCOPED_TRACE(describe(s));
    const std::vector<double> qkv = random_vector(qkv_size(s), 111, -2.0, 2.0);
    const std::vector<double> dout = random_vector(out_size(s), 112);
    const std::vector<double> expected = naive_backward(dout, qkv, s, dropout);
    for (std::int64_t block : {std::int64_t{3}, kAttentionBlock}) {
      std::vector<double> out(out_size(s)), lse(lse_size(s)), dqkv(qkv_size(s), 5.0);
      detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s, block, dropout);
      detail::attention_backward_blocked(dout.data(), qkv.data(), out.data(), lse.data(),
                                         dqkv.data(), s, block, dropout);
      for (std::size_t i = 0; i < dqkv.size(); ++i)
        ASSERT_NEAR(dqkv[i], expected[i], 1e-11) << "block " << block << " element " << i;
    }
    // Float against the double reference within AttentionGeneral's bound, widened by the
    // 1 / (1 - p) factor.
    const std::vector<float> qkv_f = to_float(qkv), dout_f = to_float(dout);
    std::vector<float> out_f(out_size(s)), lse_f(lse_size(s)), dqkv_f(qkv_size(s));
    attention_forward(qkv_f.data(), out_f.data(), lse_f.data(), s, dropout);
    attention_backward(dout_f.data(), qkv_f.data(), out_f.data(), lse_f.data(), dqkv_f.data(), s,
                       dropout);
    for (std::size_t i = 0; i < dqkv_f.size(); ++i) ASSERT_NEAR(dqkv_f[i], expected[i], 4e-4) << i;
  }
}

TEST(AttentionDropout, BackwardMatchesFiniteDifferences) {
  // The mask does not depend on qkv, so the loss is smooth in it.
  const SingleThreaded single_threaded;
  const AttentionDropout dropout = some_dropout(0.4);
  for (const AttentionShape& s :
       {AttentionShape{2, 7, 4, 2, 3, true}, AttentionShape{1, 9, 3, 1, 3, false}}) {
    for (std::int64_t block : {std::int64_t{2}, std::int64_t{4}}) {
      SCOPED_TRACE(describe(s) + " block=" + std::to_string(block));
      std::vector<double> qkv = random_vector(qkv_size(s), 121, -1.0, 1.0);
      const std::vector<double> w = random_vector(out_size(s), 122, -1.0, 1.0);
      std::vector<double> out(out_size(s)), lse(lse_size(s));
      auto forward = [&] {
        detail::attention_forward_blocked(qkv.data(), out.data(), lse.data(), s, block, dropout);
      };
      forward();
      std::vector<double> dqkv(qkv_size(s), 123.0);
      detail::attention_backward_blocked(w.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                                         s, block, dropout);
      expect_gradient_matches("dqkv", qkv, dqkv, [&] {
        forward();
        return oases::testing::dot(w, out);
      });
    }
  }
}

TEST(AttentionDropout, DropsTheGivenFractionWithIndependentDraws) {
  // 4 * 256 * 256 draws: the dropped fraction is within 5 standard deviations of p, and the
  // four keys that share a Philox block are not correlated (each pair of neighbours in a block
  // is dropped together about p^2 of the time).
  const DropoutSite site{99, 3, 1, 6};
  for (double p : {0.1, 0.5}) {
    std::int64_t dropped = 0, both = 0, pairs = 0, draws = 0;
    for (std::int64_t head = 0; head < 4; ++head) {
      for (std::int64_t i = 0; i < 256; ++i) {
        bool previous = false;
        for (std::int64_t j = 0; j < 256; ++j) {
          const bool drop = !attention_probability_keep(site, p, 11, head, i, j);
          dropped += drop;
          ++draws;
          if (j % 4 != 0) {
            both += drop && previous;
            ++pairs;
          }
          previous = drop;
        }
      }
    }
    const double n = static_cast<double>(draws), m = static_cast<double>(pairs);
    EXPECT_NEAR(static_cast<double>(dropped) / n, p, 5 * std::sqrt(p * (1 - p) / n)) << p;
    EXPECT_NEAR(static_cast<double>(both) / m, p * p, 5 * std::sqrt(p * p * (1 - p * p) / m)) << p;
  }
  // Another head, sample, layer or step draws another mask.
  auto mask = [](const DropoutSite& s, std::int64_t sample, std::int64_t head) {
    std::vector<bool> bits;
    for (std::int64_t i = 0; i < 16; ++i)
      for (std::int64_t j = 0; j < 16; ++j)
        bits.push_back(attention_probability_keep(s, 0.5, sample, head, i, j));
    return bits;
  };
  const std::vector<bool> base = mask(site, 0, 0);
  EXPECT_NE(base, mask(site, 0, 1));
  EXPECT_NE(base, mask(site, 1, 0));
  EXPECT_NE(base, mask({99, 4, 1, 6}, 0, 0));
  EXPECT_NE(base, mask({99, 3, 2, 6}, 0, 0));
  EXPECT_EQ(base, mask(site, 0, 0));
}

TEST(AttentionDropout, SplittingHeadsAndRowsWithOffsetsDrawsTheSameMask) {
  // What tensor parallelism (heads) and data parallelism or sub-batches (rows) do: each part
  // called with its global offsets equals the whole call, bit for bit.
  const AttentionShape whole{4, 40, 4, 4, 5, true};
  const AttentionDropout dropout = some_dropout();
  const std::vector<double> qkv = random_vector(qkv_size(whole), 131, -2.0, 2.0);
  const std::vector<double> dout = random_vector(out_size(whole), 132);
  std::vector<double> out(out_size(whole)), lse(lse_size(whole)), dqkv(qkv_size(whole));
  attention_forward(qkv.data(), out.data(), lse.data(), whole, dropout);
  attention_backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), whole, dropout);
  const std::int64_t hd = whole.head_dim, C = whole.heads * hd, ld = 3 * C;
  // Part (rows [b0, b0 + 2), heads [h0, h0 + 2)): its own qkv [2 * seq, 3 * 2 * hd].
  for (std::int64_t b0 : {0, 2}) {
    for (std::int64_t h0 : {0, 2}) {
      const AttentionShape part{2, whole.seq, 2, 2, hd, true};
      const std::int64_t pc = 2 * hd, pld = 3 * pc;
      std::vector<double> pqkv(qkv_size(part)), pdout(out_size(part));
      for (std::int64_t r = 0; r < 2 * whole.seq; ++r) {
        const std::int64_t row = b0 * whole.seq + r;
        for (std::int64_t part_of = 0; part_of < 3; ++part_of)
          for (std::int64_t c = 0; c < pc; ++c)
            pqkv[static_cast<std::size_t>(r * pld + part_of * pc + c)] =
                qkv[static_cast<std::size_t>(row * ld + part_of * C + h0 * hd + c)];
        for (std::int64_t c = 0; c < pc; ++c)
          pdout[static_cast<std::size_t>(r * pc + c)] =
              dout[static_cast<std::size_t>(row * C + h0 * hd + c)];
      }
      AttentionDropout shifted = dropout;
      shifted.sample_offset += b0;
      shifted.head_offset += h0;
      std::vector<double> pout(out_size(part)), plse(lse_size(part)), pdqkv(qkv_size(part));
      attention_forward(pqkv.data(), pout.data(), plse.data(), part, shifted);
      attention_backward(pdout.data(), pqkv.data(), pout.data(), plse.data(), pdqkv.data(), part,
                         shifted);
      for (std::int64_t r = 0; r < 2 * whole.seq; ++r) {
        const std::int64_t row = b0 * whole.seq + r;
        for (std::int64_t c = 0; c < pc; ++c)
          ASSERT_EQ(pout[static_cast<std::size_t>(r * pc + c)],
                    out[static_cast<std::size_t>(row * C + h0 * hd + c)]);
        for (std::int64_t part_of = 0; part_of < 3; ++part_of)
          for (std::int64_t c = 0; c < pc; ++c)
            ASSERT_EQ(pdqkv[static_cast<std::size_t>(r * pld + part_of * pc + c)],
                      dqkv[static_cast<std::size_t>(row * ld + part_of * C + h0 * hd + c)]);
      }
    }
  }
}

TEST(AttentionDropout, ZeroProbabilityIsNoDropoutAndIsThreadIndependent) {
  const AttentionShape s{2, 150, 4, 2, 16, true};
  const std::vector<float> qkv = to_float(random_vector(qkv_size(s), 141, -2.0, 2.0));
  const std::vector<float> dout = to_float(random_vector(out_size(s), 142));
  auto run = [&](const AttentionDropout& dropout) {
    std::vector<float> out(out_size(s)), lse(lse_size(s)), dqkv(qkv_size(s));
    attention_forward(qkv.data(), out.data(), lse.data(), s, dropout);
    attention_backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), s, dropout);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  EXPECT_EQ(run(some_dropout(0.0)), run({}));
  EXPECT_NE(run(some_dropout()), run({}));
  oases::testing::expect_independent_of_thread_count("dropout",
                                                     [&] { return run(some_dropout()); });
}

TEST(AttentionDropout, InvalidProbabilityIsAnInternalError) {
  const AttentionShape s{1, 2, 1, 1, 4, true};
  std::vector<float> qkv(3 * 8), out(8), lse(2);
  EXPECT_THROW(attention_forward(qkv.data(), out.data(), lse.data(), s, some_dropout(1.0)),
               InternalError);
  EXPECT_THROW(attention_forward(qkv.data(), out.data(), lse.data(), s, some_dropout(-0.1)),
               InternalError);
  EXPECT_THROW(attention_probability_keep({0, 0, 0, 6}, 0.5, 0, std::int64_t{1} << 24, 0, 0),
               InternalError);
}

}  // namespace
}  // namespace oases::kernels::cpu
