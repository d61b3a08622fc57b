// Whole-cluster simulation: a run config on a cluster description (sim/cluster.h), every rank's
// training step as the runtime would run it, priced on the devices and links it would run on.
//
// For each simulated rank the program is read from the rank's own model, built as the engine
// builds it but shape-only (comm::ShapeOnlyCommunicator groups, parameters never touched:
// model::ModelOptions::shape_only), so a GPT-175B stage costs address space, not memory. Its
// schedule is plan::rank_schedule's (generation or pipeline lowering and the config's passes,
// the instructions the runtime executes), priced by sim::cluster_costs and run with the
// pipeline's other stages by sim::simulate_ranks.
//
// Symmetry rule (folding). The ranks of one pipeline stage run the same instructions: they hold
// equal shards of the same layers and differ only in which shard and which rows, and each of
// their collectives is priced with every group of its kind running it at once. When in addition
// every group of each kind (tensor-parallel group and sub-groups, layer replica groups,
// data-parallel, pipeline, expert-parallel and expert-replica groups) meets the same tiers
// between its consecutive members, every rank of a stage has the same prices, so one pipeline
// of representatives (tensor- and data-parallel rank 0 of each stage) stands for all of them:
// pp models and schedules, whatever the world size. Otherwise (a group straddling a node
// boundary where its siblings do not) every rank is simulated, each pipeline of ranks on its own
// (collectives are priced, not synchronised between ranks, which holds for ranks that issue
// them together). The step is the slowest pipeline's.
#pragma once

#include "comm/communicator.h"
#include "model/model.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "planner/memory.h"
#include "planner/profile.h"
#include "sim/cluster.h"
#include "sim/cluster_costs.h"
#include "sim/placement.h"
#include "sim/schedule_sim.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace oases::cluster {

struct ClusterSimulationOptions {
  bool fold = true;            // apply the symmetry rule where it holds (false: every rank)
  bool record_events = false;  // keep every simulated activity (for write_simulation_trace)
  // Compute for a cluster whose device computes from a profile (this machine's CPU ranks):
  // every compute instruction takes its segment kind's profiled time at the segment's degree
  // (planner::profiled_compute), a zero-bubble BackwardWeight half of its stage 0; the
  // optimizer step the profiled one over this rank's share of the parameters; the slowdowns
  // the profile's, measured at the whole group's degree; the link's efficiency for large
  // transfers the profile's measured all-reduce (calibrate_replica_link). Must outlive the call;
  // it must match the config (planner::check_profile_matches).
  const planner::Profile* profile = nullptr;
  // With `profile`: the peak FLOP/s per rank of this machine's products in the config's
  // precision (train/peaks.h), for the prediction's MFU; 0: no MFU.
  double profiled_peak_flops = 0;
  // Verify every rank's schedule before pricing it (schedule::verify_schedule). The joint
  // planner's many reduced estimates leave it out; whatever runs or is reported is verified.
  bool verify_schedules = true;
  // Whether the layout is symmetric on the cluster (cluster_layout_is_symmetric), where the
  // caller knows it already (it costs a pass over every rank's groups); empty: found here.
  std::optional<bool> symmetric;
  // Collective prices shared with other simulations on the same cluster
  // (sim::CollectivePriceCache); none: found for this one alone. Not with a profile (the
  // simulation's link is calibrated from it).
  std::shared_ptr<sim::CollectivePriceCache> collective_prices;
};

struct SimulatedRank {
  int rank = 0;   // world rank
  int stage = 0;  // pipeline stage
  sim::RankSimResult time;
  // At its peak, the figures the engine's memory metrics give (planner::memory_figures).
  planner::MemoryFigures memory;
};

struct ClusterSimulation {
  int world = 0;
  bool folded = false;                // one representative per stage stood for its ranks
  double step_seconds = 0;
  double tokens_per_step = 0;         // train.global_batch x model.seq_len
  double model_flops_per_step = 0;    // forward and backward products of every rank, no recompute
  double peak_flops_per_device = 0;   // the device's peak for the products' element type
  std::vector<SimulatedRank> ranks;   // by world rank; folded: the representatives
  std::vector<sim::SimEvent> events;  // record_events: SimEvent::rank is the world rank

  double tokens_per_second() const { return tokens_per_step / step_seconds; }
  // Model FLOPs utilisation: the model's FLOPs over the step at every device's peak.
  double mfu() const { return model_flops_per_step / (step_seconds * world * peak_flops_per_device); }
};

// The plan's ranks as the simulator places them (parallel.tp, dp, pp, ep).
sim::RankLayout rank_layout(const plan::RunPlan& plan);

// One rank as the simulator sees it: its model built shape-only, as the engine builds it, with
// ShapeOnlyCommunicator groups of the rank's sizes and positions; its schedule
// (plan::rank_schedule); its prices on the cluster (sim::cluster_costs); its memory; and the
// model FLOPs of its step. The communicators and the model outlive the prices and the schedule,
// which refer to the program.
struct ShapeOnlyRank {
  int rank = 0, stage = 0;
  std::unique_ptr<comm::ShapeOnlyCommunicator> tp, ep, cp;
  std::map<std::pair<int, int>, std::unique_ptr<comm::ShapeOnlyCommunicator>> subgroups;
  std::unique_ptr<model::Model> model;
  schedule::Schedule schedule;
  sim::CostModel costs;
  planner::MemoryFigures memory;
  double flops_per_step = 0;
};

// The rank `plan` is made for (plan.mesh.rank): its model, schedule, memory and model FLOPs,
// without prices (costs left empty for the caller).
// `verify` false: the schedule is not verified (ClusterSimulationOptions::verify_schedules).
std::unique_ptr<ShapeOnlyRank> shape_only_rank(const plan::RunPlan& plan, bool verify = true);
// `r` (built by shape_only_rank for a plan that differs from `plan` at most in its micro-batch
// count, with the same schedule::slot_lanes) given `plan`'s schedule, memory and model FLOPs.
void schedule_shape_only_rank(const plan::RunPlan& plan, bool verify, ShapeOnlyRank& r);
// The rank `plan` is made for (plan.mesh.rank) running its training steps.
// `profile`: as ClusterSimulationOptions::profile (needed where the cluster computes from one).
std::unique_ptr<ShapeOnlyRank> build_shape_only_rank(
    const plan::RunPlan& plan, const sim::ClusterSpec& cluster,
    const planner::Profile* profile = nullptr, bool verify = true,
    const std::shared_ptr<sim::CollectivePriceCache>& collective_prices = nullptr);

// `cluster` with its link taking its efficiency at the profile's Profile::replica_link size from
// that measurement (a cluster that computes from a profile describes the machine the profile
// was taken on, and how much of a link a large transfer reaches depends on that machine's
// network stack): the tier holding the first replica_link.ranks devices gets the point
// (bytes, fraction) on its efficiency curve in place of its points at and beyond that size, the
// fraction being what makes the ring all-reduce of sim/collective_costs.h take the measured
// time, within (0, 1]. Smaller transfers keep the curve's points below that size (none: the
// measured fraction holds for them too). Unchanged when the profile has no replica_link or the
// cluster fewer devices.
sim::ClusterSpec calibrate_replica_link(const sim::ClusterSpec& cluster,
                                        const planner::Profile& profile);

// Whether the symmetry rule holds for the plan's layout on the cluster.
bool cluster_layout_is_symmetric(const plan::RunPlan& plan, const sim::ClusterSpec& cluster);

// UserError when the cluster does not hold the config's ranks, computes from a profile (this
// machine's CPU clusters) and none matching the config is given, or lacks a peak for
// train.precision; or when the config cannot run.
ClusterSimulation simulate_cluster(const plan::RunConfig& config, const sim::ClusterSpec& cluster,
                                   const ClusterSimulationOptions& options = {});

// simulate_cluster of `config` at each of `micro_batch_counts` micro-batches per replica
// (train.global_batch = count x train.micro_batch x parallel.dp), in that order: each rank's
// shape-only model and prices are built once and scheduled for every count (the joint planner's
// reduced models). The same errors.
std::vector<ClusterSimulation> simulate_cluster_at(
    const plan::RunConfig& config, const sim::ClusterSpec& cluster,
    const std::vector<std::int64_t>& micro_batch_counts,
    const ClusterSimulationOptions& options = {});

// Step, throughput, MFU, exposed communication, bubble and memory per simulated rank (with
// "does not fit" and the figures where a rank needs more than the device holds), as printed by
// `oases simulate --cluster`.
std::string format_cluster_simulation(const ClusterSimulation& simulation,
                                      const sim::ClusterSpec& cluster);

// The recorded events as a Chrome trace (chrome://tracing, Perfetto): a process per simulated
// rank, a thread per lane, times in microseconds. Written to a temporary name and renamed.
void write_simulation_trace(const ClusterSimulation& simulation, const std::string& path);

}  // namespace oases::cluster
