// The memory one rank holds, by kind: one formula for the engine's metrics (the start-up line,
// run.json and every metrics record), the cluster simulation's per-rank figures and the
// planner's prices.
//
// The callers differ only in where the sizes come from: the engine reads its own arrays and
// schedule, the cluster simulation a shape-only model of the rank with the engine's ZeRO
// partition, the planner a profile's measured parameter bytes and optimizer ratio.
#pragma once

#include <cstddef>
#include <cstdint>

namespace oases::planner {

struct MemoryFigures {
  // The parameters: the master copy (f32, or f64 in fp64 runs), 2bw's second weight version,
  // and under mixed precision the 16-bit copy forward and backward read (also in working_copy).
  // ZeRO-3: this rank's blocks of each, plus the most of the others' blocks its schedule holds
  // gathered at once.
  std::size_t params = 0;
  std::size_t working_copy = 0;
  std::size_t grads = 0;        // the gradient accumulators (ZeRO-2 and 3: this rank's blocks)
  std::size_t optimizer = 0;    // the optimizer's state (ZeRO: of this rank's blocks)
  std::size_t activations = 0;  // peak of a training step: slots, scratch and kept tensors
  // parallel.offload: the part of the above kept in a scratch file between optimizer steps (the
  // optimizer state, and with "optimizer+params" the master weights of this rank's blocks).
  std::size_t offloaded = 0;
  // What must fit in memory.
  std::size_t total() const { return params + grads + optimizer + activations - offloaded; }
  bool operator==(const MemoryFigures&) const = default;
};

// What, besides sizes, decides the figures: the run's precision, pipeline and ZeRO settings
// (plan::RunPlan::memory_policy gives a run's).
struct MemoryPolicy {
  std::size_t master_element = 4;   // bytes per element of the master parameters and gradients
  std::size_t working_element = 0;  // of the 16-bit working copy (mixed precision); 0: none
  int weight_versions = 1;          // 2 under the 2bw pipeline (a stashed version)
  int zero_stage = 0;               // ZeRO in effect (0 when it partitions nothing)
  bool offload_params = false;      // parallel.offload = "optimizer+params"
};

struct MemorySizes {
  std::int64_t params = 0;        // elements of every parameter (part) this rank computes with
  std::int64_t owned_params = 0;  // of those, this rank's ZeRO blocks (= params without ZeRO)
  // ZeRO-3: the most bytes of other ranks' blocks (of the copy compute reads) gathered at once.
  std::size_t gathered_bytes = 0;
  std::size_t optimizer_state = 0;  // bytes of this rank's optimizer state
  std::size_t activations = 0;      // bytes: slots, scratch and the schedule's peak of kept sets
  std::size_t offload_store = 0;    // bytes the offload scratch file holds (parallel.offload)
};

// ZeRO-1 keeps whole parameters and gradients; ZeRO-2 this rank's blocks of the gradients
// between steps; ZeRO-3 also of both parameter copies. Under ZeRO-3 the offload store still
// holds every master weight, of which only this rank's blocks stand for memory.
MemoryFigures memory_figures(const MemoryPolicy& policy, const MemorySizes& sizes);

}  // namespace oases::planner
