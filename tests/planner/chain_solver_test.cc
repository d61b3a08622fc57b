// The three chain solvers agree on the optimum: the CBC integer program and the dynamic program
// on random chains up to 24 layers (with memory limits that bind), and both with brute force
// on chains small enough to enumerate.
#include "planner/chain_solver.h"

#include "core/philox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>

namespace oases::planner {
namespace {

// Uniform in [0, 1) from Philox keyed by (seed, counter).
class Draws {
 public:
  explicit Draws(std::uint64_t seed) : key_(philox_key(seed, fnv1a64("chain"))) {}
  double next() {
    const auto block = philox4x32({counter_++, 0, 0, 0}, key_);
    return static_cast<double>(block[0]) / 4294967296.0;
  }

 private:
  PhiloxKey key_;
  std::uint32_t counter_ = 0;
};

// Layers whose cost falls and memory rises with the candidate index (as a lower tensor-parallel
// degree trades communication for memory), boundaries that cost more between different
// candidates, and a memory limit somewhere between the least and the most any plan needs.
ChainProblem random_chain(int layers, int candidates, std::uint64_t seed, double tightness) {
  Draws draw(seed);
  ChainProblem p;
  p.layers = layers;
  p.candidates = candidates;
  p.fixed_memory = static_cast<std::int64_t>(draw.next() * 100);
  std::int64_t most = p.fixed_memory;
  for (int l = 0; l < layers; ++l) {
    std::vector<double> cost;
    std::vector<std::int64_t> memory;
    for (int k = 0; k < candidates; ++k) {
      cost.push_back((candidates - k) * (1.0 + draw.next()) + draw.next());
      memory.push_back(static_cast<std::int64_t>((k + 1) * (10 + 20 * draw.next())));
    }
    most += *std::max_element(memory.begin(), memory.end());
    p.layer_cost.push_back(cost);
    p.layer_memory.push_back(memory);
    if (l + 1 < layers) {
      std::vector<std::vector<double>> boundary(
          static_cast<std::size_t>(candidates),
          std::vector<double>(static_cast<std::size_t>(candidates)));
      for (int j = 0; j < candidates; ++j)
        for (int k = 0; k < candidates; ++k)
          boundary[j][k] = j == k ? 0.1 * draw.next() : 0.5 + draw.next();
      p.boundary_cost.push_back(boundary);
    }
  }
  const std::int64_t least = minimum_memory(p);
  p.memory_limit = least + static_cast<std::int64_t>(tightness * static_cast<double>(most - least));
  return p;
}

void expect_same_optimum(const ChainPlan& a, const ChainPlan& b, const ChainProblem& p,
                         const std::string& what) {
  ASSERT_EQ(a.feasible, b.feasible) << what;
  if (!a.feasible) return;
  EXPECT_NEAR(a.cost, b.cost, 1e-9 * std::max(1.0, std::abs(b.cost))) << what;
  EXPECT_LE(a.memory, p.memory_limit) << what;
  EXPECT_LE(b.memory, p.memory_limit) << what;
  EXPECT_DOUBLE_EQ(a.cost, plan_cost(p, a.choice)) << what;
}

TEST(ChainSolvers, AgreeWithBruteForceOnSmallChains) {
  int binding = 0;
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    const int layers = 1 + static_cast<int>(seed % 6), candidates = 2 + static_cast<int>(seed % 3);
    const double tightness =
        (seed % 5) / 4.0;  // 0 (only the least-memory plans fit) .. 1 (no limit)
    const ChainProblem p = random_chain(layers, candidates, seed, tightness);
    const std::string what = "seed " + std::to_string(seed);
    const ChainPlan brute = solve_brute_force(p);
    expect_same_optimum(solve_dynamic_program(p), brute, p, what + " dp");
    expect_same_optimum(solve_ilp(p), brute, p, what + " ilp");
    // Does the limit change the answer? Count those instances: they must occur.
    ChainProblem unlimited = p;
    unlimited.memory_limit = std::numeric_limits<std::int64_t>::max();
    if (solve_brute_force(unlimited).cost < brute.cost - 1e-12) ++binding;
  }
  EXPECT_GE(binding, 10);
}

// Chains whose boundaries cost nothing (the joint planner's recomputation and compression per
// layer), which the dynamic program solves with one front per layer: the same optimum as brute
// force on small chains and as the integer program on long ones.
TEST(ChainSolvers, FreeBoundariesKeepTheOptimum) {
  const auto free_boundaries = [](ChainProblem p) {
    for (auto& boundary : p.boundary_cost)
      for (auto& row : boundary) std::fill(row.begin(), row.end(), 0.0);
    return p;
  };
  int binding = 0;
  for (std::uint64_t seed = 500; seed < 560; ++seed) {
    const int layers = 1 + static_cast<int>(seed % 6), candidates = 2 + static_cast<int>(seed % 4);
    const ChainProblem p = free_boundaries(
        random_chain(layers, candidates, seed, static_cast<double>(seed % 5) / 4.0));
    const ChainPlan brute = solve_brute_force(p);
    expect_same_optimum(solve_dynamic_program(p), brute, p, "seed " + std::to_string(seed));
    ChainProblem unlimited = p;
    unlimited.memory_limit = std::numeric_limits<std::int64_t>::max();
    if (solve_brute_force(unlimited).cost < brute.cost - 1e-12) ++binding;
  }
  EXPECT_GE(binding, 10);
  for (std::uint64_t seed = 600; seed < 610; ++seed) {
    const ChainProblem p = free_boundaries(random_chain(
        40 + static_cast<int>(seed % 3) * 28, 9, seed, 0.05 + 0.1 * static_cast<double>(seed % 4)));
    expect_same_optimum(solve_dynamic_program(p), solve_ilp(p), p, "seed " + std::to_string(seed));
  }
  // The joint planner's chains: every layer alike but the last, some candidates equal to or
  // dominated by others (an option that keeps as much and costs more). Alike layers make a
  // plan a count of layers per candidate: every count and last candidate is the reference.
  for (std::uint64_t seed = 700; seed < 710; ++seed) {
    constexpr int kLayers = 30, kCandidates = 5;
    ChainProblem p = free_boundaries(random_chain(kLayers, kCandidates, seed, 0.3));
    for (int l = 1; l + 1 < p.layers; ++l) {
      p.layer_cost[static_cast<std::size_t>(l)] = p.layer_cost[0];
      p.layer_memory[static_cast<std::size_t>(l)] = p.layer_memory[0];
    }
    for (auto& row : p.layer_cost) row[3] = row[1];
    for (auto& row : p.layer_memory) row[3] = row[1];
    for (auto& row : p.layer_cost) row[4] = row[2] * 1.5;
    for (auto& row : p.layer_memory) row[4] = row[2];
    double best = std::numeric_limits<double>::infinity();
    std::array<int, kCandidates> count{};
    const auto& alike_cost = p.layer_cost[0];
    const auto& alike_memory = p.layer_memory[0];
    const std::function<void(int, int)> each_count = [&](int k, int left) {
      if (k + 1 == kCandidates) {
        count[static_cast<std::size_t>(k)] = left;
        double cost = 0;
        std::int64_t memory = p.fixed_memory;
        for (int j = 0; j < kCandidates; ++j) {
          cost += count[static_cast<std::size_t>(j)] * alike_cost[static_cast<std::size_t>(j)];
          memory += count[static_cast<std::size_t>(j)] * alike_memory[static_cast<std::size_t>(j)];
        }
        for (int last = 0; last < kCandidates; ++last)
          if (memory + p.layer_memory.back()[static_cast<std::size_t>(last)] <= p.memory_limit)
            best = std::min(best, cost + p.layer_cost.back()[static_cast<std::size_t>(last)]);
        return;
      }
      for (int n = 0; n <= left; ++n) {
        count[static_cast<std::size_t>(k)] = n;
        each_count(k + 1, left - n);
      }
    };
    each_count(0, kLayers - 1);
    const ChainPlan solved = solve_dynamic_program(p);
    ASSERT_TRUE(solved.feasible) << seed;
    EXPECT_LE(solved.memory, p.memory_limit) << seed;
    EXPECT_NEAR(solved.cost, best, 1e-9 * best) << seed;
  }
}

TEST(ChainSolvers, IntegerProgramAndDynamicProgramAgreeOnLongerChains) {
  for (std::uint64_t seed = 100; seed < 130; ++seed) {
    const int layers = 8 + static_cast<int>(seed % 17), candidates = 3 + static_cast<int>(seed % 4);
    const ChainProblem p =
        random_chain(layers, candidates, seed, 0.1 + 0.3 * static_cast<double>(seed % 3));
    expect_same_optimum(solve_dynamic_program(p), solve_ilp(p), p, "seed " + std::to_string(seed));
  }
}

// Longer chains with tight limits, where the integer program drops candidates by their
// Lagrangian bound before CBC starts, and chains without a limit (the bound is then exact).
TEST(ChainSolvers, IntegerProgramKeepsTheOptimumOnLongTightChains) {
  for (std::uint64_t seed = 300; seed < 310; ++seed) {
    ChainProblem p = random_chain(40 + static_cast<int>(seed % 3) * 8, 4 + static_cast<int>(seed % 3),
                                  seed, 0.02 + 0.04 * static_cast<double>(seed % 4));
    expect_same_optimum(solve_ilp(p), solve_dynamic_program(p), p, "seed " + std::to_string(seed));
    p.memory_limit = std::numeric_limits<std::int64_t>::max();
    expect_same_optimum(solve_ilp(p), solve_dynamic_program(p), p,
                        "seed " + std::to_string(seed) + " without limit");
  }
}

// Alike layers with one reshard price: the integer program orders the degrees (a symmetry cut);
// the optimum must not change.
TEST(ChainSolvers, AlikeLayersKeepTheirOptimumUnderTheOrderingCut) {
  for (std::uint64_t seed = 200; seed < 240; ++seed) {
    ChainProblem p = random_chain(1 + static_cast<int>(seed % 7), 2 + static_cast<int>(seed % 3),
                                  seed, (seed % 5) / 4.0);
    for (int l = 1; l < p.layers; ++l) {
      p.layer_cost[l] = p.layer_cost[0];
      p.layer_memory[l] = p.layer_memory[0];
    }
    const std::int64_t least = minimum_memory(p);
    p.memory_limit = std::max(p.memory_limit, least);
    for (auto& boundary : p.boundary_cost)
      for (int j = 0; j < p.candidates; ++j)
        for (int k = 0; k < p.candidates; ++k) boundary[j][k] = j == k ? 0.0 : 0.7;
    const ChainPlan brute = solve_brute_force(p);
    const ChainPlan ilp = solve_ilp(p);
    expect_same_optimum(ilp, brute, p, "seed " + std::to_string(seed) + " ilp");
    expect_same_optimum(solve_dynamic_program(p), brute, p, "seed " + std::to_string(seed) + " dp");
    for (std::size_t l = 1; l < ilp.choice.size(); ++l) EXPECT_LE(ilp.choice[l - 1], ilp.choice[l]);
  }
}

TEST(ChainSolvers, ALimitBelowTheLeastMemoryIsInfeasibleForAll) {
  ChainProblem p = random_chain(4, 3, 7, 0.5);
  p.memory_limit = minimum_memory(p) - 1;
  EXPECT_FALSE(solve_dynamic_program(p).feasible);
  EXPECT_FALSE(solve_ilp(p).feasible);
  EXPECT_FALSE(solve_brute_force(p).feasible);
  p.memory_limit = minimum_memory(p);  // exactly the least: the least-memory plans only
  const ChainPlan plan = solve_dynamic_program(p);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(plan.memory, minimum_memory(p));
  expect_same_optimum(solve_ilp(p), plan, p, "at the least memory");
}

}  // namespace
}  // namespace oases::planner
