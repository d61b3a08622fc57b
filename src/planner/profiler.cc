#include "planner/profiler.h"

#include "planner/cost_model.h"

#include <algorithm>
#include <chrono>

namespace oases::planner {

double blocking_seconds(const DegreeProfile& degree, const std::string& kind,
                        const schedule::Instruction& ins) {
  using schedule::Op;
  if (ins.op == Op::start || ins.op == Op::wait) {
    const auto it = degree.collectives.find(
        kind + (ins.direction == schedule::Direction::forward ? ".fwd_s" : ".bwd_s"));
    return it == degree.collectives.end() ? 0.0 : it->second;
  }
  const auto it = degree.segments.find(kind);
  return it == degree.segments.end() ? 0.0 : segment_seconds(it->second, ins);
}

void OverlapCollector::record(const runtime::InstructionRecord& r) {
  using schedule::Op;
  if (r.segment == nullptr) return;
  const Op op = r.instruction.op;
  const bool compute = r.lane == runtime::Lane::compute &&
                       (op == Op::forward || op == Op::recompute || op == Op::backward);
  // Replayed forward collectives count too: where a schedule replays one it is on the wire.
  const bool collective = r.lane == runtime::Lane::communication;
  if (!compute && !collective) return;
  if (!origin_) origin_ = r.began;
  const auto since = [&](runtime::InstructionRecord::Clock::time_point t) {
    return std::chrono::duration<double>(t - *origin_).count();
  };
  (compute ? compute_ : collectives_)
      .push_back({r.instruction, segment_kind(r.segment->name), since(r.began), since(r.finished)});
}

void OverlapCollector::end_step() {
  steps_compute_.push_back(std::move(compute_));
  steps_collectives_.push_back(std::move(collectives_));
  compute_.clear();
  collectives_.clear();
}

namespace {

using Span = std::pair<double, double>;

std::vector<Span> merged(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end());
  std::vector<Span> out;
  for (const Span& s : spans) {
    if (!out.empty() && s.first <= out.back().second)
      out.back().second = std::max(out.back().second, s.second);
    else
      out.push_back(s);
  }
  return out;
}

// Seconds of [began, finished) covered by the sorted, disjoint `spans`.
double covered(double began, double finished, const std::vector<Span>& spans) {
  double sum = 0;
  for (const Span& s : spans) sum += std::max(0.0, std::min(finished, s.second) - std::max(began, s.first));
  return sum;
}

template <class Interval>
std::vector<Span> spans_of(const std::vector<Interval>& intervals) {
  std::vector<Span> spans;
  for (const Interval& i : intervals) spans.emplace_back(i.began, i.finished);
  return merged(std::move(spans));
}

}  // namespace

OverlapCollector::Estimate OverlapCollector::estimate(const DegreeProfile& blocking) const {
  // One lane's slowdown in one step: its intervals against the other lane's busy spans.
  struct Lane {
    double blocking = 0, outside = 0, inside = 0;
  };
  const auto lane = [&](const std::vector<Interval>& own, const std::vector<Span>& other) {
    Lane l;
    for (const Interval& i : own) {
      const double inside = covered(i.began, i.finished, other);
      l.blocking += blocking_seconds(blocking, i.kind, i.instruction);
      l.inside += inside;
      l.outside += i.finished - i.began - inside;
    }
    return l;
  };
  std::vector<double> compute_slowdowns, collective_slowdowns;
  double compute_total = 0, compute_inside = 0, collective_total = 0, collective_inside = 0;
  const auto add = [](const Lane& l, std::vector<double>& slowdowns, double& total,
                      double& inside) {
    total += l.outside + l.inside;
    inside += l.inside;
    // blocking = outside + inside / (1 + s)
    if (l.inside >= 0.1 * (l.outside + l.inside) && l.blocking > l.outside)
      slowdowns.push_back(std::max(0.0, l.inside / (l.blocking - l.outside) - 1));
  };
  for (std::size_t s = 0; s < steps_compute_.size(); ++s) {
    add(lane(steps_compute_[s], spans_of(steps_collectives_[s])), compute_slowdowns,
        compute_total, compute_inside);
    add(lane(steps_collectives_[s], spans_of(steps_compute_[s])), collective_slowdowns,
        collective_total, collective_inside);
  }
  Estimate e;
  // A majority of the steps must measure it, else it is noise of the few that did.
  if (2 * compute_slowdowns.size() > steps_compute_.size())
    e.compute_slowdown = median(compute_slowdowns);
  if (2 * collective_slowdowns.size() > steps_collectives_.size())
    e.collective_slowdown = median(collective_slowdowns);
  e.compute_share_in_flight = compute_total > 0 ? compute_inside / compute_total : 0;
  e.collective_share_under_compute = collective_total > 0 ? collective_inside / collective_total : 0;
  return e;
}

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
