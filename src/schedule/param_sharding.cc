// schedule::shard_parameters (schedule.h): ZeRO-3's gathers and releases of parameter buckets
// around the windows of compute that read them, and ZeRO-1/2's deferred gathers ahead of the
// first use.
#include "schedule/schedule.h"

#include "core/error.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace oases::schedule {
namespace {

bool is_compute(Op op) {
  return op == Op::forward || op == Op::recompute || op == Op::backward ||
         op == Op::backward_weight;
}

// Which side of a window boundary a use is on: Forward, or Recompute, Backward and
// BackwardWeight, which need the parameters again once the forward pass is done.
bool backward_side(Op op) { return op != Op::forward; }

// The parameter instructions inserted between two instructions of the schedule, by bucket.
// std::set keeps each kind in ascending bucket order, the order every data-parallel rank
// issues them in.
struct Insertions {
  std::set<int> releases, gathers, waits;
};

}  // namespace

void shard_parameters(const ops::Program& program, const ScheduleSpec& spec, Schedule& schedule) {
  OASES_ASSERT(spec.sharded_params != spec.deferred_param_gather,
               "shard_parameters needs sharded parameters or deferred gathers (not both)");
  const std::size_t n = schedule.size();
  // uses[b]: positions of the compute instructions that read bucket b, in order.
  std::map<int, std::vector<std::size_t>> uses;
  // previous_compute[i]: the last compute instruction before position i; -1: none.
  std::vector<std::ptrdiff_t> previous_compute(n, -1);
  // previous_switch[i]: the last UseWeights or OptimizerStep before position i (2bw: the weights
  // the following compute reads change there); -1: none.
  std::vector<std::ptrdiff_t> previous_switch(n + 1, -1);
  std::ptrdiff_t last_compute = -1, last_switch = -1;
  for (std::size_t i = 0; i < n; ++i) {
    const Instruction& ins = schedule[i];
    OASES_ASSERT(!is_parameter_op(ins.op),
                 "shard_parameters on a schedule that already holds parameter instructions: "
                 "instruction {} ({})",
                 i, to_string(ins));
    previous_compute[i] = last_compute;
    previous_switch[i] = last_switch;
    if (ins.op == Op::use_weights || ins.op == Op::optimizer_step)
      last_switch = static_cast<std::ptrdiff_t>(i);
    if (!is_compute(ins.op)) continue;
    last_compute = static_cast<std::ptrdiff_t>(i);
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    for (int bucket : shape.param_buckets) {
      OASES_ASSERT(bucket >= 0, "segment {} ({}) reads parameter bucket {}; ids are >= 0",
                   ins.segment, shape.name, bucket);
      std::vector<std::size_t>& positions = uses[bucket];
      if (positions.empty() || positions.back() != i) positions.push_back(i);
    }
  }

  if (spec.deferred_param_gather) {
    // Gathers in the order of first use, all at the start; a wait before each first use.
    std::vector<std::pair<std::size_t, int>> first_uses;
    for (const auto& [bucket, positions] : uses) first_uses.emplace_back(positions.front(), bucket);
    std::ranges::sort(first_uses);
    Schedule out;
    out.reserve(n + 2 * first_uses.size());
    for (const auto& [position, bucket] : first_uses) {
      Instruction gather{Op::gather_params};
      gather.bucket = bucket;
      out.push_back(gather);
    }
    std::size_t next = 0;
    for (std::size_t i = 0; i < n; ++i) {
      for (; next < first_uses.size() && first_uses[next].first == i; ++next) {
        Instruction wait{Op::wait_params};
        wait.bucket = first_uses[next].second;
        out.push_back(wait);
      }
      out.push_back(schedule[i]);
    }
    schedule = std::move(out);
    return;
  }

  // at[i]: what goes right before schedule[i] (at[n]: at the end).
  std::vector<Insertions> at(n + 1);
  const auto window_ends_between = [&](std::size_t previous, std::size_t next) {
    const bool was_backward = backward_side(schedule[previous].op);
    const bool is_backward = backward_side(schedule[next].op);
    return (was_backward && !is_backward) ||
           (spec.reshard_after_forward && !was_backward && is_backward) ||
           previous_switch[next] > static_cast<std::ptrdiff_t>(previous);
  };
  std::size_t windows = 0;
  for (const auto& [bucket, positions] : uses) {
    std::ptrdiff_t released_after = -1;  // the last use of the previous window; -1: none
    for (std::size_t first = 0; first < positions.size();) {
      std::size_t last = first;
      while (last + 1 < positions.size() &&
             !window_ends_between(positions[last], positions[last + 1]))
        ++last;
      const std::size_t begin = positions[first], end = positions[last];
      // The gather travels while the compute instruction before the window's first use runs,
      // unless that instruction is the previous window's last use: then it follows the release.
      const std::ptrdiff_t ahead = previous_compute[begin];
      std::size_t gather = 0;  // no compute before the window: the start of the schedule
      if (released_after >= 0 && ahead <= released_after)
        gather = static_cast<std::size_t>(released_after) + 1;
      else if (ahead >= 0)
        gather = static_cast<std::size_t>(ahead);
      // Never before the weights the window reads are in place.
      if (previous_switch[begin] >= 0)
        gather = std::max(gather, static_cast<std::size_t>(previous_switch[begin]) + 1);
      at[gather].gathers.insert(bucket);
      at[begin].waits.insert(bucket);
      at[end + 1].releases.insert(bucket);
      released_after = static_cast<std::ptrdiff_t>(end);
      first = last + 1;
      ++windows;
    }
  }

  Schedule out;
  out.reserve(n + 3 * windows);
  const auto emit = [&](Op op, const std::set<int>& buckets) {
    for (int bucket : buckets) {
      Instruction ins{op};
      ins.bucket = bucket;
      out.push_back(ins);
    }
  };
  for (std::size_t i = 0; i <= n; ++i) {
    // A release before a gather between the same two instructions: the released blocks make
    // room for the gathered ones, and a bucket's next gather follows its own release.
    emit(Op::release_params, at[i].releases);
    emit(Op::gather_params, at[i].gathers);
    emit(Op::wait_params, at[i].waits);
    if (i < n) out.push_back(schedule[i]);
  }
  schedule = std::move(out);
}

}  // namespace oases::schedule
