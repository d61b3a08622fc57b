#include "optim/lr_schedule.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace oases::optim {

double LrSchedule::at(std::int64_t step) const {
  OASES_ASSERT(step >= 0, "learning rate asked for step {}; steps count from 0", step);
  if (step < warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const std::int64_t decay_length = (decay_steps > 0 ? decay_steps : total_steps) - warmup_steps;
  if (decay_length <= 0) return lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_length));
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (lr - min_lr);
}

}  // namespace oases::optim
