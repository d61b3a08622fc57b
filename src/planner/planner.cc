#include "planner/planner.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/timer.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

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
                     std::int64_t micro_batch, std::int64_t memory_limit) {
  OASES_CHECK(!profile.degrees.empty(), "the profile has no degrees");
  const auto L = static_cast<int>(profile.model.layers);
  const int T = profile.tp;
  PlanReport report;
  report.memory_settings = profile.memory_settings();
  ChainProblem chain;
  chain.layers = L;
  chain.candidates = static_cast<int>(profile.degrees.size());
  std::vector<int> degrees;
  std::vector<double> layer_time;
  std::vector<double> layer_bytes;
  Prediction top_full;
  for (const DegreeProfile& d : profile.degrees) {
    const auto every_layer_at = [&](int layers) {
      return std::vector<int>(static_cast<std::size_t>(layers), d.degree);
    };
    const Prediction full = predict_plan(profile, every_layer_at(L), spec, micro_batch);
    const Prediction less = predict_plan(profile, every_layer_at(L - 1), spec, micro_batch);
    report.uniform.push_back(
        {d.degree, full, memory_limit == 0 || full.memory_bytes() <= memory_limit});
    degrees.push_back(d.degree);
    layer_time.push_back(std::max(0.0, full.step_seconds - less.step_seconds));
    layer_bytes.push_back(static_cast<double>(full.memory_bytes() - less.memory_bytes()));
    top_full = full;  // degrees ascend: the last is T, where the embedding and head run
  }
  std::int64_t largest = 0;
  for (const UniformOption& u : report.uniform)
    largest = std::max(largest, u.prediction.memory_bytes());
  const std::int64_t unit = memory_unit(std::max(largest, memory_limit));
  std::vector<std::int64_t> layer_memory;
  for (double bytes : layer_bytes) layer_memory.push_back(units_up(bytes, unit));
  const double fixed_time = top_full.step_seconds - L * layer_time.back();
  const double fixed_bytes =
      static_cast<double>(top_full.memory_bytes()) - L * layer_bytes.back();
  // A degree change pays one measured all-gather per (micro-batch, sub-batch) instance,
  // counted as if nothing hid it; the embedding and the head sit at T, so the first and last
  // layers pay the change from and to T.
  const double instances = static_cast<double>(spec.micro_batches) * spec.sub_batches;
  const auto reshard = [&](int a, int b) { return profile.reshard_seconds(a, b) * instances; };
  for (int l = 0; l < L; ++l) {
    std::vector<double> cost = layer_time;
    for (int k = 0; k < chain.candidates; ++k) {
      if (l == 0) cost[k] += reshard(T, degrees[k]);
      if (l == L - 1) cost[k] += reshard(degrees[k], T);
    }
    chain.layer_cost.push_back(cost);
    chain.layer_memory.push_back(layer_memory);
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
    report.chosen_chain_seconds = fixed_time + dp.cost;
    // The chain is additive; the simulation of the chosen plan's own schedule is the prediction.
    const Prediction chosen = predict_plan(profile, report.chosen.degrees, spec, micro_batch);
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
                       fmt::format("every layer at {}", u.degree), u.prediction.step_seconds,
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
                   {"version", 1},
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
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomically(path, j.dump(2) + "\n");
}

Plan read_plan(const std::string& path, int tp, std::int64_t layers) {
  std::ifstream in(path);
  OASES_CHECK(in.good(), "parallel.plan = \"{}\": no such file or not readable (valid: "
              "\"uniform\", \"auto\", degrees per layer like \"1,2,2,1\", or a file written by "
              "`oases plan`)", path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = io::parse_untrusted_json(text.str(), fmt::format("plan file '{}'", path));
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("plan file '{}' is not JSON: {}", path, e.what());
  }
  // Fields are compared as JSON values and integers read checked (io/untrusted_json.h),
  // which never throws or wraps whatever the file holds.
  OASES_CHECK(j.is_object() && j.value("format", nlohmann::json()) == "oases-plan",
              "'{}' is not a plan file (written by `oases plan`)", path);
  const nlohmann::json version = j.value("version", nlohmann::json(0));
  OASES_CHECK(version == 1, "plan file '{}' has version {}; this build reads 1", path,
              version.dump());
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
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("plan file '{}': {}", path, e.what());
  }
  OASES_CHECK(static_cast<std::int64_t>(plan.degrees.size()) == layers,
              "plan file '{}' has {} layer degrees; the model has model.layers = {}", path,
              plan.degrees.size(), layers);
  return plan;
}

}  // namespace oases::planner
