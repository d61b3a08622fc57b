#include "cluster/cluster_profile.h"

#include "core/error.h"
#include "planner/profiler.h"
#include "sim/collective_costs.h"
#include "sim/placement.h"
#include "cluster/cluster_simulation.h"
#include "train/engine.h"
#include "train/profiler.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace oases::cluster {
namespace {

// The degree-k replica's run as `oases profile` runs it: k ranks of tensor parallelism on k / T of
// each sub-batch, fine-grained recomputation, one micro-batch; the other degree-k groups of the
// run (T / k per tensor-parallel group, times the data-parallel replicas) beside it.
plan::RunConfig degree_config(const plan::RunConfig& config, int k, std::int64_t rows) {
  plan::RunConfig c = config;
  const auto T = static_cast<int>(config.parallel.tp);
  c.parallel = plan::ParallelConfig{};
  c.parallel.tp = k;
  c.parallel.dp = config.parallel.dp * (T / k);
  c.parallel.zero = config.parallel.zero;
  c.parallel.schedule = "fine-grained";
  c.train.micro_batch = rows;
  c.train.global_batch = rows * c.parallel.dp;
  return c;
}

// Per segment kind, the median of each action's prices, as planner::TimingCollector takes
// medians of measured times.
void price_schedule(const ShapeOnlyRank& rank, planner::DegreeProfile& degree) {
  using schedule::Op;
  std::map<std::string, std::map<std::string, std::vector<double>>> compute;
  std::map<std::string, std::vector<double>> collectives;
  const ops::Program& program = rank.model->program();
  for (const schedule::Instruction& ins : rank.schedule) {
    if (ins.segment < 0) continue;
    const std::string kind =
        planner::segment_kind(program.segments[static_cast<std::size_t>(ins.segment)].name);
    switch (ins.op) {
      case Op::start:
        if (!ins.replay)
          collectives[kind + (ins.direction == schedule::Direction::forward ? ".fwd_s" : ".bwd_s")]
              .push_back(rank.costs.collective(ins));
        break;
      case Op::forward: compute[kind]["forward"].push_back(rank.costs.compute(ins)); break;
      case Op::recompute: compute[kind]["recompute"].push_back(rank.costs.compute(ins)); break;
      case Op::backward:
        compute[kind][ins.stage == 0 ? "backward0" : "backward1"].push_back(rank.costs.compute(ins));
        break;
      default: break;
    }
  }
  for (const auto& [kind, by_action] : compute) {
    const auto of = [&](const char* action) {
      const auto it = by_action.find(action);
      return it == by_action.end() ? 0.0 : planner::median(it->second);
    };
    degree.segments[kind] = {of("forward"), of("recompute"), of("backward0"), of("backward1")};
  }
  for (const auto& [name, values] : collectives) degree.collectives[name] = planner::median(values);
}

}  // namespace

planner::Profile cluster_profile(const plan::RunConfig& config, const sim::ClusterSpec& cluster) {
  const plan::RunPlan run_plan = plan::make_run_plan(config);
  const schedule::ScheduleSpec& spec = run_plan.schedule;
  const auto T = static_cast<int>(config.parallel.tp);
  const auto dp = static_cast<int>(config.parallel.dp);
  planner::Profile profile = train::profile_of_run(run_plan);
  const std::int64_t sub_batch_rows = config.train.micro_batch / spec.sub_batches;
  // The run's own layout (one pipeline stage's worth): the groups its replicas reduce over.
  sim::RankLayout run = rank_layout(run_plan);
  run.pp = 1;
  sim::check_cluster_holds(cluster, run.world(), cluster.name);
  for (int k = 1; k <= T; k *= 2) {
    const plan::RunPlan degree_plan = plan::make_run_plan(degree_config(config, k, sub_batch_rows * k / T));
    const plan::RunConfig& c = degree_plan.config;
    const sim::RankLayout layout = rank_layout(degree_plan);
    const std::unique_ptr<ShapeOnlyRank> rank = build_shape_only_rank(degree_plan, cluster);
    const model::Model& model = *rank->model;

    planner::DegreeProfile degree;
    degree.degree = k;
    degree.rows = c.train.micro_batch;
    price_schedule(*rank, degree);
    degree.optimizer_s = rank->costs.optimizer_step;
    const auto element = static_cast<std::int64_t>(dtype_size(model.dtype()));
    const auto& layer0 = model.layout().groups().at(1);
    degree.parameter_bytes_per_layer = (layer0.second - layer0.first) * element;
    degree.parameter_bytes = model.param_count() * element;
    degree.overlap_slowdown = cluster.device.overlap_slowdown;
    degree.collective_slowdown = cluster.device.collective_slowdown;
    degree.static_activation_bytes = static_cast<std::int64_t>(model.static_activation_bytes());
    // One layer's gradients over every replica of its shard in the run, data-parallel ones
    // included, while every replica group reduces its own.
    if (k < T || dp > 1) {
      const auto group_of = [&](int r) { return run.tp_replica_group(r, k); };
      const double grad_bytes = static_cast<double>(layer0.second - layer0.first) *
                                static_cast<double>(dtype_size(run_plan.dtypes.gradient_reduce));
      degree.replica_reduce_per_layer_s = sim::collective_seconds(
          cluster, sim::CollectiveOp::all_reduce, grad_bytes, group_of(0), run.every(group_of));
    }
    train::record_segment_shapes(model, degree);
    // The engine's memory per parameter byte at dp = 1 (the simulated figures divide the ZeRO
    // shares over the layout's dp, which this undoes).
    const double parameter_bytes = static_cast<double>(std::max<std::int64_t>(1, degree.parameter_bytes));
    const double share = static_cast<double>(layout.dp);
    const int zero = degree_plan.zero.effective_stage();
    const auto bytes = [](std::size_t b) { return static_cast<double>(b); };
    profile.param_bytes_ratio = bytes(rank->memory.params) * (zero >= 3 ? share : 1) / parameter_bytes;
    profile.grad_bytes_ratio = bytes(rank->memory.grads) * (zero >= 2 ? share : 1) / parameter_bytes;
    profile.optimizer_bytes_ratio =
        bytes(rank->memory.optimizer) * (zero >= 1 ? share : 1) / parameter_bytes;
    profile.degrees.push_back(std::move(degree));
  }
  // Reshards: a sub-batch's rows of degree b gathered from its groups of degree a, every
  // degree-b group of the run at once.
  const double row_bytes = static_cast<double>(config.model.seq_len * config.model.hidden) *
                           static_cast<double>(profile.element_bytes);
  for (int a = 1; a < T; a *= 2)
    for (int b = 2 * a; b <= T; b *= 2) {
      const auto group_of = [&](int r) { return run.tp_subgroup(r, b, a); };
      const double bytes = row_bytes * static_cast<double>(sub_batch_rows * b / T);
      profile.reshards[planner::Profile::reshard_key(a, b)] = sim::collective_seconds(
          cluster, sim::CollectiveOp::all_gather, bytes, group_of(0), run.every(group_of));
    }
  if (profile.ep > 1) {
    const sim::DeviceGroup experts = run.ep_group(0);
    const int tier = cluster.tier_of(experts);
    OASES_ASSERT(tier >= 0, "an expert-parallel group of one device");
    const sim::LinkTier& link = cluster.tiers[static_cast<std::size_t>(tier)];
    profile.expert_link = {link.link_bytes_per_second, link.latency_seconds};
  }
  return profile;
}

}  // namespace oases::cluster
