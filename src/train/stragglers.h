// Stragglers: which rank the others wait for, from every rank's own compute time.
//
// In a synchronous job every step goes at the pace of its slowest rank: one slow node (a
// throttled CPU, a noisy neighbour, a failing disk under its data) slows every rank, and what
// the others see is only longer waits. Every `log.every` steps the ranks share, per rank, the
// compute seconds and the exposed waits of the window's steps (one all-gather of three numbers
// per rank over the world: 24 bytes a rank, off the step's own work); the slowest rank is the
// one with the most compute per step, and the straggler ratio is its compute over the median
// rank's. A rank whose compute stays above train.straggler_warn_ratio x the median for
// kStragglerWindowsBeforeWarning windows and kStragglerStepsBeforeWarning steps in a row is
// named, with its host, once per run of such windows (short windows are noisy: with
// log.every = 1 a busy host puts one rank 20% behind for three steps now and then).
#pragma once

#include "comm/communicator.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {

inline constexpr int kStragglerWindowsBeforeWarning = 3;
inline constexpr std::int64_t kStragglerStepsBeforeWarning = 20;

// One window's figures, the same on every rank.
struct StragglerWindow {
  std::int64_t steps = 0;               // in the window
  int slowest_rank = 0;                 // most compute per step; the lowest such rank on ties
  double straggler_ratio = 1;           // slowest rank's compute over the median rank's
  double median_compute_s = 0;          // the median rank's compute per step
  std::vector<double> compute_s;        // per world rank: compute seconds per step
  std::vector<double> exposed_comm_s;   // per world rank: exposed waits per step
  // For each rank that has just been above the warning ratio for long enough (see above): the
  // warning's text, naming the rank and its host.
  std::vector<std::string> warnings;
};

class StragglerMonitor {
 public:
  // Collective over `world` (the ranks' host names are shared once). `host`: this rank's.
  StragglerMonitor(comm::Communicator& world, const std::string& host, double warn_ratio);

  // Adds one step of this rank. When `window_ends`, every rank must call it together: the
  // window's figures are exchanged and returned (and the window starts anew).
  std::optional<StragglerWindow> after_step(double compute_seconds, double exposed_comm_seconds,
                                            bool window_ends);

  const std::vector<std::string>& hosts() const { return hosts_; }

 private:
  comm::Communicator& world_;
  double warn_ratio_;
  std::vector<std::string> hosts_;   // per world rank
  // Per world rank: consecutive windows (and their steps) above warn_ratio, and whether this
  // run of them was warned about.
  std::vector<int> windows_above_;
  std::vector<std::int64_t> steps_above_;
  std::vector<bool> warned_;
  double compute_ = 0, exposed_ = 0;
  std::int64_t steps_ = 0;
};

// The figures of one window from every rank's sums over its `steps` steps (pure, for tests):
// per-step means, the slowest rank, the ratio to the median (the lower middle one for an even
// count, so that with two ranks the ratio compares the slower with the faster).
StragglerWindow straggler_window(const std::vector<double>& compute_sums,
                                 const std::vector<double>& exposed_sums, std::int64_t steps);

}  // namespace oases::train
