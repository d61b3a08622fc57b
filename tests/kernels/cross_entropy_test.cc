#include "kernels/cpu/cross_entropy.h"

#include "core/error.h"

#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using oases::testing::append;
using oases::testing::expect_gradient_matches;
using oases::testing::expect_independent_of_thread_count;
using oases::testing::random_vector;

struct Problem {
  std::int64_t n, V, ld;
  std::vector<double> logits;  // [n, ld]; padding columns hold `padding_value`
  std::vector<std::int32_t> targets;
};

// Real logits in [lo, hi); padding columns get a value that would dominate the softmax (or
// poison it, if NaN) were it ever read.
Problem make_problem(std::int64_t n, std::int64_t V, std::int64_t ld, std::uint64_t seed,
                     double lo = -3.0, double hi = 3.0, double padding_value = 50.0) {
  Problem p{n, V, ld, random_vector(static_cast<std::size_t>(n * ld), seed, lo, hi), {}};
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = V; j < ld; ++j)
      p.logits[static_cast<std::size_t>(i * ld + j)] = padding_value;
  }
  const std::vector<double> t = random_vector(static_cast<std::size_t>(n), seed + 1, 0.0, 1.0);
  for (std::int64_t i = 0; i < n; ++i) {
    p.targets.push_back(static_cast<std::int32_t>(
        std::min<double>(static_cast<double>(V - 1),
                         std::floor(t[static_cast<std::size_t>(i)] * static_cast<double>(V)))));
  }
  return p;
}

// The definition, in double: log(sum_j exp(x_j - max)) + max - x_target.
std::vector<double> naive_losses(const Problem& p) {
  std::vector<double> losses;
  for (std::int64_t i = 0; i < p.n; ++i) {
    const double* x = &p.logits[static_cast<std::size_t>(i * p.ld)];
    const double m = *std::max_element(x, x + p.V);
    double sum = 0;
    for (std::int64_t j = 0; j < p.V; ++j) sum += std::exp(x[j] - m);
    losses.push_back(std::log(sum) + m - x[p.targets[static_cast<std::size_t>(i)]]);
  }
  return losses;
}

std::vector<float> to_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

struct Case {
  std::int64_t n, V, ld;
};
const Case kCases[] = {{1, 1, 1}, {3, 2, 5}, {5, 7, 7}, {4, 100, 128}, {6, 1000, 1003}};

TEST(CrossEntropyForward, MatchesNaiveReferenceInDoubleAndIgnoresPadding) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " V=" << c.V << " ld=" << c.ld);
    // NaN padding: any read of it would make a loss NaN.
    const Problem p =
        make_problem(c.n, c.V, c.ld, 7, -3.0, 3.0, std::numeric_limits<double>::quiet_NaN());
    const std::vector<double> expected = naive_losses(p);
    std::vector<double> losses(static_cast<std::size_t>(c.n), -1.0);
    cross_entropy_forward(p.logits.data(), p.targets.data(), losses.data(), c.n, c.V, c.ld);
    for (std::int64_t i = 0; i < c.n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      ASSERT_NEAR(losses[k], expected[k], 1e-12 * std::max(1.0, std::abs(expected[k]))) << i;
    }
  }
}

TEST(CrossEntropyForward, FloatMatchesDoubleReferenceAtFullVocabulary) {
  // GPT-2's vocabulary padded to 50304 columns (50257 real). A loss of ~11 from a sum of
  // 50k terms: summed in double, the float result is within a few ulps of the loss (the
  // vectorised exp adds ~1e-7 relative per term); 2e-6 relative leaves margin.
  const Problem p = make_problem(8, 50257, 50304, 3, -4.0, 4.0);
  const std::vector<double> expected = naive_losses(p);
  const std::vector<float> logits = to_float(p.logits);
  std::vector<float> losses(8);
  cross_entropy_forward(logits.data(), p.targets.data(), losses.data(), p.n, p.V, p.ld);
  for (std::size_t i = 0; i < losses.size(); ++i) {
    ASSERT_NEAR(losses[i], expected[i], 2e-6 * std::abs(expected[i])) << i;
  }
  // The fused pass gives the same losses.
  std::vector<float> fused = logits, fused_losses(8);
  cross_entropy_forward_backward(fused.data(), p.targets.data(), fused_losses.data(), p.n, p.V,
                                 p.ld, 1.0f);
  for (std::size_t i = 0; i < losses.size(); ++i) ASSERT_EQ(fused_losses[i], losses[i]) << i;
}

TEST(CrossEntropyForward, LeavesLogitsUnchanged) {
  const Problem p = make_problem(4, 100, 128, 9);
  const std::vector<float> logits = to_float(p.logits);
  std::vector<float> copy = logits, losses(4);
  cross_entropy_forward(copy.data(), p.targets.data(), losses.data(), p.n, p.V, p.ld);
  ASSERT_EQ(std::memcmp(copy.data(), logits.data(), logits.size() * sizeof(float)), 0);
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

TEST(CrossEntropyForwardBackward, GradientMatchesFiniteDifferences) {
  const SingleThreaded single_threaded;
  for (const Case& c : kCases) {
    for (double grad_scale : {1.0, 0.37, -2.5}) {
      SCOPED_TRACE(::testing::Message() << "n=" << c.n << " V=" << c.V << " ld=" << c.ld
                                        << " grad_scale=" << grad_scale);
      if (c.V > 100) continue;  // keeps the O((n ld)^2) check small; covered below in float
      Problem p = make_problem(c.n, c.V, c.ld, 17);
      std::vector<double> grad = p.logits, losses(static_cast<std::size_t>(c.n));
      cross_entropy_forward_backward(grad.data(), p.targets.data(), losses.data(), c.n, c.V, c.ld,
                                     grad_scale);
      const std::vector<double> expected = naive_losses(p);
      for (std::int64_t i = 0; i < c.n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        ASSERT_NEAR(losses[k], expected[k], 1e-12 * std::max(1.0, expected[k])) << i;
      }
      for (std::int64_t i = 0; i < c.n; ++i) {
        for (std::int64_t j = c.V; j < c.ld; ++j) {
          ASSERT_EQ(grad[static_cast<std::size_t>(i * c.ld + j)], 0.0)
              << "padding " << i << "," << j;
        }
      }
      // Central differences over every column, padding included (whose numeric derivative
      // is exactly 0 because the loss never reads it).
      std::vector<double> scratch(static_cast<std::size_t>(c.n));
      expect_gradient_matches("dlogits", p.logits, grad, [&] {
        cross_entropy_forward(p.logits.data(), p.targets.data(), scratch.data(), c.n, c.V, c.ld);
        double total = 0;
        for (double l : scratch) total += l;
        return grad_scale * total;
      });
    }
  }
}

TEST(CrossEntropyForwardBackward, FloatGradientMatchesDoubleSoftmax) {
  const Problem p = make_problem(6, 1000, 1003, 23);
  const float grad_scale = 1.0f / 6;
  std::vector<float> grad = to_float(p.logits), losses(6);
  cross_entropy_forward_backward(grad.data(), p.targets.data(), losses.data(), p.n, p.V, p.ld,
                                 grad_scale);
  for (std::int64_t i = 0; i < p.n; ++i) {
    const double* x = &p.logits[static_cast<std::size_t>(i * p.ld)];
    const double m = *std::max_element(x, x + p.V);
    double sum = 0;
    for (std::int64_t j = 0; j < p.V; ++j) sum += std::exp(x[j] - m);
    for (std::int64_t j = 0; j < p.ld; ++j) {
      double expected = j < p.V ? std::exp(x[j] - m) / sum : 0.0;
      if (j == p.targets[static_cast<std::size_t>(i)]) expected -= 1.0;
      expected *= grad_scale;
      // Probabilities are ~1e-3 here: 1e-6 relative plus a float ulp of the -1 at the
      // target.
      ASSERT_NEAR(grad[static_cast<std::size_t>(i * p.ld + j)], expected,
                  1e-6 * std::abs(expected) + 1e-8)
          << i << "," << j;
    }
  }
}

TEST(CrossEntropyForwardBackward, LargeLogitsGiveFiniteLossAndGradient) {
  // Logits around 1000 (exp(1000) overflows even double) and one dominant row at 1e4.
  Problem p = make_problem(3, 300, 320, 29, 995.0, 1005.0);
  p.logits[2 * 320 + 5] = 1e4;
  p.targets[2] = 5;
  const std::vector<double> expected = naive_losses(p);
  std::vector<float> grad = to_float(p.logits), losses(3);
  cross_entropy_forward_backward(grad.data(), p.targets.data(), losses.data(), p.n, p.V, p.ld,
                                 1.0f);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(std::isfinite(losses[i])) << i;
    // Float keeps ~1000 to 6e-5 absolute, and the loss inherits that rounding of the inputs.
    ASSERT_NEAR(losses[i], expected[i], 2e-4) << i;
    double row_sum = 0;
    for (std::int64_t j = 0; j < p.V; ++j) {
      const float g = grad[i * 320 + static_cast<std::size_t>(j)];
      ASSERT_TRUE(std::isfinite(g));
      row_sum += g;
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-5) << i;  // softmax - onehot sums to 0
  }
  EXPECT_EQ(losses[2], 0.0f);  // the dominant logit is the target: probability exactly 1
}

// Every function, fused and vocab-parallel, gives bitwise-equal results at 1, 2 and 3 threads
// (and run to run), with ignored rows among the targets.
TEST(CrossEntropy, IsBitwiseIndependentOfThreadCount) {
  Problem p = make_problem(37, 5003, 5008, 31);
  for (std::size_t i = 0; i < p.targets.size(); i += 5) p.targets[i] = -100;
  const std::vector<float> logits = to_float(p.logits);
  // This rank's shard: columns [1000, 3500) of the vocabulary, rows of 2504 (4 padding).
  const std::int64_t begin = 1000, V = 2500, ld = 2504;
  std::vector<float> shard_logits(static_cast<std::size_t>(p.n * ld), 0.0f);
  for (std::int64_t i = 0; i < p.n; ++i)
    for (std::int64_t j = 0; j < V; ++j) shard_logits[i * ld + j] = logits[i * p.ld + begin + j];
  expect_independent_of_thread_count("cross-entropy", [&] {
    std::vector<float> grad = logits, losses(37), forward_losses(37);
    cross_entropy_forward(logits.data(), p.targets.data(), forward_losses.data(), p.n, p.V, p.ld);
    cross_entropy_forward_backward(grad.data(), p.targets.data(), losses.data(), p.n, p.V, p.ld,
                                   0.5f);
    std::vector<float> shard = shard_logits, row_max(37), sum_exp(37), target_logit(37),
                       shard_losses(37);
    cross_entropy_shard_max(shard.data(), p.n, V, ld, row_max.data());
    cross_entropy_shard_sums(shard.data(), p.targets.data(), begin, row_max.data(), p.n, V, ld,
                             sum_exp.data(), target_logit.data());
    cross_entropy_shard_finish(shard.data(), p.targets.data(), begin, row_max.data(),
                               sum_exp.data(), target_logit.data(), p.n, V, ld, 0.5f,
                               shard_losses.data(), true);
    for (const auto* part : {&losses, &forward_losses, &shard, &row_max, &sum_exp, &target_logit,
                             &shard_losses})
      append(grad, *part);
    return grad;
  });
}

TEST(CrossEntropy, TargetOutsideVocabularyIsAnInternalError) {
  // The data loader validates tokens; one past the vocabulary reaching the kernel is an engine
  // bug. (Negative targets are ignored rows, tested below.)
  std::vector<float> logits(2 * 4, 0.0f), losses(2);
  const std::vector<std::int32_t> too_big{1, 4}, ignored{-1, 0};
  EXPECT_THROW(cross_entropy_forward(logits.data(), too_big.data(), losses.data(), 2, 4, 4),
               InternalError);
  EXPECT_THROW(
      cross_entropy_forward_backward(logits.data(), too_big.data(), losses.data(), 2, 4, 4, 1.0f),
      InternalError);
  EXPECT_THROW(cross_entropy_forward(logits.data(), ignored.data(), losses.data(), 2, 4, 3),
               InternalError);  // ld < V
}

// Rows 1 and 4 are ignored (the -100 of torch's default ignore_index and a -1).
Problem problem_with_ignored_rows(std::int64_t n, std::int64_t V, std::int64_t ld,
                                  std::uint64_t seed) {
  Problem p = make_problem(n, V, ld, seed);
  p.targets[1] = -100;
  p.targets[4] = -1;
  return p;
}

bool is_ignored(const Problem& p, std::int64_t i) {
  return p.targets[static_cast<std::size_t>(i)] < 0;
}

TEST(CrossEntropyIgnoredRows, ForwardGivesZeroLossAndKeepsTheOthers) {
  const Problem p = problem_with_ignored_rows(6, 11, 13, 41);
  Problem kept = p;  // the same rows with every target valid
  kept.targets[1] = 3;
  kept.targets[4] = 0;
  const std::vector<double> expected = naive_losses(kept);
  std::vector<double> losses(6, -1.0);
  cross_entropy_forward(p.logits.data(), p.targets.data(), losses.data(), p.n, p.V, p.ld);
  std::vector<float> losses_f(6, -1.0f);
  const std::vector<float> logits_f = to_float(p.logits);
  cross_entropy_forward(logits_f.data(), p.targets.data(), losses_f.data(), p.n, p.V, p.ld);
  for (std::int64_t i = 0; i < p.n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (is_ignored(p, i)) {
      EXPECT_EQ(losses[k], 0.0) << i;
      EXPECT_EQ(losses_f[k], 0.0f) << i;
    } else {
      EXPECT_NEAR(losses[k], expected[k], 1e-12 * expected[k]) << i;
      EXPECT_NEAR(losses_f[k], expected[k], 2e-6 * expected[k]) << i;
    }
  }
}

// The fused pass zeroes an ignored row's gradient (padding included) and its gradient is
// still the finite-difference gradient of grad_scale * sum of losses.
TEST(CrossEntropyIgnoredRows, FusedGradientIsZeroOnIgnoredRowsAndMatchesFiniteDifferences) {
  const SingleThreaded single_threaded;
  Problem p = problem_with_ignored_rows(6, 7, 9, 43);
  const double grad_scale = 0.3;
  std::vector<double> grad = p.logits, losses(6);
  cross_entropy_forward_backward(grad.data(), p.targets.data(), losses.data(), p.n, p.V, p.ld,
                                 grad_scale);
  for (std::int64_t i = 0; i < p.n; ++i) {
    if (!is_ignored(p, i)) continue;
    EXPECT_EQ(losses[static_cast<std::size_t>(i)], 0.0);
    for (std::int64_t j = 0; j < p.ld; ++j)
      ASSERT_EQ(grad[static_cast<std::size_t>(i * p.ld + j)], 0.0) << i << "," << j;
  }
  std::vector<double> scratch(6);
  expect_gradient_matches("dlogits", p.logits, grad, [&] {
    cross_entropy_forward(p.logits.data(), p.targets.data(), scratch.data(), p.n, p.V, p.ld);
    double total = 0;
    for (double l : scratch) total += l;
    return grad_scale * total;
  });

  std::vector<float> grad_f = to_float(p.logits), losses_f(6);
  cross_entropy_forward_backward(grad_f.data(), p.targets.data(), losses_f.data(), p.n, p.V, p.ld,
                                 0.3f);
  for (std::size_t k = 0; k < grad.size(); ++k) ASSERT_NEAR(grad_f[k], grad[k], 1e-7) << k;
}

}  // namespace
}  // namespace oases::kernels::cpu

namespace oases::kernels::cpu {
namespace {

// The vocab-parallel steps over a vocabulary split into shards [bounds[s], bounds[s + 1]), the
// reductions done by hand. Each shard's rows have 3 padding columns holding 99.
struct ShardedResult {
  std::vector<double> losses;        // from shard 0 (every shard computes the same)
  std::vector<double> gradient;      // [n, V] reassembled from the shards
  std::vector<double> sum_exp;       // reduced over shards
  std::vector<double> target_logit;  // reduced over shards
};

ShardedResult run_shards(const std::vector<double>& logits,
                         const std::vector<std::int32_t>& targets, std::int64_t n, std::int64_t V,
                         const std::vector<std::int64_t>& bounds, double grad_scale) {
  std::vector<double> row_max(n, -1e300);
  ShardedResult result{std::vector<double>(n), std::vector<double>(n * V),
                       std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  std::vector<std::vector<double>> shards;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    const std::int64_t begin = bounds[s], width = bounds[s + 1] - begin, ld = width + 3;
    std::vector<double> shard(static_cast<std::size_t>(n * ld), 99.0);  // padding columns
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < width; ++j) shard[i * ld + j] = logits[i * V + begin + j];
    std::vector<double> local_max(n);
    cross_entropy_shard_max(shard.data(), n, width, ld, local_max.data());
    for (std::int64_t i = 0; i < n; ++i) row_max[i] = std::max(row_max[i], local_max[i]);
    shards.push_back(std::move(shard));
  }
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::int64_t begin = bounds[s], width = bounds[s + 1] - begin;
    std::vector<double> local_sum(n), local_target(n);
    cross_entropy_shard_sums(shards[s].data(), targets.data(), begin, row_max.data(), n, width,
                             width + 3, local_sum.data(), local_target.data());
    for (std::int64_t i = 0; i < n; ++i) {
      result.sum_exp[i] += local_sum[i];
      result.target_logit[i] += local_target[i];
    }
  }
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::int64_t begin = bounds[s], width = bounds[s + 1] - begin, ld = width + 3;
    std::vector<double> losses(n);
    cross_entropy_shard_finish(shards[s].data(), targets.data(), begin, row_max.data(),
                               result.sum_exp.data(), result.target_logit.data(), n, width, ld,
                               grad_scale, losses.data(), true);
    if (s == 0) result.losses = losses;
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(losses[i], result.losses[i]) << "shard " << s << " row " << i;
      for (std::int64_t j = 0; j < width; ++j)
        result.gradient[i * V + begin + j] = shards[s][i * ld + j];
      for (std::int64_t j = width; j < ld; ++j)
        EXPECT_EQ(shards[s][i * ld + j], 0.0) << "padding of shard " << s;
    }
  }
  return result;
}

// The vocab-parallel steps over a vocabulary split in three uneven shards give the losses and
// gradients of the fused kernel on the whole row.
TEST(CrossEntropyShards, ReductionsOverShardsEqualTheFusedKernel) {
  const std::int64_t n = 5, V = 37;
  auto logits = oases::testing::random_vector(static_cast<std::size_t>(n * V), 71, -4.0, 4.0);
  std::vector<std::int32_t> targets = {0, 12, 13, 36, 25};
  std::vector<double> fused = logits, fused_losses(n);
  cross_entropy_forward_backward(fused.data(), targets.data(), fused_losses.data(), n, V, V, 0.25);
  const ShardedResult sharded = run_shards(logits, targets, n, V, {0, 13, 25, 37}, 0.25);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(sharded.losses[i], fused_losses[i], 1e-12 * std::abs(fused_losses[i]));
    for (std::int64_t j = 0; j < V; ++j)
      EXPECT_NEAR(sharded.gradient[i * V + j], fused[i * V + j], 1e-14) << i << "," << j;
  }
}

// Ignored rows over 2 and 3 shards: loss 0, zero gradient rows, nothing summed for them, and
// the other rows as the unsharded kernels give them.
TEST(CrossEntropyShards, IgnoredRowsOverShardsEqualTheUnshardedKernels) {
  const std::int64_t n = 6, V = 37;
  auto logits = oases::testing::random_vector(static_cast<std::size_t>(n * V), 73, -4.0, 4.0);
  const std::vector<std::int32_t> targets = {5, -100, 20, -1, 36, 0};
  std::vector<double> fused = logits, fused_losses(n), forward_losses(n);
  cross_entropy_forward_backward(fused.data(), targets.data(), fused_losses.data(), n, V, V, 0.5);
  cross_entropy_forward(logits.data(), targets.data(), forward_losses.data(), n, V, V);
  for (const auto& bounds :
       {std::vector<std::int64_t>{0, 19, 37}, std::vector<std::int64_t>{0, 6, 21, 37}}) {
    SCOPED_TRACE(::testing::Message() << bounds.size() - 1 << " shards");
    const ShardedResult sharded = run_shards(logits, targets, n, V, bounds, 0.5);
    for (std::int64_t i = 0; i < n; ++i) {
      const bool ignored = targets[i] < 0;
      if (ignored) {
        EXPECT_EQ(sharded.losses[i], 0.0) << i;
        EXPECT_EQ(sharded.sum_exp[i], 0.0) << i;
        EXPECT_EQ(sharded.target_logit[i], 0.0) << i;
      }
      EXPECT_EQ(fused_losses[i], forward_losses[i]) << i;
      EXPECT_NEAR(sharded.losses[i], fused_losses[i], 1e-12 * std::abs(fused_losses[i])) << i;
      for (std::int64_t j = 0; j < V; ++j) {
        if (ignored) {
          ASSERT_EQ(sharded.gradient[i * V + j], 0.0) << i << "," << j;
        }
        EXPECT_NEAR(sharded.gradient[i * V + j], fused[i * V + j], 1e-14) << i << "," << j;
      }
    }
  }
}

}  // namespace
}  // namespace oases::kernels::cpu
