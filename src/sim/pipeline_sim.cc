#include "sim/pipeline_sim.h"

#include "core/error.h"

#include <algorithm>

namespace oases::sim {
namespace {

using schedule::PipelineAction;

double cost_of(const PipelineCosts& costs, PipelineAction::Kind kind) {
  switch (kind) {
    case PipelineAction::forward:
      return costs.forward;
    case PipelineAction::backward:
      return costs.backward;
    case PipelineAction::backward_input:
      return costs.backward_input;
    case PipelineAction::backward_weight:
      return costs.backward_weight;
  }
  OASES_ASSERT(false, "unknown pipeline action kind {}", static_cast<int>(kind));
}

}  // namespace

PipelineTiming simulate_pipeline(const schedule::PipelineSpec& spec,
                                 const schedule::PipelineOrders& orders,
                                 const PipelineCosts& costs) {
  OASES_ASSERT(orders.size() == static_cast<std::size_t>(spec.stages),
               "{} rank lists for {} pipeline stages", orders.size(), spec.stages);
  OASES_ASSERT(costs.forward >= 0 && costs.backward >= 0 && costs.backward_input >= 0 &&
                   costs.backward_weight >= 0 && costs.p2p >= 0,
               "negative pipeline cost");
  const auto chunks = static_cast<std::size_t>(spec.chunks());
  const auto micro_batches = static_cast<std::size_t>(spec.micro_batches);
  // finish[(kind, chunk, micro-batch)], negative until the action has run.
  std::vector<double> finish(4 * chunks * micro_batches, -1.0);
  const auto slot = [&](const PipelineAction& a) -> double& {
    return finish[(static_cast<std::size_t>(a.kind) * chunks + static_cast<std::size_t>(a.chunk)) *
                      micro_batches +
                  static_cast<std::size_t>(a.micro_batch)];
  };

  const auto ranks = orders.size();
  PipelineTiming timing;
  timing.busy.assign(ranks, 0.0);
  timing.start.resize(ranks);
  std::vector<double> free_at(ranks, 0.0);
  std::vector<std::size_t> position(ranks, 0);
  // An action's start depends only on finished actions, so running each rank as far as its
  // dependencies allow, round after round, gives the same times as an event queue.
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      const auto& order = orders[rank];
      for (std::size_t& at = position[rank]; at < order.size(); ++at, progress = true) {
        const PipelineAction& a = order[at];
        OASES_ASSERT(a.chunk >= 0 && a.chunk < spec.chunks() && a.micro_batch >= 0 &&
                         a.micro_batch < spec.micro_batches,
                     "rank {} position {}: {} lies outside the pipeline (P v = {}, m = {})", rank,
                     at, schedule::to_string(a), spec.chunks(), spec.micro_batches);
        double ready = free_at[rank];
        if (const auto dependency = schedule::pipeline_dependency(spec, a)) {
          const double done = slot(*dependency);
          if (done < 0) break;
          const bool crosses = spec.rank_of_chunk(dependency->chunk) != static_cast<int>(rank);
          ready = std::max(ready, done + (crosses ? costs.p2p : 0.0));
        }
        const double seconds = cost_of(costs, a.kind);
        timing.start[rank].push_back(ready);
        free_at[rank] = slot(a) = ready + seconds;
        timing.busy[rank] += seconds;
      }
    }
  }
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    OASES_ASSERT(position[rank] == orders[rank].size(),
                 "pipeline orders wait on each other in a cycle (rank {} stops at position {} of "
                 "{}); run schedule::verify_pipeline_orders for the details",
                 rank, position[rank], orders[rank].size());
    timing.makespan = std::max(timing.makespan, free_at[rank]);
  }
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    timing.idle.push_back(timing.makespan - timing.busy[rank]);
  }
  return timing;
}

}  // namespace oases::sim
