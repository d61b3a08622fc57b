#include "planner/profiler.h"

#include <algorithm>

namespace oases::planner {

std::string segment_kind(const std::string& name) { return name.substr(0, name.find('.')); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void TimingCollector::record(const runtime::InstructionRecord& r) {
  using schedule::Op;
  const schedule::Instruction& ins = r.instruction;
  const double seconds = r.seconds();
  if (ins.op == Op::optimizer_step) {
    optimizer_.push_back(seconds);
    return;
  }
  if (r.segment == nullptr) return;
  const std::string kind = segment_kind(r.segment->name);
  switch (ins.op) {
    case Op::start:
    case Op::wait:
      if (!ins.replay)
        collectives_[kind + (ins.direction == schedule::Direction::forward ? ".fwd_s" : ".bwd_s")]
            .push_back(seconds);
      return;
    case Op::forward: compute_[kind]["forward_s"].push_back(seconds); return;
    case Op::recompute: compute_[kind]["recompute_s"].push_back(seconds); return;
    case Op::backward:
      compute_[kind][ins.stage == 0 ? "backward0_s" : "backward1_s"].push_back(seconds);
      return;
    default: return;
  }
}

void TimingCollector::fill(DegreeProfile& degree) const {
  for (const auto& [kind, by_action] : compute_) {
    SegmentTimes& t = degree.segments[kind];
    const auto of = [&](const char* action) {
      const auto it = by_action.find(action);
      return it == by_action.end() ? 0.0 : median(it->second);
    };
    t.forward_s = of("forward_s");
    t.recompute_s = of("recompute_s");
    t.backward0_s = of("backward0_s");
    t.backward1_s = of("backward1_s");
  }
  for (const auto& [name, values] : collectives_) degree.collectives[name] = median(values);
  degree.optimizer_s = median(optimizer_);
}

}  // namespace oases::planner
