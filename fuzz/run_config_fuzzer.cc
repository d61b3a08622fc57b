// libFuzzer target: plan::parse_run_config, the TOML run configuration with --set overrides.
//
// Input: the TOML text, then optionally NUL-separated `section.key=value` overrides (TOML
// text cannot hold a NUL, so the split loses nothing):  <toml> \0 <override> \0 <override> ...
// An accepted configuration must print (to_toml, as stored in checkpoints and shown by
// `--print-config`) to TOML that parses back to the same configuration, and its schedule and
// per-layer degrees must resolve. A plan naming a file is not opened (the fuzzer could name
// any file, /dev/zero included); the plan file reader has its own target.
#include "fuzz_support.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "plan/settings.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

using oases::fuzz::accepts;
using oases::fuzz::require;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t text_end = input.find('\0');
  const std::string text(input.substr(0, text_end));
  std::vector<std::string> overrides;
  for (std::size_t begin = text_end; begin < input.size();) {
    const std::size_t end = input.find('\0', begin + 1);
    const std::string_view item = input.substr(begin + 1, end - begin - 1);
    if (!item.empty()) overrides.emplace_back(item);
    begin = end;
  }

  oases::plan::RunConfig config;
  if (!accepts([&] { config = oases::plan::parse_run_config(text, "fuzz input", overrides); }))
    return 0;

  const std::string printed = oases::plan::to_toml(config);
  oases::plan::RunConfig reparsed;
  require(accepts([&] { reparsed = oases::plan::parse_run_config(printed, "printed"); }),
          "the printed form of an accepted configuration does not parse");
  require(oases::plan::to_toml(reparsed) == printed,
          "the printed form of an accepted configuration parses to another configuration");

  // A plan names no file here but those a list of degrees or "uniform" stand for, so every
  // accepted configuration resolves to a run plan, once train.precision = "auto" is (a run
  // resolves it at start-up from the host's measured peaks).
  const oases::plan::LayerPlanSource source = oases::plan::layer_plan_source(config.parallel.plan);
  const bool precision_resolved =
      oases::plan::parse_settings(config).precision != oases::plan::Precision::automatic;
  if (source != oases::plan::LayerPlanSource::file && precision_resolved) {
    std::vector<int> degrees;
    require(accepts([&] { degrees = oases::plan::make_run_plan(config).layer_degrees; }),
            "an accepted configuration does not resolve to a run plan");
    for (const int degree : degrees)
      require(degree >= 1 && config.parallel.tp % degree == 0,
              "an accepted plan has a degree that does not divide parallel.tp");
  }
  return 0;
}
