#include "train/stragglers.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace oases::train {
namespace {

constexpr std::size_t kHostWords = 16;  // host names travel as 64 bytes (int32 words)

std::vector<std::string> gather_hosts(comm::Communicator& world, const std::string& host) {
  std::vector<std::int32_t> mine(kHostWords, 0);
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kHostWords * 4 - 1));
  std::vector<std::int32_t> all(kHostWords * static_cast<std::size_t>(world.size()), 0);
  if (world.size() > 1)
    world.all_gather(Tensor::of(mine.data(), {static_cast<std::int64_t>(mine.size())}),
                     Tensor::of(all.data(), {static_cast<std::int64_t>(all.size())}));
  else
    all = mine;
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    const char* text = reinterpret_cast<const char*>(all.data() + kHostWords * r);
    hosts.emplace_back(text, strnlen(text, kHostWords * 4));
  }
  return hosts;
}

}  // namespace

StragglerWindow straggler_window(const std::vector<double>& compute_sums,
                                 const std::vector<double>& exposed_sums, std::int64_t steps) {
  OASES_ASSERT(steps > 0 && !compute_sums.empty() && compute_sums.size() == exposed_sums.size(),
               "a straggler window of {} steps over {} ranks", steps, compute_sums.size());
  StragglerWindow w;
  w.steps = steps;
  for (std::size_t r = 0; r < compute_sums.size(); ++r) {
    w.compute_s.push_back(compute_sums[r] / static_cast<double>(steps));
    w.exposed_comm_s.push_back(exposed_sums[r] / static_cast<double>(steps));
  }
  w.slowest_rank = static_cast<int>(std::max_element(w.compute_s.begin(), w.compute_s.end()) -
                                    w.compute_s.begin());
  std::vector<double> sorted = w.compute_s;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[(sorted.size() - 1) / 2];
  w.median_compute_s = median;
  w.straggler_ratio = median > 0 ? w.compute_s[static_cast<std::size_t>(w.slowest_rank)] / median
                                 : 1.0;
  return w;
}

StragglerMonitor::StragglerMonitor(comm::Communicator& world, const std::string& host,
                                   double warn_ratio)
    : world_(world),
      warn_ratio_(warn_ratio),
      hosts_(gather_hosts(world, host)),
      windows_above_(static_cast<std::size_t>(world.size()), 0),
      steps_above_(static_cast<std::size_t>(world.size()), 0),
      warned_(static_cast<std::size_t>(world.size()), false) {}

std::optional<StragglerWindow> StragglerMonitor::after_step(double compute_seconds,
                                                            double exposed_comm_seconds,
                                                            bool window_ends) {
  compute_ += compute_seconds;
  exposed_ += exposed_comm_seconds;
  ++steps_;
  if (!window_ends) return std::nullopt;
  // [compute, exposed, steps] per rank. The window's step count is the same on every rank;
  // it travels along so that a rank that disagrees shows as a bug, not as a wrong ratio.
  const auto size = static_cast<std::size_t>(world_.size());
  double mine[3] = {compute_, exposed_, static_cast<double>(steps_)};
  std::vector<double> all(3 * size, 0.0);
  if (size > 1) {
    const comm::IssuerLabel label(world_, "straggler window (log.every)");
    world_.all_gather(Tensor::of(mine, {3}),
                      Tensor::of(all.data(), {static_cast<std::int64_t>(all.size())}));
  } else {
    std::copy(mine, mine + 3, all.begin());
  }
  std::vector<double> compute(size), exposed(size);
  for (std::size_t r = 0; r < size; ++r) {
    compute[r] = all[3 * r];
    exposed[r] = all[3 * r + 1];
    OASES_ASSERT(all[3 * r + 2] == static_cast<double>(steps_),
                 "rank {} closed a straggler window of {} steps, this rank one of {}", r,
                 all[3 * r + 2], steps_);
  }
  StragglerWindow w = straggler_window(compute, exposed, steps_);
  compute_ = exposed_ = 0;
  steps_ = 0;

  const double median = w.median_compute_s;
  for (std::size_t r = 0; r < size; ++r) {
    const bool above = size > 1 && median > 0 && w.compute_s[r] > warn_ratio_ * median;
    windows_above_[r] = above ? windows_above_[r] + 1 : 0;
    steps_above_[r] = above ? steps_above_[r] + w.steps : 0;
    if (!above) warned_[r] = false;
    if (warned_[r] || windows_above_[r] < kStragglerWindowsBeforeWarning ||
        steps_above_[r] < kStragglerStepsBeforeWarning)
      continue;
    warned_[r] = true;
    w.warnings.push_back(fmt::format(
        "straggler: rank {} (host {}) computed {:.2f}x the median rank's time per step ({:.4f} s "
        "against {:.4f} s) for {} windows of {} steps in a row, above train.straggler_warn_ratio "
        "= {}; every step of the job waits for it (the other ranks wait up to {:.4f} s per step, "
        "it waits {:.4f} s)",
        r, hosts_[r], w.compute_s[r] / median, w.compute_s[r], median,
        windows_above_[r], w.steps, warn_ratio_,
        [&] {
          double most = 0;
          for (std::size_t other = 0; other < size; ++other)
            if (other != r) most = std::max(most, w.exposed_comm_s[other]);
          return most;
        }(),
        w.exposed_comm_s[r]));
  }
  return w;
}

}  // namespace oases::train
