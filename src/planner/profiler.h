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

// The segment kind of a segment name ("attention.3" -> "attention", "moe_dispatch.3" ->
// "moe_dispatch").
std::string segment_kind(const std::string& name);

double median(std::vector<double> values);

}  // namespace oases::planner
