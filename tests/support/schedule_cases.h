// The within-stage schedules with the recomputation policies they run, for tests of passes
// over their instruction lists.
#pragma once

#include "schedule/schedule.h"

#include <vector>

namespace oases::testing {

struct ScheduleCase {
  schedule::ScheduleKind kind;
  schedule::Recompute recompute;
  int sub_batches;
};

inline const std::vector<ScheduleCase>& within_stage_schedules() {
  using schedule::Recompute;
  using schedule::ScheduleKind;
  static const std::vector<ScheduleCase> cases = {
      {ScheduleKind::megatron, Recompute::none, 1},
      {ScheduleKind::megatron, Recompute::full, 1},
      {ScheduleKind::megatron, Recompute::selective, 1},
      {ScheduleKind::megatron, Recompute::sqrt, 1},
      {ScheduleKind::fine_grained, Recompute::fine_grained, 1},
      {ScheduleKind::cross_pass, Recompute::full, 2},
      {ScheduleKind::oases, Recompute::fine_grained, 2},
      {ScheduleKind::oases_interleaved, Recompute::fine_grained, 2},
      {ScheduleKind::oases_deferred, Recompute::fine_grained, 2},
  };
  return cases;
}

}  // namespace oases::testing
