#include "planner/planner.h"

#include "core/error.h"
#include "support/files.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace oases::planner {
namespace {

using oases::testing::expect_user_error;
using oases::testing::write_bytes;

TEST(PlanFile, RoundTrips) {
  oases::testing::TempDir dir("plan_file");
  const std::string path = dir.file("plan.json");
  Plan plan;
  plan.degrees = {2, 2, 2, 1};
  plan.predicted_step_seconds = 6.25;
  plan.predicted_memory_bytes = 166199296;
  write_plan(plan, 2, path);
  const Plan read = read_plan(path, 2, 4);
  EXPECT_EQ(read.degrees, plan.degrees);
  EXPECT_EQ(read.predicted_step_seconds, plan.predicted_step_seconds);
  EXPECT_EQ(read.predicted_memory_bytes, plan.predicted_memory_bytes);
  expect_user_error([&] { read_plan(path, 4, 4); }, {path, "made for parallel.tp = 2"});
  expect_user_error([&] { read_plan(path, 2, 5); }, {path, "has 4 layer degrees"});
}

TEST(PlanFile, CarriesThePredictedMemoryByKind) {
  oases::testing::TempDir dir("plan_file");
  const std::string path = dir.file("plan.json");
  Plan plan;
  plan.degrees = {2, 2, 2, 1};
  plan.predicted_memory = {1000, 1000, 2000, 500};
  plan.predicted_memory_bytes = plan.predicted_memory.total();
  write_plan(plan, 2, path);
  EXPECT_EQ(read_plan(path, 2, 4).predicted_memory, plan.predicted_memory);
  // A plan file written without the parts reads with none.
  write_bytes(path, R"({"format": "oases-plan", "version": 1, "tp": 2, "degrees": [2, 2, 2, 1], )"
                    R"("predicted_step_s": 1.5, "predicted_memory_bytes": 4500})");
  const Plan old = read_plan(path, 2, 4);
  EXPECT_EQ(old.predicted_memory_bytes, 4500);
  EXPECT_EQ(old.predicted_memory, MemoryBytes{});
}

// The cases below once threw nlohmann's exceptions, wrapped a degree into range or overflowed
// the stack (found by fuzz/plan_fuzzer.cc).
TEST(PlanFile, FieldsOfAnotherTypeOrOutOfRangeAreRejected) {
  oases::testing::TempDir dir("plan_file");
  const std::string path = dir.file("plan.json");
  const auto rejected = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_bytes(path, text);
    std::vector<std::string> all = parts;
    all.insert(all.begin(), path);
    expect_user_error([&] { read_plan(path, 2, 4); }, all);
  };
  rejected(R"({"format": 1})", {"is not a plan file"});
  rejected(R"({"format": "oases-plan", "version": "1"})", {"has version \"1\""});
  rejected(R"({"format": "oases-plan", "version": 1, "tp": "2"})",
           {"made for parallel.tp = \"2\""});
  // 4294967298 would wrap to 2 in an int.
  rejected(R"({"format": "oases-plan", "version": 1, "tp": 4294967298, "degrees": [2, 2, 2, 2]})",
           {"made for parallel.tp = 4294967298"});
  rejected(R"({"format": "oases-plan", "version": 1, "tp": 2, "degrees": [2, 4294967298, 2, 2]})",
           {"the layer degree 4294967298 is not an integer in [-2147483648, 2147483647]"});
  rejected(R"({"format": "oases-plan", "version": 1, "tp": 2, "degrees": [2, 1e300, 2, 2]})",
           {"the layer degree 1e+300 is not an integer"});
  rejected(R"({"format": "oases-plan", "version": 1, "tp": 2, "degrees": {"a": 1}})",
           {"degrees must be an array"});
  rejected(R"({"format": "oases-plan", "version": 1, "tp": 2, "degrees": [1, 1, 1, 1], )"
           R"("predicted_memory_bytes": 1e300})",
           {"predicted_memory_bytes is not an integer"});
  const std::string four_layers =
      R"({"format": "oases-plan", "version": 1, "tp": 2, "degrees": [1, 1, 1, 1], )"
      R"("predicted_memory_bytes": 4500, )";
  rejected(four_layers + R"("predicted_param_bytes": 1000, "predicted_grad_bytes": 1000, )"
                         R"("predicted_optimizer_bytes": 2000, "predicted_activation_bytes": 400})",
           {"do not sum to predicted_memory_bytes = 4500"});
  rejected(four_layers + R"("predicted_param_bytes": 1000})",
           {"predicted_grad_bytes is missing"});
  rejected(four_layers + R"("predicted_param_bytes": 9223372036854775807, )"
                         R"("predicted_grad_bytes": 9223372036854775807, )"
                         R"("predicted_optimizer_bytes": 2, "predicted_activation_bytes": 4500})",
           {"do not sum to predicted_memory_bytes = 4500"});
  rejected(four_layers + R"("predicted_param_bytes": 1.5, "predicted_grad_bytes": 0, )"
                         R"("predicted_optimizer_bytes": 0, "predicted_activation_bytes": 0})",
           {"predicted_param_bytes is not an integer"});
  rejected(R"({"format": "oases-plan", "version": )" + std::string(100000, '[') +
               std::string(100000, ']') + "}",
           {"deeper than 64 levels"});
}

}  // namespace
}  // namespace oases::planner
