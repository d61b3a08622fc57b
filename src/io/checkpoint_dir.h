// The checkpoint folder protocol (docs/checkpoints.md, "The folder protocol"):
//
//   <dir>/step_<N>/model.safetensors      the model's tensors (whole, Hugging Face names)
//   <dir>/step_<N>/optimizer.safetensors  optimizer state, RNG counters and data position
//   <dir>/step_<N>/COMPLETE               the marker: the step and, for every file it vouches
//                                         for, its size and CRC-32:
//                                           oases-checkpoint 1
//                                           step <N>
//                                           file <name> <bytes> <crc32, 8 hex digits>
//
// A folder named step_<N> always holds a complete checkpoint, and its marker exists only while
// every file it lists exists: a checkpoint is written into `step_<N>.partial` (each file to a
// temporary name, fsynced, renamed; the marker last) and the folder is renamed to step_<N> in
// one step; a checkpoint is deleted by renaming its folder to `step_<N>.deleting` first. A kill
// at any point leaves complete checkpoints and leftovers (`.partial`, `.deleting`), which the
// next save, and clean_checkpoint_dir, remove. A step_<N> folder without a marker is never the
// protocol's (someone copied, moved or edited it): nothing here deletes it, and a save refuses
// to run beside one (unmarked_step_folders). N counts completed optimizer steps. What the files
// hold is the caller's (train/checkpoint.h).
//
// One writer per folder: the caller holds the run's lock (train/run_outputs.h) so that no other
// job cleans away a save in progress.
#pragma once

#include "io/safetensors.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace oases::io {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kCompleteMarker = "COMPLETE";

// Messages for the log (e.g. "pruned step_3 before writing: ...").
using CheckpointLog = std::function<void(const std::string&)>;

// A further file of a checkpoint (e.g. the tokenizer's model), written and vouched for by the
// marker like the two safetensors files. `name` is a plain file name.
struct CheckpointFile {
  std::string name;
  std::string contents;
};

// Writes step_<step> under dir as above and removes the oldest complete checkpoints beyond
// `keep` (0 keeps all). Before writing, it cleans leftovers and, when the file system lacks
// the room for another checkpoint of this size (`model` and `optimizer` bytes) and keep > 0,
// prunes down to keep - 1 first (saying so through `log`). A failed write removes what it
// wrote. `extra_files` join the folder and the marker. Returns the checkpoint folder. UserError
// (nothing written) when dir holds an unmarked step folder.
std::string write_checkpoint(const std::string& dir, std::int64_t step,
                             const SafetensorsWriter& model, const SafetensorsWriter& optimizer,
                             std::int64_t keep, const CheckpointLog& log = {},
                             const std::vector<CheckpointFile>& extra_files = {});

// Removes leftovers of interrupted saves and prunes from dir: `*.partial` and `*.deleting`
// folders. Returns what it removed.
std::vector<std::string> clean_checkpoint_dir(const std::string& dir);
// The folders clean_checkpoint_dir would remove, sorted; removes nothing.
std::vector<std::string> checkpoint_leftovers(const std::string& dir);
// step_<N> folders of dir without a COMPLETE marker, sorted: not written by the protocol, so
// neither complete nor leftovers.
std::vector<std::string> unmarked_step_folders(const std::string& dir);
// UserError naming the first unmarked step folder of dir, and how to keep or drop it: a save
// beside it would leave a folder that looks like a checkpoint and is none.
void refuse_unmarked_step_folders(const std::string& dir);

// Complete checkpoints in dir as (step, folder), sorted by step.
std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& dir);
// The newest complete checkpoint in dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// What verify_checkpoint_files found.
struct CheckpointFiles {
  std::int64_t step = 0;
  bool checksummed = false;  // false for a marker written before checksums existed
};

// Checks a checkpoint folder against its marker: the marker's format and step (equal to the
// folder's N), that it lists model.safetensors and optimizer.safetensors, and the size and
// CRC-32 of every file it lists. UserError naming the folder, the file and what differs. A
// marker written before checksums existed ("step <N>" only) passes with nothing to check.
CheckpointFiles verify_checkpoint_files(const std::string& folder);

// The step of a folder named step_<N> (UserError otherwise).
std::int64_t checkpoint_step(const std::string& folder);

// Accepts a checkpoint folder (step_N), a run's checkpoint.dir (its newest checkpoint is
// taken) or a model.safetensors file; returns the path of model.safetensors. UserError saying
// which of these was expected when none fits.
std::string resolve_model_file(const std::string& path);

// A metadata value of a file written by the engine; UserError naming the file and key when
// absent (or, for metadata_int, not an integer).
std::string metadata_value(const SafetensorsFile& file, const std::string& key);
std::int64_t metadata_int(const SafetensorsFile& file, const std::string& key);

}  // namespace oases::io
