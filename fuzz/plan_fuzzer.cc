// libFuzzer target: planner::read_plan, the plan file `oases plan` writes, read the way a run
// with `parallel.plan = <file>` reads it (plan::layer_degrees, which also checks every degree
// against parallel.tp). The file is read for parallel.tp = 2 and model.layers = 4, as the
// seed corpus was written.
#include "fuzz_support.h"
#include "planner/planner.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using oases::fuzz::accepts;
  using oases::fuzz::require;
  static const oases::fuzz::ScratchFile scratch("plan");
  scratch.write(data, size);
  constexpr int kTp = 2;
  constexpr std::int64_t kLayers = 4;

  oases::planner::Plan plan;
  const bool read =
      accepts([&] { plan = oases::planner::read_plan(scratch.path(), kTp, kLayers); });
  if (read)
    require(plan.degrees.size() == static_cast<std::size_t>(kLayers),
            "read_plan accepted a plan for another number of layers");

  oases::plan::RunConfig config;
  config.model.layers = kLayers;
  config.parallel.tp = kTp;
  config.parallel.plan = scratch.path();
  std::vector<int> degrees;
  if (!accepts([&] { degrees = oases::plan::make_run_plan(config).layer_degrees; })) return 0;
  require(read && degrees == plan.degrees,
          "layer_degrees accepted a plan that read_plan rejects, or changed its degrees");
  for (const int degree : degrees)
    require(degree >= 1 && kTp % degree == 0, "accepted a degree that does not divide tp");
  return 0;
}
