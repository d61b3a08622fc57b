// Predicted step time and memory of every uniform plan under every schedule, from a profile
// (`oases profile`) and the run config it was measured for; one CSV line per (degree,
// schedule). Used by bench/run_planner_fidelity.sh.
//   build/release/bench/planner_predict PROFILE.json CONFIG.toml [OVERLAP_SLOWDOWN]
// (without OVERLAP_SLOWDOWN: the slowdown the profile measured)
#include "planner/cost_model.h"
#include "plan/run_config.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: planner_predict PROFILE.json CONFIG.toml [OVERLAP_SLOWDOWN]\n");
    return 2;
  }
  const auto profile = oases::planner::read_profile(argv[1]);
  const auto config = oases::plan::load_run_config(argv[2]);
  const double slowdown = argc > 3 ? std::atof(argv[3]) : -1.0;  // -1: the profile's measurement
  using oases::schedule::Recompute;
  using oases::schedule::ScheduleKind;
  const std::pair<std::string, oases::schedule::ScheduleSpec> schedules[] = {
      {"megatron-full", {ScheduleKind::megatron, Recompute::full, 1, 1, true}},
      {"megatron-none", {ScheduleKind::megatron, Recompute::none, 1, 1, true}},
      {"fine-grained", {ScheduleKind::fine_grained, Recompute::fine_grained, 1, 1, true}},
      {"cross-pass", {ScheduleKind::cross_pass, Recompute::full, 1, 2, true}},
      {"oases", {ScheduleKind::oases, Recompute::fine_grained, 1, 2, true}},
  };
  fmt::print("degree,schedule,step_s,exposed_s,memory_bytes\n");
  for (const auto& d : profile.degrees) {
    for (auto [name, spec] : schedules) {
      // Each replica runs its share of the global batch in micro-batches of its share.
      spec.micro_batches = static_cast<int>(config.train.global_batch / config.train.micro_batch);
      const auto p = oases::planner::predict_uniform(profile, d.degree, spec,
                                                     config.train.micro_batch, slowdown);
      fmt::print("{},{},{:.4f},{:.4f},{}\n", d.degree, name, p.step_seconds, p.exposed_comm_seconds,
                 p.memory_bytes());
    }
  }
}
