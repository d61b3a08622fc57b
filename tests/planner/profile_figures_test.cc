// A profile's measured figures are checked when it is read: a negative, or non-finite time,
// byte count, slowdown or ratio is a UserError naming the file, the field and the value,
// instead of a plan priced at "inf s" or an internal error deep in the solver.
#include "planner/profile.h"

#include "support/errors.h"
#include "support/files.h"

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace oases::planner {
namespace {

using nlohmann::json;
using oases::testing::user_error_of;

Profile sample() {
  Profile p;
  p.model.layers = 2;
  p.model.hidden = 64;
  p.model.heads = 4;
  p.model.ffn_hidden = 256;
  p.model.vocab_size = 257;
  p.model.seq_len = 32;
  p.tp = 2;
  p.micro_batch = 4;
  p.sub_batches = 2;
  for (int k : {1, 2}) {
    DegreeProfile d;
    d.degree = k;
    d.rows = k;
    d.segments["attention"] = {0.001, 0.0009, 0.002, 0.0003};
    d.segments["mlp"] = {0.0015, 0.0012, 0.003, 0.0004};
    d.collectives["attention.fwd_s"] = 1e-4;
    d.optimizer_s = 0.01;
    d.parameter_bytes_per_layer = 80000;
    d.parameter_bytes = 500000;
    d.overlap_slowdown = 0.05;
    d.collective_slowdown = 0.1;
    d.activation_bytes["attention"] = {{"checkpoint", 65536}, {"internals", 100000}};
    d.static_activation_bytes = 30000;
    p.degrees.push_back(d);
  }
  p.reshards["1-2"] = 2.5e-4;
  return p;
}

// The sample profile's JSON with the value at `pointer` replaced by `value`.
std::string with(const std::string& pointer, const json& value) {
  json j = json::parse(to_json(sample()));
  j[json::json_pointer(pointer)] = value;
  // The single ratio of older profiles must agree with the three; left out, it cannot.
  if (pointer.ends_with("_ratio")) j.erase("optimizer_state_ratio");
  return j.dump();
}

TEST(ProfileFigures, TheSampleReads) {
  EXPECT_EQ(user_error_of([] { (void)profile_from_json(to_json(sample()), "p.json"); }), "");
}

TEST(ProfileFigures, NegativeOrNonFiniteFiguresAreRejectedNamingTheField) {
  struct Case {
    std::string pointer;  // in the file
    std::string named;    // in the message
    json value;
  };
  const std::vector<Case> cases = {
      {"/degrees/0/segments/attention/forward_s", "segments.attention.forward_s", -0.5},
      {"/degrees/1/segments/mlp/backward1_s", "segments.mlp.backward1_s", -1e-9},
      {"/degrees/0/collectives/attention.fwd_s", "collectives.attention.fwd_s", -2.0},
      {"/degrees/0/optimizer_s", "optimizer_s", -0.01},
      {"/degrees/1/parameter_bytes", "parameter_bytes", -500000},
      {"/degrees/0/parameter_bytes_per_layer", "parameter_bytes_per_layer", -1},
      {"/degrees/0/replica_reduce_per_layer_s", "replica_reduce_per_layer_s", -3.0},
      {"/degrees/0/overlap_slowdown", "overlap_slowdown", -0.5},
      {"/degrees/1/collective_slowdown", "collective_slowdown", -7.0},
      {"/degrees/0/activation_bytes/attention/checkpoint", "activation_bytes.attention.checkpoint",
       -65536},
      {"/degrees/0/static_activation_bytes", "static_activation_bytes", -1},
      {"/degrees/0/rows", "rows", 0},
      {"/degrees/0/degree", "degree", -1},
      {"/reshards/1-2", "reshards.1-2", -2.5e-4},
      {"/micro_batch", "micro_batch", 0},
      {"/element_bytes", "element_bytes", -4},
      {"/grad_bytes_ratio", "grad_bytes_ratio", -1.0},
      {"/optimizer_bytes_ratio", "optimizer_bytes_ratio", -2.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer);
    const std::string text = with(c.pointer, c.value);
    const std::string message = user_error_of([&] { (void)profile_from_json(text, "p.json"); });
    ASSERT_FALSE(message.empty()) << "accepted " << c.pointer << " = " << c.value.dump();
    EXPECT_NE(message.find("p.json"), std::string::npos) << message;
    EXPECT_NE(message.find(c.named), std::string::npos) << message;
    {
      const std::string shown = c.value.is_number_integer()
                                    ? std::to_string(c.value.get<std::int64_t>())
                                    : fmt::format("{}", c.value.get<double>());
      EXPECT_NE(message.find(shown), std::string::npos) << message;
    }
  }
}

TEST(ProfileFigures, ReadProfileRejectsANegativeReshardAsTheUsersError) {
  testing::TempDir dir("profile_figures");
  const std::string path = dir.file("negative.json");
  testing::write_bytes(path, with("/reshards/1-2", -1.0));
  const std::string message = user_error_of([&] { (void)read_profile(path); });
  EXPECT_NE(message.find("negative.json"), std::string::npos) << message;
  EXPECT_NE(message.find("reshards.1-2"), std::string::npos) << message;
}

}  // namespace
}  // namespace oases::planner
