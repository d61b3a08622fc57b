// The memory floor a run is checked against before anything is allocated: never above what
// the engine then holds (so no run that fits is refused), and above any host for the configs
// that used to grow without a word (two billion layers, a vocabulary of two billion, a
// micro-batch of a hundred million).
#include "train/host_memory.h"

#include "plan/run_plan.h"
#include "support/errors.h"
#include "support/tiny_run.h"
#include "train/engine.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace oases::train {
namespace {

using testing::user_error_of;

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

TEST(HostMemory, TheFloorIsNeverAboveWhatTheEngineHolds) {
  for (const char* precision : {"fp32", "bf16", "fp64"}) {
    for (const std::int64_t micro_batch : {1, 4}) {
      SCOPED_TRACE(std::string(precision) + " micro_batch " + std::to_string(micro_batch));
      plan::RunConfig c = testing::tiny_run();
      c.train.precision = precision;
      c.train.micro_batch = micro_batch;
      c.train.global_batch = 8;
      const plan::RunPlan plan = plan::make_run_plan(c);
      const MemoryFloor floor = memory_floor(plan);
      TrainingEngine engine(plan, {});
      const planner::MemoryFigures held = engine.memory_figures();
      EXPECT_GT(floor.figures.total(), 0u);
      EXPECT_LE(floor.figures.params, held.params);
      EXPECT_LE(floor.figures.grads, held.grads);
      EXPECT_LE(floor.figures.activations, held.activations);
      EXPECT_LE(floor.figures.total(), held.total());
      EXPECT_LE(floor.parameters, static_cast<double>(engine.model().param_count()));
      EXPECT_EQ(user_error_of([&] { check_memory_floor(plan, 1, kGiB); }), "");
    }
  }
}

TEST(HostMemory, RunsBeyondTheHostAreRefusedNamingTheSettings) {
  struct Case {
    const char* what;
    void (*change)(plan::RunConfig&);
    const char* named;
  };
  const Case cases[] = {
      {"layers", [](plan::RunConfig& c) { c.model.layers = 2'000'000'000; }, "model.layers = 2000000000"},
      {"vocabulary", [](plan::RunConfig& c) { c.model.vocab_size = 2'000'000'000; },
       "model.vocab_size = 2000000000"},
      {"micro-batch",
       [](plan::RunConfig& c) {
         c.train.micro_batch = 100'000'000;
         c.train.global_batch = 100'000'000;
       },
       "train.micro_batch = 100000000"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    plan::RunConfig c = testing::tiny_run();
    k.change(c);
    const plan::RunPlan plan = plan::make_run_plan(c);
    const std::string message = user_error_of([&] { check_memory_floor(plan, 1, 64 * kGiB); });
    EXPECT_NE(message.find(k.named), std::string::npos) << message;
    EXPECT_NE(message.find("64.0 GiB (68719476736 bytes) of physical memory"), std::string::npos)
        << message;
  }
}

TEST(HostMemory, RanksOnOneHostAddUp) {
  const plan::RunPlan plan = plan::make_run_plan(testing::tiny_run());
  const std::uint64_t one = memory_floor(plan).figures.total();
  EXPECT_EQ(user_error_of([&] { check_memory_floor(plan, 4, 4 * one); }), "");
  const std::string message = user_error_of([&] { check_memory_floor(plan, 4, 4 * one - 1); });
  EXPECT_NE(message.find("4 ranks"), std::string::npos) << message;
}

}  // namespace
}  // namespace oases::train
