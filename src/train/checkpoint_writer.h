// Writes checkpoints on a thread of its own (checkpoint.async = true), so that training goes
// on while the files are written, fsynced and published.
//
// The trainer waits for the save in flight, stages the next checkpoint into the writer's
// staging memory (train/checkpoint.h: every tensor copied; the memory is kept from save to
// save, so its pages are resident after the first) at the step boundary and hands it here; the writer thread writes it by the folder protocol
// of io/checkpoint_dir.h, the same partial-then-COMPLETE steps as a synchronous save, so a
// crash during an asynchronous save leaves the previous checkpoints as they were. At most one
// save is in flight: handing over the next waits for the one before (and says how long).
// What the writer would log, and its error, are kept and given back on the trainer's thread.
#pragma once

#include "train/checkpoint.h"

#include <atomic>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace oases::train {

// A save that ended: its folder, and what it said while writing (leftovers cleaned, early
// pruning).
struct FinishedSave {
  std::string folder;
  std::vector<std::string> messages;
  double seconds = 0;  // writing, on the writer thread
};

class CheckpointWriter {
 public:
  CheckpointWriter() = default;
  // Waits for a save in flight; its outcome is lost (call finish() to have it).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Where the next checkpoint is staged. REQUIRES: no save in flight (finish() first).
  StagingMemory& staging();
  // Starts writing `staged`. REQUIRES: no save in flight.
  void start(StagedCheckpoint staged);
  // The save in flight once it has ended (rethrowing its error), without waiting; nullopt
  // while it runs or when none was started.
  std::optional<FinishedSave> poll();
  // Waits for the save in flight; nullopt when there is none.
  std::optional<FinishedSave> finish();
  bool busy() const { return thread_.joinable(); }

 private:
  StagingMemory staging_;
  StagedCheckpoint staged_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  FinishedSave result_;
  std::exception_ptr error_;
};

}  // namespace oases::train
