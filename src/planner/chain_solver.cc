#include "planner/chain_solver.h"

#include "core/error.h"

#include <coin/Cbc_C_Interface.h>

#include <algorithm>
#include <array>
#include <limits>
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

namespace {

// `entries` reduced to their Pareto front, by memory ascending: each keeps less memory than the
// next and costs more.
template <typename Entry>
void keep_front(std::vector<Entry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.memory != b.memory ? a.memory < b.memory : a.cost < b.cost;
  });
  std::vector<Entry> front;
  for (const Entry& e : entries)
    if (front.empty() || e.cost < front.back().cost) front.push_back(e);
  entries = std::move(front);
}

bool boundaries_are_free(const ChainProblem& p) {
  for (const auto& boundary : p.boundary_cost)
    for (const auto& row : boundary)
      for (double c : row)
        if (c != 0) return false;
  return true;
}

// The dynamic program when no boundary costs anything (the joint planner's per-layer
// recomputation and compression): what follows a partial plan depends only on the memory it
// keeps, so one front per layer, over every candidate it ends with, keeps every optimum.
ChainPlan solve_without_boundaries(const ChainProblem& p) {
  struct Entry {
    std::int64_t memory;
    double cost;
    int candidate;  // at this layer
    int parent;     // index in the previous layer's front
  };
  const std::int64_t budget = p.memory_limit - p.fixed_memory;
  std::vector<std::vector<Entry>> fronts(static_cast<std::size_t>(p.layers));
  for (int k = 0; k < p.candidates; ++k)
    if (p.layer_memory[0][k] <= budget)
      fronts[0].push_back({p.layer_memory[0][k], p.layer_cost[0][k], k, -1});
  keep_front(fronts[0]);
  // Where the memory within the budget takes few values, the front is found by the cheapest
  // entry at each value rather than by sorting (the same front; ties in both memory and cost
  // keep the first met).
  std::vector<Entry> cheapest_at;
  const bool by_value = budget >= 0 && budget < (std::int64_t{1} << 16);
  if (by_value) cheapest_at.resize(static_cast<std::size_t>(budget) + 1);
  std::vector<int> useful;  // the layer's candidates no other one dominates
  for (int l = 1; l < p.layers; ++l) {
    const std::vector<Entry>& previous = fronts[static_cast<std::size_t>(l - 1)];
    std::vector<Entry>& entries = fronts[static_cast<std::size_t>(l)];
    const auto& memory_of = p.layer_memory[static_cast<std::size_t>(l)];
    const auto& cost_of = p.layer_cost[static_cast<std::size_t>(l)];
    // Without boundary costs a candidate with no less memory and no less cost than another
    // never improves a plan.
    useful.clear();
    for (int k = 0; k < p.candidates; ++k) {
      bool dominated = false;
      for (int j = 0; j < p.candidates && !dominated; ++j)
        dominated = j != k && memory_of[j] <= memory_of[k] && cost_of[j] <= cost_of[k] &&
                    (memory_of[j] < memory_of[k] || cost_of[j] < cost_of[k] || j < k);
      if (!dominated) useful.push_back(k);
    }
    if (by_value) {
      constexpr double kNone = std::numeric_limits<double>::infinity();
      std::int64_t highest = -1;
      for (Entry& e : cheapest_at) e.cost = kNone;
      for (int i = 0; i < static_cast<int>(previous.size()); ++i)
        for (int k : useful) {
          const Entry& from = previous[static_cast<std::size_t>(i)];
          const std::int64_t memory = from.memory + memory_of[k];
          if (memory > budget) continue;
          Entry& at = cheapest_at[static_cast<std::size_t>(memory)];
          const double cost = from.cost + cost_of[k];
          if (cost < at.cost) at = {memory, cost, k, i};
          highest = std::max(highest, memory);
        }
      for (std::int64_t m = 0; m <= highest; ++m) {
        const Entry& e = cheapest_at[static_cast<std::size_t>(m)];
        if (e.cost != kNone && (entries.empty() || e.cost < entries.back().cost))
          entries.push_back(e);
      }
      continue;
    }
    entries.reserve(previous.size() * useful.size());
    for (int i = 0; i < static_cast<int>(previous.size()); ++i)
      for (int k : useful) {
        const std::int64_t memory = previous[static_cast<std::size_t>(i)].memory + memory_of[k];
        if (memory <= budget)
          entries.push_back(
              {memory, previous[static_cast<std::size_t>(i)].cost + cost_of[k], k, i});
      }
    keep_front(entries);
  }
  const std::vector<Entry>& last = fronts.back();
  if (last.empty()) return {};
  // The front's costs fall with its memory: its last entry is the cheapest.
  int index = static_cast<int>(last.size()) - 1;
  std::vector<int> choice(static_cast<std::size_t>(p.layers));
  for (int l = p.layers - 1; l >= 0; --l) {
    const Entry& e = fronts[static_cast<std::size_t>(l)][static_cast<std::size_t>(index)];
    choice[static_cast<std::size_t>(l)] = e.candidate;
    index = e.parent;
  }
  return make_plan(p, std::move(choice));
}

}  // namespace

// For every (layer, degree), the Pareto front of partial plans over layers 0..l ending at that
// degree: (memory, cost) pairs where less memory always costs more. Any optimal plan extends an
// entry of the front, so keeping only the front is exact; its size is bounded by the number of
// distinct memory values within the limit.
ChainPlan solve_dynamic_program(const ChainProblem& p) {
  p.validate();
  if (boundaries_are_free(p)) return solve_without_boundaries(p);
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
      keep_front(entries);
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

// Lagrangian relaxation of the memory row. For a multiplier lambda >= 0 every feasible plan P has
//   cost(P) >= cost(P) + lambda (memory(P) - budget)
//           >= min over all plans Q of [cost(Q) + lambda memory(Q)] - lambda budget,
// and the minimum on the right, over all plans (no memory limit), is a shortest path through the
// chain: a Viterbi pass. Run forwards and backwards, it gives that bound for the plans through
// each (layer, candidate) and through each boundary pair. Any of these bounds above the cost of a
// known feasible plan proves that no optimal plan uses that candidate or pair, so the integer
// program may drop it: fixing by Lagrangian reduced cost, exact whatever lambda is (a better
// lambda only proves more). The shortest paths met on the way that fit the limit are feasible
// plans and give the incumbent. Solves no memory-indexed dynamic program.
struct LagrangianFixing {
  bool have_incumbent = false;
  std::vector<int> incumbent;
  double incumbent_cost = std::numeric_limits<double>::infinity();
  // Lower bounds on the cost of any feasible plan with layer l at k, or with boundary l joining
  // j and k; already lowered by a margin for the rounding of the sums that produce them.
  std::vector<std::vector<double>> x_bound;               // [l][k]
  std::vector<std::vector<std::vector<double>>> y_bound;  // [l][j][k]
  std::vector<std::vector<int>> paths;  // every shortest path met, feasible or not
  bool proven_optimal = false;          // the incumbent is the best plan ignoring memory
};

LagrangianFixing lagrangian_fixing(const ChainProblem& p) {
  const int L = p.layers, K = p.candidates;
  const double inf = std::numeric_limits<double>::infinity();
  LagrangianFixing out;
  out.x_bound.assign(static_cast<std::size_t>(L), std::vector<double>(K, -inf));
  out.y_bound.assign(static_cast<std::size_t>(std::max(L - 1, 0)),
                     std::vector<std::vector<double>>(K, std::vector<double>(K, -inf)));
  const bool limited = p.memory_limit < std::numeric_limits<std::int64_t>::max();
  const double budget = limited ? static_cast<double>(p.memory_limit - p.fixed_memory) : 0.0;
  std::vector<std::vector<double>> fwd(L, std::vector<double>(K)), bwd = fwd, unit = fwd;
  std::vector<std::vector<int>> from(L, std::vector<int>(K, -1));
  // Every plan costs at most total_cost and uses at most total_memory.
  double total_cost = 0, total_memory = 0;
  for (int l = 0; l < L; ++l) {
    total_cost += *std::max_element(p.layer_cost[l].begin(), p.layer_cost[l].end());
    total_memory += static_cast<double>(
        *std::max_element(p.layer_memory[l].begin(), p.layer_memory[l].end()));
    if (l + 1 < L)
      for (const auto& row : p.boundary_cost[l])
        total_cost += *std::max_element(row.begin(), row.end());
  }
  // One Viterbi pass at lambda: tightens every bound and returns the shortest path.
  const auto pass = [&](double lambda) {
    for (int l = 0; l < L; ++l)
      for (int k = 0; k < K; ++k)
        unit[l][k] = p.layer_cost[l][k] + lambda * static_cast<double>(p.layer_memory[l][k]);
    for (int k = 0; k < K; ++k) fwd[0][k] = unit[0][k];
    for (int l = 1; l < L; ++l)
      for (int k = 0; k < K; ++k) {
        double best = inf;
        for (int j = 0; j < K; ++j) {
          const double v = fwd[l - 1][j] + p.boundary_cost[l - 1][j][k];
          if (v < best) best = v, from[l][k] = j;
        }
        fwd[l][k] = best + unit[l][k];
      }
    for (int k = 0; k < K; ++k) bwd[L - 1][k] = unit[L - 1][k];
    for (int l = L - 2; l >= 0; --l)
      for (int j = 0; j < K; ++j) {
        double best = inf;
        for (int k = 0; k < K; ++k) best = std::min(best, p.boundary_cost[l][j][k] + bwd[l + 1][k]);
        bwd[l][j] = best + unit[l][j];
      }
    const double shift = lambda * budget;
    // Each bound sums O(layers) terms, together at most `margin / 1e-10`; subtracting far more than their
    // rounding error keeps every bound a true lower bound, so the fixing stays exact.
    const double margin = 1e-10 * (1.0 + total_cost + lambda * (total_memory + std::abs(budget)));
    for (int l = 0; l < L; ++l)
      for (int k = 0; k < K; ++k)
        out.x_bound[l][k] =
            std::max(out.x_bound[l][k], fwd[l][k] + bwd[l][k] - unit[l][k] - shift - margin);
    for (int l = 0; l + 1 < L; ++l)
      for (int j = 0; j < K; ++j)
        for (int k = 0; k < K; ++k)
          out.y_bound[l][j][k] =
              std::max(out.y_bound[l][j][k],
                       fwd[l][j] + p.boundary_cost[l][j][k] + bwd[l + 1][k] - shift - margin);
    std::vector<int> path(static_cast<std::size_t>(L));
    path[L - 1] = static_cast<int>(std::min_element(fwd[L - 1].begin(), fwd[L - 1].end()) -
                                   fwd[L - 1].begin());
    for (int l = L - 1; l > 0; --l) path[l - 1] = from[l][path[l]];
    if (std::find(out.paths.begin(), out.paths.end(), path) == out.paths.end())
      out.paths.push_back(path);
    if (plan_memory(p, path) <= p.memory_limit) {
      const double cost = plan_cost(p, path);
      if (cost < out.incumbent_cost) {
        out.have_incumbent = true;
        out.incumbent_cost = cost;
        out.incumbent = path;
      }
    }
    return path;
  };
  std::vector<int> low = pass(0.0);  // lambda = 0: the best plan ignoring memory
  if (!limited || plan_memory(p, low) <= p.memory_limit) {
    out.proven_optimal = true;  // it fits, so nothing cheaper does
    return out;
  }
  // Above total_cost + 1 per memory unit, saving one unit outweighs any cost difference: the
  // shortest path is a least-memory plan. If even that does not fit, no plan does; leave it to
  // CBC to prove.
  double lambda_low = 0, lambda_high = total_cost + 1;
  std::vector<int> high = pass(lambda_high);
  if (plan_memory(p, high) > p.memory_limit) return out;
  // Maximise the concave, piecewise linear Lagrangian dual over lambda: move to where the lines
  // of the two bracketing plans cross (cost + lambda memory), until no new plan appears there.
  for (int iteration = 0; iteration < 64; ++iteration) {
    const double memory_low = static_cast<double>(plan_memory(p, low));
    const double memory_high = static_cast<double>(plan_memory(p, high));
    if (memory_low <= memory_high) break;
    double lambda = (plan_cost(p, high) - plan_cost(p, low)) / (memory_low - memory_high);
    if (!(lambda > lambda_low && lambda < lambda_high)) lambda = 0.5 * (lambda_low + lambda_high);
    std::vector<int> path = pass(lambda);
    const std::int64_t memory = plan_memory(p, path);
    // No plan lies below the crossing: lambda maximises the dual.
    const double crossing = plan_cost(p, low) + lambda * memory_low;
    if (plan_cost(p, path) + lambda * static_cast<double>(memory) >=
        crossing - 1e-12 * std::abs(crossing))
      break;
    if (memory > p.memory_limit) low = std::move(path), lambda_low = lambda;
    else high = std::move(path), lambda_high = lambda;
  }
  return out;
}

// A feasible plan near the Lagrangian optimum, for a tight incumbent (the tighter, the more the
// fixing above removes). The shortest paths on either side of the best multiplier are nearly
// optimal but one uses too much memory and the other too little: splice a segment of one into
// the other, keep the cheapest splice that fits, then improve it by moving one or two segments
// of layers to one candidate each while that lowers the cost and keeps the plan within the
// limit. A heuristic: its only role is an upper bound, so it need not be optimal.
std::vector<int> splice_and_improve(const ChainProblem& p,
                                    const std::vector<std::vector<int>>& paths,
                                    std::vector<int> best) {
  const int L = p.layers, K = p.candidates;
  const std::int64_t budget = p.memory_limit - p.fixed_memory;
  double best_cost = best.empty() ? std::numeric_limits<double>::infinity() : plan_cost(p, best);
  // Prefix sums along a path: layer costs, its own boundary costs, memory.
  struct Prefix {
    std::vector<double> layer, boundary;
    std::vector<std::int64_t> memory;
  };
  const auto prefix = [&](const std::vector<int>& s) {
    Prefix f{std::vector<double>(L + 1, 0.0), std::vector<double>(L, 0.0),
             std::vector<std::int64_t>(L + 1, 0)};
    for (int l = 0; l < L; ++l) {
      f.layer[l + 1] = f.layer[l] + p.layer_cost[l][s[l]];
      f.memory[l + 1] = f.memory[l] + p.layer_memory[l][s[l]];
      if (l + 1 < L) f.boundary[l + 1] = f.boundary[l] + p.boundary_cost[l][s[l]][s[l + 1]];
    }
    return f;
  };
  // boundary[i] sums the boundaries 0..i-1, i.e. those inside layers 0..i.
  std::vector<Prefix> prefixes;
  for (const auto& s : paths) prefixes.push_back(prefix(s));
  for (std::size_t u = 0; u < paths.size(); ++u)
    for (std::size_t v = 0; v < paths.size(); ++v) {
      if (u == v) continue;
      const auto &P = paths[u], &Q = paths[v];
      const Prefix &fp = prefixes[u], &fq = prefixes[v];
      for (int a = 0; a < L; ++a)
        for (int b = a; b < L; ++b) {  // layers a..b from Q, the rest from P
          const std::int64_t memory =
              fp.memory[a] + (fq.memory[b + 1] - fq.memory[a]) + (fp.memory[L] - fp.memory[b + 1]);
          if (memory > budget) continue;
          double cost = fp.layer[a] + (fq.layer[b + 1] - fq.layer[a]) + (fp.layer[L] - fp.layer[b + 1]);
          if (a > 0) cost += fp.boundary[a - 1] + p.boundary_cost[a - 1][P[a - 1]][Q[a]];
          cost += fq.boundary[b] - fq.boundary[a];
          if (b + 1 < L) cost += p.boundary_cost[b][Q[b]][P[b + 1]] + fp.boundary[L - 1] - fp.boundary[b + 1];
          if (cost < best_cost) {
            best_cost = cost;
            best = P;
            std::copy(Q.begin() + a, Q.begin() + b + 1, best.begin() + a);
          }
        }
    }
  if (best.empty()) return best;
  // Local search. A move sets a segment of layers a..b to one candidate k (a single layer when
  // a == b); a step makes the best improving move, or pair of disjoint moves, that keeps the
  // plan within the limit: one move can buy speed with memory that the other frees.
  struct Move {
    int a, b, k;
    double cost;          // change of the plan's cost
    std::int64_t memory;  // change of its memory
  };
  // along[k][i]: sums over layers 0..i-1 at candidate k (cost, memory, and the boundaries between
  // them at k on both sides).
  std::vector<std::vector<double>> along_cost(K, std::vector<double>(L + 1, 0.0)),
      along_boundary(K, std::vector<double>(L, 0.0));
  std::vector<std::vector<std::int64_t>> along_memory(K, std::vector<std::int64_t>(L + 1, 0));
  for (int k = 0; k < K; ++k)
    for (int l = 0; l < L; ++l) {
      along_cost[k][l + 1] = along_cost[k][l] + p.layer_cost[l][k];
      along_memory[k][l + 1] = along_memory[k][l] + p.layer_memory[l][k];
      if (l + 1 < L) along_boundary[k][l + 1] = along_boundary[k][l] + p.boundary_cost[l][k][k];
    }
  std::vector<Move> moves, by_memory;
  std::vector<std::array<int, 4>> cheapest;  // per prefix of by_memory: its 4 cheapest moves
  for (int round = 0; round < 4 * L; ++round) {
    const Prefix now = prefix(best);
    const std::int64_t slack = budget - now.memory[L];
    std::vector<std::vector<int>> count(K, std::vector<int>(L + 1, 0));  // layers at k so far
    for (int k = 0; k < K; ++k)
      for (int l = 0; l < L; ++l) count[k][l + 1] = count[k][l] + (best[l] == k);
    moves.clear();
    for (int a = 0; a < L; ++a)
      for (int b = a; b < L; ++b)
        for (int k = 0; k < K; ++k) {
          if (count[k][b + 1] - count[k][a] == b - a + 1) continue;  // already all at k
          double cost = (along_cost[k][b + 1] - along_cost[k][a]) - (now.layer[b + 1] - now.layer[a]) +
                        (along_boundary[k][b] - along_boundary[k][a]) - (now.boundary[b] - now.boundary[a]);
          if (a > 0)
            cost += p.boundary_cost[a - 1][best[a - 1]][k] - p.boundary_cost[a - 1][best[a - 1]][best[a]];
          if (b + 1 < L)
            cost += p.boundary_cost[b][k][best[b + 1]] - p.boundary_cost[b][best[b]][best[b + 1]];
          moves.push_back({a, b, k, cost,
                           (along_memory[k][b + 1] - along_memory[k][a]) - (now.memory[b + 1] - now.memory[a])});
        }
    const double tolerance = 1e-9 * (1.0 + std::abs(best_cost));
    double gain = -tolerance;
    int first = -1;
    for (int i = 0; i < static_cast<int>(moves.size()); ++i)
      if (moves[i].memory <= slack && moves[i].cost < gain) gain = moves[i].cost, first = i;
    // Pairs: for each move, the cheapest partners among those that fit the memory it leaves.
    by_memory = moves;
    std::sort(by_memory.begin(), by_memory.end(),
              [](const Move& u, const Move& v) { return u.memory < v.memory; });
    cheapest.assign(by_memory.size(), {-1, -1, -1, -1});
    for (int i = 0; i < static_cast<int>(by_memory.size()); ++i) {
      std::array<int, 4> top = i > 0 ? cheapest[i - 1] : std::array<int, 4>{-1, -1, -1, -1};
      int at = i;
      for (int& t : top)
        if (t < 0 || by_memory[at].cost < by_memory[t].cost) std::swap(t, at);
        else if (at < 0) break;
      cheapest[i] = top;
    }
    int pair_u = -1, pair_v = -1;
    for (int i = 0; i < static_cast<int>(by_memory.size()); ++i) {
      const Move& u = by_memory[i];
      if (u.cost >= 0) continue;  // one of the two must gain; let it be u
      const auto end_fit = std::upper_bound(by_memory.begin(), by_memory.end(), slack - u.memory,
                                            [](std::int64_t t, const Move& v) { return t < v.memory; });
      const int last = static_cast<int>(end_fit - by_memory.begin()) - 1;
      if (last < 0) continue;
      for (int j : cheapest[last]) {
        if (j < 0) break;
        const Move& v = by_memory[j];
        if (v.b + 1 >= u.a && u.b + 1 >= v.a) continue;  // overlapping or adjacent
        if (u.cost + v.cost < gain) {
          gain = u.cost + v.cost, pair_u = i, pair_v = j;
          first = -1;
        }
        break;  // the cheapest disjoint partner decides
      }
    }
    const auto apply = [&](const Move& mv) {
      for (int l = mv.a; l <= mv.b; ++l) best[l] = mv.k;
    };
    if (first >= 0) apply(moves[first]);
    else if (pair_u >= 0) apply(by_memory[pair_u]), apply(by_memory[pair_v]);
    else break;
    best_cost = plan_cost(p, best);
  }
  return best;
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
  // Exact reduction before the search: drop every candidate and pair that the Lagrangian bound
  // proves worse than a feasible plan found by a heuristic, start CBC from that plan and cut
  // off anything not better. Without it CBC proves the last few units of its gap by enumerating
  // the many near-optimal plans (0.9 s at 48 layers, 1.7 s at 96); with it a few dozen nodes.
  LagrangianFixing fixing = lagrangian_fixing(p);
  if (fixing.have_incumbent) {
    if (!fixing.proven_optimal)
      fixing.incumbent = splice_and_improve(p, fixing.paths, std::move(fixing.incumbent));
    // The ordering cut below admits only sorted plans; sorting alike layers adds no cost.
    if (interchangeable_layers(p)) std::sort(fixing.incumbent.begin(), fixing.incumbent.end());
    fixing.incumbent_cost = plan_cost(p, fixing.incumbent);
    // Strictly above the incumbent (with room for rounding): every optimal plan stays.
    const double above = fixing.incumbent_cost + 1e-9 * (1.0 + std::abs(fixing.incumbent_cost));
    for (int l = 0; l < p.layers; ++l)
      for (int k = 0; k < K; ++k)
        if (fixing.x_bound[l][k] > above) Cbc_setColUpper(m, x(l, k), 0.0);
    for (int l = 0; l + 1 < p.layers; ++l)
      for (int j = 0; j < K; ++j)
        for (int k = 0; k < K; ++k)
          if (fixing.y_bound[l][j][k] > above) Cbc_setColUpper(m, y(l, j, k), 0.0);
    std::vector<int> columns;
    std::vector<double> values;
    for (int l = 0; l < p.layers; ++l)
      for (int k = 0; k < K; ++k)
        columns.push_back(x(l, k)), values.push_back(fixing.incumbent[l] == k ? 1.0 : 0.0);
    for (int l = 0; l + 1 < p.layers; ++l)
      for (int j = 0; j < K; ++j)
        for (int k = 0; k < K; ++k)
          columns.push_back(y(l, j, k)),
              values.push_back(fixing.incumbent[l] == j && fixing.incumbent[l + 1] == k ? 1.0 : 0.0);
    Cbc_setMIPStartI(m, static_cast<int>(columns.size()), columns.data(), values.data());
    Cbc_setCutoff(m, above);
  }
  // What is left is small, and its LP bound with branching closes the gap faster than rounds of
  // cuts; primal heuristics only repeat the incumbent. "dense 0": Clp would factorise the small
  // crunched LPs of the nodes densely through LAPACK, and the OpenMP build of OpenBLAS wakes its
  // thread team for every tiny solve, which cost seconds (95% of the time in libgomp).
  Cbc_setParameter(m, "cuts", "off");
  Cbc_setParameter(m, "heuristicsOnOff", "off");
  Cbc_setParameter(m, "dense", "0");
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
