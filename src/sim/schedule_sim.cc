#include "sim/schedule_sim.h"

#include "core/error.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace oases::sim {

SimResult simulate(const schedule::Schedule& schedule, const CostModel& costs) {
  using schedule::Op;
  OASES_ASSERT(costs.compute && costs.collective, "cost model without compute or collective costs");
  SimResult result;
  double now = 0;                                               // compute lane clock
  double wire_free = 0;                                         // tensor-parallel lane free from
  double dp_free = 0;                                           // data-parallel lane free from
  std::map<std::tuple<int, int, int, int, bool>, double> ends;  // collective -> end time
  for (const schedule::Instruction& ins : schedule) {
    const auto key = std::tuple{ins.segment, ins.micro_batch, ins.sub_batch,
                                static_cast<int>(ins.direction), ins.replay};
    switch (ins.op) {
      case Op::forward:
      case Op::recompute:
      case Op::backward: {
        // Compute advances at 1 / (1 + slowdown) while the lane is busy, at full speed after.
        const double work = costs.compute(ins);
        const double busy = std::max(0.0, wire_free - now);
        const double rate = 1 + costs.overlap_slowdown;
        const double seconds = work * rate <= busy ? work * rate : busy + (work - busy / rate);
        now += seconds;
        result.compute_seconds += seconds;
        break;
      }
      case Op::start: {
        const double begin = std::max(now, wire_free);
        const double seconds = costs.collective(ins);
        // Two flows at half speed each: both finish later by the time they share.
        const double shared = costs.shared_link ? std::min(seconds, std::max(0.0, dp_free - begin)) : 0.0;
        wire_free = begin + seconds + shared;
        dp_free += shared;
        result.comm_seconds += seconds;
        ends[key] = wire_free;
        break;
      }
      case Op::wait: {
        const auto it = ends.find(key);
        OASES_ASSERT(it != ends.end(), "wait on a collective never started: {}",
                     schedule::to_string(ins));
        if (it->second > now) {
          result.exposed_comm_seconds += it->second - now;
          now = it->second;
        }
        ends.erase(it);
        break;
      }
      case Op::reduce_grads: {
        if (!costs.reduce_grads) break;
        const double begin = std::max(now, dp_free);
        const double seconds = costs.reduce_grads(ins.segment);
        const double shared =
            costs.shared_link ? std::min(seconds, std::max(0.0, wire_free - begin)) : 0.0;
        dp_free = begin + seconds + shared;
        if (shared > 0) {
          // The collectives on the wire from `begin` on move at half speed for that long.
          wire_free += shared;
          for (auto& [collective, end] : ends)
            if (end > begin) end += std::min(shared, end - begin);
        }
        break;
      }
      case Op::optimizer_step:
        if (dp_free > now) {
          result.exposed_comm_seconds += dp_free - now;
          now = dp_free;
        }
        now += costs.optimizer_step;
        break;
      case Op::free:
        break;
    }
  }
  result.step_seconds = now;
  return result;
}

}  // namespace oases::sim
