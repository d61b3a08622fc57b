// Settings per transformer layer (parallel.recompute and parallel.activation_compression as
// lists) parsed once into typed values, their errors, the rank's schedule they give, and the
// settings a plan file carries (parallel.plan), applied over the config's.
#include "plan/rank_schedule.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "plan/settings.h"

#include "core/error.h"
#include "planner/planner.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/stage_programs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace oases::plan {
namespace {

using schedule::Recompute;
using testing::user_error_of;

RunConfig config_of(const std::vector<std::string>& overrides, const std::string& toml = "") {
  return parse_run_config("[model]\nlayers = 4\n" + toml, "test.toml", overrides);
}
std::string error_of(const std::vector<std::string>& overrides, const std::string& toml = "") {
  return user_error_of([&] { config_of(overrides, toml); });
}
// Whether `text` holds every one of `phrases`; else the text, for the failure message.
::testing::AssertionResult holds(const std::string& text, const std::vector<std::string>& phrases) {
  for (const std::string& phrase : phrases)
    if (text.find(phrase) == std::string::npos)
      return ::testing::AssertionFailure() << "\"" << phrase << "\" not in: " << text;
  return ::testing::AssertionSuccess();
}

TEST(LayerSettings, ListsParseIntoOnePolicyAndOneEncodingPerLayer) {
  const RunConfig c = config_of({"parallel.schedule=cross-pass", "parallel.tp=2",
                                 "parallel.recompute=full, none,selective ,none",
                                 "parallel.activation_compression=none,bf16,none,fp8"});
  const RunPlan plan = make_run_plan(c);
  using enum Recompute;
  EXPECT_EQ(plan.settings.layer_recompute, (std::vector<Recompute>{full, none, selective, none}));
  EXPECT_FALSE(plan.settings.recompute.has_value());
  EXPECT_EQ(plan.schedule.layer_recompute, plan.settings.layer_recompute);
  // The segments outside the layers keep cross-pass's own policy.
  EXPECT_EQ(plan.schedule.recompute, full);
  EXPECT_EQ(plan.schedule.recompute_every, 0);
  const ActivationCompression& compression = plan.settings.activation_compression;
  EXPECT_FALSE(compression.whole.has_value());
  EXPECT_EQ(compression.layers, (std::vector<std::optional<ops::ActivationEncoding>>{
                                    std::nullopt, ops::ActivationEncoding::bf16, std::nullopt,
                                    ops::ActivationEncoding::fp8_e4m3}));
  EXPECT_TRUE(compression.any());
  EXPECT_EQ(compression.first_layer_in(ops::ActivationEncoding::fp8_e4m3), 3);
  EXPECT_EQ(compression.describe(), "bf16 (1 layer), fp8 (1 layer)");
  EXPECT_EQ(schedule::describe_recompute(plan.schedule),
            "per layer: full x1, none x1, selective x1, none x1");
  // One word stays one word.
  const RunPlan whole = make_run_plan(
      config_of({"parallel.recompute=selective", "parallel.activation_compression=fp8"}));
  EXPECT_EQ(whole.settings.recompute, selective);
  EXPECT_TRUE(whole.schedule.layer_recompute.empty());
  EXPECT_EQ(whole.settings.activation_compression.whole, ops::ActivationEncoding::fp8_e4m3);
  EXPECT_TRUE(whole.settings.activation_compression.layers.empty());
  // A list of nothing compressed compresses nothing.
  EXPECT_FALSE(make_run_plan(config_of({"parallel.activation_compression=none,none,none,none"}))
                   .settings.activation_compression.any());
}

TEST(LayerSettings, TheConfigKeepsTheListsAsWritten) {
  const RunConfig c =
      config_of({"parallel.schedule=megatron", "parallel.recompute=full, none,selective,none",
                 "parallel.activation_compression=none,bf16,none,fp8"});
  EXPECT_EQ(c.parallel.recompute, "full, none,selective,none");
  const RunConfig back = parse_run_config(to_toml(c), "round trip");
  EXPECT_EQ(back.parallel.recompute, "full, none,selective,none");
  EXPECT_EQ(back.parallel.activation_compression, "none,bf16,none,fp8");
  EXPECT_EQ(to_toml(back), to_toml(c));
}

TEST(LayerSettings, BadListsNameTheSettingTheValueTheLayerAndWhatIsValid) {
  EXPECT_TRUE(holds(error_of({"parallel.recompute=full,none"}),
                    {"parallel.recompute = \"full,none\" gives 2 words",
                     "one per layer, model.layers = 4", "\"full,full,full,full\""}));
  EXPECT_TRUE(holds(error_of({"parallel.recompute=full,none,,none"}),
                    {"parallel.recompute = \"full,none,,none\": layer 2 has an empty word"}));
  EXPECT_TRUE(
      holds(error_of({"parallel.recompute=full,none,none,"}), {"layer 3 has an empty word"}));
  EXPECT_TRUE(
      holds(error_of({"parallel.schedule=megatron", "parallel.recompute=full,most,none,none"}),
            {"parallel.recompute = \"full,most,none,none\": layer 1's \"most\" is not known",
             "valid per layer: \"none\", \"full\", \"selective\", \"fine-grained\""}));
  EXPECT_TRUE(
      holds(error_of({"parallel.schedule=megatron", "parallel.recompute=full,sqrt,none,none"}),
            {"gives layer 1 \"sqrt\", which is one policy for the whole model alone",
             "or \"sqrt\" as the whole value"}));
  EXPECT_TRUE(
      holds(error_of({"parallel.recompute=auto,none,none,none"}), {"gives layer 0 \"auto\""}));
  // A word the schedule does not allow at that layer.
  EXPECT_TRUE(
      holds(error_of({"parallel.schedule=oases", "parallel.tp=2",
                      "parallel.recompute=fine-grained,full,none,fine-grained"}),
            {"parallel.recompute = \"fine-grained,full,none,fine-grained\" gives layer 1 "
             "\"full\"",
             "parallel.schedule = \"oases\"", "valid per layer: \"fine-grained\" or \"none\"",
             "schedule = \"cross-pass\" for another policy"}));
  EXPECT_TRUE(
      holds(error_of({"parallel.schedule=megatron", "parallel.recompute=full,none,none,none",
                      "parallel.recompute_every=2"}),
            {"parallel.recompute_every = 2 is set, but parallel.recompute resolves to "
             "\"full,none,none,none\""}));
  // Compression.
  EXPECT_TRUE(holds(error_of({"parallel.activation_compression=bf16,none"}),
                    {"parallel.activation_compression = \"bf16,none\" gives 2 words",
                     "\"bf16,bf16,bf16,bf16\""}));
  EXPECT_TRUE(
      holds(error_of({"parallel.activation_compression=none,int4,none,none"}),
            {"layer 1's \"int4\" is not known", "valid per layer: \"none\", \"bf16\", \"fp8\""}));
  EXPECT_TRUE(holds(error_of({"parallel.activation_compression=none,fp8,bf16,none"},
                             "[train]\nprecision = \"bf16\"\n"),
                    {"parallel.activation_compression = \"none,fp8,bf16,none\" gives layer 2 "
                     "\"bf16\", which with train.precision = \"bf16\" would change nothing",
                     "valid per layer: \"fp8\""}));
  EXPECT_EQ(error_of({"parallel.activation_compression=none,fp8,fp8,none"},
                     "[train]\nprecision = \"bf16\"\n"),
            "");
  EXPECT_TRUE(holds(error_of({"parallel.activation_compression=none,fp8,none,none",
                              "parallel.partition_activations=true"}),
                    {"parallel.partition_activations = true with parallel.activation_compression "
                     "= \"none,fp8,none,none\""}));
  EXPECT_TRUE(holds(error_of({"parallel.activation_compression=none,fp8,none,none", "parallel.pp=2",
                              "parallel.pipeline=2bw", "train.global_batch=16"}),
                    {"parallel.activation_compression = \"none,fp8,none,none\" does not run with "
                     "parallel.pipeline = \"2bw\""}));
  // Mixture-of-experts layers keep their token indices beside their rows: no list compresses.
  EXPECT_TRUE(holds(error_of({"parallel.activation_compression=fp8,none,none,none"},
                             "moe_every = 2\nexperts = 4\n"),
                    {"parallel.activation_compression = \"fp8,none,none,none\" with "
                     "mixture-of-experts layers"}));
}

TEST(LayerSettings, MixtureOfExpertsLayersTakeTheirOwnPolicies) {
  const RunPlan plan = make_run_plan(
      config_of({"parallel.schedule=megatron", "parallel.recompute=none,full,selective,full"},
                "moe_every = 2\nexperts = 4\n"));
  const model::ModelConfig& model = plan.config.model;
  const ops::Program program = testing::tiny_stage_program(
      [&] {
        model::ModelConfig tiny = testing::tiny_stage_model("gpt", 4);
        tiny.moe_every = model.moe_every;
        tiny.experts = model.experts;
        return tiny;
      }(),
      1);
  const schedule::ScheduleSpec spec = plan.pass_spec(2, true);
  const schedule::Schedule s = rank_schedule(plan, program, spec, 0);
  std::set<int> replayed, recomputed;
  for (const schedule::Instruction& ins : s) {
    if (ins.segment < 0) continue;
    const int layer = program.segments[static_cast<std::size_t>(ins.segment)].layer;
    if (ins.op == schedule::Op::start && ins.replay) replayed.insert(layer);
    if (ins.op == schedule::Op::recompute) recomputed.insert(layer);
  }
  EXPECT_EQ(replayed, (std::set<int>{1, 3}));
  EXPECT_EQ(recomputed, (std::set<int>{1, 2, 3}));
}

TEST(LayerSettings, TheRankScheduleEncodesOnlyTheLayersGivenAnEncoding) {
  const RunPlan plan =
      make_run_plan(config_of({"parallel.schedule=megatron", "parallel.recompute=none",
                               "parallel.activation_compression=none,bf16,none,fp8"}));
  const ops::Program program = testing::tiny_stage_program(testing::tiny_stage_model("gpt", 4), 1);
  const schedule::Schedule s = rank_schedule(plan, program, plan.pass_spec(2, true), 0);
  std::set<int> layers;
  for (const schedule::Instruction& ins : s) {
    if (ins.op != schedule::Op::encode) continue;
    const int layer = program.segments[static_cast<std::size_t>(ins.segment)].layer;
    layers.insert(layer);
    EXPECT_EQ(ins.encoding,
              layer == 1 ? ops::ActivationEncoding::bf16 : ops::ActivationEncoding::fp8_e4m3);
  }
  EXPECT_EQ(layers, (std::set<int>{1, 3}));
  // Forward passes keep nothing to compress.
  for (const schedule::Instruction& ins : rank_schedule(plan, program, plan.pass_spec(2, false), 0))
    EXPECT_NE(ins.op, schedule::Op::encode);
}

// ---- Settings from a plan file ----

class PlanFileSettings : public ::testing::Test {
 protected:
  // A plan file for tp = 2 over 4 layers carrying `settings`.
  std::string plan_file(const std::vector<std::pair<std::string, std::string>>& settings) const {
    planner::Plan plan;
    plan.degrees = {2, 1, 2, 2};
    plan.settings = settings;
    const std::string path = dir_.file("plan.json");
    planner::write_plan(plan, 2, path);
    return path;
  }
  RunConfig config(const std::string& plan, const std::vector<std::string>& overrides = {}) const {
    std::vector<std::string> all{"parallel.plan=" + plan};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return config_of(all, "[parallel]\ntp = 2\nschedule = \"oases\"\n[train]\nmicro_batch = 4\n");
  }
  testing::TempDir dir_{"plan_file_settings"};
};

TEST_F(PlanFileSettings, ThePlansSettingsReplaceTheConfigsAndItsDegreesAreReadAsBefore) {
  const std::string path = plan_file({{"parallel.schedule", "cross-pass"},
                                      {"parallel.recompute", "full,none,selective,none"},
                                      {"train.micro_batch", "2"}});
  const RunConfig c = config(path);
  EXPECT_EQ(c.parallel.schedule, "cross-pass");
  EXPECT_EQ(c.parallel.recompute, "full,none,selective,none");
  EXPECT_EQ(c.train.micro_batch, 2);
  EXPECT_EQ(c.parallel.plan, path);
  const RunPlan plan = make_run_plan(c);
  EXPECT_EQ(plan.layer_degrees, (std::vector<int>{2, 1, 2, 2}));
  EXPECT_EQ(plan.schedule.kind, schedule::ScheduleKind::cross_pass);
  EXPECT_EQ(plan.schedule.layer_recompute.size(), 4u);
  // The same value given by --set is no conflict; settings the plan leaves alone stay the
  // user's.
  const RunConfig same =
      config(path, {"parallel.schedule=\"cross-pass\"", "train.micro_batch=2", "train.lr=1e-3"});
  EXPECT_EQ(same.parallel.schedule, "cross-pass");
  EXPECT_DOUBLE_EQ(same.train.lr, 1e-3);
  // A degrees-only plan changes nothing.
  const RunConfig plain = config(plan_file({}));
  EXPECT_EQ(plain.parallel.schedule, "oases");
  EXPECT_EQ(plain.train.micro_batch, 4);
}

TEST_F(PlanFileSettings, ASetOfAKeyThePlanSetsOtherwiseIsAnError) {
  const std::string path = plan_file(
      {{"parallel.recompute", "full,none,selective,none"}, {"parallel.schedule", "cross-pass"}});
  EXPECT_TRUE(
      holds(user_error_of([&] { config(path, {"parallel.recompute=full"}); }),
            {"--set parallel.recompute=full differs from the plan file '" + path +
                 "' (parallel.plan), which sets parallel.recompute=full,none,selective,none",
             "drop --set parallel.recompute or edit the plan"}));
  // The last assignment of a key is the user's value.
  EXPECT_EQ(user_error_of([&] {
              config(path, {"parallel.schedule=oases", "parallel.schedule=cross-pass"});
            }),
            "");
}

TEST_F(PlanFileSettings, RunsFromAModelFolderTakeThemToo) {
  const std::string path =
      plan_file({{"parallel.recompute", "full,none,full,none"}, {"parallel.schedule", "megatron"}});
  const std::filesystem::path folder = dir_.path() / "gpt2";
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "config.json") << R"({"model_type": "gpt2", "n_layer": 4, "n_embd": 32,
    "n_head": 4, "n_positions": 16, "vocab_size": 257, "layer_norm_epsilon": 1e-05})";
  const RunConfig c = parse_run_config_with_folder("[parallel]\ntp = 2\n", "test.toml",
                                                   {"parallel.plan=" + path}, folder.string());
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.parallel.recompute, "full,none,full,none");
  EXPECT_EQ(c.parallel.schedule, "megatron");
}

TEST_F(PlanFileSettings, BadSettingsInThePlanNameThePlanFile) {
  const std::string unknown = plan_file({{"parallel.recomputation", "full"}});
  EXPECT_TRUE(holds(user_error_of([&] { config(unknown); }),
                    {"plan file '" + unknown + "'", "unknown config key parallel.recomputation"}));
  const std::string bad_word = plan_file({{"parallel.recompute", "full,none,most,none"}});
  EXPECT_TRUE(holds(user_error_of([&] { config(bad_word); }),
                    {"layer 2's \"most\" is not known", "parallel.plan = \"" + bad_word + "\""}));
}

}  // namespace
}  // namespace oases::plan
