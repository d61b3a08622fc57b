// What a training run writes, claimed at start-up before anything is written or removed.
//
// A run writes checkpoints into checkpoint.dir (and cleans the leftovers of its own
// interrupted saves there), appends to log.metrics, and writes run.json beside it and the trace
// at log.trace. Two jobs writing one folder would delete each other's saves in progress,
// overwrite each other's checkpoints and interleave their metrics, so each of these places is
// held by one job at a time through a lock (core/file_lock.h):
//
//   <checkpoint.dir>/LOCK             held while the run lives
//   <log.metrics>.lock                beside the metrics file (not for a device such as
//                                     /dev/stdout)
//
// A second job stops at start-up with the holder's host and pid; a lock whose holder died is
// taken over (the kernel releases it). Claimed by world rank 0, which writes every file.
#pragma once

#include "core/file_lock.h"
#include "plan/run_config.h"

#include <string>
#include <vector>

namespace oases::train {

inline constexpr const char* kCheckpointDirLock = "LOCK";

class RunOutputs {
 public:
  RunOutputs() = default;  // claims nothing (ranks other than the writer)
  explicit RunOutputs(std::vector<FileLock> locks) : locks_(std::move(locks)) {}

 private:
  std::vector<FileLock> locks_;
};

// Checks the run's output paths and takes their locks:
//  - log.metrics, log.trace and run.json are different files, none of them inside a
//    checkpoint folder of checkpoint.dir (a trace would overwrite the metrics; a directory
//    given as one of them is RunConfig::validate's to refuse);
//  - checkpoint.dir exists (it is created) and a file can be created in it, so that an
//    unwritable folder is found now rather than at the first save;
//  - checkpoint.dir holds no step folder without a COMPLETE marker (io/checkpoint_dir.h).
// UserError naming the setting, the path and what to do.
RunOutputs claim_run_outputs(const plan::RunConfig& config);

}  // namespace oases::train
