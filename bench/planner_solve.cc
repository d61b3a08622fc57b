// Solve time of the per-layer degree choice for 24, 48 and 96 layers with 6 candidate degrees
// (1, 2, 4, 8, 16, 32), by the CBC integer program and the dynamic program, on chains shaped
// like a transformer's: a layer at degree k computes 1/k of the work, pays a communication
// cost that grows with k, and keeps 1/k of its weights and activations; changing degree
// between layers costs a reshard. The memory limit sits where it binds (between the least and
// the most a plan needs), and layers differ a little, as profiled layers do.
//   build/release/bench/planner_solve
#include "core/philox.h"
#include "core/timer.h"
#include "planner/chain_solver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using oases::planner::ChainProblem;

// alike: every layer with the same costs and one reshard price, as the planner builds chains
// from a profile (layers of one kind are measured once); otherwise each layer differs a little.
ChainProblem transformer_chain(int layers, std::uint64_t seed, bool alike) {
  const std::vector<int> degrees = {1, 2, 4, 8, 16, 32};
  const auto key = oases::philox_key(seed, oases::fnv1a64("planner_solve"));
  std::uint32_t counter = 0;
  const auto noise = [&] {
    return 1.0 + 0.1 * (oases::philox4x32({counter++, 0, 0, 0}, key)[0] / 4294967296.0 - 0.5);
  };
  ChainProblem p;
  p.layers = layers;
  p.candidates = static_cast<int>(degrees.size());
  std::int64_t most = 0;
  for (int l = 0; l < layers; ++l) {
    if (alike) counter = 0;  // the same draws for every layer
    std::vector<double> cost;
    std::vector<std::int64_t> memory;
    for (int k : degrees) {
      const double compute = 100.0 / k, comm = k > 1 ? 8.0 * std::log2(k) : 0.0;
      cost.push_back(std::max(compute, comm) * noise());  // overlapped: the larger of the two
      memory.push_back(static_cast<std::int64_t>(std::ceil(4096.0 / k * noise())));  // MiB
    }
    most += *std::max_element(memory.begin(), memory.end());
    p.layer_cost.push_back(cost);
    p.layer_memory.push_back(memory);
    if (l + 1 < layers) {
      std::vector<std::vector<double>> boundary(degrees.size(),
                                                std::vector<double>(degrees.size()));
      for (std::size_t j = 0; j < degrees.size(); ++j)
        for (std::size_t k = 0; k < degrees.size(); ++k)
          boundary[j][k] = j == k ? 0.0 : alike ? 3.0 : 3.0 * noise();
      p.boundary_cost.push_back(boundary);
    }
  }
  const std::int64_t least = oases::planner::minimum_memory(p);
  // Tight enough that the fastest uniform degree (8) does not fit: the plan must mix 16 and 32.
  p.memory_limit = least + (most - least) / 40;
  return p;
}

template <class Solve>
double median_seconds(const Solve& solve, int repeats) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const oases::Stopwatch clock;
    solve();
    times.push_back(clock.seconds());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main() {
  fmt::print("{:>7} {:>8} {:>11} {:>11} {:>14} {:>14} {:>22}\n", "layers", "layers", "ILP (CBC)",
             "DP", "optimum", "same optimum", "optimum without limit");
  for (bool alike : {true, false})
    for (int layers : {24, 48, 96}) {
      const ChainProblem p = transformer_chain(layers, 7, alike);
      oases::planner::ChainPlan ilp, dp;
      const double ilp_s = median_seconds([&] { ilp = oases::planner::solve_ilp(p); }, 5);
      const double dp_s = median_seconds([&] { dp = oases::planner::solve_dynamic_program(p); }, 5);
      const bool same =
          ilp.feasible && dp.feasible && std::abs(ilp.cost - dp.cost) <= 1e-9 * dp.cost;
      ChainProblem unlimited = p;
      unlimited.memory_limit = std::numeric_limits<std::int64_t>::max();
      fmt::print("{:>7} {:>8} {:>10.3f}s {:>10.3f}s {:>14.4f} {:>14} {:>22.4f}\n", layers,
                 alike ? "alike" : "differ", ilp_s, dp_s, dp.cost, same ? "yes" : "NO",
                 oases::planner::solve_dynamic_program(unlimited).cost);
    }
}
