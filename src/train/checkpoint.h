// What a checkpoint holds (the folder protocol is io/checkpoint_dir.h):
//
//   model.safetensors      every parameter, whole, under its Hugging Face name and shape, in
//                          the run's element type (F32, or F64 for train.precision = "fp64");
//                          metadata "format" = "pt", "oases_config" = the run's TOML
//   optimizer.safetensors  the optimizer's state tensors (AdamW: "exp_avg.<name>",
//                          "exp_avg_sq.<name>"; Adafactor: "exp_avg_sq_row.<name>" and
//                          "exp_avg_sq_col.<name>" for matrices, shaped like the whole
//                          parameter without its last or second-to-last dimension, and
//                          "exp_avg_sq.<name>" for vectors; optim/optimizer.h), whole, same
//                          element type; metadata: step, seed, data position, format
//                          version, optimizer name, the run's TOML
//                          parallel.pipeline = "2bw" adds "stashed_weights.<name>": W(step - 1),
//                          the weights the next batch computes on (train/weight_versions.h)
//   tokenizer.model        for data.tokenizer = "sentencepiece": the run's tokenizer model
//                          file, byte for byte, so the checkpoint decodes its own tokens
//                          whatever became of the data folder (see checkpoint_tokenizer)
//
// Whole tensors are written whatever the parallel layout, so a run resumes under any other
// layout, plan or precision (values are converted on reading).
#pragma once

#include "comm/communicator.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "train/loss_scaler.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace oases::train {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kTokenizerModelFile = "tokenizer.model";
inline constexpr const char* kStashedWeightsPrefix = "stashed_weights.";

struct TrainingState {
  std::int64_t step = 0;           // completed optimizer steps
  std::int64_t data_position = 0;  // the next training batch index (= step, kept explicit)
  std::uint64_t seed = 0;          // keys dropout masks and initialisation
  // Tokens in the training shard the run reads (the data position indexes its batches); 0 in
  // checkpoints written before it was recorded.
  std::int64_t data_tokens = 0;
  // fp16's loss scaler (absent in checkpoints of other precisions).
  std::optional<LossScaleState> loss_scale;
};

// Writes step_<state.step> under dir and removes the oldest complete checkpoints beyond `keep`
// (0 keeps all), by the protocol of io/checkpoint_dir.h (`log` hears what it cleaned or pruned
// early), with `tokenizer_files` (Tokenizer::files of the run's tokenizer: tokenizer.model,
// tokenizer.json, vocab.txt, tokenizer_config.json, ...) beside the weights. Returns the checkpoint
// folder. Every rank of the tensor-parallel group `tp` must call this (the shards are assembled
// over it); only the rank with `write_files` writes. Under pipeline parallelism every rank of the
// pipeline group `pp` calls it too: `model` and `optimizer` hold one stage's parameters
// (plan.pipeline.stage_ranges(pp.rank())), and each stage's whole tensors are broadcast over `pp`
// (a parameter several stages hold, GPT's tied word embedding, from the first of them), so the
// writer, on stage 0, writes every tensor once. A tensor holding a NaN or an infinity is never
// written: UserError on every rank.
std::string save_checkpoint(const std::string& dir, const plan::RunPlan& plan,
                            const model::Model& model, optim::Optimizer& optimizer,
                            const TrainingState& state,
                            const std::vector<data::TokenizerFile>& tokenizer_files,
                            std::int64_t keep, comm::Communicator& tp, comm::Communicator& pp,
                            bool write_files,
                            const std::function<void(const std::string&)>& log = {},
                            const Tensor* stashed_weights = nullptr,
                            comm::Communicator* ep = nullptr);
// (`stashed_weights`: 2bw's older weight version, this rank's flat array like model.params(),
// written beside the optimizer state. `ep`: under expert parallelism, the expert-parallel
// group, every rank of which holds other experts; each expert's tensors are broadcast over it
// from their owner.)

// A checkpoint gathered into host memory and not yet written: the writer rank's copy of every
// whole tensor, so that training may change its own arrays while this is written (by another
// thread: train/checkpoint_writer.h).
struct StagedCheckpoint {
  std::string dir;
  std::int64_t step = 0;
  std::int64_t keep = 0;
  io::SafetensorsWriter model;      // copies of its tensors (its own, or in staging memory)
  io::SafetensorsWriter optimizer;
  std::vector<io::CheckpointFile> extra_files;

  std::uint64_t bytes() const { return model.file_bytes() + optimizer.file_bytes(); }
  // Writes step_<step> under dir by the folder protocol; returns the folder.
  std::string write(const io::CheckpointLog& log) const;
};

// save_checkpoint's first half: the same collectives on the same ranks, every tensor copied
// (into `staging` when given, which must stay unrewound until the files are written); holds
// the files on the rank with `write_files` and nothing on the others.
std::optional<StagedCheckpoint> stage_checkpoint(
    const std::string& dir, const plan::RunPlan& plan, const model::Model& model,
    optim::Optimizer& optimizer, const TrainingState& state,
    const std::vector<data::TokenizerFile>& tokenizer_files, std::int64_t keep,
    comm::Communicator& tp, comm::Communicator& pp, bool write_files,
    const Tensor* stashed_weights = nullptr, comm::Communicator* ep = nullptr,
    StagingMemory* staging = nullptr);

// Reads a checkpoint's stashed weights (2bw) into `params` (this rank's shards, like
// load_model_weights); false, leaving `params` as it was, when the checkpoint has none.
bool load_stashed_weights(const std::string& checkpoint_dir, const model::ParamLayout& layout,
                          const Tensor& params);

// Adds to `writer`, as `prefix` + parameter name, the whole tensor of every parameter of
// `layout` whose shards are the flat array `flat` (parameters, gradients, ...) of this rank,
// assembled over the tensor-parallel group `tp` (every rank calls; only `write` adds).
void add_whole_tensors(io::SafetensorsWriter& writer, const std::string& prefix,
                       const model::ParamLayout& layout, const Tensor& flat,
                       comm::Communicator& tp, bool write);

// The newest complete checkpoint in dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Reads parameters by name with shape checks (UserError naming the file, tensor and shapes,
// or a tensor holding NaN or infinite values); each rank takes its own shard of the whole
// tensors in the file, converted to the element type of `params`.
// `safetensors_path` may also be a sharded set (an index file, or a folder holding one or
// model.safetensors: io/safetensors_set.h).
void load_model_weights(const std::string& safetensors_path, const model::ParamLayout& layout,
                        const Tensor& params);
// Reads the weights of the Hugging Face model folder `folder` (model/hf_config.h) into this
// rank's shards: each parameter from the folder's tensor of its Hugging Face name, converted to
// the element type of `params`. UserError when a parameter has no tensor, when the folder holds
// a tensor the model has no use for (buffers and heads hf_unused_tensor names excepted; stored
// copies of tied tensors must equal them), or as load_model_weights.
void load_model_folder_weights(const std::string& folder, const model::ModelConfig& config,
                               const model::ParamLayout& layout, const Tensor& params);
// A Hugging Face model folder (holding config.json) through load_model_folder_weights; a
// sharded set's index, or what io::resolve_model_file accepts (a checkpoint folder, a run's
// checkpoint.dir, a safetensors file), through load_model_weights.
void load_model_weights(const std::string& path, const model::ModelConfig& config,
                        const model::ParamLayout& layout, const Tensor& params);

// Restores the optimizer's state and the training state from a checkpoint folder written by
// save_checkpoint; the state must agree with the folder's step (UserError otherwise).
TrainingState load_optimizer_state(const std::string& checkpoint_dir,
                                   const model::ParamLayout& layout, optim::Optimizer& optimizer);

// What verify_checkpoint found in a checkpoint that passed.
struct CheckpointSummary {
  std::int64_t step = 0;
  std::int64_t tensors = 0;     // in both files
  std::int64_t values = 0;      // elements of those tensors
  std::int64_t bytes = 0;       // size of both files
  bool checksummed = false;     // false for a marker written before checksums existed
};

// Checks everything a resume would rely on, without a model or a communicator: the marker and
// the size and CRC-32 of each file (io::verify_checkpoint_files), both files' structure, that
// every tensor is finite, that the optimizer state has a tensor for every parameter with its
// shape, that the training state agrees with the folder's step, and that the stored run
// configuration parses. UserError naming the file and what is wrong.
CheckpointSummary verify_checkpoint(const std::string& checkpoint_dir);

// The run configuration stored in a checkpoint's model.safetensors (for `oases generate`),
// with the [parallel] section at its defaults: one process, whatever trained it. For a Hugging
// Face model folder, the configuration its config.json gives (plan::parse_run_config_with_folder)
// with every other setting at its default.
plan::RunConfig config_from_checkpoint(const std::string& checkpoint_dir);

// The tokenizer of a checkpoint (a step_N folder, a run's checkpoint.dir or a model.safetensors
// file, as config_from_checkpoint takes): the tokenizer its stored data.tokenizer names, with
// the model file the checkpoint carries (sentencepiece: tokenizer.model beside
// model.safetensors; data.tokenizer_model and the data folder are not consulted). gpt2 reads
// its files from `gpt2_files` (a tokenizer.json or a folder; empty: its default). Everything
// that turns a checkpoint's tokens into text or back calls this. UserError when the
// sentencepiece model is missing, does not load, or has more tokens than model.vocab_size, and
// when `gpt2_files` is given for a checkpoint whose tokenizer is not gpt2.
std::unique_ptr<data::Tokenizer> checkpoint_tokenizer(const std::string& checkpoint,
                                                      const std::string& gpt2_files = "");

}  // namespace oases::train
