// The profile's memory ratios (planner::Profile::param_bytes_ratio, ...) against the engine's
// memory figures: for one rank under fp32 and bf16, ZeRO and offload, the planner's state per
// rank from the profile is what the engine reports (train::planner::MemoryFigures, the start-up line and
// the metrics param_bytes, grad_bytes, optimizer_bytes), and the profile records the settings.
#include "train/profiler.h"
#include "planner/cost_model.h"
#include "support/tiny_run.h"
#include "train/engine.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace oases::train {
namespace {

namespace fs = std::filesystem;

// The tiny run, one micro-batch per step, in `precision` under ZeRO stage `zero`, offloading
// `offload`.
plan::RunConfig config(const std::string& precision, std::int64_t zero, const std::string& offload) {
  plan::RunConfig c = testing::tiny_run();
  c.train.global_batch = 4;
  c.train.precision = precision;
  c.parallel.zero = zero;
  c.parallel.offload = offload;
  if (offload != "none") {
    const fs::path dir = fs::temp_directory_path() / "oases_profiler_test";
    fs::create_directories(dir);
    c.parallel.offload_dir = dir.string();
  }
  return c;
}

TEST(ProfileMemory, RatiosGiveTheEnginesFiguresUnderEachSetting) {
  struct Case {
    std::string precision;
    std::int64_t zero;
    std::string offload;
  };
  for (const Case& s : {Case{"fp32", 0, "none"}, Case{"bf16", 0, "none"},
                        Case{"fp32", 2, "optimizer"}, Case{"bf16", 1, "optimizer+params"}}) {
    const std::string what = s.precision + " zero " + std::to_string(s.zero) + " " + s.offload;
    const plan::RunConfig c = config(s.precision, s.zero, s.offload);
    ProfileOptions options;
    options.warmup_steps = 0;
    options.steps = 1;
    options.progress = false;
    const planner::Profile profile = run_profile(
        c, options, [](int tp, int dp) { return comm::Mesh::single_process(tp, dp); });
    EXPECT_EQ(profile.memory_settings(),
              "zero " + std::to_string(s.zero) + ", offload " + s.offload + ", precision " +
                  s.precision)
        << what;
    ASSERT_EQ(profile.degrees.size(), 1u);
    const planner::MemoryBytes predicted =
        planner::state_memory(profile, profile.degrees[0].parameter_bytes);

    TrainingEngine engine(c);
    const planner::MemoryFigures measured = engine.memory_figures();
    // The offloaded bytes: the optimizer's state, and with "optimizer+params" the master
    // weights (the parameters less the 16-bit working copy).
    const std::size_t master_offloaded =
        s.offload == "optimizer+params" ? measured.params - measured.working_copy : 0;
    EXPECT_EQ(measured.offloaded,
              s.offload == "none" ? 0 : measured.optimizer + master_offloaded)
        << what;
    EXPECT_EQ(predicted.params, static_cast<std::int64_t>(measured.params - master_offloaded))
        << what;
    EXPECT_EQ(predicted.grads, static_cast<std::int64_t>(measured.grads)) << what;
    EXPECT_EQ(predicted.optimizer,
              static_cast<std::int64_t>(measured.optimizer + master_offloaded -
                                        measured.offloaded))
        << what;
    EXPECT_EQ(predicted.state(), static_cast<std::int64_t>(measured.total() - measured.activations))
        << what;
  }
}

}  // namespace
}  // namespace oases::train
