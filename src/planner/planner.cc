#include "planner/planner.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "core/timer.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

namespace oases::planner {
namespace {

// The chain's memory unit: a power of two (at least 1 KiB) that counts the largest plan in at
// most 8192 units, so the dynamic program stays small and rounding (up, per layer) stays
// within about L / 8192 of the memory.
std::int64_t memory_unit(std::int64_t largest_bytes) {
  std::int64_t unit = 1024;
  while (largest_bytes / unit > 8192) unit *= 2;
  return unit;
}

std::int64_t units_up(double bytes, std::int64_t unit) {
  return static_cast<std::int64_t>(std::ceil(std::max(0.0, bytes) / static_cast<double>(unit)));
}

// The optional per-kind parts of a plan file's predicted memory (write_plan).
void read_memory_parts(const nlohmann::json& j, Plan& plan, const std::string& path) {
  const std::pair<const char*, std::int64_t MemoryBytes::*> parts[] = {
      {"predicted_param_bytes", &MemoryBytes::params},
      {"predicted_grad_bytes", &MemoryBytes::grads},
      {"predicted_optimizer_bytes", &MemoryBytes::optimizer},
      {"predicted_activation_bytes", &MemoryBytes::activations}};
  bool any = false;
  for (const auto& [key, part] : parts) any = any || j.contains(key);
  if (!any) return;
  std::int64_t sum = 0;
  bool overflow = false;
  for (const auto& [key, part] : parts) {
    OASES_CHECK(j.contains(key), "plan file '{}': {} is missing (it has the other parts of the "
                "predicted memory)", path, key);
    const std::optional<std::int64_t> bytes = io::json_integer<std::int64_t>(j.at(key));
    OASES_CHECK(bytes.has_value(), "plan file '{}': {} is not an integer", path, key);
    plan.predicted_memory.*part = *bytes;
    overflow = overflow || __builtin_add_overflow(sum, *bytes, &sum);
  }
  OASES_CHECK(!overflow && sum == plan.predicted_memory_bytes,
              "plan file '{}': the parts of the predicted memory (parameters {}, gradients {}, "
              "optimizer {}, activations {} bytes) do not sum to predicted_memory_bytes = {}",
              path, plan.predicted_memory.params, plan.predicted_memory.grads,
              plan.predicted_memory.optimizer, plan.predicted_memory.activations,
              plan.predicted_memory_bytes);
}

}  // namespace

PlanReport make_plan(const Profile& profile, const schedule::ScheduleSpec& spec,
                     std::int64_t micro_batch, std::int64_t memory_limit,
                     bool moe_at_degree_one) {
  return make_plan(profile, spec, memory_limit, moe_at_degree_one,
                   [&](const std::vector<int>& degrees, const std::vector<bool>& moe) {
                     return predict_plan(profile, degrees, moe, spec, micro_batch);
                   });
}

PlanReport make_plan(const Profile& profile, const schedule::ScheduleSpec& spec,
                     std::int64_t memory_limit, bool moe_at_degree_one,
                     const PlanPredictor& predict) {
  std::vector<const DegreeProfile*> candidates;
  for (const DegreeProfile& d : profile.degrees)
    if (d.degree > 1 || !profile.layout.sequence_parallel) candidates.push_back(&d);
  OASES_CHECK(
      !candidates.empty(), "the profile has no degrees{}",
      profile.layout.sequence_parallel ? " above 1 (measured with sequence parallelism)" : "");
  const auto L = static_cast<int>(profile.model.layers);
  const int T = profile.tp;
  PlanReport report;
  report.memory_settings = profile.memory_settings();
  ChainProblem chain;
  chain.layers = L;
  chain.candidates = static_cast<int>(candidates.size());
  // MoE layers (three segments in place of the MLP) cost what dense ones do not: each kind of
  // layer is priced apart, as the difference between the whole model and the model less one
  // layer of that kind.
  std::vector<bool> moe(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) moe[static_cast<std::size_t>(l)] = profile.model.is_moe_layer(l);
  const auto without_one = [&](bool kind) -> std::optional<std::vector<bool>> {
    const auto it = std::find(moe.begin(), moe.end(), kind);
    if (it == moe.end()) return std::nullopt;
    std::vector<bool> less = moe;
    less.erase(less.begin() + (it - moe.begin()));
    return less;
  };
  // The degrees of a uniform plan at k: every layer at k, save MoE layers that must run at 1.
  const auto uniform_at = [&](int k) {
    std::vector<int> degrees(static_cast<std::size_t>(L), k);
    for (int l = 0; l < L; ++l)
      if (moe_at_degree_one && moe[static_cast<std::size_t>(l)]) degrees[static_cast<std::size_t>(l)] = 1;
    return degrees;
  };
  std::vector<int> degrees;
  // [kind][candidate]: kind 0 a dense layer, 1 an MoE layer.
  std::vector<double> layer_time[2];
  std::vector<double> layer_bytes[2];
  Prediction top_full;
  for (const DegreeProfile* candidate : candidates) {
    const DegreeProfile& d = *candidate;
    const std::vector<int> every_layer(static_cast<std::size_t>(L), d.degree);
    const Prediction full = predict(every_layer, moe);
    const Prediction uniform = moe_at_degree_one ? predict(uniform_at(d.degree), moe) : full;
    report.uniform.push_back({d.degree, uniform,
                              memory_limit == 0 || uniform.memory_bytes() <= memory_limit,
                              moe_at_degree_one && d.degree != 1});
    degrees.push_back(d.degree);
    for (const bool kind : {false, true}) {
      const std::optional<std::vector<bool>> less_moe = without_one(kind);
      if (!less_moe) {
        layer_time[kind].push_back(0);
        layer_bytes[kind].push_back(0);
        continue;
      }
      const Prediction less =
          predict(std::vector<int>(static_cast<std::size_t>(L - 1), d.degree), *less_moe);
      layer_time[kind].push_back(std::max(0.0, full.step_seconds - less.step_seconds));
      layer_bytes[kind].push_back(static_cast<double>(full.memory_bytes() - less.memory_bytes()));
    }
    top_full = full;  // degrees ascend: the last is T, where the embedding and head run
  }
  // parallel.expert_tp = 1 keeps MoE layers at degree 1: any other degree costs more than
  // every plan that respects it, so neither solver picks it while such a plan fits.
  double penalty = 0;
  if (moe_at_degree_one) {
    for (const auto& times : layer_time)
      for (double t : times) penalty += t;
    penalty = 1e3 * (penalty + 1.0);
  }
  std::int64_t largest = 0;
  for (const UniformOption& u : report.uniform)
    largest = std::max(largest, u.prediction.memory_bytes());
  const std::int64_t unit = memory_unit(std::max(largest, memory_limit));
  std::vector<std::int64_t> layer_memory[2];
  for (const bool kind : {false, true})
    for (double bytes : layer_bytes[kind]) layer_memory[kind].push_back(units_up(bytes, unit));
  double fixed_time = top_full.step_seconds;
  double fixed_bytes = static_cast<double>(top_full.memory_bytes());
  for (int l = 0; l < L; ++l) {
    fixed_time -= layer_time[moe[static_cast<std::size_t>(l)]].back();
    fixed_bytes -= layer_bytes[moe[static_cast<std::size_t>(l)]].back();
  }
  // A degree change pays one measured all-gather per (micro-batch, sub-batch) instance,
  // counted as if nothing hid it; the embedding and the head sit at T, so the first and last
  // layers pay the change from and to T.
  const double instances = static_cast<double>(spec.micro_batches) * spec.sub_batches;
  const auto reshard = [&](int a, int b) { return profile.reshard_seconds(a, b) * instances; };
  for (int l = 0; l < L; ++l) {
    const bool kind = moe[static_cast<std::size_t>(l)];
    std::vector<double> cost = layer_time[kind];
    for (int k = 0; k < chain.candidates; ++k) {
      if (l == 0) cost[k] += reshard(T, degrees[k]);
      if (l == L - 1) cost[k] += reshard(degrees[k], T);
      if (kind && moe_at_degree_one && degrees[k] != 1) cost[k] += penalty;
    }
    chain.layer_cost.push_back(cost);
    chain.layer_memory.push_back(layer_memory[kind]);
    if (l + 1 < L) {
      std::vector<std::vector<double>> boundary(static_cast<std::size_t>(chain.candidates));
      for (int a = 0; a < chain.candidates; ++a)
        for (int b = 0; b < chain.candidates; ++b)
          boundary[a].push_back(reshard(degrees[a], degrees[b]));
      chain.boundary_cost.push_back(boundary);
    }
  }
  chain.fixed_memory = units_up(fixed_bytes, unit);
  if (memory_limit > 0) chain.memory_limit = memory_limit / unit;
  // The chain prices layers one by one; the simulated plan also holds what plans with reshards
  // allocate once (their buffers). When that pushes it over the limit, the chain is solved
  // again with the limit lowered by the excess.
  for (int attempt = 0;; ++attempt) {
    const Stopwatch dp_clock;
    const ChainPlan dp = solve_dynamic_program(chain);
    report.dp_seconds += dp_clock.seconds();
    const Stopwatch ilp_clock;
    const ChainPlan ilp = solve_ilp(chain);
    report.ilp_seconds += ilp_clock.seconds();
    if (!dp.feasible) {
      const std::int64_t least = minimum_memory(chain) * unit;
      OASES_FAIL(
          "parallel.memory_limit = {} bytes is too small for any plan: the least a plan needs "
          "is about {} bytes ({:.1f} MiB more than the limit); raise the limit, lower "
          "train.micro_batch, or use more ranks",
          memory_limit, least, static_cast<double>(least - memory_limit) / (1 << 20));
    }
    OASES_ASSERT(ilp.feasible && std::abs(ilp.cost - dp.cost) <= 1e-9 * std::max(1.0, dp.cost),
                 "the integer program ({}) and the dynamic program ({}) disagree", ilp.cost,
                 dp.cost);
    report.chosen.degrees.clear();
    for (int k : dp.choice) report.chosen.degrees.push_back(degrees[static_cast<std::size_t>(k)]);
    for (int l = 0; l < L && moe_at_degree_one; ++l)
      OASES_CHECK(!moe[static_cast<std::size_t>(l)] ||
                      report.chosen.degrees[static_cast<std::size_t>(l)] == 1,
                  "parallel.memory_limit = {} bytes leaves no plan with the MoE layers at degree "
                  "1, as parallel.expert_tp = 1 runs them (the best gives layer {} degree {}); "
                  "raise the limit, or set parallel.expert_tp = {}",
                  memory_limit, l, report.chosen.degrees[static_cast<std::size_t>(l)], T);
    report.chosen_chain_seconds = fixed_time + dp.cost;
    // The chain is additive; the simulation of the chosen plan's own schedule is the prediction.
    const Prediction chosen = predict(report.chosen.degrees, moe);
    report.chosen.predicted_step_seconds = chosen.step_seconds;
    report.chosen.predicted_memory_bytes = chosen.memory_bytes();
    report.chosen.predicted_memory = chosen.memory;
    const std::int64_t excess = memory_limit > 0 ? chosen.memory_bytes() - memory_limit : 0;
    if (excess <= 0 || attempt == 3) break;
    chain.memory_limit -= (excess + unit - 1) / unit;
  }
  return report;
}

std::string format_plan_report(const PlanReport& report, const schedule::ScheduleSpec& spec,
                               std::int64_t memory_limit) {
  const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  std::string out = fmt::format(
      "schedule {}, recompute {}, {} sub-batch(es){}; memory limit {}\n", schedule::name(spec.kind),
      schedule::describe_recompute(spec), spec.sub_batches,
      spec.partitioned_checkpoints ? ", checkpoints partitioned" : "",
      memory_limit > 0 ? fmt::format("{:.1f} MiB", static_cast<double>(memory_limit) / (1 << 20))
                       : std::string("none"));
  out += fmt::format("{:<22}{:>14}{:>16}{:>8}\n", "plan", "step (pred.)", "memory (pred.)", "fits");
  for (const auto& u : report.uniform)
    out += fmt::format("{:<22}{:>12.3f} s{:>12.1f} MiB{:>8}\n",
                       u.moe_at_degree_one ? fmt::format("dense at {}, MoE at 1", u.degree)
                                           : fmt::format("every layer at {}", u.degree),
                       u.prediction.step_seconds,
                       mib(u.prediction.memory_bytes()), u.fits ? "yes" : "no");
  const bool fits =
      memory_limit == 0 || report.chosen.predicted_memory_bytes <= memory_limit;
  out += fmt::format("{:<22}{:>12.3f} s{:>12.1f} MiB{:>8}\n", "chosen",
                     report.chosen.predicted_step_seconds,
                     mib(report.chosen.predicted_memory_bytes), fits ? "yes" : "no (see below)");
  const MemoryBytes& memory = report.chosen.predicted_memory;
  out += fmt::format(
      "memory per rank (pred.): params {:.1f} MiB, grads {:.1f} MiB, optimizer {:.1f} MiB, "
      "activations {:.1f} MiB, total {:.1f} MiB{}\n",
      mib(memory.params), mib(memory.grads), mib(memory.optimizer), mib(memory.activations),
      mib(memory.total()),
      report.memory_settings.empty()
          ? std::string()
          : fmt::format(" (state as profiled under {})", report.memory_settings));
  out += fmt::format(
      "degrees per layer: {}\nsolved by the dynamic program in {:.3f} s and by CBC in {:.3f} s "
      "(same optimum; the chain's additive estimate of the plan: {:.3f} s)\n",
      fmt::join(report.chosen.degrees, " "), report.dp_seconds, report.ilp_seconds,
      report.chosen_chain_seconds);
  if (!fits)
    out += "the simulated schedule of the chosen plan needs more than the limit the chain "
           "allowed for (reshard buffers); lower the limit a little and plan again\n";
  return out;
}

void write_plan(const Plan& plan, int tp, const std::string& path) {
  nlohmann::json j{{"format", "oases-plan"},
                   {"version", 2},
                   {"tp", tp},
                   {"degrees", plan.degrees},
                   {"predicted_step_s", plan.predicted_step_seconds},
                   {"predicted_memory_bytes", plan.predicted_memory_bytes}};
  if (plan.predicted_memory != MemoryBytes{}) {
    OASES_ASSERT(plan.predicted_memory.total() == plan.predicted_memory_bytes,
                 "the plan's memory by kind sums to {} bytes, its total is {}",
                 plan.predicted_memory.total(), plan.predicted_memory_bytes);
    j["predicted_param_bytes"] = plan.predicted_memory.params;
    j["predicted_grad_bytes"] = plan.predicted_memory.grads;
    j["predicted_optimizer_bytes"] = plan.predicted_memory.optimizer;
    j["predicted_activation_bytes"] = plan.predicted_memory.activations;
  }
  if (!plan.settings.empty()) {
    nlohmann::json settings = nlohmann::json::object();
    for (const auto& [key, value] : plan.settings) {
      OASES_ASSERT(key != "parallel.plan", "a plan's settings may not set parallel.plan");
      settings[key] = value;
    }
    j["settings"] = settings;
  }
  if (!plan.report_json.empty()) j["report"] = nlohmann::json::parse(plan.report_json);
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomically(path, j.dump(2) + "\n");
}

namespace {

// The plan file at `path` as JSON, checked to be a plan file of a version this build reads.
nlohmann::json read_plan_json(const std::string& path) {
  std::error_code ec;
  OASES_CHECK(std::filesystem::exists(path, ec),
              "parallel.plan = \"{}\": no such file (valid: \"uniform\", \"auto\", degrees "
              "per layer like \"1,2,2,1\", or a file written by `oases plan`)",
              path);
  const std::string text = read_regular_file(path, "plan file", kMaxJsonFileBytes);
  nlohmann::json j;
  try {
    j = io::parse_untrusted_json(text, fmt::format("plan file '{}'", path));
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("plan file '{}' is not JSON: {}", path, e.what());
  }
  // Fields are compared as JSON values and integers read checked (io/untrusted_json.h),
  // which never throws or wraps whatever the file holds.
  OASES_CHECK(j.is_object() && j.value("format", nlohmann::json()) == "oases-plan",
              "'{}' is not a plan file (written by `oases plan`)", path);
  const nlohmann::json version = j.value("version", nlohmann::json(0));
  OASES_CHECK(version == 1 || version == 2,
              "plan file '{}' has version {}; this build reads 1 and 2", path, version.dump());
  return j;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> read_plan_settings(const std::string& path) {
  const nlohmann::json j = read_plan_json(path);
  std::vector<std::pair<std::string, std::string>> settings;
  if (!j.contains("settings")) return settings;
  const nlohmann::json& table = j.at("settings");
  OASES_CHECK(table.is_object(), "plan file '{}': settings must be an object, found {}", path,
              table.dump());
  for (const auto& [key, value] : table.items()) {
    OASES_CHECK(value.is_string(),
                "plan file '{}': the setting {} must be a string (the value as --set takes "
                "it), found {}",
                path, key, value.dump());
    OASES_CHECK(key != "parallel.plan" && key.find('.') != std::string::npos,
                "plan file '{}': the setting '{}' is not a section.key other than parallel.plan",
                path, key);
    settings.emplace_back(key, value.get<std::string>());
  }
  return settings;
}

Plan read_plan(const std::string& path, int tp, std::int64_t layers) {
  const nlohmann::json j = read_plan_json(path);
  const nlohmann::json file_tp = j.value("tp", nlohmann::json(0));
  OASES_CHECK(file_tp.is_number_integer() && file_tp == tp,
              "plan file '{}' was made for parallel.tp = {}; this run has {}", path, file_tp.dump(),
              tp);
  Plan plan;
  try {
    const nlohmann::json& degrees = j.at("degrees");
    OASES_CHECK(degrees.is_array(), "plan file '{}': degrees must be an array, found {}", path,
                degrees.dump());
    for (const nlohmann::json& degree : degrees) {
      const std::optional<int> d = io::json_integer<int>(degree);
      OASES_CHECK(d.has_value(),
                  "plan file '{}': the layer degree {} is not an integer in [{}, {}]", path,
                  degree.dump(), std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
      plan.degrees.push_back(*d);
    }
    plan.predicted_step_seconds = j.value("predicted_step_s", 0.0);
    const std::optional<std::int64_t> memory =
        io::json_integer<std::int64_t>(j.value("predicted_memory_bytes", nlohmann::json(0)));
    OASES_CHECK(memory.has_value(), "plan file '{}': predicted_memory_bytes is not an integer",
                path);
    plan.predicted_memory_bytes = *memory;
    read_memory_parts(j, plan, path);
    if (j.contains("report")) plan.report_json = j.at("report").dump();
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("plan file '{}': {}", path, e.what());
  }
  OASES_CHECK(static_cast<std::int64_t>(plan.degrees.size()) == layers,
              "plan file '{}' has {} layer degrees; the model has model.layers = {}", path,
              plan.degrees.size(), layers);
  plan.settings = read_plan_settings(path);
  return plan;
}

}  // namespace oases::planner
