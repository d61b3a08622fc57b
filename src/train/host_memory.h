// Whether a run can fit in this host's memory, decided from its plan before anything is
// allocated: a config with two billion layers, a vocabulary of two billion tokens or an eval
// batch of a hundred million windows would otherwise grow until the kernel kills the process,
// without a word.
#pragma once

#include "plan/run_plan.h"
#include "planner/memory.h"

#include <cstdint>
#include <string_view>

namespace oases::train {

// A floor of the memory one rank of a run holds, in the engine's own formula
// (planner::memory_figures) over sizes taken from the plan alone: of the parameters, only the
// embedding, each layer's attention query and output projections and its feed-forward up and
// down projections, split evenly over parallel.tp x parallel.pp; of the activations, only the
// micro-batch's hidden states between two layers; no optimizer state. The engine's true
// figures are larger, so a run the floor refuses cannot run.
struct MemoryFloor {
  double parameters = 0;  // at least this many parameters on one rank
  planner::MemoryFigures figures;
};
MemoryFloor memory_floor(const plan::RunPlan& plan);

// UserError when `ranks_on_host` ranks of `plan` need more than `available_bytes` by the floor,
// naming the settings that decide it, the bytes needed and the bytes available.
// `batch_setting` names where the micro-batch came from ("train.micro_batch", or eval's
// "--batch-size").
void check_memory_floor(const plan::RunPlan& plan, int ranks_on_host,
                        std::uint64_t available_bytes,
                        std::string_view batch_setting = "train.micro_batch");

// check_memory_floor against this host's physical memory; returns `plan`, so that a caller
// checks the plan it is about to build an engine from in the same expression.
const plan::RunPlan& check_host_memory(const plan::RunPlan& plan, int ranks_on_host = 1,
                                       std::string_view batch_setting = "train.micro_batch");

}  // namespace oases::train
