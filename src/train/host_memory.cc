#include "train/host_memory.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/regular_file.h"

#include <fmt/format.h>

#include <algorithm>

namespace oases::train {
namespace {

// Sizes beyond any host are held at this many elements or bytes, so that the size_t sums of
// planner::memory_figures cannot overflow whatever the settings (2^50: a pebibyte of bytes).
constexpr double kSizeCap = 1125899906842624.0;

std::size_t capped(double value) {
  return static_cast<std::size_t>(std::clamp(value, 0.0, kSizeCap));
}

}  // namespace

MemoryFloor memory_floor(const plan::RunPlan& plan) {
  const model::ModelConfig& m = plan.config.model;
  // In double: the products of a hostile config overflow 64-bit integers.
  const double hidden = static_cast<double>(m.hidden), layers = static_cast<double>(m.layers);
  const double attention = static_cast<double>(m.heads * m.head_dim());
  const double feed_forward =
      static_cast<double>(std::min(m.ffn_hidden, m.moe_every > 0 ? m.expert_ffn_hidden()
                                                                 : m.ffn_hidden));
  const double whole_model = static_cast<double>(m.vocab_size) * hidden +
                             layers * (2 * hidden * attention + 2 * hidden * feed_forward);
  MemoryFloor floor;
  floor.parameters = whole_model / static_cast<double>(plan.mesh.tp * plan.mesh.pp);

  const planner::MemoryPolicy policy = plan.memory_policy();
  planner::MemorySizes sizes;
  sizes.params = static_cast<std::int64_t>(capped(floor.parameters));
  sizes.owned_params = policy.zero_stage >= 1 ? sizes.params / plan.mesh.dp : sizes.params;
  sizes.activations = capped(static_cast<double>(plan.micro_batch()) *
                             static_cast<double>(m.seq_len) * hidden *
                             static_cast<double>(dtype_size(plan.dtypes.compute)));
  // What parallel.offload = "optimizer+params" keeps in its scratch file: the master weights of
  // this rank's blocks (under ZeRO-3 the store holds every block, of which only this rank's
  // stand for memory). The optimizer's state is left out of the floor, so of its store too.
  if (policy.offload_params)
    sizes.offload_store = static_cast<std::size_t>(policy.zero_stage >= 3 ? sizes.params
                                                                         : sizes.owned_params) *
                          policy.master_element;
  floor.figures = planner::memory_figures(policy, sizes);
  return floor;
}

void check_memory_floor(const plan::RunPlan& plan, int ranks_on_host,
                        std::uint64_t available_bytes, std::string_view batch_setting) {
  if (available_bytes == 0) return;  // the system does not say: nothing to check against
  const MemoryFloor floor = memory_floor(plan);
  const planner::MemoryFigures& f = floor.figures;
  const double per_rank = static_cast<double>(f.total());
  const double needed = per_rank * std::max(1, ranks_on_host);
  if (needed <= static_cast<double>(available_bytes)) return;
  const model::ModelConfig& m = plan.config.model;
  const auto bytes = [](double b) { return describe_bytes(capped(b)); };
  OASES_FAIL(
      "this run needs at least {} of memory on this host ({}), more than its {} "
      "of physical memory. Per rank: {} of parameters and gradients for at least {:.3g} "
      "parameters (model.layers = {}, model.hidden = {}, model.ffn_hidden = {}, "
      "model.vocab_size = {}, over parallel.tp x parallel.pp = {} x {} ranks), and {} of "
      "activations for one micro-batch ({} = {} sequences x model.seq_len = {} x model.hidden "
      "= {}); the optimizer state and most activations come on top. Lower these settings",
      bytes(needed),
      ranks_on_host > 1 ? fmt::format("{} ranks x {}", ranks_on_host, bytes(per_rank)) : "one rank",
      describe_bytes(available_bytes),
      bytes(static_cast<double>(f.params + f.grads - f.offloaded)), floor.parameters, m.layers,
      m.hidden, m.ffn_hidden, m.vocab_size, plan.mesh.tp, plan.mesh.pp,
      bytes(static_cast<double>(f.activations)), batch_setting, plan.micro_batch(), m.seq_len,
      m.hidden);
}

const plan::RunPlan& check_host_memory(const plan::RunPlan& plan, int ranks_on_host,
                                       std::string_view batch_setting) {
  check_memory_floor(plan, ranks_on_host, physical_memory_bytes(), batch_setting);
  return plan;
}

}  // namespace oases::train
