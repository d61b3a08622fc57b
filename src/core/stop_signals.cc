#include "core/stop_signals.h"

#include "core/error.h"

#include <unistd.h>

#include <atomic>

namespace oases {
namespace {

// The one piece of process-wide state a signal handler can reach. Lock-free, so touching it
// from a handler is async-signal-safe.
std::atomic<int> first_stop_signal{0};
std::atomic<bool> stop_signals_installed{false};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signal_number) {
  int none = 0;
  if (!first_stop_signal.compare_exchange_strong(none, signal_number)) _exit(128 + signal_number);
}

}  // namespace

std::string signal_name(int signal_number) {
  for (const NamedValue<int>& entry : kStopSignalNames)
    if (entry.value == signal_number) return "SIG" + std::string(entry.name);
  return "signal " + std::to_string(signal_number);
}

StopSignals::StopSignals(const std::vector<int>& signals) : signals_(signals) {
  OASES_ASSERT(!stop_signals_installed.exchange(true),
               "stop signals are installed twice in one process");
  first_stop_signal.store(0);
  struct sigaction action{};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a blocking call the signal lands in goes on
  previous_.resize(signals_.size());
  for (std::size_t i = 0; i < signals_.size(); ++i) {
    OASES_ASSERT(sigaction(signals_[i], &action, &previous_[i]) == 0,
                 "cannot install a handler for {}", signal_name(signals_[i]));
    // A signal the launcher chose to ignore (nohup's SIGHUP) stays ignored.
    if (!(previous_[i].sa_flags & SA_SIGINFO) && previous_[i].sa_handler == SIG_IGN)
      sigaction(signals_[i], &previous_[i], nullptr);
  }
}

StopSignals::~StopSignals() {
  for (std::size_t i = signals_.size(); i-- > 0;) sigaction(signals_[i], &previous_[i], nullptr);
  stop_signals_installed.store(false);
}

int StopSignals::received() const { return first_stop_signal.load(); }

int stop_signal_received() {
  return stop_signals_installed.load() ? first_stop_signal.load() : 0;
}

void StopSignals::simulate(int signal_number) {
  int none = 0;
  first_stop_signal.compare_exchange_strong(none, signal_number);
}

}  // namespace oases
