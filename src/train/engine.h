// TrainingEngine: one model plus its optimizer on this rank, and the schedules that drive it.
// It knows nothing about files or data sets: callers hand it token batches. The Trainer (run
// loop, data, metrics, checkpoints) and the parity tests are built on it.
#pragma once

#include "comm/communicator.h"
#include "core/buffer.h"
#include "model/gpt_model.h"
#include "runtime/executor.h"
#include "schedule/schedule.h"
#include "train/config.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace oases::train {

struct StepResult {
  double loss = 0;           // mean per-token loss of the global batch
  double grad_norm = 0;      // global L2 norm of the gradient before clipping
  double exposed_comm_seconds = 0;
};

class TrainingEngine {
 public:
  explicit TrainingEngine(const RunConfig& config);

  model::GptModel& model() { return model_; }
  const RunConfig& config() const { return config_; }
  float* exp_avg() { return exp_avg_.as<float>(); }
  float* exp_avg_sq() { return exp_avg_sq_.as<float>(); }

  // Learning rate of optimizer step `step` (0-based): linear warmup to train.lr over
  // warmup_steps, then cosine decay to min_lr over the remaining lr_decay_steps (or steps).
  double learning_rate(std::int64_t step) const;

  // Forward and backward over a global batch of `global_batch` sequences ([global_batch, seq]
  // inputs and targets), accumulating gradients over micro-batches, then gradient clipping and
  // one AdamW update with the step's learning rate. Dropout masks are keyed by `step`.
  StepResult train_step(std::int64_t step, const std::int32_t* inputs,
                        const std::int32_t* targets);

  // Gradients of the mean loss over `sequences` rows (a multiple of micro_batch) into grads()
  // without an optimizer update. Returns the mean loss.
  double compute_gradients(std::int64_t step, const std::int32_t* inputs,
                           const std::int32_t* targets, std::int64_t sequences);

  // Mean loss over `sequences` rows without dropout or gradients.
  double evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                  std::int64_t sequences);

  // Logits [micro_batch, seq, vocab] of one micro-batch, without dropout.
  void logits(const std::int32_t* inputs, float* out);

  // Record every instruction of the following steps into `trace` (null: stop recording).
  void set_trace(runtime::TraceRecorder* trace) { trace_ = trace; }

  // Bytes this rank holds for the run: parameters, gradients, AdamW moments, activations.
  std::size_t memory_bytes() const;

 private:
  // Runs the schedule over `sequences` rows; `hooks` handles ReduceGrads and OptimizerStep.
  double run_batches(std::int64_t step, const std::int32_t* inputs, const std::int32_t* targets,
                     std::int64_t sequences, ops::HeadMode mode, const runtime::StepHooks& hooks,
                     StepResult* result);
  double clip_gradients();  // returns the norm before clipping
  void apply_adamw(std::int64_t step, double lr);

  RunConfig config_;
  model::GptModel model_;
  Buffer exp_avg_;
  Buffer exp_avg_sq_;
  comm::SelfCommunicator tp_;
  runtime::Executor executor_;
  schedule::ProgramShape shape_;
  runtime::TraceRecorder* trace_ = nullptr;
};

}  // namespace oases::train
