// LrSchedule: the learning rate of each optimizer step, from the [train] settings lr, min_lr,
// warmup_steps, lr_decay_steps and steps.
//
// For 0-based step s, with W = warmup_steps and D = (decay_steps > 0 ? decay_steps :
// total_steps) - W (the length of the decay, which ends at step W + D):
//   s < W:       lr * (s + 1) / W                                  linear warmup, reaching lr
//                                                                   on the last warmup step
//   D <= 0:      lr                                                no decay
//   otherwise:   min_lr + 0.5 * (1 + cos(pi * min(1, (s - W) / D))) * (lr - min_lr)
//                                                                   cosine decay, then min_lr
// evaluated in double in that order (the engine's learning rates, bit for bit).
// With warmup_steps = 0 and min_lr = lr the rate is exactly lr at every step.
#pragma once

#include <cstdint>

namespace oases::optim {

struct LrSchedule {
  double lr = 0;                  // peak learning rate
  double min_lr = 0;              // floor reached at the end of the decay
  std::int64_t warmup_steps = 0;  // steps of linear warmup
  std::int64_t decay_steps = 0;   // step at which the decay ends, warmup included; 0: total
  std::int64_t total_steps = 0;   // steps of the run

  // The learning rate of step `step` (0-based). REQUIRES: step >= 0.
  double at(std::int64_t step) const;
};

}  // namespace oases::optim
