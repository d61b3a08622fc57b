// Checkpoints (DESIGN.md "Checkpoints"):
//
//   <dir>/step_<N>/model.safetensors      parameters, Hugging Face GPT-2 names and shapes
//                                         (metadata: "format" = "pt", "oases_config" = TOML)
//   <dir>/step_<N>/optimizer.safetensors  AdamW moments "exp_avg.<name>", "exp_avg_sq.<name>";
//                                         metadata: step, seed, data position, format version
//   <dir>/step_<N>/COMPLETE               written last: a checkpoint without it is ignored
//
// N counts completed optimizer steps. Every file is written to a temporary name and renamed,
// so a crash leaves earlier checkpoints intact and never a half-written file under its name.
#pragma once

#include "comm/communicator.h"
#include "model/param_layout.h"
#include "train/config.h"

#include <cstdint>
#include <optional>
#include <string>

namespace oases::train {

inline constexpr int kCheckpointFormatVersion = 1;

struct TrainingState {
  std::int64_t step = 0;           // completed optimizer steps
  std::int64_t data_position = 0;  // the next training batch index (= step, kept explicit)
  std::uint64_t seed = 0;          // keys dropout masks and initialisation
};

// Writes step_<state.step> under dir and removes the oldest complete checkpoints beyond `keep`
// (0 keeps all). Returns the checkpoint directory. The files hold whole tensors whatever the
// layout: every rank of the tensor-parallel group `tp` must call this (the shards are
// assembled over it); only the rank with `write_files` writes.
std::string save_checkpoint(const std::string& dir, const RunConfig& config,
                            const model::ParamLayout& layout, const float* params,
                            const float* exp_avg, const float* exp_avg_sq,
                            const TrainingState& state, std::int64_t keep,
                            comm::Communicator& tp, bool write_files);

// The newest complete checkpoint in dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Reads parameters by name with shape checks (UserError naming the file, tensor and shapes);
// each rank takes its own shard of the whole tensors in the file.
void load_model_weights(const std::string& safetensors_path, const model::ParamLayout& layout,
                        float* params);

// Restores moments and state from a checkpoint directory written by save_checkpoint.
TrainingState load_optimizer_state(const std::string& checkpoint_dir,
                                   const model::ParamLayout& layout, float* exp_avg,
                                   float* exp_avg_sq);

// The run configuration stored in a checkpoint's model.safetensors (for `oases generate`),
// with the [parallel] section at its defaults: one process, whatever trained it.
RunConfig config_from_checkpoint(const std::string& checkpoint_dir);

// Accepts a checkpoint directory (step_N), a run's checkpoint.dir (its newest checkpoint is
// taken) or a model.safetensors file; returns the path of model.safetensors.
std::string resolve_model_file(const std::string& path);

}  // namespace oases::train
