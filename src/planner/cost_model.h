// Cost model: what a plan costs, predicted from a Profile.
//
// A plan gives each transformer layer a degree k dividing T = profile.tp (the embedding and the
// head stay at T), as `parallel.plan` runs it: layer l processes k / T of every sub-batch's rows,
// and a reshard segment sits wherever the degree changes. predict_plan simulates the schedule
// generator's output for that program: each segment's instructions take the times profiled at
// its degree, scaled to its rows; each reshard takes the measured all-gather (exposed unless
// the other sub-batches have compute to run meanwhile, which the simulation decides); each
// layer below T sums its gradients over its replicas (ReduceGrads); then the optimizer.
//
// predict_uniform is the older, whole-model view of a uniform plan: every layer at
// degree k: tp / k replicas, each on k / tp of every micro-batch, each running the schedule on
// its share (the layout tp = k, dp = T / k). Under spec.partitioned_checkpoints both simulate
// the schedule with the layers' checkpoints partitioned (schedule::partition_kept_checkpoints),
// each gather priced as the profile's reshard from degree 1 to the layer's degree (the same
// all-gather). The step time comes from simulating that schedule (sim/schedule_sim.h) with each
// instruction's profiled time, scaled linearly from the profiled rows to the rows it runs on;
// the replicas' gradient reduction and the optimizer step are included. Memory is parameters,
// gradients and the optimizer state of this rank's shard, plus the schedule's activation peak.
#pragma once

#include "ops/program.h"
#include "planner/memory.h"
#include "planner/profile.h"
#include "schedule/schedule.h"
#include "sim/schedule_sim.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace oases::planner {

// Bytes one rank holds, by the kinds of the engine's memory figures (train::MemoryFigures;
// the metrics param_bytes, grad_bytes, optimizer_bytes and peak_activation_bytes).
struct MemoryBytes {
  std::int64_t params = 0;       // with any working copy and second weight version
  std::int64_t grads = 0;
  std::int64_t optimizer = 0;    // what stays in memory of the optimizer's state
  std::int64_t activations = 0;  // boundary buffers, scratch and the peak of kept tensors
  std::int64_t state() const { return params + grads + optimizer; }
  std::int64_t total() const { return state() + activations; }
  bool operator==(const MemoryBytes&) const = default;
};

// The engine's memory figures as these kinds, what stays in memory: what parallel.offload keeps
// off memory comes off the optimizer's state first and the rest off the parameters (the master
// weights of "optimizer+params"), as the profile's ratios count them.
MemoryBytes resident_memory(const MemoryFigures& figures);

// The parameters, gradients and optimizer state of `parameter_bytes` of (master) parameters, by
// the profile's ratios (Profile::param_bytes_ratio, ...). Their sum is the sum of the ratios
// times parameter_bytes, rounded once; the optimizer's part takes what rounding each part
// apart would lose, so that the three add up to it exactly.
MemoryBytes state_memory(const Profile& profile, std::int64_t parameter_bytes);

struct Prediction {
  double step_seconds = 0;
  double compute_seconds = 0;
  double exposed_comm_seconds = 0;
  MemoryBytes memory;  // per rank
  std::int64_t memory_bytes() const { return memory.total(); }
};

// The GPT program of a degree-`degree` replica whose segment instances process `rows`
// sequences, with set sizes scaled from the profile. Layers where profile.model.is_moe_layer
// run three segments in place of the MLP (moe_dispatch.l, experts.l, moe_combine.l, shaped as
// ops/moe_segment.cc shapes them: all-to-alls over profile.ep ranks). costs_at prices those
// all-to-alls over profile.expert_link when profile.ep > 1.
ops::Program program_at(const Profile& profile, int degree, double rows);
ops::Program program_at(const Profile& profile, int degree, double rows, int layers);

// A Forward's, Recompute's or Backward's time from its segment's profiled times: a Recompute
// with ops::kOutput reruns the whole forward; 0 for other ops.
double segment_seconds(const SegmentTimes& times, const schedule::Instruction& instruction);

// CostModel::compute from the profile's times for any program whose segments are named by kind
// ("attention.3") and run at a degree of the profile: each instruction takes its kind's time at
// the segment's degree, scaled from the profile's rows to the segment's (sub_batch_rows x
// degree / tp, where tp is the tensor-parallel group of the program's run: a degree-1 layer of
// a tp = 1 run takes the whole sub-batch, one of a tp = 2 run half of it, while the profile's
// degree-1 times are for its own tp's share), an MoE layer's experts times the layer's
// Profile::expert_load_imbalance (the busiest expert-parallel rank's share); kinds the profile
// lacks (reshards, stage outputs) cost nothing. `profile` and `program` must outlive the
// function.
std::function<double(const schedule::Instruction&)> profiled_compute(const Profile& profile,
                                                                     const ops::Program& program,
                                                                     double sub_batch_rows, int tp);

// CostModel::codec from the profile's measured rates (Profile::activation_codec): an Encode or
// Decode takes its rate per element times the set's encodable elements; an encoding the profile
// did not time takes `unmeasured`'s price (free when null). Null when the profile timed none.
// `profile` and `program` must outlive the function.
std::function<double(const schedule::Instruction&)> profiled_codec(
    const Profile& profile, const ops::Program& program,
    std::function<double(const schedule::Instruction&)> unmeasured);

// UserError when a segment of `program` (other than a reshard or a stage output, priced by
// their collectives) is of a kind the profile has no times for at the segment's degree: a
// program of another layout than the profile's (Profile::layout), or a sequence-parallel
// layer at degree 1.
void check_profiled_kinds(const Profile& profile, const ops::Program& program);

// The simulator's costs, from the profile, of any program whose segments are named by kind and
// run at degrees of the profile (the planner's plan programs, and a run's own program built
// shape-only in the profile's layout), its layers at `layer_degrees` (one per layer):
//   compute: profiled_compute;
//   a collective: its kind's profiled time in its direction ("<kind>.fwd_s", ".bwd_s") at the
//     segment's degree, scaled to the segment's rows; a reshard's the profiled all-gather
//     between its two degrees; a partitioned checkpoint's gather the reshard from 1 to the
//     segment's degree;
//   bucket 1 + l: layer l's replica reduction at its degree; bucket 0 (the embeddings) the
//     whole group's at the same rate per byte (0 where the group has no replicas);
//   the optimizer step: the profiled one, scaled to the parameters the degrees leave here;
//   overlap_slowdown (< 0: the profile's at degree T) and the collective slowdown at T;
//   MoE all-to-alls over profile.ep > 1 ranks by their per-peer volume (sim::price_all_to_alls).
// `profile` and `program` must outlive the costs.
sim::CostModel profiled_costs(const Profile& profile, const ops::Program& program,
                              double sub_batch_rows, const std::vector<int>& layer_degrees,
                              double overlap_slowdown = -1);

// Instruction costs of that program for the simulator.
sim::CostModel costs_at(const Profile& profile, int degree, double rows,
                        const ops::Program& program, double overlap_slowdown = 0);

// The plan `degrees` (one per layer; the number of layers is degrees.size()) under `spec`
// (micro_batches: per step), micro_batch sequences per micro-batch of the whole group.
// overlap_slowdown < 0 takes the profile's measured value (at degree T, as the collective
// slowdown under compute).
// Layer l is an MoE layer (three segments: moe_dispatch, experts, moe_combine, in place of the
// MLP) where profile.model.is_moe_layer(l); its all-to-alls span profile.ep ranks and, for
// ep > 1, are priced by their per-peer volume over profile.expert_link
// (sim::price_all_to_alls), otherwise at their profiled times.
Prediction predict_plan(const Profile& profile, const std::vector<int>& degrees,
                        const schedule::ScheduleSpec& spec, std::int64_t micro_batch,
                        double overlap_slowdown = -1);
// The same with moe[l] (one per layer) saying which layers are MoE layers: the planner prices
// one layer of each kind by the difference of two plans.
Prediction predict_plan(const Profile& profile, const std::vector<int>& degrees,
                        const std::vector<bool>& moe, const schedule::ScheduleSpec& spec,
                        std::int64_t micro_batch, double overlap_slowdown = -1);

// Every layer at `degree` under `spec` (kind, recompute, sub_batches, micro_batches: the
// schedule each replica runs; micro_batch: sequences per micro-batch of the whole group).
// overlap_slowdown < 0 takes the profile's measured value.
Prediction predict_uniform(const Profile& profile, int degree, const schedule::ScheduleSpec& spec,
                           std::int64_t micro_batch, double overlap_slowdown = -1);
// The same model with `layers` transformer layers (the planner takes differences to price one
// layer).
Prediction predict_uniform(const Profile& profile, int degree, const schedule::ScheduleSpec& spec,
                           std::int64_t micro_batch, int layers, double overlap_slowdown);

}  // namespace oases::planner
