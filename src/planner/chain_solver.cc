#include "planner/chain_solver.h"

#include "core/error.h"

#include <coin/Cbc_C_Interface.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

// Lagrangian relaxation of the memory row. For a multiplier lambda >= 0 every feasible plan P has
//   cost(P) >= cost(P) + lambda (memory(P) - budget) >= min over plans Q of the same shape
//              [cost(Q) + lambda memory(Q)] - lambda budget,
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
  std::vector<std::vector<double>> x_bound;               // [l][k]
  std::vector<std::vector<std::vector<double>>> y_bound;  // [l][j][k]
  int passes = 0;
  std::vector<std::vector<int>> paths;  // every shortest path met, feasible or not
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
  // One Viterbi pass at lambda: tightens every bound and returns the shortest path.
  const auto pass = [&](double lambda) {
    ++out.passes;
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
    for (int l = 0; l < L; ++l)
      for (int k = 0; k < K; ++k)
        out.x_bound[l][k] = std::max(out.x_bound[l][k], fwd[l][k] + bwd[l][k] - unit[l][k] - shift);
    for (int l = 0; l + 1 < L; ++l)
      for (int j = 0; j < K; ++j)
        for (int k = 0; k < K; ++k)
          out.y_bound[l][j][k] = std::max(
              out.y_bound[l][j][k], fwd[l][j] + p.boundary_cost[l][j][k] + bwd[l + 1][k] - shift);
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
  if (!limited || plan_memory(p, low) <= p.memory_limit) return out;
  // Above total_cost + 1 per memory unit, saving one unit outweighs any cost: the shortest path
  // is a least-memory plan. If even that does not fit, no plan does; leave it to CBC to prove.
  double total_cost = 0;
  for (int l = 0; l < L; ++l) {
    total_cost += *std::max_element(p.layer_cost[l].begin(), p.layer_cost[l].end());
    if (l + 1 < L)
      for (const auto& row : p.boundary_cost[l])
        total_cost = total_cost + *std::max_element(row.begin(), row.end());
  }
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
// the other, keep the cheapest splice that fits, then improve it by changing one or two layers
// at a time while that lowers the cost and keeps the plan within the limit. A heuristic: its
// only role is an upper bound, so it need not be optimal.
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
  // Local search: the best move of one or two layers to other candidates, until none helps.
  std::int64_t memory = plan_memory(p, best) - p.fixed_memory;
  const auto boundary = [&](int l, int j, int k) { return p.boundary_cost[l][j][k]; };
  const auto delta = [&](int l, int k) {  // cost change of moving layer l alone to k
    const int c = best[l];
    double d = p.layer_cost[l][k] - p.layer_cost[l][c];
    if (l > 0) d += boundary(l - 1, best[l - 1], k) - boundary(l - 1, best[l - 1], c);
    if (l + 1 < L) d += boundary(l, k, best[l + 1]) - boundary(l, c, best[l + 1]);
    return d;
  };
  std::vector<double> single(static_cast<std::size_t>(L * K));
  for (int round = 0; round < 10 * L; ++round) {
    for (int l = 0; l < L; ++l)
      for (int k = 0; k < K; ++k) single[l * K + k] = k == best[l] ? 0.0 : delta(l, k);
    const double tolerance = 1e-9 * (1.0 + std::abs(best_cost));
    double gain = -tolerance;
    int l1 = -1, k1 = -1, l2 = -1, k2 = -1;
    for (int a = 0; a < L; ++a)
      for (int ka = 0; ka < K; ++ka) {
        if (ka == best[a]) continue;
        const std::int64_t ma = p.layer_memory[a][ka] - p.layer_memory[a][best[a]];
        if (memory + ma <= budget && single[a * K + ka] < gain)
          gain = single[a * K + ka], l1 = a, k1 = ka, l2 = -1;
        for (int b = a + 1; b < L; ++b)
          for (int kb = 0; kb < K; ++kb) {
            if (kb == best[b]) continue;
            const std::int64_t mb = p.layer_memory[b][kb] - p.layer_memory[b][best[b]];
            if (memory + ma + mb > budget) continue;
            double d = single[a * K + ka] + single[b * K + kb];
            if (b == a + 1)  // the shared boundary was counted twice, from the old neighbours
              d += boundary(a, ka, kb) - boundary(a, ka, best[b]) - boundary(a, best[a], kb) +
                   boundary(a, best[a], best[b]);
            if (d < gain) gain = d, l1 = a, k1 = ka, l2 = b, k2 = kb;
          }
      }
    if (l1 < 0) break;
    memory += p.layer_memory[l1][k1] - p.layer_memory[l1][best[l1]];
    best[l1] = k1;
    if (l2 >= 0) {
      memory += p.layer_memory[l2][k2] - p.layer_memory[l2][best[l2]];
      best[l2] = k2;
    }
    best_cost = plan_cost(p, best);
  }
  return best;
}
}  // namespace

ChainPlan solve_ilp(const ChainProblem& p) {
  p.validate();
  const std::unique_ptr<Cbc_Model, void (*)(Cbc_Model*)> model(Cbc_newModel(), Cbc_deleteModel);
  Cbc_Model* m = model.get();
  Cbc_setLogLevel(m, std::getenv("OASES_CBC_LOG") ? std::atoi(std::getenv("OASES_CBC_LOG")) : 0);
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
  LagrangianFixing fixing = lagrangian_fixing(p);
  if (fixing.have_incumbent && !(std::getenv("OASES_NOHEUR"))) {
    fixing.incumbent = splice_and_improve(p, fixing.paths, fixing.incumbent);
    fixing.incumbent_cost = plan_cost(p, fixing.incumbent);
  }
  const char* dbg = std::getenv("OASES_ILP_DEBUG");
  const int mode = dbg ? std::atoi(dbg) : 7;
  if (mode & 8) {
    const ChainPlan cheat = solve_dynamic_program(p);
    fixing.incumbent = cheat.choice;
    fixing.incumbent_cost = cheat.cost;
  }
  int fixed_x = 0, fixed_y = 0;
  if (fixing.have_incumbent && (mode & 1)) {
    const double above = fixing.incumbent_cost + 1e-6 * (1.0 + std::abs(fixing.incumbent_cost));
    for (int l = 0; l < p.layers; ++l)
      for (int k = 0; k < K; ++k)
        if (fixing.x_bound[l][k] > above) Cbc_setColUpper(m, x(l, k), 0.0), ++fixed_x;
    for (int l = 0; l + 1 < p.layers; ++l)
      for (int j = 0; j < K; ++j)
        for (int k = 0; k < K; ++k)
          if (fixing.y_bound[l][j][k] > above) Cbc_setColUpper(m, y(l, j, k), 0.0), ++fixed_y;
  }
  if (fixing.have_incumbent && (mode & 2)) {
    std::vector<int> idx;
    std::vector<double> val;
    for (int l = 0; l < p.layers; ++l)
      for (int k = 0; k < K; ++k) idx.push_back(x(l, k)), val.push_back(fixing.incumbent[l] == k);
    for (int l = 0; l + 1 < p.layers; ++l)
      for (int j = 0; j < K; ++j)
        for (int k = 0; k < K; ++k)
          idx.push_back(y(l, j, k)),
              val.push_back(fixing.incumbent[l] == j && fixing.incumbent[l + 1] == k);
    Cbc_setMIPStartI(m, static_cast<int>(idx.size()), idx.data(), val.data());
  }
  if (fixing.have_incumbent && (mode & 4))
    Cbc_setCutoff(m, fixing.incumbent_cost + 1e-6 * (1.0 + std::abs(fixing.incumbent_cost)));
  if (dbg) {
    double lb = -1e300;
    for (int k = 0; k < K; ++k) lb = std::max(lb, -1e300);
    double best_lb = std::numeric_limits<double>::infinity();
    for (int k = 0; k < K; ++k) best_lb = std::min(best_lb, fixing.x_bound[0][k]);
    std::fprintf(stderr, "L=%d passes=%d inc=%d ub=%.4f lb=%.4f fixed_x=%d/%d fixed_y=%d/%d\n",
                 p.layers, fixing.passes, fixing.have_incumbent, fixing.incumbent_cost, best_lb,
                 fixed_x, p.layers * K, fixed_y, (p.layers - 1) * K * K);
  }
  if (const char* params = std::getenv("OASES_CBC_PARAMS")) {
    std::string all = params;
    std::size_t start = 0;
    while (start < all.size()) {
      std::size_t end = all.find(',', start);
      if (end == std::string::npos) end = all.size();
      const std::string item = all.substr(start, end - start);
      const std::size_t eq = item.find('=');
      Cbc_setParameter(m, item.substr(0, eq).c_str(), item.substr(eq + 1).c_str());
      start = end + 1;
    }
  }
  Cbc_setObjSense(m, 1.0);
  Cbc_solve(m);
  if (dbg) {
    std::fprintf(stderr, "  nodes=%d obj=%.4f\n", Cbc_getNodeCount(m), Cbc_getObjValue(m));
    if (std::getenv("OASES_SHOW")) {
      std::string a, b;
      for (int l = 0; l < p.layers; ++l) {
        a += static_cast<char>('0' + fixing.incumbent[l]);
        for (int k = 0; k < K; ++k)
          if (Cbc_getColSolution(m)[x(l, k)] > 0.5) b += static_cast<char>('0' + k);
      }
      std::fprintf(stderr, "heur %s\nopt  %s\n", a.c_str(), b.c_str());
    }
  }
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
