// The steps make_run_plan resolves a config by, shared with RunConfig::validate, which runs the
// ones that read no file so that a config that cannot run is rejected when it is read.
#pragma once

#include "optim/optimizer.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "plan/settings.h"
#include "schedule/schedule.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::plan {

// The training schedule: parallel.schedule and parallel.recompute with "auto" resolved (oases
// with fine-grained recomputation when tp > 1, else megatron without), a per-layer list
// (ScheduleSpec::layer_recompute, the segments outside the layers at the kind's own policy)
// checked against the kind layer by layer, sqrt's group size,
// sub-batches (0: two where an overlapped schedule can split the micro-batch, else one),
// micro-batches per step on one data-parallel rank, partitioned checkpoints. The ZeRO flags are
// left to make_run_plan. UserError for a combination that cannot run.
schedule::ScheduleSpec resolve_schedule(const RunConfig& config, const Settings& settings);

// The pipeline's kind, stages, virtual stages and the layers of each chunk
// (parallel.pipeline_layers; with "auto" and more than one chunk the counts stay empty, to be
// measured). UserError for counts that do not cut the model.
PipelinePlan resolve_pipeline(const RunConfig& config, const Settings& settings);

// The degree of every layer parallel.plan gives (empty: every layer at parallel.tp), reading a
// plan file if it names one, and then setting `*file` (where given) to what the file holds
// besides the degrees; empty for "auto" (to be planned). UserError for degrees that do not
// divide parallel.tp, a wrong count, or an MoE layer above 1 with parallel.expert_tp = 1.
std::vector<int> resolve_layer_degrees(const RunConfig& config, const Settings& settings,
                                       std::optional<PlanFile>* file = nullptr);

// The [train] section's optimizer settings, as optim::make_optimizer takes them.
optim::OptimizerConfig optimizer_config(const OptimConfig& train, optim::OptimizerKind kind);

// "1,1,2,2" read as one degree per layer, each dividing tp. UserError naming parallel.plan.
std::vector<int> parse_degree_list(const std::string& text, std::int64_t layers, std::int64_t tp);

// The divisors of n up to 4096 ("1, 2, 4"; larger ones elided as ", ..."), for messages that
// list the valid values without stalling on an absurd setting.
std::string divisors_of(std::int64_t n);

}  // namespace oases::plan
