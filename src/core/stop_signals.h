// Signals that ask a process to stop soon rather than at once: a scheduler's preemption
// (SIGTERM, or SIGUSR1 sent ahead of it), Ctrl-C on a terminal (SIGINT), a closed terminal
// (SIGHUP).
//
// While a StopSignals object lives, the first of its signals is only remembered: the process
// goes on, and whoever owns the object looks at received() at a point where stopping is safe
// (the trainer: the end of a step, where it saves a checkpoint and exits). A second one of
// them ends the process at once with status 128 + its number, through _exit: nothing is
// flushed or unwound, so whatever was being written stays a leftover that the writing
// protocol already tolerates (a `.partial` checkpoint folder, a `.tmp` file).
//
// A signal ignored when the object is made (nohup ignores SIGHUP) stays ignored. Handlers are
// process-wide: one StopSignals at a time (a second is an InternalError). The
// signal may arrive on any thread; the handler touches only a lock-free atomic.
#pragma once

#include "core/named_values.h"

#include <csignal>
#include <string>
#include <vector>

namespace oases {

// The signals a run may be told to stop by, by their names without "SIG" (train.save_signals).
inline constexpr NamedValue<int> kStopSignalNames[] = {
    {SIGTERM, "TERM"}, {SIGINT, "INT"},   {SIGHUP, "HUP"},    {SIGUSR1, "USR1"},
    {SIGQUIT, "QUIT"}, {SIGXCPU, "XCPU"}, {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},
    {SIGHUP, "SIGHUP"}, {SIGUSR1, "SIGUSR1"}, {SIGQUIT, "SIGQUIT"}, {SIGXCPU, "SIGXCPU"}};

// The first signal received by the StopSignals alive in this process; 0 while none was, or
// when none is alive. For observers that do not own the object (the flight recorder).
int stop_signal_received();

// "SIGTERM" for SIGTERM; "signal N" for a number without a name above.
std::string signal_name(int signal_number);

class StopSignals {
 public:
  explicit StopSignals(const std::vector<int>& signals);
  ~StopSignals();  // restores the actions the signals had before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction; 0 while none was.
  int received() const;

  // For tests: behaves as if `signal_number` had arrived (the first time only).
  void simulate(int signal_number);

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

}  // namespace oases
