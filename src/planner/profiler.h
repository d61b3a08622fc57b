// The profiler's measuring side: turns the executor's per-instruction records
// (runtime/executor.h) into a degree's timings (planner/profile.h). It listens to the steps
// the profile run drives (train/profiler.h) and keeps, per segment kind (the segment name up
// to its first '.': "attention", "mlp", "embedding", "head", "head_softmax", "reshard", ...),
// the durations of Forward, Recompute and each Backward stage, per collective
// ("<kind>.fwd_s", "<kind>.bwd_s") its time on the wire, and the optimizer step's time; the
// profile holds their medians.
#pragma once

#include "planner/profile.h"
#include "runtime/executor.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace oases::planner {

class TimingCollector final : public runtime::InstructionListener {
 public:
  void record(const runtime::InstructionRecord& record) override;
  // Medians of everything recorded so far into `degree`'s segments, collectives and
  // optimizer_s.
  void fill(DegreeProfile& degree) const;

 private:
  std::map<std::string, std::map<std::string, std::vector<double>>> compute_;  // kind -> action
  std::map<std::string, std::vector<double>> collectives_;
  std::vector<double> optimizer_;
};

// How much compute and communication slow each other in training steps that overlap them
// (sim::CostModel's overlap_slowdown and collective_slowdown), measured from those steps
// themselves. It listens to the steps of an overlapping schedule: every Forward, Recompute and
// Backward on the compute lane, and every collective's time on the wire (the executor reports
// it at the Wait); end_step() closes a step. Given what each instruction costs alone (a
// DegreeProfile of blocking steps, priced as the cost model prices it), a step's compute
// slowdown s solves
//     blocking = outside + inside / (1 + s)
// where `blocking` sums the instructions' costs alone, and `outside` and `inside` their traced
// time without and with a collective on the wire: work runs at full speed outside and at
// 1 / (1 + s) of it inside, as the simulator prices it. The collective slowdown is the same
// equation over the collectives, with their time under compute and their blocking wire times.
// The estimates are the medians over the steps; a lane that spent under a tenth of its time
// beside the other measures nothing (nullopt), nor does a step whose time outside already
// exceeds the whole blocking cost (the host slowed down between the measurements).
class OverlapCollector final : public runtime::InstructionListener {
 public:
  void record(const runtime::InstructionRecord& record) override;
  void end_step();

  struct Estimate {
    std::optional<double> compute_slowdown, collective_slowdown;  // >= 0
    double compute_share_in_flight = 0;      // compute time with a collective on the wire
    double collective_share_under_compute = 0;  // collective time with compute running
  };
  // `blocking`: the same segments' timings from steps that do not overlap (TimingCollector).
  Estimate estimate(const DegreeProfile& blocking) const;

 private:
  struct Interval {
    schedule::Instruction instruction;
    std::string kind;  // segment kind
    double began, finished;  // seconds since the first record
  };
  std::vector<Interval> compute_, collectives_;              // this step's
  std::vector<std::vector<Interval>> steps_compute_, steps_collectives_;
  std::optional<runtime::InstructionRecord::Clock::time_point> origin_;
};

// What one instruction costs alone, from a degree's profiled timings as the cost model prices
// it (planner::costs_at): compute from the segment's times, a Wait's collective from the
// collective's wire time; 0 for what the profile has no time for.
double blocking_seconds(const DegreeProfile& degree, const std::string& kind,
                        const schedule::Instruction& instruction);

double median(std::vector<double> values);

}  // namespace oases::planner
