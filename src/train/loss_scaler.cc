#include "train/loss_scaler.h"

#include "core/error.h"

#include <algorithm>

namespace oases::train {

LossScaler LossScaler::dynamic(const DynamicLossScale& s) {
  OASES_ASSERT(s.min_scale >= 1 && s.initial_scale >= s.min_scale && s.window >= 1 &&
                   s.hysteresis >= 1 && s.growth_factor > 1 && s.backoff_factor > 0 &&
                   s.backoff_factor < 1,
               "invalid dynamic loss scale settings (initial {}, min {}, window {}, hysteresis "
               "{}, growth {}, backoff {})",
               s.initial_scale, s.min_scale, s.window, s.hysteresis, s.growth_factor,
               s.backoff_factor);
  return LossScaler(true, s, {.scale = s.initial_scale, .hysteresis_left = s.hysteresis});
}

LossScaler LossScaler::constant(double scale) {
  OASES_ASSERT(scale >= 1, "constant loss scale {} is below 1", scale);
  return LossScaler(false, {}, {.scale = scale});
}

bool LossScaler::update(bool gradients_finite) {
  if (!gradients_finite) {
    ++state_.skipped_steps;
    if (dynamic_) {
      state_.clean_steps = 0;
      --state_.hysteresis_left;
      if (state_.hysteresis_left <= 0)
        state_.scale = std::max(state_.scale * settings_.backoff_factor, settings_.min_scale);
    }
    return false;
  }
  if (dynamic_ && ++state_.clean_steps == settings_.window) {
    state_.clean_steps = 0;
    state_.hysteresis_left = settings_.hysteresis;
    state_.scale *= settings_.growth_factor;
  }
  return true;
}

void LossScaler::restore(const LossScaleState& state, const std::string& source) {
  OASES_CHECK(state.scale >= 1 && state.clean_steps >= 0 && state.skipped_steps >= 0,
              "{} holds loss scale {}, clean steps {}, skipped steps {}; a loss scale must be at "
              "least 1 and the counts non-negative",
              source, state.scale, state.clean_steps, state.skipped_steps);
  if (dynamic_) {
    state_ = state;
  } else {
    // A constant scale is the configuration's; only the count carries over.
    state_.skipped_steps = state.skipped_steps;
  }
}

}  // namespace oases::train
