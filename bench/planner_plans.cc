// Predicted step time and memory of given per-layer plans, and the planner's choice under a
// memory limit, from a profile (`oases profile`) and the run config it was measured for. Used
// by bench/run_planner_mixed.sh.
//   build/release/bench/planner_plans PROFILE.json CONFIG.toml MEMORY_LIMIT PLAN...
// PLAN: degrees per layer, e.g. 1,1,2,2. MEMORY_LIMIT: bytes (0: none). Prints CSV
// "plan,step_s,memory_bytes,fits" per plan, then "chosen,<plan>,<step_s>,<memory_bytes>".
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    fmt::print(stderr, "usage: planner_plans PROFILE.json CONFIG.toml MEMORY_LIMIT PLAN...\n");
    return 2;
  }
  const auto profile = oases::planner::read_profile(argv[1]);
  const auto config = oases::plan::load_run_config(argv[2]);
  const std::int64_t limit = std::atoll(argv[3]);
  const auto spec = oases::plan::make_run_plan(config).schedule;
  const auto plan_name = [](const std::vector<int>& degrees) {
    return fmt::format("{}", fmt::join(degrees, ""));
  };
  fmt::print("plan,step_s,memory_bytes,fits\n");
  for (int i = 4; i < argc; ++i) {
    std::vector<int> degrees;
    std::stringstream items(argv[i]);
    for (std::string item; std::getline(items, item, ',');) degrees.push_back(std::stoi(item));
    const auto p = oases::planner::predict_plan(profile, degrees, spec, config.train.micro_batch);
    fmt::print("{},{:.4f},{},{}\n", plan_name(degrees), p.step_seconds, p.memory_bytes(),
               limit == 0 || p.memory_bytes() <= limit ? 1 : 0);
  }
  const auto report = oases::planner::make_plan(profile, spec, config.train.micro_batch, limit);
  fmt::print("chosen,{},{:.4f},{}\n", plan_name(report.chosen.degrees),
             report.chosen.predicted_step_seconds, report.chosen.predicted_memory_bytes);
  fmt::print(stderr, "{}", oases::planner::format_plan_report(report, spec, limit));
}
