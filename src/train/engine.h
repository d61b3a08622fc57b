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
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace oases::train {

struct StepResult {
  double loss = 0;           // mean per-token loss of the global batch
  double grad_norm = 0;      // global L2 norm of the gradient before clipping
  double compute_seconds = 0;       // compute lane busy with segments
  double exposed_comm_seconds = 0;  // compute lane waiting on collectives (TP and DP)
  double comm_seconds = 0;          // tensor-parallel collectives in flight
  std::size_t peak_activation_bytes = 0;
};

// The process groups this rank trains in. Null members mean a group of one.
struct ParallelGroups {
  comm::Communicator* tp = nullptr;  // tensor-parallel group: shards of one model replica
  comm::Communicator* dp = nullptr;  // data-parallel group: replicas that average gradients
  // Sub-groups of tp (comm::Mesh::tp_subgroup) and the groups that sum the gradients of a
  // layer's replicas (comm::Mesh::tp_replica_group), needed when parallel.plan runs a layer at
  // a degree below tp.
  ops::TpSubgroups tp_subgroup;
  std::function<comm::Communicator&(int degree)> tp_replica_group;
};

class TrainingEngine {
 public:
  // Every rank of the groups constructs the engine with the same config; the groups must
  // outlive it. parallel.plan gives the layers' degrees (layer_degrees(config)); "auto" must be
  // resolved to a plan before.
  explicit TrainingEngine(const RunConfig& config, ParallelGroups groups = {});

  comm::Communicator& tp() { return *tp_; }
  comm::Communicator& dp() { return *dp_; }
  // Sequences of each global batch this data-parallel rank processes, and the global index of
  // its first one.
  std::int64_t local_batch() const { return config_.train.global_batch / dp_->size(); }
  std::int64_t first_local_sample() const { return dp_->rank() * local_batch(); }

  model::GptModel& model() { return model_; }
  const RunConfig& config() const { return config_; }
  // The schedule of training steps (auto settings resolved).
  const schedule::ScheduleSpec& schedule_spec() const { return spec_; }
  // The instruction list run for `sequences` local rows (training or forward only); verified
  // when first generated.
  const schedule::Schedule& schedule_for(std::int64_t sequences, bool training);
  float* exp_avg() { return exp_avg_.as<float>(); }
  float* exp_avg_sq() { return exp_avg_sq_.as<float>(); }

  // Learning rate of optimizer step `step` (0-based): linear warmup to train.lr over
  // warmup_steps, then cosine decay to min_lr over the remaining lr_decay_steps (or steps).
  double learning_rate(std::int64_t step) const;

  // One optimizer step. `inputs`/`targets` are this data-parallel rank's local_batch()
  // sequences ([local_batch, seq]) of the global batch. Forward and backward accumulate
  // gradients over micro-batches, the data-parallel group sums them, then gradient clipping
  // and one AdamW update with the step's learning rate. Dropout masks are keyed by `step` and
  // global sample indices. The loss returned is the mean over the whole global batch.
  StepResult train_step(std::int64_t step, const std::int32_t* inputs,
                        const std::int32_t* targets);

  // Gradients of the mean loss over `sequences` local rows (a multiple of micro_batch) into
  // grads(), without reductions or an optimizer update. Single-replica use (tests, parity).
  double compute_gradients(std::int64_t step, const std::int32_t* inputs,
                           const std::int32_t* targets, std::int64_t sequences);

  // Mean loss over `sequences` local rows per data-parallel rank (the mean over all ranks'
  // rows), without dropout or gradients.
  double evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                  std::int64_t sequences);

  // Logits [micro_batch, seq, vocab] of one micro-batch, without dropout.
  void logits(const std::int32_t* inputs, float* out);

  // Record every instruction of the following steps into `trace` (null: stop recording).
  void set_trace(runtime::TraceRecorder* trace) { trace_ = trace; }

  // Bytes this rank holds for the run: parameters, gradients, AdamW moments, and the peak of
  // activations under the training schedule.
  std::size_t memory_bytes();
  // Peak activation bytes of a training step: boundary buffers plus the schedule's peak of
  // kept tensors (predicted from the program; the executor measures the same).
  std::size_t activation_bytes();

 private:
  // Runs the schedule over `sequences` local rows (global sample index of row 0:
  // first_sample); `hooks` handles ReduceGrads and OptimizerStep. Returns this rank's loss sum.
  double run_batches(std::int64_t step, const std::int32_t* inputs, const std::int32_t* targets,
                     std::int64_t sequences, std::int64_t first_sample, float loss_scale,
                     ops::HeadMode mode, const runtime::StepHooks& hooks, StepResult* result);
  double clip_gradients();  // returns the global norm before clipping
  // Starts the sum of the gradients of a layer run at a degree below tp (bucket 1 + l) over
  // all its replicas, data-parallel ones included; null for other buckets.
  std::unique_ptr<comm::Work> reduce_over_replicas(int bucket);
  void apply_adamw(std::int64_t step, double lr);

  RunConfig config_;
  comm::SelfCommunicator self_tp_{"tp"};
  comm::SelfCommunicator self_dp_{"dp"};
  comm::Communicator* tp_;
  comm::Communicator* dp_;
  ops::TpSubgroups tp_subgroup_;
  std::function<comm::Communicator&(int degree)> tp_replica_group_;
  model::GptModel model_;
  Buffer exp_avg_;
  Buffer exp_avg_sq_;
  schedule::ScheduleSpec spec_;
  runtime::Executor executor_;
  std::map<std::pair<std::int64_t, bool>, schedule::Schedule> schedules_;
  runtime::TraceRecorder* trace_ = nullptr;
};

}  // namespace oases::train
