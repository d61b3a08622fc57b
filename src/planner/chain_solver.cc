#include "planner/chain_solver.h"

#include "core/error.h"

#include <coin/Cbc_C_Interface.h>

#include <algorithm>
#include <memory>
#include <string>

namespace oases::planner {

void ChainProblem::validate() const {
  OASES_ASSERT(layers >= 1 && candidates >= 1, "chain of {} layers x {} candidates", layers,
               candidates);
  OASES_ASSERT(static_cast<int>(layer_cost.size()) == layers &&
                   static_cast<int>(layer_memory.size()) == layers &&
                   static_cast<int>(boundary_cost.size()) == layers - 1,
               "chain problem tables do not match {} layers", layers);
  for (int l = 0; l < layers; ++l) {
    OASES_ASSERT(static_cast<int>(layer_cost[l].size()) == candidates &&
                     static_cast<int>(layer_memory[l].size()) == candidates,
                 "layer {} has the wrong number of candidates", l);
    for (int k = 0; k < candidates; ++k)
      OASES_ASSERT(layer_cost[l][k] >= 0 && layer_memory[l][k] >= 0,
                   "layer {} candidate {}: negative cost or memory", l, k);
    if (l + 1 == layers) continue;
    OASES_ASSERT(static_cast<int>(boundary_cost[l].size()) == candidates, "boundary {} shape", l);
    for (const auto& row : boundary_cost[l]) {
      OASES_ASSERT(static_cast<int>(row.size()) == candidates, "boundary {} shape", l);
      for (double c : row) OASES_ASSERT(c >= 0, "boundary {}: negative cost", l);
    }
  }
  OASES_ASSERT(fixed_memory >= 0, "negative fixed memory");
}

double plan_cost(const ChainProblem& p, const std::vector<int>& choice) {
  double cost = 0;
  for (int l = 0; l < p.layers; ++l) {
    cost += p.layer_cost[l][choice[l]];
    if (l + 1 < p.layers) cost += p.boundary_cost[l][choice[l]][choice[l + 1]];
  }
  return cost;
}

std::int64_t plan_memory(const ChainProblem& p, const std::vector<int>& choice) {
  std::int64_t memory = p.fixed_memory;
  for (int l = 0; l < p.layers; ++l) memory += p.layer_memory[l][choice[l]];
  return memory;
}

std::int64_t minimum_memory(const ChainProblem& p) {
  std::int64_t memory = p.fixed_memory;
  for (const auto& row : p.layer_memory) memory += *std::min_element(row.begin(), row.end());
  return memory;
}

namespace {
ChainPlan make_plan(const ChainProblem& p, std::vector<int> choice) {
  ChainPlan plan;
  plan.feasible = true;
  plan.cost = plan_cost(p, choice);
  plan.memory = plan_memory(p, choice);
  plan.choice = std::move(choice);
  return plan;
}
}  // namespace

// For every (layer, degree), the Pareto front of partial plans over layers 0..l ending at that
// degree: (memory, cost) pairs where less memory always costs more. Any optimal plan extends an
// entry of the front, so keeping only the front is exact; its size is bounded by the number of
// distinct memory values within the limit.
ChainPlan solve_dynamic_program(const ChainProblem& p) {
  p.validate();
  struct Entry {
    std::int64_t memory;
    double cost;
    int parent_degree;  // at the previous layer
    int parent_index;   // in that front
  };
  const std::int64_t budget = p.memory_limit - p.fixed_memory;
  std::vector<std::vector<std::vector<Entry>>> fronts(
      static_cast<std::size_t>(p.layers),
      std::vector<std::vector<Entry>>(static_cast<std::size_t>(p.candidates)));
  const auto prune = [&](std::vector<Entry>& entries) {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.memory != b.memory ? a.memory < b.memory : a.cost < b.cost;
    });
    std::vector<Entry> front;
    for (const Entry& e : entries)
      if (front.empty() || e.cost < front.back().cost) front.push_back(e);
    entries = std::move(front);
  };
  for (int k = 0; k < p.candidates; ++k)
    if (p.layer_memory[0][k] <= budget)
      fronts[0][k].push_back({p.layer_memory[0][k], p.layer_cost[0][k], -1, -1});
  for (int l = 1; l < p.layers; ++l) {
    for (int k = 0; k < p.candidates; ++k) {
      std::vector<Entry> entries;
      for (int j = 0; j < p.candidates; ++j) {
        const auto& previous = fronts[l - 1][j];
        for (int i = 0; i < static_cast<int>(previous.size()); ++i) {
          const std::int64_t memory = previous[i].memory + p.layer_memory[l][k];
          if (memory > budget) continue;
          entries.push_back(
              {memory, previous[i].cost + p.boundary_cost[l - 1][j][k] + p.layer_cost[l][k], j, i});
        }
      }
      prune(entries);
      fronts[l][k] = std::move(entries);
    }
  }
  int best_degree = -1, best_index = -1;
  double best = std::numeric_limits<double>::infinity();
  for (int k = 0; k < p.candidates; ++k)
    for (int i = 0; i < static_cast<int>(fronts[p.layers - 1][k].size()); ++i)
      if (fronts[p.layers - 1][k][i].cost < best) {
        best = fronts[p.layers - 1][k][i].cost;
        best_degree = k;
        best_index = i;
      }
  if (best_degree < 0) return {};
  std::vector<int> choice(static_cast<std::size_t>(p.layers));
  for (int l = p.layers - 1; l >= 0; --l) {
    choice[l] = best_degree;
    const Entry& e = fronts[l][best_degree][best_index];
    best_degree = e.parent_degree;
    best_index = e.parent_index;
  }
  return make_plan(p, std::move(choice));
}

namespace {
// Every layer has the same costs and memory, and every boundary charges the same price for any
// change of candidate and nothing for none.
bool interchangeable_layers(const ChainProblem& p) {
  for (int l = 1; l < p.layers; ++l)
    if (p.layer_cost[l] != p.layer_cost[0] || p.layer_memory[l] != p.layer_memory[0]) return false;
  if (p.layers < 2) return true;
  const double change = p.candidates > 1 ? p.boundary_cost[0][0][1] : 0.0;
  for (const auto& boundary : p.boundary_cost)
    for (int j = 0; j < p.candidates; ++j)
      for (int k = 0; k < p.candidates; ++k)
        if (boundary[j][k] != (j == k ? 0.0 : change)) return false;
  return true;
}
}  // namespace

ChainPlan solve_ilp(const ChainProblem& p) {
  p.validate();
  const std::unique_ptr<Cbc_Model, void (*)(Cbc_Model*)> model(Cbc_newModel(), Cbc_deleteModel);
  Cbc_Model* m = model.get();
  Cbc_setLogLevel(m, 0);
  Cbc_setAllowableGap(m, 0.0);
  Cbc_setAllowableFractionGap(m, 0.0);
  const int K = p.candidates;
  // x[l][k]: layer l runs at candidate k (binary). y[l][j][k]: boundary l joins j and k; the
  // equalities below make it the product x[l][j] x[l+1][k] whenever x is integral, so it
  // needs no integrality of its own.
  const auto x = [&](int l, int k) { return l * K + k; };
  const int num_x = p.layers * K;
  const auto y = [&](int l, int j, int k) { return num_x + (l * K + j) * K + k; };
  for (int l = 0; l < p.layers; ++l)
    for (int k = 0; k < K; ++k)
      Cbc_addCol(m, ("x_" + std::to_string(l) + "_" + std::to_string(k)).c_str(), 0.0, 1.0,
                 p.layer_cost[l][k], 1, 0, nullptr, nullptr);
  for (int l = 0; l + 1 < p.layers; ++l)
    for (int j = 0; j < K; ++j)
      for (int k = 0; k < K; ++k)
        Cbc_addCol(
            m,
            ("y_" + std::to_string(l) + "_" + std::to_string(j) + "_" + std::to_string(k)).c_str(),
            0.0, 1.0, p.boundary_cost[l][j][k], 0, 0, nullptr, nullptr);
  std::vector<int> cols;
  std::vector<double> coefs;
  const auto add_row = [&](const char* name, char sense, double rhs) {
    Cbc_addRow(m, name, static_cast<int>(cols.size()), cols.data(), coefs.data(), sense, rhs);
    cols.clear();
    coefs.clear();
  };
  for (int l = 0; l < p.layers; ++l) {  // one degree per layer
    for (int k = 0; k < K; ++k) cols.push_back(x(l, k)), coefs.push_back(1.0);
    add_row("one_hot", 'E', 1.0);
  }
  for (int l = 0; l + 1 < p.layers; ++l) {
    for (int j = 0; j < K; ++j) {  // sum_k y[l][j][k] = x[l][j]
      for (int k = 0; k < K; ++k) cols.push_back(y(l, j, k)), coefs.push_back(1.0);
      cols.push_back(x(l, j)), coefs.push_back(-1.0);
      add_row("out", 'E', 0.0);
    }
    for (int k = 0; k < K; ++k) {  // sum_j y[l][j][k] = x[l+1][k]
      for (int j = 0; j < K; ++j) cols.push_back(y(l, j, k)), coefs.push_back(1.0);
      cols.push_back(x(l + 1, k)), coefs.push_back(-1.0);
      add_row("in", 'E', 0.0);
    }
  }
  if (interchangeable_layers(p)) {
    // Alike layers with one reshard price: reordering a plan's degrees never adds cost and
    // sorting them needs the fewest changes, so some optimal plan has non-decreasing candidate
    // indices. Requiring that removes the permutations of each plan, which the search would
    // otherwise have to rule out one by one.
    for (int l = 0; l + 1 < p.layers; ++l) {
      for (int k = 0; k < K; ++k) {
        cols.push_back(x(l, k)), coefs.push_back(static_cast<double>(k));
        cols.push_back(x(l + 1, k)), coefs.push_back(-static_cast<double>(k));
      }
      add_row("order", 'L', 0.0);
    }
  }
  if (p.memory_limit < std::numeric_limits<std::int64_t>::max()) {
    for (int l = 0; l < p.layers; ++l)
      for (int k = 0; k < K; ++k)
        cols.push_back(x(l, k)), coefs.push_back(static_cast<double>(p.layer_memory[l][k]));
    add_row("memory", 'L', static_cast<double>(p.memory_limit - p.fixed_memory));
  }
  Cbc_setObjSense(m, 1.0);
  Cbc_solve(m);
  if (Cbc_isProvenInfeasible(m)) return {};
  OASES_ASSERT(Cbc_isProvenOptimal(m), "CBC stopped without proving optimality (status {})",
               Cbc_status(m));
  const double* solution = Cbc_getColSolution(m);
  std::vector<int> choice(static_cast<std::size_t>(p.layers), -1);
  for (int l = 0; l < p.layers; ++l)
    for (int k = 0; k < K; ++k)
      if (solution[x(l, k)] > 0.5) choice[l] = k;
  for (int c : choice) OASES_ASSERT(c >= 0, "CBC returned a fractional degree choice");
  return make_plan(p, std::move(choice));
}

ChainPlan solve_brute_force(const ChainProblem& p) {
  p.validate();
  std::vector<int> choice(static_cast<std::size_t>(p.layers), 0), best_choice;
  double best = std::numeric_limits<double>::infinity();
  while (true) {
    if (plan_memory(p, choice) <= p.memory_limit) {
      const double cost = plan_cost(p, choice);
      if (cost < best) best = cost, best_choice = choice;
    }
    int l = 0;
    while (l < p.layers && ++choice[l] == p.candidates) choice[l++] = 0;
    if (l == p.layers) break;
  }
  if (best_choice.empty()) return {};
  return make_plan(p, std::move(best_choice));
}

}  // namespace oases::planner
