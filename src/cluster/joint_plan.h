// The joint planner: for a fixed model, global batch, world size and memory limit per rank, the
// run layout with the least predicted step time (docs/planner-and-simulator.md, "The joint
// planner"). It chooses
//
//   global:    the tensor-, context-, data- and pipeline-parallel degrees (multiplying to the
//              world), the schedule family (megatron, cross-pass, fine-grained, oases,
//              oases-interleaved) and its sub-batches, the micro-batch size (gradient
//              accumulation follows from the global batch), the pipeline schedule and its
//              virtual stages, sequence parallelism, the ZeRO stage and offload;
//   per layer: the recomputation policy and the activation compression;
//
// pricing each candidate with the simulator on a cluster description (sim/cluster.h), or on
// this machine from profiles measured here (a cluster whose device computes from a profile).
//
// How it searches (docs/planner-and-simulator.md, "The joint planner", says what is exact):
//   1. Every combination of the global choices is made into a RunConfig and resolved by
//      plan::make_run_plan; one that cannot run is excluded with the reason the run plan gives,
//      counted by the setting it names.
//   2. Each global choice gets a lower bound on its step (step_bound: the busiest stage's
//      compute without recomputation, the pipeline's fill, megatron's collectives) and, where
//      that does not prune it, a closer one (stage_bound: the family's schedule simulated on
//      one stage without data parallelism, through the pipeline's orders); choices are taken
//      least bound first, in batches of fixed size, until the bound reaches the
//      `simulate_best`-th best estimate of the batches before.
//   3. A choice is priced with every layer at its fastest option (no recomputation, no
//      compression) on reduced models (n1 and n2 layers per pipeline chunk, m1 and m2
//      micro-batches past the fill), extended bilinearly to the model's layers and the run's
//      micro-batches. With a pipeline, the reduced models are first those of one stage alone
//      (cached, shared by every pipeline schedule of its degrees), composed through the
//      pipeline's orders (sim/pipeline_sim.h) with the stage's time per micro-batch, the
//      transfers between stages and the activations its busiest rank keeps (composed
//      pricing); the best of those are priced again with the whole pipeline's reduced models.
//      If the fastest option does not fit, every option is priced (composed: scaled from the
//      fastest by its cost per layer and micro-batch on one stage without data parallelism)
//      and the per-layer chain is solved exactly for those costs
//      (planner::solve_dynamic_program: time adds over layers; memory is the last layer's
//      option's working set plus every other layer's kept sets in one stage, the largest base
//      over stages). Every ZeRO stage is priced; offload only while nothing fits without it.
//   4. Composed estimates among the best 2 x `simulate_best` and each family's best are priced
//      again exactly (reduced models of the whole pipeline, every option of the chain) until
//      none is left; then the best `simulate_best` estimates, each family's best, and on down
//      until one fits are simulated whole (cluster::simulate_cluster, every rank's verified
//      schedule); that prediction ranks them and decides the choice.
#pragma once

#include "plan/run_config.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "planner/profile.h"
#include "sim/cluster.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace oases::cluster {

struct JointSearchOptions {
  // Settings the search keeps as the config gives them (e.g. "parallel.pp",
  // "parallel.activation_compression"); everything else listed above is searched.
  std::vector<std::string> fixed;
  // Bytes per rank; 0: the config's parallel.memory_limit, or else the cluster's device memory.
  std::int64_t memory_limit = 0;
  // Candidates simulated whole after the estimate (besides each family's best).
  int simulate_best = 12;
  // Largest micro-batch considered (sequences); 0: up to the global batch over dp.
  std::int64_t max_micro_batch = 0;
  // Largest virtual-stage count of interleaved pipelines considered.
  int max_virtual_stages = 4;
  // Worker threads pricing candidates; 0: one per hardware thread. The result does not depend
  // on it.
  int threads = 0;
  // Price every candidate with a pipeline by reduced simulations of the pipeline itself, and
  // every option of its chain so, rather than composing it from one stage (see step 3 below):
  // slower, for checking the composed estimates.
  bool exact_estimates = false;
};

// One priced layout: the config settings that make it (as `--set` takes them, in a fixed
// order), its estimate and, where simulated whole, its prediction.
struct JointCandidate {
  std::vector<std::pair<std::string, std::string>> settings;
  std::string family;  // parallel.schedule's word
  double estimated_step_seconds = 0;
  std::int64_t estimated_memory_bytes = 0;
  bool simulated = false;  // the figures below are the whole run's simulation
  double step_seconds = 0;
  double exposed_comm_seconds = 0;
  double bubble_seconds = 0;
  planner::MemoryBytes memory;  // the rank that needs the most
  bool fits = true;
  // The predicted step where simulated, else the estimate.
  double predicted_step_seconds() const {
    return simulated ? step_seconds : estimated_step_seconds;
  }
  // "tp 2, dp 1, cp-, pp 1, cross-pass x2, mb 4, recompute none, zero 0"
  std::string summary() const;
};

struct JointPlanReport {
  std::int64_t memory_limit = 0;  // bytes per rank the search held the plans to
  int world = 0;
  std::string cost_source;  // "cluster dgx-a100" or "profiles of this machine"
  JointCandidate chosen;
  std::vector<JointCandidate> alternatives;  // the ten best others, by predicted step
  // The best of each schedule family, by family word.
  std::map<std::string, JointCandidate> best_of_family;
  std::int64_t considered = 0;   // global choices enumerated
  std::int64_t priced = 0;       // of them, priced (reached step 2)
  std::int64_t simulations = 0;  // reduced and whole simulations run
  // Excluded global choices by reason, with one example message each.
  std::map<std::string, std::int64_t> excluded;
  std::map<std::string, std::string> excluded_example;
  double search_seconds = 0;
  // The smallest memory per rank any candidate needed (by its estimate), for the error when
  // nothing fits.
  std::int64_t least_memory_bytes = 0;
};

// The search for `config` (its model, train.global_batch and world size: parallel.tp x cp x
// dp x pp), priced on `cluster`; `profiles` where the cluster computes from profiles (this
// machine: a candidate is priced only by a profile measured in its layout, micro-batch and
// sub-batches; the others are excluded saying so). UserError when no candidate fits the
// memory limit (naming the smallest memory that fits and the layouts that would) or no layout
// divides the world.
JointPlanReport search_joint_plan(const plan::RunConfig& config, const sim::ClusterSpec& cluster,
                                  const std::vector<planner::Profile>& profiles,
                                  const JointSearchOptions& options = {});

// This machine as a cluster of `ranks` CPU ranks on one node for the joint search: compute from
// a profile (device.compute = "profile"), one shared-memory tier whose rate is the profile's
// measured all-reduce between replicas (planner::Profile::replica_link; 2 GB/s where it has
// none), memory per rank `memory_bytes`.
sim::ClusterSpec this_machine_cluster(int ranks, std::int64_t memory_bytes,
                                      const planner::Profile& profile);

// parallel.plan = "auto" in `oases train` (train::JointSearch): the joint search for `config`
// on this machine's ranks (its world), priced by `profile` alone, keeping the config's
// activation compression (lossy: the run computes what its config says unless told); the
// chosen plan as a plan file's contents. `report`, when given, receives what `oases plan` would print.
planner::Plan joint_plan_on_this_machine(const plan::RunConfig& config,
                                         const planner::Profile& profile,
                                         std::string* report = nullptr);

// `config` with a candidate's settings applied (as `--set` would apply them).
plan::RunConfig apply_settings(const plan::RunConfig& config,
                               const std::vector<std::pair<std::string, std::string>>& settings);

// What `oases plan` prints: the chosen layout (global choices, then a table of layers with
// degree, recomputation, compression and sequence parallelism), its predicted step, memory per
// rank by kind and exposed communication, the ten best alternatives and each family's best
// with their predicted steps, and the excluded counts by reason.
std::string format_joint_plan_report(const JointPlanReport& report, const plan::RunConfig& config);

// The report as JSON (the plan file's "report").
std::string joint_plan_report_json(const JointPlanReport& report);

// The chosen candidate as a plan file's contents: its settings, degrees (every layer at the
// chosen tp), prediction and the report.
planner::Plan joint_plan_file(const JointPlanReport& report, const plan::RunConfig& config);

}  // namespace oases::cluster
