#include "planner/memory.h"

namespace oases::planner {

MemoryFigures memory_figures(const MemoryPolicy& policy, const MemorySizes& sizes) {
  const auto whole = static_cast<std::size_t>(sizes.params);
  const auto owned = static_cast<std::size_t>(sizes.owned_params);
  const bool sharded_params = policy.zero_stage >= 3;
  // The elements of each parameter copy that stay in memory between uses.
  const std::size_t held = sharded_params ? owned : whole;
  const std::size_t gathered = sharded_params ? sizes.gathered_bytes : 0;
  MemoryFigures m;
  // Gathered blocks are of the copy compute reads: the working copy under mixed precision.
  m.working_copy =
      policy.working_element > 0 ? held * policy.working_element + gathered : 0;
  m.params = static_cast<std::size_t>(policy.weight_versions) * held * policy.master_element +
             (policy.working_element > 0 ? m.working_copy : gathered);
  m.grads = (policy.zero_stage >= 2 ? owned : whole) * policy.master_element;
  m.optimizer = sizes.optimizer_state;
  m.activations = sizes.activations;
  m.offloaded = sizes.offload_store;
  if (sharded_params && policy.offload_params)
    m.offloaded -= (whole - owned) * policy.master_element;
  return m;
}

}  // namespace oases::planner
