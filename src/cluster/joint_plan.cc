#include "cluster/joint_plan.h"

#include "cluster/cluster_simulation.h"
#include "core/error.h"
#include "plan/run_plan.h"
#include "planner/chain_solver.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

namespace oases::cluster {

namespace {

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

// The schedule families and the recomputation words each allows per layer.
struct Family {
  const char* schedule;
  std::vector<std::int64_t> sub_batches;
  std::vector<const char*> recompute;
};
const std::vector<Family>& families() {
  static const std::vector<Family> all{
      {"megatron", {1}, {"none", "selective", "full"}},
      {"cross-pass", {1, 2}, {"none", "selective", "full"}},
      {"fine-grained", {1}, {"none", "fine-grained"}},
      {"oases", {2, 1}, {"none", "fine-grained"}},
      {"oases-interleaved", {2}, {"none", "fine-grained"}},
  };
  return all;
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
  planner::MemoryBytes memory_at_1;  // by kind, at the reduced model of n1 layers (for kinds)
  double exposed_at_1 = 0;
};

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
    double bound = 0;  // the fastest option's step: no mix of options is faster (heuristic)
  };
  struct Priced {
    bool fastest_fits = false;       // every layer at the fastest option fits
    std::optional<Pending> pending;  // set instead of the rest when it does not
    Global global;
    std::vector<LayerOption> layers;  // the chain's choice, per layer
    double step = 0;
    std::int64_t memory = 0;
  };

  std::vector<Layout> layouts() const;
  std::vector<Global> globals_of(const Layout& layout) const;
  // A lower bound on the step of a global choice at its fastest option: the compute of the
  // busiest pipeline stage (no recomputation), its fill and drain, and under megatron its
  // tensor-parallel collectives, which nothing overlaps. nullopt where the layout cannot be
  // built (the estimate then says why).
  std::optional<double> step_bound(const Global& g, Tally& tally) const;
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
  // Simulates `config` reduced to `layers` layers and `micro_batches` micro-batches.
  ClusterSimulation simulate_reduced(const plan::RunConfig& config, std::int64_t layers,
                                     std::int64_t micro_batches, const planner::Profile* profile,
                                     Tally& tally) const;
  std::optional<OptionCost> price_option(const plan::RunConfig& config,
                                         const planner::Profile* profile, Tally& tally) const;
  std::optional<Priced> price_global(const Global& g, Tally& tally) const;
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
  std::vector<JointCandidate> price_memory_steps(Global g, Tally& tally,
                                                 std::vector<Pending>& pending) const;
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

ClusterSimulation Search::simulate_reduced(const plan::RunConfig& config, std::int64_t layers,
                                           std::int64_t micro_batches,
                                           const planner::Profile* profile, Tally& tally) const {
  plan::RunConfig c = config;
  c.model.layers = layers;
  c.train.global_batch = micro_batches * c.train.micro_batch * c.parallel.dp;
  ClusterSimulationOptions options;
  // A profile's times are per segment kind, the same for any number of layers; it names the
  // model it measured, which the reduced model must match.
  const std::optional<planner::Profile> reduced = for_layers(profile, layers);
  options.profile = reduced ? &*reduced : nullptr;
  options.verify_schedules = false;
  ++tally.simulations;
  return simulate_cluster(c, cluster_, options);
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

std::optional<OptionCost> Search::price_option(const plan::RunConfig& config,
                                               const planner::Profile* profile,
                                               Tally& tally) const {
  const plan::RunPlan plan = plan::make_run_plan(config);
  const std::int64_t chunks = plan.pipeline.stages * plan.pipeline.virtual_stages;
  std::int64_t unit = chunks;
  if (config.model.has_moe()) unit = std::lcm(unit, config.model.moe_every);
  const std::int64_t n1 = unit, n2 = 2 * unit;
  const std::int64_t micro_batches = plan.schedule.micro_batches;
  const std::int64_t stages = plan.pipeline.stages;
  // Micro-batch counts past the pipeline's fill (and the interleaved schedules' pairing), on
  // which the step is affine; the run's own count where it is no larger.
  const std::int64_t m1 = std::max<std::int64_t>(2, stages),
                     m2 = m1 + std::max<std::int64_t>(1, stages);
  const bool extend = micro_batches > m2;
  const std::int64_t ma = extend ? m1 : micro_batches, mb = extend ? m2 : micro_batches;
  const auto fit = [&](double t1, double t2) {
    Affine a;
    a.per_layer = (t2 - t1) / static_cast<double>(n2 - n1);
    a.base = t1 - a.per_layer * static_cast<double>(n1);
    return a;
  };
  const ClusterSimulation s11 = simulate_reduced(config, n1, ma, profile, tally);
  const ClusterSimulation s21 = simulate_reduced(config, n2, ma, profile, tally);
  OptionCost cost;
  cost.step = fit(s11.step_seconds, s21.step_seconds);
  cost.memory = fit(peak_memory(s11, &cost.memory_at_1), peak_memory(s21));
  cost.exposed_at_1 = most_exposed(s11);
  if (extend) {
    const ClusterSimulation s12 = simulate_reduced(config, n1, mb, profile, tally);
    const ClusterSimulation s22 = simulate_reduced(config, n2, mb, profile, tally);
    const Affine step_b = fit(s12.step_seconds, s22.step_seconds);
    const Affine memory_b = fit(peak_memory(s12), peak_memory(s22));
    const double t = static_cast<double>(micro_batches - ma) / static_cast<double>(mb - ma);
    const auto extend_in_m = [t](const Affine& a, const Affine& b) {
      return Affine{a.base + t * (b.base - a.base), a.per_layer + t * (b.per_layer - a.per_layer)};
    };
    cost.step = extend_in_m(cost.step, step_b);
    cost.memory = extend_in_m(cost.memory, memory_b);
  }
  return cost;
}

std::optional<Search::Priced> Search::price_global(const Global& g, Tally& tally) const {
  // Feasibility of the global choice, with the family's first recomputation word.
  const Family& family =
      *std::ranges::find_if(families(), [&](const Family& f) { return g.schedule == f.schedule; });
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
    costs[fastest] = price_option(fastest_config, profile, tally);
  } catch (const UserError& e) {
    tally.exclude(reason_of(e.what()), e.what());
    return std::nullopt;
  }
  Priced priced;
  priced.global = g;
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
  pending.bound = pending.costs[fastest]->step.at(layers);
  priced.pending = std::move(pending);
  return priced;
}

std::optional<Search::Priced> Search::finish_chain(Pending pending, Tally& tally) const {
  const Global& g = pending.global;
  const std::vector<LayerOption>& options = pending.options;
  std::vector<bool>& valid = pending.valid;
  std::vector<std::optional<OptionCost>>& costs = pending.costs;
  const std::size_t fastest = pending.fastest;
  const planner::Profile* profile = pending.profile;
  Priced priced;
  priced.global = g;
  // Every other option, then the chain.
  for (std::size_t k = 0; k < options.size(); ++k) {
    if (!valid[k] || costs[k]) continue;
    try {
      costs[k] = price_option(config_of(base_, g, options[k].recompute, options[k].compression),
                              profile, tally);
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
  const planner::ChainPlan solved = planner::solve_dynamic_program(chain);
  OASES_ASSERT(solved.feasible, "the chain of layer options has no plan within its memory");
  priced.step = reference.step.base;
  for (int i : solved.choice) {
    const std::size_t k = priced_options[static_cast<std::size_t>(i)];
    priced.layers.push_back(options[k]);
    priced.step += costs[k]->step.per_layer;
  }
  priced.memory = static_cast<std::int64_t>(static_cast<double>(solved.memory) * unit);
  return priced;
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
    Global one = g;
    one.layout.dp = 1;
    one.layout.pp = 1;
    one.zero = 0;
    one.offload = "none";
    plan::RunConfig c = config_of(base_, one, "none", "none");
    c.train.global_batch = c.train.micro_batch;
    double seconds[2] = {0, 0};
    std::string why;
    const planner::Profile* profile = profile_for(c, why);
    if (cluster_.device.computes_from_profile() && profile == nullptr) throw UserError(why);
    for (int n = 1; n <= 2; ++n) {
      c.model.layers = base_.model.has_moe() ? n * base_.model.moe_every : n;
      const plan::RunPlan plan = plan::make_run_plan(c);
      const std::optional<planner::Profile> reduced = for_layers(profile, c.model.layers);
      const std::unique_ptr<ShapeOnlyRank> rank =
          build_shape_only_rank(plan, cluster_, reduced ? &*reduced : nullptr, /*verify=*/false);
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

std::vector<JointCandidate> Search::price_memory_steps(Global g, Tally& tally,
                                                       std::vector<Pending>& pending) const {
  std::vector<JointCandidate> out;
  const auto steps = memory_steps(g.layout);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    g.zero = steps[i].first;
    g.offload = steps[i].second;
    std::optional<Priced> p = price_global(g, tally);
    if (p && p->pending)
      pending.push_back(std::move(*p->pending));
    else if (p) {
      ++tally.priced;
      out.push_back(candidate_of(*p));
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
  std::vector<std::vector<JointCandidate>> found(workers);
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
  const auto note_found = [&](const JointCandidate& c) {
    std::lock_guard lock(found_mutex);
    best_steps.insert(c.estimated_step_seconds);
  };
  const auto beaten_by = [&](double bound) {
    std::lock_guard lock(found_mutex);
    if (static_cast<int>(best_steps.size()) < options_.simulate_best) return false;
    return bound >= *std::next(best_steps.begin(), options_.simulate_best - 1);
  };
  next = 0;
  in_parallel([&](unsigned w) {
    for (std::size_t k = next++; k < order.size(); k = next++) {
      const Global& g = globals[order[k]];
      if (beaten_by(bounds[order[k]])) {
        const auto steps = static_cast<std::int64_t>(memory_steps(g.layout).size());
        tallies[w].excluded["bounded: its compute alone is slower than the best found"] += steps;
        tallies[w].excluded_example.try_emplace(
            "bounded: its compute alone is slower than the best found",
            summary_of(g, {"none", "none"}));
        continue;
      }
      for (JointCandidate& c : price_memory_steps(g, tallies[w], pending[w])) {
        note_found(c);
        found[w].push_back(std::move(c));
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
  next = 0;
  in_parallel([&](unsigned w) {
    for (std::size_t i = next++; i < chains.size(); i = next++) {
      if (beaten(chains[i])) {
        tallies[w].exclude(
            "bounded: slower than the best even without recomputation or "
            "compression",
            summary_of(chains[i].global, chains[i].options[chains[i].fastest]));
        continue;
      }
      const std::optional<Priced> p = finish_chain(std::move(chains[i]), tallies[w]);
      if (!p) continue;
      ++tallies[w].priced;
      JointCandidate c = candidate_of(*p);
      note_found(c);
      found[w].push_back(std::move(c));
    }
  });
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
    for (JointCandidate& c : found[w]) candidates.push_back(std::move(c));
  }
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

}  // namespace oases::cluster
