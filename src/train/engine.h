// TrainingEngine: one model (model::Model) plus its optimizer (optim::Optimizer) on this
// rank, and the schedules that drive them. It knows nothing about files or data sets: callers
// hand it token batches. The Trainer (run loop, data, metrics, checkpoints), the profiler and
// the parity tests are built on it.
//
// The engine coordinates a step; each concern of it is a part with its own header:
//   Precision          (train/precision.h)          16-bit product paths, the loss scaler, bf16
//                                                   gradient reductions, non-finite gradients
//   GradientReduction  (train/gradient_reduction.h) which group sums each bucket, tied
//                                                   gradients, the global sum of squares
//   ZeroSharding       (train/zero_sharding.h)      ZeRO's reductions, updates, gathers and
//                                                   releases, whole optimizer state
//   LocalSgd           (train/local_sgd.h)          replicas stepping alone and averaging
//   TwoBwSteps         (train/two_bw_steps.h)       2bw's weight versions and batch in flight
// A step runs the schedule on the executor; the schedule's ReduceGrads starts a bucket's sum
// (GradientReduction's group, ZeroSharding's reduce-scatter or all-reduce, Precision's wire
// type), its OptimizerStep waits for them, unscales and clips, asks Precision whether to apply
// the update and lets ZeroSharding apply it; its parameter instructions are ZeroSharding's.
#pragma once

#include "comm/communicator.h"
#include "core/offload_store.h"
#include "model/model.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/executor.h"
#include "schedule/pipeline_2bw.h"
#include "schedule/schedule.h"
#include "plan/run_plan.h"
#include "planner/memory.h"
#include "train/gradient_reduction.h"
#include "train/local_sgd.h"
#include "train/loss_scaler.h"
#include "train/precision.h"
#include "train/two_bw_steps.h"
#include "train/zero_sharding.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {

// What the mixture-of-experts layers did over a run (training forward passes), summed over the
// global batch: per MoE layer, and the objective they added to the loss.
struct MoeLayerReport {
  std::int64_t layer = 0;
  double tokens_per_expert_min = 0, tokens_per_expert_max = 0;  // kept assignments
  double dropped_fraction = 0;  // tokens routed to no expert (they pass through the residual)
  double aux_loss = 0, z_loss = 0;  // means over the groups, before the coefficients
};
struct MoeSummary {
  std::vector<MoeLayerReport> layers;
  // sum over layers of moe_aux_loss_coef x aux_loss + moe_z_loss_coef x z_loss: what the
  // objective adds to the (cross-entropy) loss.
  double loss = 0;
  double dropped_fraction = 0;  // over every MoE layer's tokens
};

struct StepResult {
  double loss = 0;           // mean per-token loss over the counted targets of the global batch
  double grad_norm = 0;      // global L2 norm of the gradient before clipping
  double compute_seconds = 0;       // compute lane busy with segments
  double exposed_comm_seconds = 0;  // compute lane waiting on collectives (TP and DP)
  double comm_seconds = 0;          // tensor-parallel collectives in flight
  // MoE all-to-alls: the compute lane's wait on them (part of exposed_comm_seconds) and their
  // time on the wire.
  double exposed_all_to_all_seconds = 0, all_to_all_seconds = 0;
  // Context-parallel transfers (all-to-alls or ring shifts over the cp group), the same two ways.
  double exposed_cp_seconds = 0, cp_seconds = 0;
  double bubble_seconds = 0;        // compute lane waiting on pipeline Recvs (this rank's)
  std::size_t peak_activation_bytes = 0;
  double loss_scale = 1;     // the factor the step's loss was scaled by (fp16; else 1)
  // parallel.dp_sync_every > 1, on the steps that average the replicas: the root mean square
  // distance of the data-parallel replicas' parameters from their mean, relative to the
  // mean's norm, before averaging.
  std::optional<double> replica_divergence;
  bool skipped = false;      // fp16: the gradients overflowed and the update was not applied
  MoeSummary moe;            // empty without MoE layers
};

// The process groups this rank trains in. Null members mean a group of one.
struct ParallelGroups {
  comm::Communicator* tp = nullptr;  // tensor-parallel group: shards of one model replica
  // The replicas that sum gradients: the cp x dp ranks of comm::Mesh::dp_group (the
  // data-parallel group when cp = 1).
  comm::Communicator* dp = nullptr;
  // Sub-groups of tp (comm::Mesh::tp_subgroup) and the groups that sum the gradients of a
  // layer's replicas (comm::Mesh::tp_replica_group), needed when parallel.plan runs a layer at
  // a degree below tp.
  ops::TpSubgroups tp_subgroup;
  std::function<comm::Communicator&(int degree)> tp_replica_group;
  // Pipeline group (parallel.pp > 1): the stages of this rank's model replica, ordered by
  // stage; it carries the activations and gradients between stages (Send/Recv), the sum of
  // GPT's tied word embedding gradient, the gradient norm and the loss.
  comm::Communicator* pp = nullptr;
  // Expert parallelism (parallel.ep > 1; null otherwise): the ranks that split the MoE layers'
  // experts (comm::Mesh::ep_group) and those that hold the same experts, over which their
  // gradients are summed (comm::Mesh::expert_replica_group).
  comm::Communicator* ep = nullptr;
  std::function<comm::Communicator&(int degree)> expert_replicas = nullptr;
  // Context-parallel group (parallel.cp > 1; null otherwise): the ranks that split every
  // sequence of the same samples (comm::Mesh::cp_group).
  comm::Communicator* cp = nullptr;
};

class TrainingEngine {
 public:
  // Every rank of the groups constructs the engine with its plan of the same config; the groups
  // must outlive it and match the plan's mesh (UserError otherwise). parallel.plan = "auto"
  // must have been planned before.
  TrainingEngine(const plan::RunPlan& plan, ParallelGroups groups);
  // The plan of `config` for the rank the groups place this process at.
  explicit TrainingEngine(const plan::RunConfig& config, ParallelGroups groups = {});
  ~TrainingEngine();
  TrainingEngine(const TrainingEngine&) = delete;
  TrainingEngine& operator=(const TrainingEngine&) = delete;

  comm::Communicator& tp() { return *tp_; }
  comm::Communicator& dp() { return *dp_; }
  comm::Communicator& pp() { return *pp_; }
  // Sequences of each global batch this data-parallel rank processes, and the global index of
  // its first one.
  std::int64_t local_batch() const { return plan_.local_batch(); }
  // The context-parallel ranks of a replica group read the same samples.
  std::int64_t first_local_sample() const { return dp_->rank() / plan_.mesh.cp * local_batch(); }

  model::Model& model() { return model_; }
  // fp16's loss scaler (the identity for other precisions); its state goes into checkpoints.
  LossScaler& loss_scaler() { return precision_.loss_scaler(); }
  const Gemm16Resolution& gemm16() const { return precision_.gemm16(); }
  // Fault injection for tests: the gradient of optimizer step `step` (0-based) gets an
  // infinity before the norm is taken, as an fp16 overflow would. Every rank must be told alike.
  void inject_gradient_overflow(std::int64_t step) { precision_.inject_gradient_overflow(step); }
  const plan::RunPlan& plan() const { return plan_; }
  const plan::RunConfig& config() const { return plan_.config; }
  // This rank's optimizer. Under parallel.zero >= 1 it owns the state of this rank's blocks
  // only (optim/zero_partition.h): its layout holds those parts at their flat offsets.
  optim::Optimizer& optimizer() { return *optimizer_; }
  // Checkpoints see the optimizer state of the whole layout. Without ZeRO that is optimizer();
  // under ZeRO a whole-layout optimizer is assembled for the call: `save` gets one holding every
  // rank's parts (gathered over the groups that own them), `load` a fresh one to fill, whose
  // parts each rank then keeps. Every rank calls alike (collective over the data-parallel
  // groups); the whole state lives only during the call.
  // Under ZeRO-3 `save` also sees whole parameters in model().params() (gathered for the
  // call, given back after).
  void save_whole_optimizer_state(const std::function<void(optim::Optimizer&)>& save);
  void load_whole_optimizer_state(const std::function<void(optim::Optimizer&)>& load);
  // Whoever writes whole parameters into model().params() (a checkpoint load, weights to
  // start from) and refreshes the 16-bit copy calls this afterwards (every rank alike; under
  // ZeRO-1 and 2 no step may have run since the engine was made or the last call, so that no
  // gather of updated blocks is still writing). ZeRO-3:
  // the 16-bit copy of this rank's blocks is refreshed and the pages of the others' blocks are
  // given back; ZeRO-1 and 2: nothing is left to gather.
  void shard_params();
  // Whether parameters are partitioned between uses (ZeRO-3 over a group of more than one).
  bool params_sharded() const { return plan_.schedule.sharded_params; }
  // parallel.offload: the scratch store (null without offloading).
  const OffloadStore* offload_store() const { return offload_.get(); }
  // parallel.zero in effect (0 when no bucket is summed over more than one rank).
  int zero_stage() const { return plan_.zero.effective_stage(); }
  // The instruction list run for `sequences` local rows (training or forward only); verified
  // when first generated.
  const schedule::Schedule& schedule_for(std::int64_t sequences, bool training);

  // Learning rate of optimizer step `step` (0-based): linear warmup to train.lr over
  // warmup_steps, then cosine decay to min_lr over the remaining lr_decay_steps (or steps).
  double learning_rate(std::int64_t step) const { return lr_schedule_.at(step); }

  // One optimizer step. Under pipeline parallelism every stage gets the same arguments (the
  // first stage reads the inputs, the last the targets) and returns the same result: the loss
  // is computed on the last stage and broadcast over the pipeline group. `inputs`/`targets` are
  // this data-parallel rank's local_batch() sequences ([local_batch, seq]) of the global batch; a
  // negative target is not counted (masked-language modelling; loss masks). Forward and backward
  // accumulate gradients over micro-batches, the data-parallel group sums them, then gradient
  // clipping and one optimizer update with the step's learning rate. Dropout masks are keyed by
  // `step` and global sample indices. The loss returned is the mean over the counted targets of the
  // whole global batch.
  //
  // parallel.pipeline = "2bw" (schedule/pipeline_2bw.h): batch `step` computes on W(step - 1)
  // and its update is applied to the newest weights. With `drain` false the call returns with
  // the batch's last backwards still in flight (the next call must be step + 1, and finishes
  // them and applies the batch's update); with `drain` true (always, for other pipelines) the
  // batch's update is applied before it returns, which changes no result, only when the work
  // runs. loss is batch `step`'s; grad_norm is that of the last update the call applied (0
  // when it applied none: a first step that does not drain).
  //
  // parallel.dp_sync_every = x > 1 (local SGD): each data-parallel replica steps on the mean
  // gradient of its own local batch, and the replicas' parameters and optimizer state are
  // averaged after steps x, 2x, ... and after every step called with `drain` (the trainer's
  // evaluations, checkpoints and last step). loss is still the mean over the global batch.
  StepResult train_step(std::int64_t step, const std::int32_t* inputs,
                        const std::int32_t* targets, bool drain = true);

  // 2bw only (else null): the weights W(n - 1) the next batch computes on, n the optimizer
  // steps done; model().params() holds W(n) between steps.
  const Tensor* stashed_weights() const { return two_bw_.stashed_weights(); }
  bool stashed_weights_needed() const { return plan_.pipeline.two_bw(); }
  // 2bw only: sets the stashed weights after a resume (a checkpoint's), REQUIRES: no step has
  // run since the parameters were loaded, which also restarts the version count at `steps_done`.
  void set_stashed_weights(const Tensor& values, std::int64_t steps_done);

  // Gradients of the mean loss over `sequences` local rows (a multiple of micro_batch) into
  // model().grads(), without reductions or an optimizer update. Single-replica use (tests,
  // parity). Returns the mean loss.
  double compute_gradients(std::int64_t step, const std::int32_t* inputs,
                           const std::int32_t* targets, std::int64_t sequences);

  // The MoE layers' figures of the last training run (train_step, compute_gradients), summed
  // over every rank (a collective over the tensor-, data- and pipeline-parallel groups: every
  // rank calls it alike). Empty without MoE layers.
  MoeSummary moe_summary();

  // Mean loss over `sequences` local rows per data-parallel rank (the mean over all ranks'
  // counted targets), without dropout or gradients. Under pipeline parallelism every stage
  // calls it alike and gets the last stage's loss.
  double evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                  std::int64_t sequences);

  // Logits [micro_batch * seq, vocab] of one micro-batch, without dropout, in the model's
  // element type (a tensor-parallel group of one).
  void logits(const std::int32_t* inputs, const Tensor& out);

  // Report every instruction of the following steps to `listener` (null: stop).
  void set_listener(runtime::InstructionListener* listener) { listener_ = listener; }

  // Bytes this rank holds for the run: parameters, gradients, optimizer state, and the peak
  // of activations under the training schedule.
  planner::MemoryFigures memory_figures();
  std::size_t memory_bytes() { return memory_figures().total(); }
  // Peak activation bytes of a training step: slots and scratch plus the schedule's peak of
  // kept tensors (predicted from the program; the executor measures the same).
  std::size_t activation_bytes();
  // ZeRO-3: the most bytes of other ranks' parameter blocks the training schedule holds
  // gathered at once (0 otherwise).
  std::size_t peak_gathered_param_bytes();

 private:
  // Targets of this rank's local batch that enter the loss, and of the global batch.
  struct TargetCounts {
    double local = 0, global = 0;
  };
  // Runs the schedule over `sequences` local rows (global sample index of row 0:
  // first_sample); `hooks` handles ReduceGrads and OptimizerStep. Returns this rank's loss sum
  // (the model's LossAccumulator holds the count).
  double run_batches(std::int64_t step, const std::int32_t* inputs, const std::int32_t* targets,
                     std::int64_t sequences, std::int64_t first_sample, double loss_scale,
                     ops::HeadMode mode, const runtime::StepHooks& hooks, StepResult* result);
  // InternalError unless the last run's loss counted every target of `sequences` local rows
  // (on the stage that holds the head).
  void check_loss_count(const std::int32_t* targets, std::int64_t sequences);
  // Context parallelism: this rank's chunks of `sequences` rows of tokens ([sequences,
  // seq_len] -> [sequences, seq_len / cp], ops::ModelContext::position), copied into `own`;
  // `tokens` itself (null stays null) without it.
  const std::int32_t* own_tokens(const std::int32_t* tokens, std::int64_t sequences,
                                 std::vector<std::int32_t>& own) const;
  // Only targets >= 0 count (a masked-language model's masked positions; a causal model's
  // targets that a shard's loss mask keeps); their number differs between data-parallel ranks,
  // so the global count is summed over them (one all-reduce of a number per step).
  TargetCounts count_targets(const std::int32_t* targets);
  // The step's loss (the mean over the global batch's counted targets, from this rank's sum;
  // the last stage's under a pipeline) and the MoE summary into `result`.
  void report_loss(double local_sum, double counted, StepResult& result);
  // The 2bw pipeline's train_step.
  StepResult train_step_2bw(std::int64_t step, const std::int32_t* inputs,
                            const std::int32_t* targets, bool drain);

  // ReduceGrads(bucket): starts the sum of the bucket's gradients into `reductions` (returns
  // whether there was one) and, with offloading, the read-back of what its update touches.
  bool reduce_grads(int bucket, std::vector<std::unique_ptr<comm::Work>>& reductions);
  // The sum of bucket `bucket`'s gradients over its group, started (null: nobody to sum with).
  std::unique_ptr<comm::Work> reduce_bucket(int bucket);
  // parallel.offload: starts reading back what bucket `bucket`'s update will touch in the
  // store (its optimizer state, and its master weights), ahead of the optimizer step.
  void prefetch_offloaded(int bucket);
  // Waits for the step's gradient reductions, then makes the tied parameters' gradients whole
  // and equal on both stages that hold them.
  void finish_reductions(std::vector<std::unique_ptr<comm::Work>>& reductions, StepResult& result);
  // The step's update, after its gradients are reduced: unscale, clip, then the optimizer
  // (and the 16-bit parameter copy), or a skipped step when fp16 gradients overflowed.
  void apply_update(std::int64_t step, double loss_scale, StepResult& result);
  // The data-parallel reductions and optimizer step of one batch in a 2bw call; its update
  // goes to the newest weights.
  void step_2bw_batch(std::vector<std::unique_ptr<comm::Work>>& reductions, StepResult& result);
  // Unscales the gradients (by 1 / loss_scale) and clips them; returns the global norm of the
  // unscaled gradient before clipping, or a non-finite norm (leaving the gradients as they
  // were) when any element is an inf or a NaN.
  double clip_gradients(double loss_scale = 1);
  // The optimizer's update with learning rate of step `step` (0-based), then, under ZeRO, every
  // rank's updated blocks gathered, and the 16-bit copy refreshed.
  void step_optimizer(std::int64_t step);
  // Local SGD: averages parameters and optimizer state over the data-parallel group and
  // returns the replicas' divergence before it (StepResult).
  double average_replicas();
  // ZeRO-3 and deferred gathers: the master parameters made whole (blocking), the stashed 2bw
  // version too.
  void gather_whole_params();

  // The optimizer over the layout this rank updates (ZeRO's owned parts, or the whole), and
  // with offloading the store ranges each bucket's update reads.
  std::unique_ptr<optim::Optimizer> make_engine_optimizer();
  // A fresh optimizer over the whole layout of this rank.
  std::unique_ptr<optim::Optimizer> make_whole_optimizer() const;

  // Built in this order: each part holds references to the plan, the groups and the model
  // declared above it (and is destroyed before them).
  plan::RunPlan plan_;
  comm::SelfCommunicator self_tp_{"tp"};
  comm::SelfCommunicator self_dp_{"dp"};
  comm::SelfCommunicator self_pp_{"pp"};
  comm::Communicator* tp_;
  comm::Communicator* dp_;
  comm::Communicator* pp_;
  Precision precision_;
  ops::TpSubgroups tp_subgroup_;
  std::unique_ptr<OffloadStore> offload_;
  // parallel.offload: the byte ranges of the store each bucket's update reads, by bucket.
  std::map<int, std::vector<std::pair<const void*, std::size_t>>> offloaded_ranges_;
  model::Model model_;
  GradientReduction reduction_;
  ZeroSharding zero_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::LrSchedule lr_schedule_;
  runtime::Executor executor_;
  std::map<std::pair<std::int64_t, bool>, schedule::Schedule> schedules_;
  runtime::InstructionListener* listener_ = nullptr;
  LocalSgd local_sgd_;
  TwoBwSteps two_bw_;
  // Context parallelism: this rank's chunks of the inputs and targets of the batch running.
  std::vector<std::int32_t> own_inputs_, own_targets_;
};

// The optimizer's view of parameter `p` (this rank's shard): its place in the flat array, and
// where the shard sits in the whole parameter (split dimension, padding rows).
optim::ParamSlot param_slot(const model::ParamSpec& p);
// The flat layout an optimizer sees for `layout`'s parameters, of element type `dtype`.
optim::FlatLayout flat_layout(const model::ParamLayout& layout, DType dtype);

}  // namespace oases::train
