// The planner: from a Profile, the tensor-parallel degree of every transformer layer that
// minimises the predicted step time within the memory limit (docs/planner-and-simulator.md,
// "The planner").
//
// Layers of a kind (dense, MoE) are alike, so one layer at degree k costs what the cost model
// predicts for the plan with L layers at k minus the plan with L - 1 (one layer of that kind less) (time and memory; overlap included, as the
// simulator runs the whole schedule). A boundary between layers of different degrees pays the
// profiled reshard (one all-gather along the batch per micro-batch and sub-batch) as if it
// could not overlap. The embedding and the head stay at the full degree, so the first and last
// layers pay a reshard from and to it. The chain is solved by the dynamic program and by CBC,
// which must agree; the chosen plan is then predicted by simulating its own schedule.
#pragma once

#include "planner/chain_solver.h"
#include "planner/cost_model.h"
#include "planner/profile.h"
#include "schedule/schedule.h"

#include <functional>
#include <string>
#include <vector>

namespace oases::planner {

struct UniformOption {
  int degree = 0;
  Prediction prediction;
  bool fits = true;  // within the memory limit
  // The MoE layers stay at degree 1 (parallel.expert_tp = 1): only the dense ones run at degree.
  bool moe_at_degree_one = false;
};

struct Plan {
  std::vector<int> degrees;  // per transformer layer
  double predicted_step_seconds = 0;
  std::int64_t predicted_memory_bytes = 0;  // per rank
  // The same by kind, summing to predicted_memory_bytes; all 0 when read from a plan file
  // written without them.
  MemoryBytes predicted_memory;
  // A joint plan's global choices and per-layer policies, as config settings: each pair is a
  // `--set` assignment's key ("parallel.schedule") and value text ("cross-pass";
  // "full,none,none" for parallel.recompute per layer). A run whose parallel.plan names the
  // file takes them over its config's (plan::load_run_config). Empty for a degrees-only plan.
  std::vector<std::pair<std::string, std::string>> settings;
  // What the joint search reported (`oases plan`'s chosen layout, alternatives and exclusions)
  // as JSON text, kept in the file for the record; empty when none.
  std::string report_json;
};

struct PlanReport {
  std::vector<UniformOption> uniform;  // every degree of the profile, ascending
  Plan chosen;                      // predicted by simulating its schedule (predict_plan)
  double chosen_chain_seconds = 0;  // the chain's additive estimate of the same plan
  double ilp_seconds = 0, dp_seconds = 0;  // solve times
  // The settings the profile's memory ratios were measured under (Profile::memory_settings);
  // empty when it does not record them.
  std::string memory_settings;
};

// A plan's prediction: `degrees` one per layer, `moe` whether each is an MoE layer (the planner
// also asks for plans of one layer less, to price one layer by difference).
using PlanPredictor =
    std::function<Prediction(const std::vector<int>& degrees, const std::vector<bool>& moe)>;

// memory_limit: bytes per rank; 0 means none. UserError when no plan fits, saying by how much.
// The memory per rank is the cost model's (Prediction::memory): the profile's per-kind ratios
// of the parameters each layer's degree leaves on a rank, plus the schedule's activations.
// Mixture-of-experts models: dense and MoE layers are priced apart (each as the difference
// between the model and the model less one layer of its kind); with moe_at_degree_one
// (parallel.expert_tp = 1 at tp > 1) every MoE layer gets degree 1, in the uniform options
// too, and UserError says so when the memory limit leaves no such plan.
PlanReport make_plan(const Profile& profile, const schedule::ScheduleSpec& spec,
                     std::int64_t micro_batch, std::int64_t memory_limit,
                     bool moe_at_degree_one = false);
// The same with every plan predicted by `predict` in place of predict_plan (a run whose
// layers are not the cost model's plain tensor-parallel ones: cluster/profile_prediction.h).
// The candidate degrees are the profile's, less degree 1 where it was measured with sequence
// parallelism (a group of one has no sequence-parallel segments).
PlanReport make_plan(const Profile& profile, const schedule::ScheduleSpec& spec,
                     std::int64_t memory_limit, bool moe_at_degree_one,
                     const PlanPredictor& predict);

// What `oases plan --degrees-only` prints: every uniform plan (predicted time, memory, whether
// it fits) and the chosen degrees with their prediction, its memory per rank by kind
// (parameters, gradients, optimizer state, activations) and the solve times.
std::string format_plan_report(const PlanReport& report, const schedule::ScheduleSpec& spec,
                               std::int64_t memory_limit);

// {"format": "oases-plan", "version": 2, "tp": T, "degrees": [...], "predicted_step_s": ..,
//  "predicted_memory_bytes": .., "predicted_param_bytes": .., "predicted_grad_bytes": ..,
//  "predicted_optimizer_bytes": .., "predicted_activation_bytes": ..,
//  "settings": {"parallel.schedule": "cross-pass", "train.micro_batch": "4", ...},
//  "report": {...}}
// The four parts are optional on read (files written before them) and, when present, must sum
// to predicted_memory_bytes. "settings" and "report" are optional (version 1 files have
// neither); a setting may not name parallel.plan itself.
void write_plan(const Plan& plan, int tp, const std::string& path);
// Reads a file written by write_plan (version 1 or 2) for a tensor-parallel group of `tp`
// ranks and `layers` layers. UserError naming the file when it is not such a plan.
Plan read_plan(const std::string& path, int tp, std::int64_t layers);
// The settings of the plan file at `path` (Plan::settings), read before the run's layout is
// known: the file's tp and degrees are checked by read_plan later. UserError naming the file
// when it is not a plan file or a setting is malformed.
std::vector<std::pair<std::string, std::string>> read_plan_settings(const std::string& path);

}  // namespace oases::planner
