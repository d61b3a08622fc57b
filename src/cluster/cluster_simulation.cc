#include "cluster/cluster_simulation.h"

#include "comm/communicator.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "planner/cost_model.h"
#include "schedule/schedule.h"
#include "sim/cluster_costs.h"
#include "sim/collective_costs.h"
#include "sim/placement.h"
#include "optim/zero_partition.h"
#include "train/engine.h"
#include "train/zero_partition.h"
#include "plan/rank_schedule.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <utility>

namespace oases::cluster {

sim::RankLayout rank_layout(const plan::RunPlan& plan) {
  sim::RankLayout layout;
  layout.tp = plan.mesh.tp;
  layout.dp = plan.mesh.replicas();
  layout.cp = plan.mesh.cp;
  layout.pp = plan.mesh.pp;
  layout.ep = plan.mesh.ep;
  return layout;
}

namespace {

// The tiers between a group's consecutive devices: groups with the same signature cost the same.
std::vector<int> signature(const sim::ClusterSpec& cluster, const sim::DeviceGroup& group) {
  std::vector<int> tiers;
  for (std::size_t i = 1; i < group.size(); ++i) tiers.push_back(cluster.tier_between(group[i - 1], group[i]));
  return tiers;
}

// The place of `rank` in the group of `layout` that sums bucket `b`'s gradients, as the engine
// finds it from its communicators (TrainingEngine::reduction_group): an MoE layer's experts
// over the ranks with the same experts, a layer below the tensor-parallel degree over its
// replicas, anything else over the data-parallel group unless local SGD sums nothing.
train::GroupPlace reduction_place(const plan::RunPlan& plan, const sim::RankLayout& layout,
                                  const model::Model& model, const model::Model::Bucket& b) {
  const int rank = plan.mesh.rank;
  sim::DeviceGroup group;
  if (b.experts && layout.ep > 1) group = layout.expert_replica_group(rank, model.layer_degree(b.layer));
  else if (b.layer >= 0 && model.layer_degree(b.layer) < layout.tp)
    group = layout.tp_replica_group(rank, model.layer_degree(b.layer));
  else if (!plan.local_sgd) group = layout.dp_group(rank);
  const auto at = std::ranges::find(group, rank);
  if (group.size() <= 1 || at == group.end()) return {};
  return {static_cast<int>(group.size()), static_cast<int>(at - group.begin())};
}

// What the engine's memory figures would say of this rank (planner::memory_figures), from the
// shape-only model: the same ZeRO partition, the optimizer over the same owned layout (its
// buffers are mapped, never touched), the same schedule.
planner::MemoryFigures rank_memory(const plan::RunPlan& plan, const sim::RankLayout& layout,
                                   const ShapeOnlyRank& r) {
  const model::Model& model = *r.model;
  const optim::FlatLayout whole = train::flat_layout(model.layout(), model.dtype());
  train::ZeroPartition zero;
  if (plan.zero.stage > 0)
    zero = train::ZeroPartition(model.grad_buckets(), whole, plan.optimizer,
                                [&](const model::Model::Bucket& b) {
                                  return reduction_place(plan, layout, model, b);
                                });
  const std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(
      plan.optimizer, optim::owned_layout(whole, zero.owned_ranges(model.grad_buckets())));
  planner::MemorySizes sizes;
  sizes.params = model.param_count();
  sizes.owned_params = zero.owned_elements(model.grad_buckets());
  if (plan.schedule.sharded_params)
    sizes.gathered_bytes = zero.peak_gathered_bytes(r.schedule, model, dtype_size(model.activation_dtype()));
  sizes.optimizer_state = optimizer->state_bytes();
  sizes.activations =
      model.static_activation_bytes() + schedule::peak_activation_bytes(model.program(), r.schedule);
  if (plan.zero.offload != plan::Offload::none) {
    sizes.offload_store = sizes.optimizer_state;
    if (plan.zero.offload == plan::Offload::optimizer_and_params)
      sizes.offload_store += static_cast<std::size_t>(sizes.params) * dtype_size(model.dtype());
  }
  return planner::memory_figures(plan.memory_policy(), sizes);
}

// The rank's shape-only model, built as the engine builds it, with ShapeOnlyCommunicator groups
// of its sizes and positions.
void build_model(const plan::RunPlan& plan, const sim::RankLayout& layout, ShapeOnlyRank& r) {
  const int rank = plan.mesh.rank;
  const int tp_rank = layout.tp_rank(rank);
  r.tp = std::make_unique<comm::ShapeOnlyCommunicator>(tp_rank, layout.tp, "tp");
  model::ModelOptions options = plan.model_options(r.stage);
  options.shape_only = true;
  options.tp = r.tp.get();
  if (layout.ep > 1) {
    r.ep = std::make_unique<comm::ShapeOnlyCommunicator>(layout.dp_rank(rank) % layout.ep, layout.ep, "ep");
    options.ep = r.ep.get();
  }
  if (layout.cp > 1) {
    r.cp = std::make_unique<comm::ShapeOnlyCommunicator>(layout.dp_rank(rank) % layout.cp,
                                                         layout.cp, "cp");
    options.cp = r.cp.get();
  }
  ShapeOnlyRank* self = &r;
  options.tp_subgroup = [self, tp_rank, tp = layout.tp](int span, int stride) -> comm::Communicator& {
    if (span == tp && stride == 1) return *self->tp;
    auto& group = self->subgroups[{span, stride}];
    // Members share tp_rank / span and tp_rank % stride, ordered by tp_rank (comm/mesh.cc).
    if (!group)
      group = std::make_unique<comm::ShapeOnlyCommunicator>(tp_rank % span / stride, span / stride,
                                                            fmt::format("tp[{}/{}]", span, stride));
    return *group;
  };
  r.model = std::make_unique<model::Model>(plan.config.model, std::move(options));
}

// Compute and optimizer prices from the profile, for a cluster that computes from one.
void price_from_profile(const plan::RunPlan& plan, const sim::RankLayout& layout,
                        const planner::Profile& profile, ShapeOnlyRank& r) {
  const ops::Program& program = r.model->program();
  planner::check_profiled_kinds(profile, program);
  r.costs.compute = planner::profiled_compute(
      profile, program,
      static_cast<double>(plan.config.train.micro_batch) / plan.schedule.sub_batches, layout.tp);
  // Profiled backward stages are whole: a zero-bubble BackwardWeight takes about half of
  // stage 0 (its weight-gradient products, as many as the input gradient's).
  r.costs.weight_gradient_share = 0.5;
  const planner::DegreeProfile& whole = *profile.at_degree(layout.tp);
  double parameter_bytes = static_cast<double>(r.model->param_count() * dtype_size(r.model->dtype()));
  if (plan.zero.effective_stage() >= 1) parameter_bytes /= layout.dp;
  r.costs.optimizer_step = whole.optimizer_s * parameter_bytes /
                           static_cast<double>(std::max<std::int64_t>(1, whole.parameter_bytes));
  r.costs.overlap_slowdown = whole.overlap_slowdown;
  r.costs.collective_slowdown = whole.collective_slowdown;
  // Compressed sets at the rate measured here; an encoding the profile did not time keeps the
  // device's memory-bandwidth price.
  r.costs.codec = planner::profiled_codec(profile, program, std::move(r.costs.codec));
}

}  // namespace

void schedule_shape_only_rank(const plan::RunPlan& plan, bool verify, ShapeOnlyRank& r) {
  const ops::Program& program = r.model->program();
  r.schedule = plan::rank_schedule(plan, program, plan.pass_spec(plan.schedule.micro_batches, true),
                                   r.stage, verify);
  r.memory = rank_memory(plan, rank_layout(plan), r);

  // The model's products over a step: forward and every backward part of each segment instance,
  // once per sub-batch of every micro-batch.
  double flops = 0;
  for (const ops::SegmentShape& shape : program.segments) {
    if (!shape.work.known) continue;
    flops += shape.work.forward().flops() + shape.work.backward_weight.flops();
    for (const ops::Work& part : shape.work.backward_input) flops += part.flops();
  }
  r.flops_per_step = flops * plan.schedule.sub_batches * plan.schedule.micro_batches;
}

std::unique_ptr<ShapeOnlyRank> shape_only_rank(const plan::RunPlan& plan, bool verify) {
  auto r = std::make_unique<ShapeOnlyRank>();
  r->rank = plan.mesh.rank;
  r->stage = plan.mesh.pp_rank();
  build_model(plan, rank_layout(plan), *r);
  schedule_shape_only_rank(plan, verify, *r);
  return r;
}

std::unique_ptr<ShapeOnlyRank> build_shape_only_rank(
    const plan::RunPlan& plan, const sim::ClusterSpec& cluster, const planner::Profile* profile,
    bool verify, const std::shared_ptr<sim::CollectivePriceCache>& collective_prices) {
  std::unique_ptr<ShapeOnlyRank> r = shape_only_rank(plan, verify);
  const sim::RankLayout layout = rank_layout(plan);
  sim::ClusterRank at;
  at.layout = layout;
  at.rank = r->rank;
  at.products = plan.dtypes.compute;
  at.grad_element_bytes = dtype_size(plan.dtypes.gradient_reduce);
  at.zero = plan.zero.effective_stage();
  r->costs = sim::cluster_costs(cluster, r->model->program(), at, collective_prices);
  if (cluster.device.computes_from_profile()) {
    OASES_ASSERT(profile != nullptr, "the cluster {} computes from a profile", cluster.name);
    price_from_profile(plan, layout, *profile, *r);
  }
  return r;
}

sim::ClusterSpec calibrate_replica_link(const sim::ClusterSpec& cluster,
                                        const planner::Profile& profile) {
  const planner::ReplicaLink& link = profile.replica_link;
  if (link.ranks < 2 || link.ranks > cluster.devices() || link.seconds <= 0) return cluster;
  sim::DeviceGroup group(static_cast<std::size_t>(link.ranks));
  std::iota(group.begin(), group.end(), 0);
  sim::ClusterSpec out = cluster;
  sim::LinkTier& tier = out.tiers.at(static_cast<std::size_t>(out.tier_of(group)));
  const sim::EfficiencyCurve given = tier.efficiency;
  tier.efficiency = {};
  const sim::RingPath ring = sim::ring_path(out, group);
  const double n = link.ranks, bytes = static_cast<double>(link.bytes);
  const double on_the_wire = link.seconds - 2 * (n - 1) * ring.latency_seconds;
  const double at_full_rate = 2 * (n - 1) / n * bytes / ring.bytes_per_second;
  const double fraction =
      on_the_wire > 0 ? std::clamp(at_full_rate / on_the_wire, 1e-3, 1.0) : 1.0;
  for (std::size_t i = 0; i < given.x.size() && given.x[i] < bytes; ++i) {
    tier.efficiency.x.push_back(given.x[i]);
    tier.efficiency.fraction.push_back(given.fraction[i]);
  }
  tier.efficiency.x.push_back(bytes);
  tier.efficiency.fraction.push_back(fraction);
  return out;
}

bool cluster_layout_is_symmetric(const plan::RunPlan& plan, const sim::ClusterSpec& cluster) {
  const sim::RankLayout layout = rank_layout(plan);
  std::vector<std::function<sim::DeviceGroup(int)>> kinds = {
      [&](int r) { return layout.tp_group(r); }, [&](int r) { return layout.dp_group(r); },
      [&](int r) { return layout.pp_group(r); }};
  if (layout.cp > 1) kinds.push_back([&](int r) { return layout.cp_group(r); });
  if (layout.ep > 1) {
    kinds.push_back([&](int r) { return layout.ep_group(r); });
    kinds.push_back([&](int r) { return layout.expert_replica_group(r, layout.tp); });
    kinds.push_back([&](int r) { return layout.expert_replica_group(r, 1); });
  }
  for (int span = 2; span <= layout.tp; ++span)
    for (int stride = 1; stride < span; ++stride)
      if (layout.tp % span == 0 && span % stride == 0)
        kinds.push_back([&, span, stride](int r) { return layout.tp_subgroup(r, span, stride); });
  for (int degree = 1; degree < layout.tp; ++degree)
    if (layout.tp % degree == 0)
      kinds.push_back([&, degree](int r) { return layout.tp_replica_group(r, degree); });
  for (const auto& group_of : kinds) {
    const std::vector<int> first = signature(cluster, group_of(0));
    for (int r = 1; r < layout.world(); ++r)
      if (signature(cluster, group_of(r)) != first) return false;
  }
  return true;
}

namespace {

// simulate_cluster of each of `configs`, which differ in train.global_batch alone: every rank's
// model and prices are built once (again only where the activation slots' lanes change), its
// schedule and memory for each.
std::vector<ClusterSimulation> simulate_configs(const std::vector<plan::RunConfig>& configs,
                                                const sim::ClusterSpec& given,
                                                const ClusterSimulationOptions& options) {
  const plan::RunConfig& config = configs.front();
  const sim::ClusterSpec cluster =
      given.device.computes_from_profile() && options.profile != nullptr
          ? calibrate_replica_link(given, *options.profile)
          : given;
  std::vector<plan::RunPlan> plans;
  for (const plan::RunConfig& c : configs) plans.push_back(plan::make_run_plan(c));
  const plan::RunPlan& plan = plans.front();
  const sim::RankLayout layout = rank_layout(plan);
  sim::check_cluster_holds(cluster, layout.world(), cluster.name);
  const bool profiled = cluster.device.computes_from_profile();
  OASES_CHECK(!profiled || options.profile != nullptr,
              "the cluster {} computes from a profile of this machine (its device has no "
              "peak_tflops); give `oases simulate` the config's profile (--profile, written by "
              "`oases profile`) or a cluster with device.peak_tflops",
              cluster.name);
  if (profiled) plan.check_profile(*options.profile, "the profile");
  const std::string dtype(sim::precision_key(plan.dtypes.compute));
  const auto peak = cluster.device.peak_flops.find(dtype);
  OASES_CHECK(profiled || peak != cluster.device.peak_flops.end(),
              "train.precision = \"{}\" needs device.peak_tflops.{} in the cluster {}; it states {}",
              config.train.precision, dtype, cluster.name,
              fmt::join([&] {
                std::vector<std::string> names;
                for (const auto& [name, value] : cluster.device.peak_flops) names.push_back(name);
                return names;
              }(), ", "));

  std::vector<ClusterSimulation> outs(configs.size());
  const bool folded =
      options.fold &&
      (options.symmetric ? *options.symmetric : cluster_layout_is_symmetric(plan, cluster));
  for (std::size_t k = 0; k < configs.size(); ++k) {
    ClusterSimulation& out = outs[k];
    out.world = layout.world();
    out.folded = folded;
    out.tokens_per_step =
        static_cast<double>(configs[k].train.global_batch * configs[k].model.seq_len);
    out.peak_flops_per_device = profiled ? options.profiled_peak_flops : peak->second;
  }

  // Pipelines of ranks (one per tensor- and data-parallel position), stages in order.
  std::vector<std::vector<int>> pipelines;
  const int positions = folded ? 1 : layout.tp * layout.dp;
  for (int position = 0; position < positions; ++position) {
    std::vector<int> ranks;
    for (int stage = 0; stage < layout.pp; ++stage)
      ranks.push_back(layout.rank_of(position % layout.tp, position / layout.tp, stage));
    pipelines.push_back(std::move(ranks));
  }
  for (const std::vector<int>& pipeline : pipelines) {
    std::vector<std::unique_ptr<ShapeOnlyRank>> stages;
    std::vector<sim::CostModel> costs;
    // The models depend on the micro-batch count only through the activation slots' lanes
    // (RunPlan::model_options): they are built again where those differ.
    int built_lanes = 0;
    for (std::size_t k = 0; k < configs.size(); ++k) {
      ClusterSimulation& out = outs[k];
      const int lanes = schedule::slot_lanes(plans[k].schedule);
      if (k == 0 || lanes != built_lanes) {
        stages.clear();
        costs.clear();
        for (int rank : pipeline) {
          stages.push_back(build_shape_only_rank(plans[k].for_rank(rank), cluster, options.profile,
                                                 options.verify_schedules,
                                                 profiled ? nullptr : options.collective_prices));
          costs.push_back(stages.back()->costs);
        }
        built_lanes = lanes;
      } else {
        for (std::size_t s = 0; s < stages.size(); ++s)
          schedule_shape_only_rank(plans[k].for_rank(pipeline[s]), options.verify_schedules,
                                   *stages[s]);
      }
      std::vector<schedule::Schedule> schedules;
      for (std::size_t s = 0; s < stages.size(); ++s)
        schedules.push_back(std::move(stages[s]->schedule));
      sim::MultiRankResult result = sim::simulate_ranks(schedules, costs, options.record_events);
      out.step_seconds = std::max(out.step_seconds, result.step_seconds);
      for (std::size_t s = 0; s < stages.size(); ++s) {
        SimulatedRank rank;
        rank.rank = stages[s]->rank;
        rank.stage = stages[s]->stage;
        rank.time = result.ranks[s];
        rank.memory = stages[s]->memory;
        out.ranks.push_back(rank);
        // Every rank of a stage does what its representative does.
        out.model_flops_per_step +=
            stages[s]->flops_per_step * (folded ? layout.tp * layout.dp : 1);
      }
      for (sim::SimEvent& event : result.events) {
        event.rank = pipeline[static_cast<std::size_t>(event.rank)];
        out.events.push_back(std::move(event));
      }
    }
  }
  for (ClusterSimulation& out : outs)
    std::sort(out.ranks.begin(), out.ranks.end(),
              [](const SimulatedRank& a, const SimulatedRank& b) { return a.rank < b.rank; });
  return outs;
}

}  // namespace

std::vector<ClusterSimulation> simulate_cluster_at(
    const plan::RunConfig& config, const sim::ClusterSpec& given,
    const std::vector<std::int64_t>& micro_batch_counts, const ClusterSimulationOptions& options) {
  OASES_ASSERT(!micro_batch_counts.empty(), "simulate_cluster_at needs a micro-batch count");
  // The configs of the counts: the same but for the global batch.
  std::vector<plan::RunConfig> configs;
  for (const std::int64_t count : micro_batch_counts) {
    plan::RunConfig c = config;
    c.train.global_batch = count * config.train.micro_batch * config.parallel.dp;
    configs.push_back(std::move(c));
  }
  return simulate_configs(configs, given, options);
}

ClusterSimulation simulate_cluster(const plan::RunConfig& config, const sim::ClusterSpec& given,
                                   const ClusterSimulationOptions& options) {
  return simulate_configs({config}, given, options).front();
}

std::string format_cluster_simulation(const ClusterSimulation& s, const sim::ClusterSpec& cluster) {
  const double tflops = s.model_flops_per_step / s.step_seconds / s.world / 1e12;
  std::string out = fmt::format(
      "simulated step {:.4f} s on {} ({} of {} devices{}): {:.0f} tokens/s, {}\n", s.step_seconds,
      cluster.name, s.world, cluster.devices(),
      s.folded ? "; one rank per pipeline stage stands for its stage (symmetric layout)" : "",
      s.tokens_per_second(),
      s.peak_flops_per_device > 0
          ? fmt::format("MFU {:.1f}% ({:.1f} TFLOP/s per device of model FLOPs)", 100 * s.mfu(), tflops)
          : fmt::format("{:.3f} TFLOP/s per device of model FLOPs (compute from the profile)", tflops));
  const auto gib = [](double bytes) { return bytes / (1 << 30); };
  out += fmt::format("{:>6} {:>5} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10}\n", "rank", "stage",
                     "step s", "compute s", "exposed comm", "bubble s", "p2p s", "memory GiB");
  std::vector<std::string> too_big;
  for (const SimulatedRank& r : s.ranks) {
    out += fmt::format("{:>6} {:>5} {:>10.4f} {:>10.4f} {:>12.4f} {:>10.4f} {:>10.4f} {:>10.2f}\n",
                       r.rank, r.stage, r.time.step_seconds, r.time.compute_seconds,
                       r.time.exposed_comm_seconds, r.time.bubble_seconds, r.time.p2p_seconds,
                       gib(r.memory.total()));
    if (r.memory.total() > cluster.device.memory_bytes)
      too_big.push_back(fmt::format(
          "rank {} (stage {}) does not fit: {:.2f} GiB (parameters {:.2f}, gradients {:.2f}, "
          "optimizer {:.2f}, activations {:.2f}) on a {:.2f} GiB {}",
          r.rank, r.stage, gib(r.memory.total()), gib(r.memory.params), gib(r.memory.grads),
          gib(r.memory.optimizer), gib(r.memory.activations), gib(cluster.device.memory_bytes),
          cluster.device.name));
  }
  for (const std::string& line : too_big) out += line + "\n";
  return out;
}

void write_simulation_trace(const ClusterSimulation& s, const std::string& path) {
  using json = nlohmann::json;
  json events = json::array();
  const char* lanes[] = {"compute", "tensor-parallel collectives", "data-parallel", "messages"};
  for (const SimulatedRank& r : s.ranks) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r.rank},
                      {"args", {{"name", fmt::format("rank {} (stage {})", r.rank, r.stage)}}}});
    for (int lane = 0; lane < 4; ++lane)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r.rank}, {"tid", lane},
                        {"args", {{"name", lanes[lane]}}}});
  }
  for (const sim::SimEvent& e : s.events)
    events.push_back({{"ph", "X"}, {"name", e.name}, {"pid", e.rank},
                      {"tid", static_cast<int>(e.lane)}, {"ts", e.begin * 1e6},
                      {"dur", (e.end - e.begin) * 1e6}});
  write_file_atomically(path, json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump());
}

}  // namespace oases::cluster
