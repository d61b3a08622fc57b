#include "planner/planner.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/timer.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace oases::planner {
namespace {

constexpr std::int64_t kMemoryUnit = std::int64_t{1} << 20;  // MiB: the chain's memory unit

std::int64_t units_up(double bytes) {
  return static_cast<std::int64_t>(
      std::ceil(std::max(0.0, bytes) / static_cast<double>(kMemoryUnit)));
}

}  // namespace

PlanReport make_plan(const Profile& profile, const schedule::ScheduleSpec& spec,
                     std::int64_t micro_batch, std::int64_t memory_limit) {
  OASES_CHECK(!profile.degrees.empty(), "the profile has no degrees");
  const auto L = static_cast<int>(profile.model.layers);
  PlanReport report;
  ChainProblem chain;
  chain.layers = L;
  chain.candidates = static_cast<int>(profile.degrees.size());
  std::vector<double> layer_time;
  std::vector<std::int64_t> layer_memory;
  Prediction top_full;
  for (const DegreeProfile& d : profile.degrees) {
    const Prediction full = predict_uniform(profile, d.degree, spec, micro_batch, L, -1.0);
    const Prediction less = predict_uniform(profile, d.degree, spec, micro_batch, L - 1, -1.0);
    report.uniform.push_back(
        {d.degree, full, memory_limit == 0 || full.memory_bytes() <= memory_limit});
    layer_time.push_back(std::max(0.0, full.step_seconds - less.step_seconds));
    layer_memory.push_back(
        units_up(static_cast<double>(full.memory_bytes() - less.memory_bytes())));
    top_full = full;  // degrees ascend: the last is the full degree, where embedding and head stay
  }
  const double fixed_time = top_full.step_seconds - L * layer_time.back();
  const double fixed_bytes = static_cast<double>(top_full.memory_bytes()) -
                             static_cast<double>(L * layer_memory.back() * kMemoryUnit);
  // Reshard estimate: two activation collectives per instance at the full degree.
  const DegreeProfile& top = profile.degrees.back();
  const double rows = static_cast<double>(micro_batch) / spec.sub_batches;
  const auto ar = top.collectives.find("attention.fwd_s");
  const double reshard = 2.0 * (ar == top.collectives.end() ? 0.0 : ar->second) *
                         (rows / static_cast<double>(top.rows)) * spec.micro_batches *
                         spec.sub_batches;
  for (int l = 0; l < L; ++l) {
    chain.layer_cost.push_back(layer_time);
    chain.layer_memory.push_back(layer_memory);
    if (l + 1 < L) {
      std::vector<std::vector<double>> boundary(
          static_cast<std::size_t>(chain.candidates),
          std::vector<double>(static_cast<std::size_t>(chain.candidates), reshard));
      for (int k = 0; k < chain.candidates; ++k) boundary[k][k] = 0;
      chain.boundary_cost.push_back(boundary);
    }
  }
  chain.fixed_memory = units_up(fixed_bytes);
  if (memory_limit > 0) chain.memory_limit = memory_limit / kMemoryUnit;
  const Stopwatch dp_clock;
  const ChainPlan dp = solve_dynamic_program(chain);
  report.dp_seconds = dp_clock.seconds();
  const Stopwatch ilp_clock;
  const ChainPlan ilp = solve_ilp(chain);
  report.ilp_seconds = ilp_clock.seconds();
  if (!dp.feasible) {
    const std::int64_t least = minimum_memory(chain) * kMemoryUnit;
    OASES_FAIL(
        "parallel.memory_limit = {} bytes is too small for any plan: the least a plan needs "
        "is about {} bytes ({} MiB more than the limit); raise the limit, lower "
        "train.micro_batch, or use more ranks",
        memory_limit, least, (least - memory_limit + kMemoryUnit - 1) / kMemoryUnit);
  }
  OASES_ASSERT(ilp.feasible && std::abs(ilp.cost - dp.cost) <= 1e-9 * std::max(1.0, dp.cost),
               "the integer program ({}) and the dynamic program ({}) disagree", ilp.cost, dp.cost);
  for (int k : dp.choice)
    report.chosen.degrees.push_back(profile.degrees[static_cast<std::size_t>(k)].degree);
  report.chosen.predicted_step_seconds = fixed_time + dp.cost;
  report.chosen.predicted_memory_bytes = dp.memory * kMemoryUnit;
  return report;
}

void write_plan(const Plan& plan, int tp, const std::string& path) {
  const nlohmann::json j{{"format", "oases-plan"},
                         {"version", 1},
                         {"tp", tp},
                         {"degrees", plan.degrees},
                         {"predicted_step_s", plan.predicted_step_seconds},
                         {"predicted_memory_bytes", plan.predicted_memory_bytes}};
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
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("plan file '{}' is not JSON: {}", path, e.what());
  }
  OASES_CHECK(j.is_object() && j.value("format", "") == "oases-plan",
              "'{}' is not a plan file (written by `oases plan`)", path);
  OASES_CHECK(j.value("version", 0) == 1, "plan file '{}' has version {}; this build reads 1",
              path, j.value("version", 0));
  const int file_tp = j.value("tp", 0);
  OASES_CHECK(file_tp == tp, "plan file '{}' was made for parallel.tp = {}; this run has {}",
              path, file_tp, tp);
  Plan plan;
  try {
    plan.degrees = j.at("degrees").get<std::vector<int>>();
    plan.predicted_step_seconds = j.value("predicted_step_s", 0.0);
    plan.predicted_memory_bytes = j.value("predicted_memory_bytes", std::int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    OASES_FAIL("plan file '{}': {}", path, e.what());
  }
  OASES_CHECK(static_cast<std::int64_t>(plan.degrees.size()) == layers,
              "plan file '{}' has {} layer degrees; the model has model.layers = {}", path,
              plan.degrees.size(), layers);
  return plan;
}

}  // namespace oases::planner
