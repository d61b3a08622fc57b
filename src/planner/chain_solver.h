// The per-layer degree choice as an optimisation over a chain: layer l runs at one of K
// candidate tensor-parallel degrees; a plan pays each layer's cost at its degree, each boundary's
// cost for the pair of degrees on its two sides, and must fit its memory (the sum of each
// layer's memory at its degree, plus a fixed part) within a limit.
//
//   minimise    sum_l layer_cost[l][k_l] + sum_{l < L-1} boundary_cost[l][k_l][k_{l+1}]
//   subject to  fixed_memory + sum_l layer_memory[l][k_l] <= memory_limit
//
// Memory is in integer units (the planner picks the unit, e.g. MiB rounded up), so the dynamic
// program is exact and every solver sees the same numbers. Three solvers must agree on the
// optimal cost: an integer linear program solved by COIN-OR CBC, an exact dynamic program over
// (layer, degree, memory), and brute force (small chains only, for tests).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace oases::planner {

struct ChainProblem {
  int layers = 0;
  int candidates = 0;                                           // K
  std::vector<std::vector<double>> layer_cost;                  // [layers][K], >= 0
  std::vector<std::vector<std::int64_t>> layer_memory;          // [layers][K] units, >= 0
  std::vector<std::vector<std::vector<double>>> boundary_cost;  // [layers - 1][K][K], >= 0
  std::int64_t fixed_memory = 0;
  std::int64_t memory_limit = std::numeric_limits<std::int64_t>::max();

  // InternalError when the shapes do not match or a value is negative.
  void validate() const;
};

struct ChainPlan {
  bool feasible = false;
  std::vector<int> choice;  // candidate index per layer (empty when infeasible)
  double cost = 0;
  std::int64_t memory = 0;  // fixed part included
};

double plan_cost(const ChainProblem& problem, const std::vector<int>& choice);
std::int64_t plan_memory(const ChainProblem& problem, const std::vector<int>& choice);

// The smallest memory any plan needs (each layer at its least memory), fixed part included.
std::int64_t minimum_memory(const ChainProblem& problem);

ChainPlan solve_dynamic_program(const ChainProblem& problem);
ChainPlan solve_ilp(const ChainProblem& problem);          // CBC, optimality gap 0
ChainPlan solve_brute_force(const ChainProblem& problem);  // K^layers plans; tests only

}  // namespace oases::planner
