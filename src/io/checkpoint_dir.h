// The checkpoint folder protocol (DESIGN.md "Checkpoints"):
//
//   <dir>/step_<N>/model.safetensors      the model's tensors (whole, Hugging Face names)
//   <dir>/step_<N>/optimizer.safetensors  optimizer state, RNG counters and data position
//   <dir>/step_<N>/COMPLETE               written last: a checkpoint without it is ignored
//
// N counts completed optimizer steps. Every file is written to a temporary name and renamed,
// so a crash leaves earlier checkpoints intact and never a half-written file under its name.
// What the files hold is the caller's (train/checkpoint.h).
#pragma once

#include "io/safetensors.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace oases::io {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kCompleteMarker = "COMPLETE";

// Writes step_<step> under dir (model, optimizer, then the marker) and removes the oldest
// complete checkpoints beyond `keep` (0 keeps all). Returns the checkpoint folder.
std::string write_checkpoint(const std::string& dir, std::int64_t step,
                             const SafetensorsWriter& model, const SafetensorsWriter& optimizer,
                             std::int64_t keep);

// Complete checkpoints in dir as (step, folder), sorted by step.
std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& dir);
// The newest complete checkpoint in dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Accepts a checkpoint folder (step_N), a run's checkpoint.dir (its newest checkpoint is
// taken) or a model.safetensors file; returns the path of model.safetensors. UserError saying
// which of these was expected when none fits.
std::string resolve_model_file(const std::string& path);

// A metadata value of a file written by the engine; UserError naming the file and key when
// absent (or, for metadata_int, not an integer).
std::string metadata_value(const SafetensorsFile& file, const std::string& key);
std::int64_t metadata_int(const SafetensorsFile& file, const std::string& key);

}  // namespace oases::io
