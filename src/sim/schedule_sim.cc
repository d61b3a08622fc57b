#include "sim/schedule_sim.h"

#include "core/error.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <set>
#include <tuple>

namespace oases::sim {
namespace {

using CollectiveKey = std::tuple<int, int, int, int, bool>;

CollectiveKey key_of(const schedule::Instruction& ins) {
  return {ins.segment, ins.micro_batch, ins.sub_batch, static_cast<int>(ins.direction),
          ins.replay};
}

// The two communication lanes and the compute lane as fluids: every lane does work at a rate
// set by what else is busy, and time advances to the next moment something finishes.
class Lanes {
 public:
  explicit Lanes(const CostModel& costs) : costs_(costs) {}

  double now() const { return now_; }
  void start_collective(const CollectiveKey& key, double seconds) {
    tp_.push_back({key, seconds});
  }
  void start_reduction(double seconds) { dp_.push_back({{}, seconds}); }
  bool done(const CollectiveKey& key) const { return finished_.contains(key); }
  void forget(const CollectiveKey& key) { finished_.erase(key); }
  bool reductions_done() const { return dp_.empty(); }

  // Runs `work` seconds of compute (as timed alone); returns how long it took.
  double compute(double work) {
    const double began = now_;
    while (true) {
      settle();
      const double rate = !tp_.empty() || !dp_.empty() ? 1 / (1 + costs_.overlap_slowdown) : 1.0;
      if (work <= 0) break;
      const double dt = std::min(work / rate, next_comm_event(true));
      advance(dt, true);
      work -= dt * rate;
      if (work < 1e-15) work = 0;
    }
    return now_ - began;
  }

  // Lets the communication lanes run, with compute idle, until `until()` holds.
  template <class Condition>
  void idle_until(Condition until) {
    while (true) {
      settle();
      if (until()) return;
      OASES_ASSERT(!tp_.empty() || !dp_.empty(), "waiting on nothing in flight");
      advance(next_comm_event(false), false);
    }
  }

 private:
  struct Flow {
    CollectiveKey key;
    double remaining;
  };

  // Rates of the two lanes' head flows.
  double comm_rate(bool computing) const {
    const double cpu = computing ? 1 / (1 + costs_.collective_slowdown) : 1.0;
    const double share = costs_.shared_link && !tp_.empty() && !dp_.empty() ? 0.5 : 1.0;
    return cpu * share;
  }
  double next_comm_event(bool computing) const {
    double dt = std::numeric_limits<double>::infinity();
    const double rate = comm_rate(computing);
    if (!tp_.empty()) dt = std::min(dt, tp_.front().remaining / rate);
    if (!dp_.empty()) dt = std::min(dt, dp_.front().remaining / rate);
    return dt;
  }
  void advance(double dt, bool computing) {
    const double rate = comm_rate(computing);
    if (!tp_.empty()) tp_.front().remaining -= dt * rate;
    if (!dp_.empty()) dp_.front().remaining -= dt * rate;
    now_ += dt;
  }
  // Retires the flows that have finished (zero-length ones included).
  void settle() {
    while (!tp_.empty() && tp_.front().remaining <= 1e-15) {
      finished_.insert(tp_.front().key);
      tp_.pop_front();
    }
    while (!dp_.empty() && dp_.front().remaining <= 1e-15) dp_.pop_front();
  }

  const CostModel& costs_;
  double now_ = 0;
  std::deque<Flow> tp_, dp_;  // in issue order; only the first of each moves
  std::set<CollectiveKey> finished_;
};

}  // namespace

SimResult simulate(const schedule::Schedule& schedule, const CostModel& costs) {
  using schedule::Op;
  OASES_ASSERT(costs.compute && costs.collective, "cost model without compute or collective costs");
  SimResult result;
  Lanes lanes(costs);
  std::set<CollectiveKey> started;
  for (const schedule::Instruction& ins : schedule) {
    switch (ins.op) {
      case Op::forward:
      case Op::recompute:
      case Op::backward:
        result.compute_seconds += lanes.compute(costs.compute(ins));
        break;
      case Op::start: {
        const double seconds = costs.collective(ins);
        lanes.start_collective(key_of(ins), seconds);
        started.insert(key_of(ins));
        result.comm_seconds += seconds;
        break;
      }
      case Op::wait: {
        const CollectiveKey key = key_of(ins);
        OASES_ASSERT(started.erase(key) == 1, "wait on a collective never started: {}",
                     schedule::to_string(ins));
        const double before = lanes.now();
        lanes.idle_until([&] { return lanes.done(key); });
        result.exposed_comm_seconds += lanes.now() - before;
        lanes.forget(key);
        break;
      }
      case Op::reduce_grads:
        if (costs.reduce_grads) lanes.start_reduction(costs.reduce_grads(ins.bucket));
        break;
      case Op::optimizer_step: {
        const double before = lanes.now();
        lanes.idle_until([&] { return lanes.reductions_done(); });
        result.exposed_comm_seconds += lanes.now() - before;
        lanes.compute(costs.optimizer_step);
        break;
      }
      case Op::free:
        break;
      case Op::send:
      case Op::recv:
        OASES_ASSERT(false, "Send/Recv ({}) is not supported by this simulator yet",
                     schedule::to_string(ins));
        break;
    }
  }
  result.step_seconds = lanes.now();
  return result;
}

}  // namespace oases::sim
