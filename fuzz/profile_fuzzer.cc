// libFuzzer target: planner::profile_from_json, the planner's profile (JSON, version 3).
//
// An accepted profile must print (to_json, as `oases profile` writes it) to JSON that reads
// back and prints identically, and the checks the planner runs on it before planning
// (check_profile_matches against its own model and degrees, reshard look-ups) must answer
// with a result or a UserError.
#include "fuzz_support.h"
#include "planner/profile.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using oases::fuzz::accepts;
  using oases::fuzz::require;
  const std::string text(reinterpret_cast<const char*>(data), size);
  oases::planner::Profile profile;
  if (!accepts([&] { profile = oases::planner::profile_from_json(text, "fuzz input"); })) return 0;

  const std::string printed = oases::planner::to_json(profile);
  oases::planner::Profile reparsed;
  require(accepts([&] { reparsed = oases::planner::profile_from_json(printed, "printed"); }),
          "the printed form of an accepted profile does not read back");
  require(oases::planner::to_json(reparsed) == printed,
          "the printed form of an accepted profile reads back as another profile");

  std::vector<int> degrees;
  for (const oases::planner::DegreeProfile& d : profile.degrees) degrees.push_back(d.degree);
  accepts([&] {
    oases::planner::check_profile_matches(profile, profile.model, profile.micro_batch,
                                          profile.sub_batches, degrees, "fuzz input");
  });
  for (const int a : degrees)
    for (const int b : degrees) accepts([&] { (void)profile.reshard_seconds(a, b); });
  return 0;
}
