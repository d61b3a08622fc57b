// Checks on a generated schedule that every collective is hidden: each Start is waited on
// later, is no replay, and, but for those of the step's last backward collectives, is in flight
// while another instance (micro-batch or sub-batch) computes.
#pragma once

#include "schedule/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace oases::testing {

// The Start instructions of `steps`, each checked as above (gtest failures name it).
inline std::vector<schedule::Instruction> expect_every_collective_overlapped(
    const schedule::Schedule& steps) {
  using schedule::Op;
  std::vector<schedule::Instruction> starts;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const schedule::Instruction& start = steps[i];
    if (start.op != Op::start) continue;
    starts.push_back(start);
    EXPECT_FALSE(start.replay) << schedule::to_string(start);
    bool other_computes = false;
    std::size_t j = i + 1;
    for (; j < steps.size(); ++j) {
      const schedule::Instruction& ins = steps[j];
      if (ins.op == Op::wait && ins.segment == start.segment &&
          ins.micro_batch == start.micro_batch && ins.sub_batch == start.sub_batch &&
          ins.direction == start.direction)
        break;
      const bool compute =
          ins.op == Op::forward || ins.op == Op::backward || ins.op == Op::recompute;
      other_computes =
          other_computes ||
          (compute && (ins.sub_batch != start.sub_batch || ins.micro_batch != start.micro_batch));
    }
    EXPECT_LT(j, steps.size()) << schedule::to_string(start) << " is never waited on";
    // The last backward collective of the step has nothing left to hide behind.
    const bool last =
        std::none_of(steps.begin() + static_cast<std::ptrdiff_t>(std::min(j, steps.size())),
                     steps.end(), [](const schedule::Instruction& ins) {
                       return ins.op == Op::forward || ins.op == Op::backward;
                     });
    if (!last) {
      EXPECT_TRUE(other_computes) << schedule::to_string(start) << " is not overlapped";
    }
  }
  return starts;
}

}  // namespace oases::testing
