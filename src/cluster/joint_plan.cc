#include "cluster/joint_plan.h"

#include "cluster/cluster_simulation.h"
#include "core/error.h"
#include "plan/run_plan.h"
#include "planner/chain_solver.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"
#include "sim/collective_costs.h"
#include "sim/pipeline_sim.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

namespace oases::cluster {

namespace {

// A composed pipeline's estimate bounds the others raised by this share, so that one a little
// below its exact estimate does not prune what the exact estimate would keep (a heuristic:
// tests/cluster/joint_plan_test.cc checks that the choice matches pricing everything exactly).
constexpr double kComposedMargin = 0.05;

constexpr const char* kStageBounded =
    "bounded: its schedule on one stage alone is slower than the best found";

using Settings = std::vector<std::pair<std::string, std::string>>;

// The settings the search chooses, which --fix may keep.
constexpr std::string_view kSearchedSettings[] = {
    "parallel.tp",           "parallel.cp",           "parallel.dp",
    "parallel.pp",           "parallel.cp_kind",      "parallel.schedule",
    "parallel.sub_batches",  "train.micro_batch",     "parallel.pipeline",
    "parallel.virtual_stages", "parallel.sequence_parallel", "parallel.zero",
    "parallel.offload",      "parallel.recompute",    "parallel.activation_compression"};

bool is_fixed(const JointSearchOptions& options, const std::string& key) {
  return std::ranges::find(options.fixed, key) != options.fixed.end();
}

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The mesh degrees of one layout.
struct Layout {
  std::int64_t tp = 1, cp = 1, dp = 1, pp = 1;
};

// A global choice: everything but the per-layer options.
struct Global {
  Layout layout;
  std::string cp_kind;  // where cp > 1
  std::string schedule;
  std::int64_t sub_batches = 1;
  std::int64_t micro_batch = 1;
  std::string pipeline;  // where pp > 1
  std::int64_t virtual_stages = 1;
  bool sequence_parallel = false;
  std::int64_t zero = 0;
  std::string offload = "none";
};

// A per-layer option: recomputation policy and activation compression words.
struct LayerOption {
  std::string recompute;
  std::string compression;
};

// The settings of a global choice with per-layer words `recompute` and `compression` (one
// word, or one per layer), in a fixed order; the search's keys only.
Settings settings_of(const Global& g, const std::string& recompute,
                     const std::string& compression) {
  Settings s{{"parallel.tp", std::to_string(g.layout.tp)},
             {"parallel.cp", std::to_string(g.layout.cp)},
             {"parallel.dp", std::to_string(g.layout.dp)},
             {"parallel.pp", std::to_string(g.layout.pp)}};
  if (g.layout.cp > 1) s.emplace_back("parallel.cp_kind", g.cp_kind);
  if (g.layout.pp > 1) {
    s.emplace_back("parallel.pipeline", g.pipeline);
    s.emplace_back("parallel.virtual_stages", std::to_string(g.virtual_stages));
  }
  s.emplace_back("parallel.schedule", g.schedule);
  s.emplace_back("parallel.sub_batches", std::to_string(g.sub_batches));
  s.emplace_back("train.micro_batch", std::to_string(g.micro_batch));
  s.emplace_back("parallel.sequence_parallel", g.sequence_parallel ? "true" : "false");
  s.emplace_back("parallel.zero", std::to_string(g.zero));
  s.emplace_back("parallel.offload", g.offload);
  s.emplace_back("parallel.recompute", recompute);
  s.emplace_back("parallel.activation_compression", compression);
  return s;
}

// `base` with the global choice and per-layer words applied to its fields (what
// apply_settings does through the config parser, without parsing: the search makes many).
plan::RunConfig config_of(const plan::RunConfig& base, const Global& g,
                          const std::string& recompute, const std::string& compression) {
  plan::RunConfig c = base;
  c.parallel.tp = g.layout.tp;
  c.parallel.cp = g.layout.cp;
  c.parallel.dp = g.layout.dp;
  c.parallel.pp = g.layout.pp;
  if (g.layout.cp > 1) c.parallel.cp_kind = g.cp_kind;
  if (g.layout.pp > 1) {
    c.parallel.pipeline = g.pipeline;
    c.parallel.virtual_stages = g.virtual_stages;
  }
  c.parallel.schedule = g.schedule;
  c.parallel.sub_batches = g.sub_batches;
  c.train.micro_batch = g.micro_batch;
  c.parallel.sequence_parallel = g.sequence_parallel;
  c.parallel.zero = g.zero;
  c.parallel.offload = g.offload;
  c.parallel.recompute = recompute;
  c.parallel.activation_compression = compression;
  return c;
}

// `g` on one pipeline stage without data parallelism (dp 1, pp 1, no ZeRO, no offload): what a
// layer costs on its tensor- and context-parallel ranks alone.
Global on_one_stage(Global g) {
  g.layout.dp = 1;
  g.layout.pp = 1;
  g.zero = 0;
  g.offload = "none";
  return g;
}

// The schedule families and the recomputation words each allows per layer.
struct Family {
  const char* schedule;
  std::vector<std::int64_t> sub_batches;
  std::vector<const char*> recompute;
  // Whether one stage alone keeps more than one micro-batch's activations at once (the next
  // micro-batch's forward runs during a backward), so that its memory grows with the
  // micro-batches where a composed pipeline's estimate takes it to be flat.
  bool overlaps_micro_batches = false;
};
const std::vector<Family>& families() {
  static const std::vector<Family> all{
      {"megatron", {1}, {"none", "selective", "full"}},
      {"cross-pass", {1, 2}, {"none", "selective", "full"}},
      {"fine-grained", {1}, {"none", "fine-grained"}},
      {"oases", {2, 1}, {"none", "fine-grained"}},
      {"oases-interleaved", {2}, {"none", "fine-grained"}, true},
  };
  return all;
}
const Family& family_of(const std::string& schedule) {
  return *std::ranges::find_if(families(), [&](const Family& f) { return schedule == f.schedule; });
}

// The reason an error excludes a candidate for: the first setting its message names.
std::string reason_of(const std::string& message) {
  // The shape-only model maps (never touches) its parameter and gradient buffers; a host whose
  // kernel refuses mappings larger than its memory cannot build the largest layouts.
  if (message.starts_with("out of host memory"))
    return "could not be simulated on this host (address space for the shape-only model)";
  static const char* sections[] = {"parallel.", "train.", "model."};
  std::size_t best = std::string::npos;
  for (const char* section : sections) best = std::min(best, message.find(section));
  if (best == std::string::npos) return "cannot run";
  std::size_t end = best;
  while (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) ||
                                  message[end] == '.' || message[end] == '_'))
    ++end;
  std::string key = message.substr(best, end - best);
  while (!key.empty() && key.back() == '.') key.pop_back();
  return "cannot run (" + key + ")";
}

// Step time and memory of a run, affine in its layers at a fixed micro-batch count: what one
// more layer adds (per_layer) and what stays (base).
struct Affine {
  double base = 0, per_layer = 0;
  double at(double layers) const { return base + per_layer * layers; }
};
struct OptionCost {
  Affine step;                       // seconds
  Affine memory;                     // bytes per rank (the rank that needs the most)
  Affine activations;                // of them, activations
};

// A figure of a run that is affine in its layers n and in its micro-batches m separately (the
// step: each micro-batch and each layer adds its time), fitted on a 2 x 2 grid of both.
struct Bilinear {
  double c0 = 0, cn = 0, cm = 0, cnm = 0;
  double at(double n, double m) const { return c0 + cn * n + cm * m + cnm * n * m; }
  // Through f11 = f(n1, m1), f21 = f(n2, m1), f12 = f(n1, m2), f22 = f(n2, m2); m1 == m2 fits
  // the figure as constant in m.
  static Bilinear fit(double n1, double n2, double m1, double m2, double f11, double f21,
                      double f12, double f22) {
    Bilinear b;
    const double dn = n2 - n1;
    const double slope1 = (f21 - f11) / dn, slope2 = (f22 - f12) / dn;
    const double dm = m2 - m1;
    b.cnm = dm != 0 ? (slope2 - slope1) / dm : 0;
    b.cn = slope1 - b.cnm * m1;
    const double at1 = f11 - slope1 * n1, at2 = f12 - slope2 * n1;  // the figure at n = 0
    b.cm = dm != 0 ? (at2 - at1) / dm : 0;
    b.c0 = at1 - b.cm * m1;
    return b;
  }
  // Affine in n at micro-batch count m.
  Affine at_micro_batches(double m) const { return Affine{c0 + cm * m, cn + cnm * m}; }
};
// One pipeline stage (or a whole run without a pipeline) priced on reduced models: step, peak
// memory and activation memory of its rank that needs the most, bilinear in layers and
// micro-batches.
struct StagePrice {
  Bilinear step, memory, activations;
  planner::MemoryBytes memory_at_1;  // by kind, at the smallest reduced model
  double exposed_at_1 = 0;
};
// How a candidate with a pipeline is priced: by reduced simulations of the pipeline itself
// (exact: every stage's schedule and messages), or composed from one stage's reduced
// simulations without the pipeline and the pipeline's orders timed on that stage's cost per
// micro-batch (sim/pipeline_sim.h).
enum class Pricing { composed, exact };

// A pipeline's orders timed with every chunk's forward and backward proportional to one cost
// per chunk (the backward twice the forward; ZB-H1's I and W half the backward each): the step
// is about per_chunk x that cost + per_transfer x a transfer's time (exact while the critical
// path does not change between the two), and the busiest rank keeps `most_live` chunks'
// activations (schedule::max_in_flight).
struct PipelineShape {
  double per_chunk = 0, per_transfer = 0, most_live = 1;
};
// The micro-batches (chunks, when interleaved) each rank of a pipeline keeps in flight at most:
// until its backward, or where the backward splits until its weight gradient.
std::vector<int> in_flight(const schedule::PipelineSpec& spec,
                           const schedule::PipelineOrders& orders) {
  return spec.splits_backward() ? schedule::max_in_flight_until_weight_gradient(orders)
                                : schedule::max_in_flight(orders);
}

PipelineShape pipeline_shape(const schedule::PipelineSpec& spec) {
  const schedule::PipelineOrders orders = schedule::pipeline_orders(spec);
  const auto timed = [&](double chunk, double p2p) {
    sim::PipelineCosts costs;
    costs.forward = chunk / 3;
    costs.backward = 2 * chunk / 3;
    costs.backward_input = chunk / 3;
    costs.backward_weight = chunk / 3;
    costs.p2p = p2p;
    return sim::simulate_pipeline(spec, orders, costs).makespan;
  };
  PipelineShape shape;
  shape.per_chunk = timed(1, 0);
  // A transfer a tenth of a chunk: the order of the actions stays that of chunk-bound steps.
  shape.per_transfer = (timed(1, 0.1) - shape.per_chunk) / 0.1;
  shape.most_live = std::ranges::max(in_flight(spec, orders));
  return shape;
}

class Search {
 public:
  Search(const plan::RunConfig& config, const sim::ClusterSpec& cluster,
         const std::vector<planner::Profile>& profiles, const JointSearchOptions& options)
      : base_(config), cluster_(cluster), profiles_(profiles), options_(options) {
    base_.parallel.plan = "uniform";
    base_.parallel.pipeline_layers = "uniform";
    base_.parallel.recompute_every = 0;
    world_ = config.parallel.tp * config.parallel.cp * config.parallel.dp * config.parallel.pp;
    for (const std::string& key : options.fixed)
      OASES_CHECK(std::ranges::find(kSearchedSettings, key) != std::end(kSearchedSettings),
                  "--fix {}: not a setting the joint search chooses; valid: {}", key,
                  fmt::join(kSearchedSettings, ", "));
    limit_ = options.memory_limit > 0 ? options.memory_limit
             : config.parallel.memory_limit > 0
                 ? config.parallel.memory_limit
                 : static_cast<std::int64_t>(cluster.device.memory_bytes);
  }

  JointPlanReport run();

 private:
  // What one worker counts, merged into the report at the end.
  struct Tally {
    std::int64_t priced = 0, simulations = 0;
    std::map<std::string, std::int64_t> excluded;
    std::map<std::string, std::string> excluded_example;
    std::int64_t least_memory = std::numeric_limits<std::int64_t>::max();
    // The layouts that need the least memory (bytes by estimate, summary), fewest first.
    std::vector<std::pair<std::int64_t, std::string>> smallest;
    void exclude(const std::string& reason, const std::string& example) {
      ++excluded[reason];
      excluded_example.try_emplace(reason, example);
    }
    void note_memory(std::int64_t bytes, const std::string& summary) {
      least_memory = std::min(least_memory, bytes);
      smallest.emplace_back(bytes, summary);
      std::ranges::sort(smallest);
      if (smallest.size() > 3) smallest.resize(3);
    }
  };
  // A global choice whose fastest option does not fit: the state its chain starts from.
  struct Pending {
    Global global;
    std::vector<LayerOption> options;
    std::vector<bool> valid;
    std::vector<std::optional<OptionCost>> costs;
    std::size_t fastest = 0;
    const planner::Profile* profile = nullptr;
    Pricing pricing = Pricing::composed;
    double bound = 0;  // the fastest option's step: no mix of options is faster (heuristic)
  };
  struct Priced {
    bool fastest_fits = false;       // every layer at the fastest option fits
    std::optional<Pending> pending;  // set instead of the rest when it does not
    Global global;
    std::vector<LayerOption> layers;  // the chain's choice, per layer
    double step = 0;
    std::int64_t memory = 0;
    bool composed = false;  // priced by a composed pipeline (see Pricing)
  };

  std::vector<Layout> layouts() const;
  std::vector<Global> globals_of(const Layout& layout) const;
  // A lower bound on the step of a global choice at its fastest option: the compute of the
  // busiest pipeline stage (no recomputation), its fill and drain, and under megatron its
  // tensor-parallel collectives, which nothing overlaps. nullopt where the layout cannot be
  // built (the estimate then says why).
  std::optional<double> step_bound(const Global& g, Tally& tally) const;
  // A closer estimate from below, for the choices step_bound leaves: the family's schedule
  // simulated on one stage without data parallelism, ZeRO or pipeline (unit_price), its time
  // per micro-batch on the busiest stage's layers, through the pipeline's orders without
  // transfers. Not a strict bound (the stage's collectives and the head are priced as the
  // simulator prices them); data parallelism, ZeRO and transfers only add to it.
  std::optional<double> stage_bound(const Global& g, Tally& tally) const;
  // Seconds per micro-batch of one layer and of the rest (embedding, head), from the priced
  // instructions of a one-stage model of 1 and 2 layers; keyed by what they depend on.
  struct LayerCompute {
    double per_layer = 0, rest = 0;
  };
  std::optional<LayerCompute> layer_compute(const Global& g, Tally& tally) const;
  mutable std::mutex compute_mutex_;
  mutable std::map<std::string, std::optional<LayerCompute>> compute_cache_;
  // The (ZeRO stage, offload) pairs to try for a layout: every stage without offload, then
  // with each offload (price_memory_steps stops before offload once something fits).
  std::vector<std::pair<std::int64_t, std::string>> memory_steps(const Layout& layout) const;
  // The profile that prices `config`, or nullptr; excluded reason set when none does.
  const planner::Profile* profile_for(const plan::RunConfig& config, std::string& why) const;
  // Simulates `config` reduced to `layers` layers at each of `micro_batches` micro-batch
  // counts (one model per rank for all of them).
  std::vector<ClusterSimulation> simulate_reduced(const plan::RunConfig& config,
                                                  std::int64_t layers,
                                                  const std::vector<std::int64_t>& micro_batches,
                                                  const planner::Profile* profile,
                                                  Tally& tally) const;
  // The reduced models of `config` at unit and 2 unit layers, ma and mb micro-batches.
  StagePrice price_stage(const plan::RunConfig& config, std::int64_t unit, std::int64_t ma,
                         std::int64_t mb, const planner::Profile* profile, Tally& tally) const;
  std::optional<OptionCost> price_option(const plan::RunConfig& config,
                                         const planner::Profile* profile, Tally& tally,
                                         Pricing pricing) const;
  // The pipeline of `config` composed from its stage (see Pricing); nullopt where the stage
  // alone cannot be built (then priced exactly).
  std::optional<OptionCost> compose_pipeline(const plan::RunConfig& config,
                                             const plan::RunPlan& plan, Tally& tally) const;
  // An option's cost from the fastest option's, scaled by what each costs per layer and
  // micro-batch on one stage without data parallelism (unit_price); the composed pricing of a
  // chain's options.
  std::optional<OptionCost> scaled_option(const OptionCost& fastest, const Global& g,
                                          const LayerOption& fastest_option,
                                          const LayerOption& option, Tally& tally) const;
  std::optional<StagePrice> unit_price(const Global& g, const LayerOption& option,
                                       Tally& tally) const;
  // pipeline_shape of each spec met, cached.
  PipelineShape shape_of(const schedule::PipelineSpec& spec) const {
    const auto key = std::tuple{static_cast<int>(spec.kind), spec.stages, spec.virtual_stages,
                                spec.micro_batches};
    {
      std::lock_guard lock(stage_mutex_);
      if (const auto it = shape_cache_.find(key); it != shape_cache_.end()) return it->second;
    }
    const PipelineShape shape = pipeline_shape(spec);
    std::lock_guard lock(stage_mutex_);
    shape_cache_.emplace(key, shape);
    return shape;
  }
  mutable std::map<std::tuple<int, int, int, int>, PipelineShape> shape_cache_;
  // in_flight of each spec met, cached.
  std::vector<int> in_flight_of(const schedule::PipelineSpec& spec) const {
    const auto key = std::tuple{static_cast<int>(spec.kind), spec.stages, spec.virtual_stages,
                                spec.micro_batches};
    {
      std::lock_guard lock(stage_mutex_);
      if (const auto it = in_flight_cache_.find(key); it != in_flight_cache_.end())
        return it->second;
    }
    const std::vector<int> live = in_flight(spec, schedule::pipeline_orders(spec));
    std::lock_guard lock(stage_mutex_);
    in_flight_cache_.emplace(key, live);
    return live;
  }
  mutable std::map<std::tuple<int, int, int, int>, std::vector<int>> in_flight_cache_;
  // Collective prices shared by every simulation of the search (none where compute comes from
  // profiles: each calibrates the cluster's link from its own).
  std::shared_ptr<sim::CollectivePriceCache> collective_prices() const {
    return cluster_.device.computes_from_profile() ? nullptr : prices_;
  }
  std::shared_ptr<sim::CollectivePriceCache> prices_ = sim::make_collective_price_cache();
  // cluster_layout_is_symmetric of the config's layout, cached by its degrees.
  bool symmetric(const plan::RunConfig& config) const {
    const auto& q = config.parallel;
    const auto key = std::tuple{q.tp, q.cp, q.dp, q.pp, q.ep};
    {
      std::lock_guard lock(stage_mutex_);
      if (const auto it = symmetric_cache_.find(key); it != symmetric_cache_.end())
        return it->second;
    }
    const bool result = cluster_layout_is_symmetric(plan::make_run_plan(config), cluster_);
    std::lock_guard lock(stage_mutex_);
    symmetric_cache_.emplace(key, result);
    return result;
  }
  mutable std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>,
                   bool>
      symmetric_cache_;
  mutable std::mutex stage_mutex_;
  mutable std::map<std::string, StagePrice> stage_cache_;
  mutable std::map<std::string, std::optional<StagePrice>> unit_cache_;
  std::optional<Priced> price_global(const Global& g, Tally& tally, Pricing pricing) const;
  // The chain of per-layer options of a global choice whose fastest option does not fit.
  std::optional<Priced> finish_chain(Pending pending, Tally& tally) const;
  static std::string summary_of(const Global& g, const LayerOption& option) {
    JointCandidate c;
    c.settings = settings_of(g, option.recompute, option.compression);
    c.family = g.schedule;
    return c.summary();
  }
  // The global choice at each of memory_steps in turn, while the fastest option does not fit:
  // the candidates whose fastest option fits, and the others' pending chains.
  std::vector<Priced> price_memory_steps(Global g, Tally& tally,
                                         std::vector<Pending>& pending) const;
  // The priced choice of `p` priced again exactly (Pricing::exact); nullopt where it then
  // does not fit or cannot run.
  std::optional<Priced> reprice_exactly(const Priced& p, Tally& tally) const;
  JointCandidate candidate_of(const Priced& p) const;
  void simulate_whole(JointCandidate& candidate) const;
  // " (with the settings kept by --fix: ...)" when some are.
  std::string fixed_note() const {
    return options_.fixed.empty() ? ""
                                  : fmt::format(" (the search keeps {} as the config gives them)",
                                                fmt::join(options_.fixed, ", "));
  }

  plan::RunConfig base_;
  const sim::ClusterSpec& cluster_;
  const std::vector<planner::Profile>& profiles_;
  JointSearchOptions options_;
  std::int64_t world_ = 1;
  std::int64_t limit_ = 0;
  JointPlanReport report_;
};

std::vector<Layout> Search::layouts() const {
  std::vector<Layout> out;
  const auto& p = base_.parallel;
  for (std::int64_t tp : divisors(world_))
    for (std::int64_t cp : divisors(world_ / tp))
      for (std::int64_t pp : divisors(world_ / tp / cp)) {
        Layout l{tp, cp, world_ / tp / cp / pp, pp};
        if (is_fixed(options_, "parallel.tp") && l.tp != p.tp) continue;
        if (is_fixed(options_, "parallel.cp") && l.cp != p.cp) continue;
        if (is_fixed(options_, "parallel.dp") && l.dp != p.dp) continue;
        if (is_fixed(options_, "parallel.pp") && l.pp != p.pp) continue;
        out.push_back(l);
      }
  return out;
}

std::vector<Global> Search::globals_of(const Layout& layout) const {
  const auto& p = base_.parallel;
  const auto fixed = [&](const char* key) { return is_fixed(options_, key); };
  std::vector<std::string> cp_kinds{"all-to-all", "ring"};
  if (layout.cp == 1)
    cp_kinds = {p.cp_kind};
  else if (fixed("parallel.cp_kind"))
    cp_kinds = {p.cp_kind};
  std::vector<std::string> pipelines{p.pipeline};
  std::vector<std::int64_t> virtual_stages{p.virtual_stages};
  if (layout.pp > 1 && !fixed("parallel.pipeline")) {
    // Not 2bw unless asked for: its weights are one update stale, another optimisation.
    pipelines = {"1f1b", "gpipe", "interleaved", "zero-bubble"};
  }
  std::vector<bool> sequence_parallel{layout.tp > 1 ? std::vector<bool>{false, true}
                                                    : std::vector<bool>{false}};
  if (fixed("parallel.sequence_parallel")) sequence_parallel = {p.sequence_parallel};
  const std::int64_t per_replica =
      base_.train.global_batch % layout.dp == 0 ? base_.train.global_batch / layout.dp : 0;
  std::vector<std::int64_t> micro_batches;
  if (fixed("train.micro_batch"))
    micro_batches = {base_.train.micro_batch};
  else
    for (std::int64_t d : divisors(std::max<std::int64_t>(1, per_replica)))
      if (options_.max_micro_batch == 0 || d <= options_.max_micro_batch)
        micro_batches.push_back(d);

  std::vector<Global> out;
  for (const Family& family : families()) {
    if (fixed("parallel.schedule") && p.schedule != family.schedule) continue;
    // Without tensor- or context-parallel collectives the overlapped families have nothing to
    // hide and run as megatron does.
    if (!fixed("parallel.schedule") && layout.tp == 1 && layout.cp == 1 &&
        std::string_view(family.schedule) != "megatron")
      continue;
    std::vector<std::int64_t> subs = family.sub_batches;
    if (fixed("parallel.sub_batches")) subs = {p.sub_batches};
    for (std::int64_t sub_batches : subs)
      for (std::int64_t micro_batch : micro_batches)
        for (const std::string& cp_kind : cp_kinds)
          for (const std::string& pipeline : pipelines) {
            std::vector<std::int64_t> vs = virtual_stages;
            if (layout.pp > 1 && !fixed("parallel.virtual_stages"))
              vs = pipeline == "interleaved" ? std::vector<std::int64_t>{}
                                             : std::vector<std::int64_t>{1};
            if (layout.pp > 1 && pipeline == "interleaved" && !fixed("parallel.virtual_stages"))
              for (std::int64_t v = 2; v <= options_.max_virtual_stages; ++v) vs.push_back(v);
            for (std::int64_t v : vs)
              for (bool sp : sequence_parallel) {
                Global g;
                g.layout = layout;
                g.cp_kind = cp_kind;
                g.schedule = family.schedule;
                g.sub_batches = sub_batches;
                g.micro_batch = micro_batch;
                g.pipeline = pipeline;
                g.virtual_stages = layout.pp > 1 ? v : 1;
                g.sequence_parallel = sp;
                g.zero = memory_steps(layout).front().first;
                g.offload = memory_steps(layout).front().second;
                out.push_back(g);
              }
          }
  }
  return out;
}

std::vector<std::pair<std::int64_t, std::string>> Search::memory_steps(const Layout& layout) const {
  const auto& p = base_.parallel;
  std::vector<std::int64_t> zeros{0, 1, 2, 3};
  // ZeRO partitions over the replicas (cp x dp); over one it shards nothing.
  if (layout.cp * layout.dp == 1) zeros = {0};
  if (is_fixed(options_, "parallel.zero")) zeros = {p.zero};
  std::vector<std::string> offloads{"none"};
  if (is_fixed(options_, "parallel.offload"))
    offloads = {p.offload};
  else if (!p.offload_dir.empty())
    offloads = {"none", "optimizer", "optimizer+params"};
  std::vector<std::pair<std::int64_t, std::string>> steps;
  for (const std::string& offload : offloads)
    for (std::int64_t zero : zeros) steps.emplace_back(zero, offload);
  return steps;
}

// `profile` (if any) for the same model with `layers` layers.
std::optional<planner::Profile> for_layers(const planner::Profile* profile, std::int64_t layers) {
  if (profile == nullptr) return std::nullopt;
  planner::Profile out = *profile;
  out.model.layers = layers;
  return out;
}

const planner::Profile* Search::profile_for(const plan::RunConfig& config, std::string& why) const {
  if (!cluster_.device.computes_from_profile()) return nullptr;
  const plan::RunPlan plan = plan::make_run_plan(config);
  std::string first;
  for (const planner::Profile& profile : profiles_) {
    try {
      plan.check_profile(profile, "the profile");
      return &profile;
    } catch (const UserError& e) {
      if (first.empty()) first = e.what();
    }
  }
  why = profiles_.empty() ? "no profile given" : first;
  return nullptr;
}

std::vector<ClusterSimulation> Search::simulate_reduced(
    const plan::RunConfig& config, std::int64_t layers,
    const std::vector<std::int64_t>& micro_batches, const planner::Profile* profile,
    Tally& tally) const {
  plan::RunConfig c = config;
  c.model.layers = layers;
  c.train.global_batch = micro_batches.front() * c.train.micro_batch * c.parallel.dp;
  ClusterSimulationOptions options;
  // A profile's times are per segment kind, the same for any number of layers; it names the
  // model it measured, which the reduced model must match.
  const std::optional<planner::Profile> reduced = for_layers(profile, layers);
  options.profile = reduced ? &*reduced : nullptr;
  options.verify_schedules = false;
  options.symmetric = symmetric(c);
  options.collective_prices = collective_prices();
  tally.simulations += static_cast<std::int64_t>(micro_batches.size());
  return simulate_cluster_at(c, cluster_, micro_batches, options);
}

double peak_memory(const ClusterSimulation& s, planner::MemoryBytes* by_kind = nullptr) {
  double most = 0;
  for (const SimulatedRank& rank : s.ranks) {
    const planner::MemoryBytes bytes = planner::resident_memory(rank.memory);
    if (static_cast<double>(bytes.total()) >= most) {
      most = static_cast<double>(bytes.total());
      if (by_kind != nullptr) *by_kind = bytes;
    }
  }
  return most;
}

double most_exposed(const ClusterSimulation& s) {
  double most = 0;
  for (const SimulatedRank& rank : s.ranks) most = std::max(most, rank.time.exposed_comm_seconds);
  return most;
}

StagePrice Search::price_stage(const plan::RunConfig& config, std::int64_t unit, std::int64_t ma,
                               std::int64_t mb, const planner::Profile* profile,
                               Tally& tally) const {
  const std::int64_t n1 = unit, n2 = 2 * unit;
  StagePrice price;
  planner::MemoryBytes kinds21, kinds12, kinds22;
  const std::vector<std::int64_t> counts =
      mb != ma ? std::vector<std::int64_t>{ma, mb} : std::vector<std::int64_t>{ma};
  const std::vector<ClusterSimulation> at_n1 = simulate_reduced(config, n1, counts, profile, tally);
  const std::vector<ClusterSimulation> at_n2 = simulate_reduced(config, n2, counts, profile, tally);
  const ClusterSimulation &s11 = at_n1.front(), &s21 = at_n2.front();
  double t11 = s11.step_seconds, t21 = s21.step_seconds, t12 = t11, t22 = t21;
  double m11 = peak_memory(s11, &price.memory_at_1), m21 = peak_memory(s21, &kinds21);
  double m12 = m11, m22 = m21;
  kinds12 = price.memory_at_1;
  kinds22 = kinds21;
  price.exposed_at_1 = most_exposed(s11);
  if (mb != ma) {
    const ClusterSimulation &s12 = at_n1.back(), &s22 = at_n2.back();
    t12 = s12.step_seconds;
    t22 = s22.step_seconds;
    m12 = peak_memory(s12, &kinds12);
    m22 = peak_memory(s22, &kinds22);
  }
  const auto n_1 = static_cast<double>(n1), n_2 = static_cast<double>(n2);
  const auto m_1 = static_cast<double>(ma), m_2 = static_cast<double>(mb);
  price.step = Bilinear::fit(n_1, n_2, m_1, m_2, t11, t21, t12, t22);
  price.memory = Bilinear::fit(n_1, n_2, m_1, m_2, m11, m21, m12, m22);
  price.activations = Bilinear::fit(
      n_1, n_2, m_1, m_2, static_cast<double>(price.memory_at_1.activations),
      static_cast<double>(kinds21.activations), static_cast<double>(kinds12.activations),
      static_cast<double>(kinds22.activations));
  return price;
}

std::optional<OptionCost> Search::price_option(const plan::RunConfig& config,
                                               const planner::Profile* profile, Tally& tally,
                                               Pricing pricing) const {
  const plan::RunPlan plan = plan::make_run_plan(config);
  if (plan.pipeline.stages > 1 && pricing == Pricing::composed && profile == nullptr)
    if (std::optional<OptionCost> composed = compose_pipeline(config, plan, tally)) return composed;
  const std::int64_t chunks = plan.pipeline.stages * plan.pipeline.virtual_stages;
  std::int64_t unit = chunks;
  if (config.model.has_moe()) unit = std::lcm(unit, config.model.moe_every);
  const std::int64_t micro_batches = plan.schedule.micro_batches;
  const std::int64_t stages = plan.pipeline.stages;
  // Micro-batch counts past the pipeline's fill (and the interleaved schedules' pairing), on
  // which the step is affine; the run's own count where it is no larger.
  const std::int64_t m1 = std::max<std::int64_t>(2, stages);
  std::int64_t m2 = m1 + std::max<std::int64_t>(1, stages);
  // Memory is not affine in the micro-batches: a pipeline's ranks keep more of them in flight
  // until its warm-up is full, then no more. The second count is taken where every rank keeps
  // as many as at the run's count, and memory is held at it (constant past it).
  bool memory_saturates = stages == 1;
  if (stages > 1 && micro_batches > m2) {
    schedule::PipelineSpec spec;
    spec.kind = plan.pipeline.kind;
    spec.stages = static_cast<int>(stages);
    spec.virtual_stages = static_cast<int>(plan.pipeline.virtual_stages);
    const auto live_at = [&](std::int64_t count) {
      spec.micro_batches = static_cast<int>(count);
      return in_flight_of(spec);
    };
    const std::vector<int> at_run = live_at(micro_batches);
    while (m2 < micro_batches && live_at(m2) != at_run) m2 += std::max<std::int64_t>(1, stages);
    m2 = std::min(m2, micro_batches);
    memory_saturates = live_at(m2) == at_run;
  }
  const bool extend = micro_batches > m2;
  const StagePrice price = price_stage(config, unit, extend ? m1 : micro_batches,
                                       extend ? m2 : micro_batches, profile, tally);
  const auto m = static_cast<double>(micro_batches);
  OptionCost cost;
  cost.step = price.step.at_micro_batches(m);
  const double memory_at = extend && memory_saturates ? static_cast<double>(m2) : m;
  cost.memory = price.memory.at_micro_batches(memory_at);
  cost.activations = price.activations.at_micro_batches(memory_at);
  return cost;
}

std::optional<OptionCost> Search::compose_pipeline(const plan::RunConfig& config,
                                                   const plan::RunPlan& plan, Tally& tally) const {
  // One stage without the pipeline: the same degrees, schedule and per-layer policies on the
  // stage's own ranks (the first tp x cp x dp of the cluster, as the pipeline's first stage).
  plan::RunConfig stage = config;
  stage.parallel.pp = 1;
  stage.parallel.pipeline = "1f1b";
  stage.parallel.virtual_stages = 1;
  const auto& q = stage.parallel;
  const std::string key =
      fmt::format("{} {} {} {} {} {} {} {} {} {} {} {}", q.tp, q.cp, q.dp, q.cp_kind, q.schedule,
                  q.sub_batches, stage.train.micro_batch, q.sequence_parallel, q.zero, q.offload,
                  q.recompute, q.activation_compression);
  std::optional<StagePrice> price;
  {
    std::lock_guard lock(stage_mutex_);
    if (const auto it = stage_cache_.find(key); it != stage_cache_.end()) price = it->second;
  }
  if (!price) {
    try {
      (void)plan::make_run_plan(stage);
      const std::int64_t unit = config.model.has_moe() ? config.model.moe_every : 1;
      price = price_stage(stage, unit, 2, 3, nullptr, tally);
    } catch (const UserError&) {
      return std::nullopt;  // priced exactly instead
    }
    std::lock_guard lock(stage_mutex_);
    stage_cache_.emplace(key, *price);
  }
  schedule::PipelineSpec spec;
  spec.kind = plan.pipeline.kind;
  spec.stages = static_cast<int>(plan.pipeline.stages);
  spec.virtual_stages = static_cast<int>(plan.pipeline.virtual_stages);
  spec.micro_batches = static_cast<int>(plan.schedule.micro_batches);
  if (spec.kind == schedule::PipelineKind::two_bw) return std::nullopt;
  const PipelineShape shape = shape_of(spec);
  const double most_live = shape.most_live;
  // The activations one micro-batch hands the next stage, every stage-0 rank to its peer at once.
  const sim::RankLayout layout = rank_layout(plan);
  double bytes = static_cast<double>(config.train.micro_batch * config.model.seq_len / layout.cp *
                                     config.model.hidden) *
                 static_cast<double>(dtype_size(plan.dtypes.compute));
  if (config.parallel.sequence_parallel) bytes /= layout.tp;
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < layout.tp * layout.dp; ++r) pairs.emplace_back(r, layout.pp_group(r)[1]);
  const double p2p = sim::message_seconds(cluster_, bytes, pairs[0].first, pairs[0].second, pairs);

  const double p = spec.stages, v = spec.virtual_stages, m = spec.micro_batches;
  // The stage alone keeps at most the activations of the micro-batches its family overlaps
  // (two and a bit), all within the 3 it was priced at: its memory is flat past them.
  const double stage_memory_at = std::min(m, 3.0);
  const auto at_layers = [&](double layers) {
    const double per_stage = layers / p;
    // One micro-batch through the stage: each chunk 1/v of it, the backward twice the forward.
    const double per_micro_batch = price->step.cm + price->step.cnm * per_stage;
    const double chunk = per_micro_batch / v;
    const double bubble = shape.per_chunk * chunk + shape.per_transfer * p2p - m * per_micro_batch;
    // The stage alone holds one micro-batch's kept activations; the pipeline's busiest rank
    // holds `most_live` chunks of them.
    const double kept_per_layer = price->activations.cn + price->activations.cnm * stage_memory_at;
    const double memory = price->memory.at(per_stage, stage_memory_at) +
                          kept_per_layer * per_stage * std::max(0.0, most_live / v - 1);
    return std::pair{price->step.at(per_stage, m) + std::max(0.0, bubble), memory};
  };
  const double l1 = p * v, l2 = 2 * p * v;
  const auto [t1, memory1] = at_layers(l1);
  const auto [t2, memory2] = at_layers(l2);
  const auto through = [&](double f1, double f2) {
    Affine a;
    a.per_layer = (f2 - f1) / (l2 - l1);
    a.base = f1 - a.per_layer * l1;
    return a;
  };
  OptionCost cost;
  cost.step = through(t1, t2);
  cost.memory = through(memory1, memory2);
  const Affine kept = price->activations.at_micro_batches(stage_memory_at);
  cost.activations = Affine{kept.base, kept.per_layer * std::max(1.0, most_live / v) / p};
  return cost;
}

std::optional<OptionCost> Search::scaled_option(const OptionCost& fastest, const Global& g,
                                                const LayerOption& fastest_option,
                                                const LayerOption& option, Tally& tally) const {
  const std::optional<StagePrice> f = unit_price(g, fastest_option, tally);
  const std::optional<StagePrice> o = unit_price(g, option, tally);
  if (!f || !o) return std::nullopt;
  // Per layer and micro-batch: time, kept activations; and the last layer's working set.
  const double m = 2;
  const double time_f = f->step.cnm, time_o = o->step.cnm;
  const double kept_f = f->activations.cn + f->activations.cnm * m;
  const double kept_o = o->activations.cn + o->activations.cnm * m;
  OptionCost cost = fastest;
  if (time_f > 0) cost.step.per_layer = fastest.step.per_layer * time_o / time_f;
  const double kept =
      kept_f > 0 ? fastest.activations.per_layer * kept_o / kept_f : fastest.activations.per_layer;
  cost.memory.per_layer += kept - fastest.activations.per_layer;
  cost.activations.per_layer = kept;
  const double working = o->memory.at_micro_batches(m).base - f->memory.at_micro_batches(m).base;
  cost.memory.base += working;
  cost.activations.base += working;
  return cost;
}

std::optional<StagePrice> Search::unit_price(const Global& g, const LayerOption& option,
                                             Tally& tally) const {
  const std::string key = fmt::format("{} {} {} {} {} {} {} {} {}", g.layout.tp, g.layout.cp,
                                      g.cp_kind, g.sequence_parallel, g.schedule, g.sub_batches,
                                      g.micro_batch, option.recompute, option.compression);
  {
    std::lock_guard lock(stage_mutex_);
    if (const auto it = unit_cache_.find(key); it != unit_cache_.end()) return it->second;
  }
  std::optional<StagePrice> price;
  try {
    const plan::RunConfig c =
        config_of(base_, on_one_stage(g), option.recompute, option.compression);
    (void)plan::make_run_plan(c);
    const std::int64_t unit = c.model.has_moe() ? c.model.moe_every : 1;
    price = price_stage(c, unit, 2, 3, nullptr, tally);
  } catch (const UserError&) {
    price.reset();
  }
  std::lock_guard lock(stage_mutex_);
  unit_cache_.emplace(key, price);
  return price;
}

std::optional<Search::Priced> Search::price_global(const Global& g, Tally& tally,
                                                   Pricing pricing) const {
  // Feasibility of the global choice, with the family's first recomputation word.
  const Family& family = family_of(g.schedule);
  std::vector<LayerOption> options;
  std::vector<std::string> recompute_words;
  if (is_fixed(options_, "parallel.recompute"))
    recompute_words = {base_.parallel.recompute};
  else
    recompute_words.assign(family.recompute.begin(), family.recompute.end());
  std::vector<std::string> compression_words{"none", "bf16", "fp8"};
  if (is_fixed(options_, "parallel.activation_compression") || base_.model.has_moe())
    compression_words = {base_.parallel.activation_compression};
  // The fastest option first: no recomputation, no compression.
  for (const std::string& compression : compression_words)
    for (const std::string& recompute : recompute_words)
      options.push_back({recompute, compression});

  std::string first_error;
  std::vector<std::optional<OptionCost>> costs(options.size());
  const planner::Profile* profile = nullptr;
  std::vector<bool> valid(options.size(), false);
  bool any_valid = false;
  for (std::size_t k = 0; k < options.size(); ++k) {
    try {
      const plan::RunConfig c = config_of(base_, g, options[k].recompute, options[k].compression);
      c.validate();
      (void)plan::make_run_plan(c);
      valid[k] = true;
      any_valid = true;
    } catch (const UserError& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!any_valid) {
    tally.exclude(reason_of(first_error), first_error);
    return std::nullopt;
  }
  std::size_t fastest = 0;
  while (!valid[fastest]) ++fastest;
  const plan::RunConfig fastest_config =
      config_of(base_, g, options[fastest].recompute, options[fastest].compression);
  if (cluster_.device.computes_from_profile()) {
    std::string why;
    profile = profile_for(fastest_config, why);
    if (profile == nullptr) {
      tally.exclude("not priced by the profiles given", why);
      return std::nullopt;
    }
  }
  const double layers = static_cast<double>(base_.model.layers);
  try {
    costs[fastest] = price_option(fastest_config, profile, tally, pricing);
  } catch (const UserError& e) {
    tally.exclude(reason_of(e.what()), e.what());
    return std::nullopt;
  }
  Priced priced;
  priced.global = g;
  priced.composed = pricing == Pricing::composed && g.layout.pp > 1 && profile == nullptr;
  const auto whole = [&](const OptionCost& c) {
    return std::pair{c.step.at(layers), static_cast<std::int64_t>(std::ceil(c.memory.at(layers)))};
  };
  if (const auto [step, memory] = whole(*costs[fastest]); memory <= limit_) {
    priced.layers.assign(static_cast<std::size_t>(base_.model.layers), options[fastest]);
    priced.step = step;
    priced.memory = memory;
    priced.fastest_fits = true;
    tally.note_memory(memory, summary_of(g, options[fastest]));
    return priced;
  }
  Pending pending;
  pending.global = g;
  pending.options = std::move(options);
  pending.valid = std::move(valid);
  pending.costs = std::move(costs);
  pending.fastest = fastest;
  pending.profile = profile;
  pending.pricing = pricing;
  pending.bound = pending.costs[fastest]->step.at(layers);
  priced.pending = std::move(pending);
  return priced;
}

// Whether a composed pipeline's memory estimate for `g` holds (see finish_chain).
bool composes_memory(const Global& g) {
  if (family_of(g.schedule).overlaps_micro_batches) return false;
  schedule::PipelineSpec spec;
  spec.kind = schedule::parse_pipeline_kind(g.pipeline, "parallel.pipeline");
  return !spec.splits_backward();
}

std::optional<Search::Priced> Search::finish_chain(Pending pending, Tally& tally) const {
  // Composed, the other options are scaled from the fastest option's cost (the choice is
  // priced exactly again if it comes near the top, Search::run's phase 3).
  const bool scaled = pending.pricing == Pricing::composed && pending.profile == nullptr;
  // A chain may exclude the choice outright on its memory, the least certain part of a composed
  // pipeline's estimate: where the composition is known to miss kinds of memory (a split
  // backward's output gradients kept for the weight gradient; a family whose stage keeps two
  // micro-batches, whose growth with the micro-batches the pipeline caps), the fastest option
  // is priced exactly first. Elsewhere the composed memory is within a few percent of the
  // exact one (docs/planner-and-simulator.md).
  if (scaled && pending.global.layout.pp > 1 && !composes_memory(pending.global)) {
    std::optional<Priced> exact = price_global(pending.global, tally, Pricing::exact);
    if (!exact || !exact->pending) return exact;
    pending = std::move(*exact->pending);
  }
  const Global& g = pending.global;
  const std::vector<LayerOption>& options = pending.options;
  std::vector<bool>& valid = pending.valid;
  std::vector<std::optional<OptionCost>>& costs = pending.costs;
  const std::size_t fastest = pending.fastest;
  const planner::Profile* profile = pending.profile;
  Priced priced;
  priced.global = g;
  priced.composed = scaled;
  // Every other option, then the chain.
  for (std::size_t k = 0; k < options.size(); ++k) {
    if (!valid[k] || costs[k]) continue;
    try {
      if (scaled)
        costs[k] = scaled_option(*costs[fastest], g, options[fastest], options[k], tally);
      else
        costs[k] = price_option(config_of(base_, g, options[k].recompute, options[k].compression),
                                profile, tally, pending.pricing);
      if (!costs[k]) valid[k] = false;
    } catch (const UserError&) {
      valid[k] = false;
    }
  }
  std::vector<std::size_t> priced_options;
  for (std::size_t k = 0; k < options.size(); ++k)
    if (valid[k] && costs[k]) priced_options.push_back(k);
  // The chain: layers alike, each at one of the priced options. Time adds up: the fastest
  // option's base plus each layer's marginal time. Memory peaks where the last layer's backward
  // begins, holding every earlier layer's kept sets and the last layer's own working set: in
  // one stage (pp = 1) that is the base and marginal of the last layer's option plus the
  // marginal of every other layer's, which the chain prices exactly with a row of its own for
  // the last layer; over stages, the peak rank's last layer is not the model's, and every
  // layer is held to the largest base (conservative).
  const OptionCost& reference = *costs[fastest];
  const double unit = std::max(1.0, static_cast<double>(limit_) / 8192.0);
  const bool one_stage = g.layout.pp == 1;
  double fixed_memory = one_stage ? std::numeric_limits<double>::infinity() : reference.memory.base;
  for (std::size_t k : priced_options)
    fixed_memory = one_stage ? std::min(fixed_memory, costs[k]->memory.base)
                             : std::max(fixed_memory, costs[k]->memory.base);
  planner::ChainProblem chain;
  chain.layers = static_cast<int>(base_.model.layers);
  chain.candidates = static_cast<int>(priced_options.size());
  std::vector<double> cost_row;
  std::vector<std::int64_t> memory_row, last_row;
  for (std::size_t k : priced_options) {
    cost_row.push_back(std::max(0.0, costs[k]->step.per_layer));
    const double m = std::max(0.0, costs[k]->memory.per_layer);
    memory_row.push_back(static_cast<std::int64_t>(std::ceil(m / unit)));
    const double last = one_stage ? costs[k]->memory.base - fixed_memory + m : m;
    last_row.push_back(static_cast<std::int64_t>(std::ceil(std::max(0.0, last) / unit)));
  }
  chain.layer_cost.assign(static_cast<std::size_t>(chain.layers), cost_row);
  chain.layer_memory.assign(static_cast<std::size_t>(chain.layers), memory_row);
  chain.layer_memory.back() = last_row;
  chain.boundary_cost.assign(
      static_cast<std::size_t>(std::max(0, chain.layers - 1)),
      std::vector<std::vector<double>>(priced_options.size(),
                                       std::vector<double>(priced_options.size(), 0.0)));
  chain.fixed_memory = static_cast<std::int64_t>(std::ceil(std::max(0.0, fixed_memory) / unit));
  chain.memory_limit = static_cast<std::int64_t>(std::floor(static_cast<double>(limit_) / unit));
  // The least memory any mix needs, and the option most layers then take.
  std::size_t least_option = 0;
  for (std::size_t i = 1; i < priced_options.size(); ++i)
    if (memory_row[i] < memory_row[least_option]) least_option = i;
  const std::int64_t needed =
      static_cast<std::int64_t>(static_cast<double>(planner::minimum_memory(chain)) * unit);
  tally.note_memory(needed, summary_of(g, options[priced_options[least_option]]));
  if (planner::minimum_memory(chain) > chain.memory_limit) {
    tally.exclude(
        "does not fit the memory limit",
        fmt::format("needs at least {:.2f} GiB per rank", static_cast<double>(needed) / (1 << 30)));
    return std::nullopt;
  }
  planner::ChainPlan solved = planner::solve_dynamic_program(chain);
  OASES_ASSERT(solved.feasible, "the chain of layer options has no plan within its memory");
  // Layers with the same rows are interchangeable (all but the last in one stage, every layer
  // over stages): the options that keep the least go to the first layers, as Megatron-LM's
  // recompute of the first layers, so the plan reads as a few runs rather than a scatter.
  const auto alike = solved.choice.begin() + (one_stage ? chain.layers - 1 : chain.layers);
  std::stable_sort(solved.choice.begin(), alike, [&](int a, int b) {
    return memory_row[static_cast<std::size_t>(a)] < memory_row[static_cast<std::size_t>(b)];
  });
  priced.step = reference.step.base;
  for (int i : solved.choice) {
    const std::size_t k = priced_options[static_cast<std::size_t>(i)];
    priced.layers.push_back(options[k]);
    priced.step += costs[k]->step.per_layer;
  }
  priced.memory = static_cast<std::int64_t>(static_cast<double>(solved.memory) * unit);
  return priced;
}

std::optional<Search::Priced> Search::reprice_exactly(const Priced& p, Tally& tally) const {
  std::optional<Priced> exact = price_global(p.global, tally, Pricing::exact);
  if (exact && exact->pending) exact = finish_chain(std::move(*exact->pending), tally);
  return exact;
}

// One word when every layer has it, else one per layer.
std::string per_layer_words(const std::vector<std::string>& layers) {
  if (std::ranges::all_of(layers, [&](const std::string& w) { return w == layers.front(); }))
    return layers.front();
  return fmt::format("{}", fmt::join(layers, ","));
}

JointCandidate Search::candidate_of(const Priced& p) const {
  std::vector<std::string> recompute, compression;
  for (const LayerOption& option : p.layers) {
    recompute.push_back(option.recompute);
    compression.push_back(option.compression);
  }
  JointCandidate c;
  c.settings = settings_of(p.global, per_layer_words(recompute), per_layer_words(compression));
  c.family = p.global.schedule;
  c.estimated_step_seconds = p.step;
  c.estimated_memory_bytes = p.memory;
  c.fits = p.memory <= limit_;
  return c;
}

void Search::simulate_whole(JointCandidate& candidate) const {
  if (candidate.simulated) return;
  const plan::RunConfig config = apply_settings(base_, candidate.settings);
  ClusterSimulationOptions options;
  std::string why;
  options.profile = profile_for(config, why);
  options.symmetric = symmetric(config);
  options.collective_prices = collective_prices();
  const ClusterSimulation s = simulate_cluster(config, cluster_, options);
  candidate.simulated = true;
  candidate.step_seconds = s.step_seconds;
  peak_memory(s, &candidate.memory);
  candidate.exposed_comm_seconds = most_exposed(s);
  for (const SimulatedRank& rank : s.ranks)
    candidate.bubble_seconds = std::max(candidate.bubble_seconds, rank.time.bubble_seconds);
  candidate.fits = candidate.memory.total() <= limit_;
}

std::optional<Search::LayerCompute> Search::layer_compute(const Global& g, Tally& tally) const {
  const bool megatron = g.schedule == "megatron";
  const std::string key = fmt::format("{} {} {} {} {} {} {}", g.layout.tp, g.layout.cp, g.cp_kind,
                                      g.sequence_parallel, g.micro_batch, g.sub_batches, megatron);
  {
    std::lock_guard lock(compute_mutex_);
    if (const auto it = compute_cache_.find(key); it != compute_cache_.end()) return it->second;
  }
  std::optional<LayerCompute> result;
  try {
    plan::RunConfig c = config_of(base_, on_one_stage(g), "none", "none");
    c.train.global_batch = c.train.micro_batch;
    double seconds[2] = {0, 0};
    std::string why;
    const planner::Profile* profile = profile_for(c, why);
    if (cluster_.device.computes_from_profile() && profile == nullptr) throw UserError(why);
    for (int n = 1; n <= 2; ++n) {
      c.model.layers = base_.model.has_moe() ? n * base_.model.moe_every : n;
      const plan::RunPlan plan = plan::make_run_plan(c);
      const std::optional<planner::Profile> reduced = for_layers(profile, c.model.layers);
      const std::unique_ptr<ShapeOnlyRank> rank = build_shape_only_rank(
          plan, cluster_, reduced ? &*reduced : nullptr, /*verify=*/false, collective_prices());
      for (const schedule::Instruction& ins : rank->schedule) {
        if (ins.op == schedule::Op::forward || ins.op == schedule::Op::recompute ||
            ins.op == schedule::Op::backward || ins.op == schedule::Op::backward_weight)
          seconds[n - 1] += rank->costs.compute(ins);
        else if (megatron && ins.op == schedule::Op::start && rank->costs.collective)
          seconds[n - 1] += rank->costs.collective(ins);
      }
    }
    const double unit = base_.model.has_moe() ? static_cast<double>(base_.model.moe_every) : 1.0;
    LayerCompute lc;
    lc.per_layer = std::max(0.0, (seconds[1] - seconds[0]) / unit);
    lc.rest = std::max(0.0, seconds[0] - lc.per_layer * unit);
    result = lc;
    ++tally.simulations;
  } catch (const UserError&) {
    result.reset();
  }
  std::lock_guard lock(compute_mutex_);
  compute_cache_.emplace(key, result);
  return result;
}

std::optional<double> Search::step_bound(const Global& g, Tally& tally) const {
  const std::optional<LayerCompute> lc = layer_compute(g, tally);
  if (!lc) return std::nullopt;
  const double layers = static_cast<double>(base_.model.layers);
  const double p = static_cast<double>(g.layout.pp);
  const double per_replica = static_cast<double>(base_.train.global_batch) /
                             static_cast<double>(g.layout.dp * g.micro_batch);
  const double micro_batches = std::max(1.0, std::floor(per_replica));
  // One micro-batch on the busiest stage: its share of the layers, and at one stage the rest.
  const double stage = lc->per_layer * std::ceil(layers / p) + (p == 1 ? lc->rest : 0.0);
  double fill = 0;
  if (g.layout.pp > 1) {
    if (g.pipeline == "interleaved")
      fill = (p - 1) * stage / static_cast<double>(g.virtual_stages);
    else if (g.pipeline != "zero-bubble")
      fill = (p - 1) * stage;
  }
  return micro_batches * stage + fill;
}

std::optional<double> Search::stage_bound(const Global& g, Tally& tally) const {
  const std::optional<StagePrice> unit = unit_price(g, {"none", "none"}, tally);
  if (!unit) return std::nullopt;
  const double layers = static_cast<double>(base_.model.layers);
  const double per_replica = static_cast<double>(base_.train.global_batch) /
                             static_cast<double>(g.layout.dp * g.micro_batch);
  const double m = std::max(1.0, std::floor(per_replica));
  const double per_stage = std::ceil(layers / static_cast<double>(g.layout.pp));
  // One micro-batch through the busiest stage: its layers and the head (the rest).
  const double per_micro_batch = std::max(0.0, unit->step.cm + unit->step.cnm * per_stage);
  if (g.layout.pp == 1) return m * per_micro_batch;
  schedule::PipelineSpec spec;
  spec.kind = schedule::parse_pipeline_kind(g.pipeline, "parallel.pipeline");
  spec.stages = static_cast<int>(g.layout.pp);
  spec.virtual_stages = static_cast<int>(g.virtual_stages);
  spec.micro_batches = static_cast<int>(m);
  if (spec.kind == schedule::PipelineKind::two_bw) return std::nullopt;
  try {
    return shape_of(spec).per_chunk * per_micro_batch / spec.virtual_stages;
  } catch (const UserError&) {
    return std::nullopt;
  }
}

std::vector<Search::Priced> Search::price_memory_steps(Global g, Tally& tally,
                                                       std::vector<Pending>& pending) const {
  std::vector<Priced> out;
  const auto steps = memory_steps(g.layout);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    g.zero = steps[i].first;
    g.offload = steps[i].second;
    std::optional<Priced> p =
        price_global(g, tally, options_.exact_estimates ? Pricing::exact : Pricing::composed);
    if (p && p->pending)
      pending.push_back(*p->pending);
    else if (p) {
      ++tally.priced;
      out.push_back(*p);
    }
    // Every ZeRO stage is tried (each shards and moves differently; none is always the
    // fastest); offload, which only adds transfers, only while nothing without it fits.
    const bool last_without_offload =
        steps[i].second == "none" && (i + 1 == steps.size() || steps[i + 1].second != "none");
    if (p && p->fastest_fits && last_without_offload) {
      for (std::size_t j = i + 1; j < steps.size(); ++j)
        tally.exclude("dominated: offload that the memory does not need",
                      fmt::format("parallel.offload = {} at parallel.zero = {}: more transfers "
                                  "than without offload, which fits",
                                  steps[j].second, steps[j].first));
      break;
    }
  }
  return out;
}

JointPlanReport Search::run() {
  const auto started = std::chrono::steady_clock::now();
  report_.memory_limit = limit_;
  report_.world = static_cast<int>(world_);
  report_.cost_source = cluster_.device.computes_from_profile()
                            ? fmt::format("profiles of this machine ({})", cluster_.name)
                            : fmt::format("cluster {}", cluster_.name);
  const std::vector<Layout> all_layouts = layouts();
  OASES_CHECK(!all_layouts.empty(),
              "no layout of tp x cp x dp x pp = {} ranks keeps the fixed settings", world_);
  std::vector<Global> globals;
  for (const Layout& layout : all_layouts)
    for (const Global& g : globals_of(layout)) globals.push_back(g);
  for (const Global& g : globals)
    report_.considered += static_cast<std::int64_t>(memory_steps(g.layout).size());

  // Workers take global choices in turn; each keeps its own tally and candidates.
  const unsigned workers =
      std::max(1u, std::min(options_.threads > 0 ? static_cast<unsigned>(options_.threads)
                                                 : std::thread::hardware_concurrency(),
                            static_cast<unsigned>(globals.size())));
  std::vector<Tally> tallies(workers);
  std::vector<std::vector<Priced>> found(workers);
  std::vector<std::vector<Pending>> pending(workers);
  std::vector<std::exception_ptr> failures(workers);
  const auto in_parallel = [&](const std::function<void(unsigned)>& work) {
    std::vector<std::thread> threads;
    const auto guarded = [&](unsigned w) {
      try {
        work(w);
      } catch (...) {
        failures[w] = std::current_exception();
      }
    };
    for (unsigned w = 1; w < workers; ++w) threads.emplace_back(guarded, w);
    guarded(0);
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& failure : failures)
      if (failure) std::rethrow_exception(failure);
  };
  // Phase 0: each global choice's bound (the compute its layout cannot avoid).
  std::vector<double> bounds(globals.size(), 0.0);
  std::atomic<std::size_t> next{0};
  in_parallel([&](unsigned w) {
    for (std::size_t i = next++; i < globals.size(); i = next++)
      // A layout the bound cannot build goes first: pricing it gives the reason at once.
      bounds[i] = step_bound(globals[i], tallies[w]).value_or(0.0);
  });
  std::vector<std::size_t> order(globals.size());
  std::iota(order.begin(), order.end(), 0);
  std::ranges::stable_sort(order, {}, [&](std::size_t i) { return bounds[i]; });
  // Phase 1: the global choices at their fastest option, least bound first, while the bound
  // can still beat the `simulate_best` best estimates found.
  std::mutex found_mutex;
  std::multiset<double> best_steps;
  // A composed estimate may be below its pipeline's exact one; it bounds the others only with
  // a margin (kComposedMargin) so that it does not prune what the exact estimate would keep.
  const auto note_found = [&](const Priced& p) {
    std::lock_guard lock(found_mutex);
    best_steps.insert(p.composed ? p.step * (1 + kComposedMargin) : p.step);
  };
  // The bound that prunes: the `simulate_best`-th best estimate, as of the end of the previous
  // batch. Choices are taken in batches of a fixed size in a fixed order, each batch against
  // the estimates of the batches before it, so what is pruned does not depend on which
  // worker finishes first (the bounds are heuristic in part and may prune what a later
  // estimate would have kept).
  double threshold = std::numeric_limits<double>::infinity();
  const auto beaten_by = [&](double bound) { return bound >= threshold; };
  const auto in_batches = [&](std::size_t count,
                              const std::function<void(unsigned, std::size_t)>& body) {
    constexpr std::size_t kBatch = 64;
    for (std::size_t begin = 0; begin < count; begin += kBatch) {
      if (static_cast<int>(best_steps.size()) >= options_.simulate_best)
        threshold = *std::next(best_steps.begin(), options_.simulate_best - 1);
      const std::size_t end = std::min(count, begin + kBatch);
      next = begin;
      in_parallel([&](unsigned w) {
        for (std::size_t k = next++; k < end; k = next++) body(w, k);
      });
    }
  };
  in_batches(order.size(), [&](unsigned w, std::size_t k) {
    {
      const Global& g = globals[order[k]];
      if (beaten_by(bounds[order[k]])) {
        const auto steps = static_cast<std::int64_t>(memory_steps(g.layout).size());
        tallies[w].excluded["bounded: its compute alone is slower than the best found"] += steps;
        tallies[w].excluded_example.try_emplace(
            "bounded: its compute alone is slower than the best found",
            summary_of(g, {"none", "none"}));
        return;
      }
      if (const std::optional<double> bound = stage_bound(g, tallies[w]);
          bound && beaten_by(*bound)) {
        const auto steps = static_cast<std::int64_t>(memory_steps(g.layout).size());
        tallies[w].excluded[kStageBounded] += steps;
        tallies[w].excluded_example.try_emplace(kStageBounded, summary_of(g, {"none", "none"}));
        return;
      }
      for (Priced& p : price_memory_steps(g, tallies[w], pending[w])) {
        note_found(p);
        found[w].push_back(std::move(p));
      }
    }
  });
  // Phase 2: the chains of those that do not fit, least bound first, while the bound can still
  // beat the candidates that will be simulated whole (the best `simulate_best` and each
  // family's best).
  std::vector<Pending> chains;
  for (auto& list : pending)
    for (Pending& p : list) chains.push_back(std::move(p));
  std::ranges::sort(chains, [](const Pending& a, const Pending& b) {
    return a.bound != b.bound ? a.bound < b.bound
                              : settings_of(a.global, "", "") < settings_of(b.global, "", "");
  });
  const auto beaten = [&](const Pending& p) { return beaten_by(p.bound); };
  in_batches(chains.size(), [&](unsigned w, std::size_t i) {
    {
      if (beaten(chains[i])) {
        tallies[w].exclude(
            "bounded: slower than the best even without recomputation or "
            "compression",
            summary_of(chains[i].global, chains[i].options[chains[i].fastest]));
        return;
      }
      std::optional<Priced> p = finish_chain(std::move(chains[i]), tallies[w]);
      if (!p) return;
      ++tallies[w].priced;
      note_found(*p);
      found[w].push_back(std::move(*p));
    }
  });
  // Phase 3: composed pipelines among the best priced again exactly, until the best
  // `2 simulate_best` and each family's best are all priced so.
  std::vector<Priced> priced;
  for (auto& list : found)
    for (Priced& p : list) priced.push_back(std::move(p));
  const auto by_step = [](const Priced& a, const Priced& b) {
    return a.step != b.step ? a.step < b.step
                            : settings_of(a.global, "", "") < settings_of(b.global, "", "");
  };
  for (;;) {
    std::ranges::sort(priced, by_step);
    std::vector<std::size_t> again;
    std::set<std::string> families_seen;
    for (std::size_t i = 0; i < priced.size(); ++i) {
      const bool family_first = families_seen.insert(priced[i].global.schedule).second;
      if (priced[i].composed && (static_cast<int>(i) < 2 * options_.simulate_best || family_first))
        again.push_back(i);
    }
    if (again.empty()) break;
    std::vector<std::optional<Priced>> exact(again.size());
    next = 0;
    in_parallel([&](unsigned w) {
      for (std::size_t k = next++; k < again.size(); k = next++)
        exact[k] = reprice_exactly(priced[again[k]], tallies[w]);
    });
    for (std::size_t k = 0; k < again.size(); ++k) {
      if (exact[k])
        priced[again[k]] = std::move(*exact[k]);
      else
        priced[again[k]].step = std::numeric_limits<double>::infinity();
    }
    std::erase_if(priced, [](const Priced& p) { return std::isinf(p.step); });
  }
  std::vector<JointCandidate> candidates;
  std::int64_t least_memory = std::numeric_limits<std::int64_t>::max();
  std::vector<std::pair<std::int64_t, std::string>> smallest;
  for (unsigned w = 0; w < workers; ++w) {
    smallest.insert(smallest.end(), tallies[w].smallest.begin(), tallies[w].smallest.end());
    const Tally& t = tallies[w];
    report_.priced += t.priced;
    report_.simulations += t.simulations;
    for (const auto& [reason, count] : t.excluded) {
      report_.excluded[reason] += count;
      report_.excluded_example.try_emplace(reason, t.excluded_example.at(reason));
    }
    least_memory = std::min(least_memory, t.least_memory);
  }
  for (const Priced& p : priced) candidates.push_back(candidate_of(p));
  // The workers' order depends on timing; the candidates' order must not.
  std::ranges::sort(candidates, [](const JointCandidate& a, const JointCandidate& b) {
    return a.estimated_step_seconds != b.estimated_step_seconds
               ? a.estimated_step_seconds < b.estimated_step_seconds
               : a.settings < b.settings;
  });
  report_.least_memory_bytes =
      least_memory == std::numeric_limits<std::int64_t>::max() ? 0 : least_memory;
  if (candidates.empty()) {
    std::ranges::sort(smallest);
    if (smallest.size() > 3) smallest.resize(3);
    std::string reasons;
    for (const auto& [reason, count] : report_.excluded)
      reasons +=
          fmt::format("\n  {} x {} (e.g. {})", count, reason, report_.excluded_example.at(reason));
    OASES_CHECK(!smallest.empty(),
                "no layout of the {} ranks can run this config{}; what excluded them:{}", world_,
                fixed_note(), reasons);
    std::string layouts;
    for (const auto& [bytes, summary] : smallest)
      layouts += fmt::format("\n  {:.2f} GiB: {}", static_cast<double>(bytes) / (1 << 30), summary);
    OASES_FAIL(
        "no layout of the {} ranks fits the memory limit of {:.2f} GiB per rank "
        "(parallel.memory_limit, else the cluster's device memory){}; the smallest memory that "
        "fits is {:.2f} GiB (estimated), by these layouts:{}\nraise the limit to at least that, "
        "allow offload (parallel.offload_dir), or use more ranks",
        world_, static_cast<double>(limit_) / (1 << 30), fixed_note(),
        static_cast<double>(report_.least_memory_bytes) / (1 << 30), layouts);
  }
  // Whole simulations: the best by estimate and each family's best.
  // Past those, on down the estimates until one that the whole simulation finds fitting.
  std::set<std::string> families_seen;
  bool any_fits = false;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const bool family_first = families_seen.insert(candidates[i].family).second;
    if (static_cast<int>(i) < options_.simulate_best || family_first || !any_fits) {
      ++report_.simulations;
      try {
        simulate_whole(candidates[i]);
        any_fits = any_fits || candidates[i].fits;
      } catch (const UserError& e) {
        const std::string reason = reason_of(e.what()) + " (whole simulation)";
        ++report_.excluded[reason];
        report_.excluded_example.try_emplace(reason, candidates[i].summary() + ": " + e.what());
      }
    }
  }
  std::vector<JointCandidate> ranked;
  for (const JointCandidate& c : candidates)
    if (c.simulated) ranked.push_back(c);
  std::ranges::stable_sort(ranked, {}, &JointCandidate::step_seconds);
  OASES_CHECK(!ranked.empty(), "no candidate layout could be simulated whole:{}", [&] {
    std::string reasons;
    for (const auto& [reason, count] : report_.excluded)
      if (reason.ends_with("(whole simulation)"))
        reasons += fmt::format("\n  {} (e.g. {})", reason, report_.excluded_example.at(reason));
    return reasons;
  }());
  const auto chosen = std::ranges::find_if(ranked, &JointCandidate::fits);
  OASES_CHECK(
      chosen != ranked.end(),
      "no simulated layout fits the memory limit of {:.2f} GiB per rank (the estimates "
      "did, the whole simulations did not); the least memory a simulated one needs is "
      "{:.2f} GiB",
      static_cast<double>(limit_) / (1 << 30),
      static_cast<double>(
          std::ranges::min(ranked, {}, [](const JointCandidate& c) { return c.memory.total(); })
              .memory.total()) /
          (1 << 30));
  report_.chosen = *chosen;
  // Layouts the simulation cannot tell apart (equal step and memory: a family that runs as
  // another here) are shown once, the first in the families' order.
  const auto same_prediction = [](const JointCandidate& x, const JointCandidate& y) {
    return x.step_seconds == y.step_seconds && x.memory == y.memory;
  };
  for (const JointCandidate& c : ranked) {
    if (&c == &*chosen || !c.fits || same_prediction(c, *chosen)) continue;
    if (std::ranges::any_of(report_.alternatives,
                            [&](const JointCandidate& a) { return same_prediction(a, c); }))
      continue;
    if (report_.alternatives.size() < 10) report_.alternatives.push_back(c);
  }
  for (const JointCandidate& c : ranked)
    if (c.fits) report_.best_of_family.try_emplace(c.family, c);
  for (const JointCandidate& c : ranked)
    if (!c.fits) {
      ++report_.excluded["does not fit the memory limit (whole simulation)"];
      report_.excluded_example.try_emplace("does not fit the memory limit (whole simulation)",
                                           c.summary());
    }
  report_.search_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report_;
}

std::string setting(const JointCandidate& c, const std::string& key) {
  for (const auto& [k, v] : c.settings)
    if (k == key) return v;
  return "";
}

std::string gib(double bytes) {
  return fmt::format("{:.2f}", bytes / (1 << 30));
}

// "full x2, none x2" for a per-layer list; the word for one.
std::string describe_words(const std::string& words) {
  if (words.find(',') == std::string::npos) return words;
  std::vector<std::pair<std::string, int>> runs;
  std::size_t start = 0;
  while (start <= words.size()) {
    const std::size_t comma = std::min(words.find(',', start), words.size());
    const std::string word = words.substr(start, comma - start);
    if (!runs.empty() && runs.back().first == word)
      ++runs.back().second;
    else
      runs.emplace_back(word, 1);
    start = comma + 1;
  }
  std::vector<std::string> parts;
  for (const auto& [word, n] : runs) parts.push_back(fmt::format("{} x{}", word, n));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

std::string JointCandidate::summary() const {
  std::string s = fmt::format("tp {}, cp {}, dp {}, pp {}", setting(*this, "parallel.tp"),
                              setting(*this, "parallel.cp"), setting(*this, "parallel.dp"),
                              setting(*this, "parallel.pp"));
  if (setting(*this, "parallel.cp") != "1")
    s += fmt::format(" ({})", setting(*this, "parallel.cp_kind"));
  if (setting(*this, "parallel.pp") != "1") {
    s += fmt::format(" {}", setting(*this, "parallel.pipeline"));
    if (setting(*this, "parallel.virtual_stages") != "1")
      s += fmt::format(" x{}", setting(*this, "parallel.virtual_stages"));
  }
  s += fmt::format(", {} sb {}, mb {}", family, setting(*this, "parallel.sub_batches"),
                   setting(*this, "train.micro_batch"));
  if (setting(*this, "parallel.sequence_parallel") == "true") s += ", sp";
  s += fmt::format(", recompute {}", describe_words(setting(*this, "parallel.recompute")));
  if (const std::string c = setting(*this, "parallel.activation_compression"); c != "none")
    s += fmt::format(", compress {}", describe_words(c));
  s += fmt::format(", zero {}", setting(*this, "parallel.zero"));
  if (const std::string o = setting(*this, "parallel.offload"); o != "none") s += ", offload " + o;
  return s;
}

JointPlanReport search_joint_plan(const plan::RunConfig& config, const sim::ClusterSpec& cluster,
                                  const std::vector<planner::Profile>& profiles,
                                  const JointSearchOptions& options) {
  return Search(config, cluster, profiles, options).run();
}

plan::RunConfig apply_settings(const plan::RunConfig& config, const Settings& settings) {
  std::vector<std::string> overrides;
  for (const auto& [key, value] : settings) overrides.push_back(key + "=" + value);
  return plan::parse_run_config(plan::to_toml(config), "the plan's config", overrides);
}

std::string format_joint_plan_report(const JointPlanReport& report, const plan::RunConfig& config) {
  const JointCandidate& c = report.chosen;
  std::string out = fmt::format(
      "joint plan for {} ranks within {} GiB per rank, priced on {} ({} global choices, {} "
      "priced, {} simulations, {:.2f} s)\n",
      report.world, gib(static_cast<double>(report.memory_limit)), report.cost_source,
      report.considered, report.priced, report.simulations, report.search_seconds);
  out += "chosen layout:\n";
  for (const auto& [key, value] : c.settings)
    if (key != "parallel.recompute" && key != "parallel.activation_compression")
      out += fmt::format("  {:<34} {}\n", key, value);
  out += fmt::format("  {:<6} {:>6} {:<14} {:<12} {}\n", "layer", "degree", "recompute",
                     "compression", "sp");
  const auto word_of = [](const std::string& words, std::int64_t layer) {
    if (words.find(',') == std::string::npos) return words;
    std::size_t start = 0;
    for (std::int64_t l = 0; l < layer; ++l) start = words.find(',', start) + 1;
    return words.substr(start, words.find(',', start) - start);
  };
  const std::string recompute = setting(c, "parallel.recompute");
  const std::string compression = setting(c, "parallel.activation_compression");
  for (std::int64_t l = 0; l < config.model.layers; ++l)
    out += fmt::format("  {:<6} {:>6} {:<14} {:<12} {}\n", l, setting(c, "parallel.tp"),
                       word_of(recompute, l), word_of(compression, l),
                       setting(c, "parallel.sequence_parallel") == "true" ? "on" : "off");
  out += fmt::format(
      "predicted step {:.4f} s (estimate {:.4f} s), exposed communication {:.4f} s, bubble "
      "{:.4f} s\n",
      c.step_seconds, c.estimated_step_seconds, c.exposed_comm_seconds, c.bubble_seconds);
  out += fmt::format(
      "memory per rank (pred.): params {} GiB, grads {} GiB, optimizer {} GiB, activations {} "
      "GiB, total {} GiB\n",
      gib(static_cast<double>(c.memory.params)), gib(static_cast<double>(c.memory.grads)),
      gib(static_cast<double>(c.memory.optimizer)), gib(static_cast<double>(c.memory.activations)),
      gib(static_cast<double>(c.memory.total())));
  out += "the ten best alternatives (simulated):\n";
  for (const JointCandidate& a : report.alternatives)
    out += fmt::format("  {:>9.4f} s  {:>7} GiB  {}\n", a.step_seconds,
                       gib(static_cast<double>(a.memory.total())), a.summary());
  out += "the best of each schedule family (simulated):\n";
  for (const auto& [family, a] : report.best_of_family)
    out += fmt::format("  {:<18} {:>9.4f} s  {}\n", family, a.step_seconds, a.summary());
  if (!report.excluded.empty()) {
    out += "excluded:\n";
    for (const auto& [reason, count] : report.excluded)
      out += fmt::format("  {:>7}  {}  (e.g. {})\n", count, reason,
                         report.excluded_example.at(reason).substr(0, 160));
  }
  return out;
}

namespace {
nlohmann::json candidate_json(const JointCandidate& c) {
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& [key, value] : c.settings) settings[key] = value;
  return {{"settings", settings},
          {"summary", c.summary()},
          {"family", c.family},
          {"estimated_step_s", c.estimated_step_seconds},
          {"estimated_memory_bytes", c.estimated_memory_bytes},
          {"simulated", c.simulated},
          {"predicted_step_s", c.predicted_step_seconds()},
          {"exposed_comm_s", c.exposed_comm_seconds},
          {"bubble_s", c.bubble_seconds},
          {"memory_bytes", c.memory.total()},
          {"fits", c.fits}};
}
}  // namespace

std::string joint_plan_report_json(const JointPlanReport& report) {
  nlohmann::json j{
      {"memory_limit_bytes", report.memory_limit}, {"world", report.world},
      {"cost_source", report.cost_source},         {"chosen", candidate_json(report.chosen)},
      {"considered", report.considered},           {"priced", report.priced},
      {"simulations", report.simulations},         {"search_s", report.search_seconds}};
  j["alternatives"] = nlohmann::json::array();
  for (const JointCandidate& c : report.alternatives)
    j["alternatives"].push_back(candidate_json(c));
  j["best_of_family"] = nlohmann::json::object();
  for (const auto& [family, c] : report.best_of_family)
    j["best_of_family"][family] = candidate_json(c);
  j["excluded"] = nlohmann::json::object();
  for (const auto& [reason, count] : report.excluded)
    j["excluded"][reason] = {{"count", count}, {"example", report.excluded_example.at(reason)}};
  return j.dump();
}

planner::Plan joint_plan_file(const JointPlanReport& report, const plan::RunConfig& config) {
  planner::Plan plan;
  const JointCandidate& c = report.chosen;
  const int tp = std::stoi(setting(c, "parallel.tp"));
  plan.degrees.assign(static_cast<std::size_t>(config.model.layers), tp);
  plan.predicted_step_seconds = c.predicted_step_seconds();
  plan.predicted_memory = c.memory;
  plan.predicted_memory_bytes = c.memory.total();
  plan.settings = c.settings;
  plan.report_json = joint_plan_report_json(report);
  return plan;
}

sim::ClusterSpec this_machine_cluster(int ranks, std::int64_t memory_bytes,
                                      const planner::Profile& profile) {
  double gbs = 2.0;
  if (const planner::ReplicaLink& link = profile.replica_link; link.ranks >= 2 && link.seconds > 0)
    gbs = 2.0 * (link.ranks - 1) / link.ranks * static_cast<double>(link.bytes) / link.seconds / 1e9;
  const std::string text = fmt::format(
      "name = \"this-machine\"\n"
      "[topology]\nnodes = 1\ndevices_per_node = {}\n"
      "[device]\nname = \"CPU rank\"\ncompute = \"profile\"\nmemory_gib = {}\n"
      "memory_bandwidth_gbs = 10\n"
      "[[tier]]\nname = \"shared-memory\"\nspan = {}\nlink_gbs = {}\nlatency_us = 13\n",
      ranks, static_cast<double>(memory_bytes) / (1 << 30), ranks, gbs);
  return sim::parse_cluster(text, "this machine");
}

planner::Plan joint_plan_on_this_machine(const plan::RunConfig& config,
                                         const planner::Profile& profile, std::string* report) {
  const std::int64_t ranks =
      config.parallel.tp * config.parallel.cp * config.parallel.dp * config.parallel.pp;
  const std::int64_t host = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) *
                            static_cast<std::int64_t>(sysconf(_SC_PAGE_SIZE));
  const std::int64_t memory =
      config.parallel.memory_limit > 0 ? config.parallel.memory_limit : host / ranks;
  const sim::ClusterSpec cluster =
      this_machine_cluster(static_cast<int>(ranks), memory, profile);
  const std::vector<planner::Profile> profiles{profile};
  JointSearchOptions options;
  options.memory_limit = memory;
  // Compression changes what the run computes; the run keeps the config's (`oases plan`
  // searches it). The profile measured one stage of the config's context parallelism.
  options.fixed = {"parallel.activation_compression", "parallel.pp", "parallel.cp"};
  const JointPlanReport found = search_joint_plan(config, cluster, profiles, options);
  if (report != nullptr) *report = format_joint_plan_report(found, config);
  return joint_plan_file(found, config);
}

}  // namespace oases::cluster
