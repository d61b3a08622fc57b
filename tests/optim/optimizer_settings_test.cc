// The [train] settings that choose and tune the optimizer: parsed, printed back, turned into an
// optim::OptimizerConfig, and rejected with the key's name when out of range.
#include "core/error.h"
#include "support/files.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::expect_user_error;

plan::RunConfig parse(const std::vector<std::string>& overrides) {
  return plan::parse_run_config("[model]\nlayers = 2\n", "test.toml", overrides);
}

TEST(OptimizerSettings, ParseIntoTheOptimizerConfigAndRoundTripThroughToml) {
  const plan::RunConfig c = parse({"train.optimizer=\"sgd\"", "train.momentum=0.9", "train.nesterov=true",
                             "train.weight_decay=0.01"});
  const optim::OptimizerConfig o = plan::make_run_plan(c).optimizer;
  EXPECT_EQ(o.kind, optim::OptimizerKind::sgd);
  EXPECT_DOUBLE_EQ(o.momentum, 0.9);
  EXPECT_TRUE(o.nesterov);
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.01);
  EXPECT_FALSE(o.relative_step);
  const plan::RunConfig again = plan::parse_run_config(to_toml(c), "printed");
  EXPECT_EQ(again.train.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(again.train.momentum, 0.9);
  EXPECT_TRUE(again.train.nesterov);

  const plan::RunConfig a =
      parse({"train.optimizer=\"adafactor\"", "train.lr=0", "train.adafactor_beta1=0.9"});
  const optim::OptimizerConfig ao = plan::make_run_plan(a).optimizer;
  EXPECT_TRUE(ao.relative_step);
  EXPECT_DOUBLE_EQ(ao.adafactor_beta1, 0.9);
  EXPECT_DOUBLE_EQ(plan::parse_run_config(to_toml(a), "printed").train.adafactor_beta1, 0.9);
  EXPECT_FALSE(plan::make_run_plan(parse({"train.optimizer=\"adafactor\""})).optimizer.relative_step);
}

TEST(OptimizerSettings, UnknownOptimizerListsTheValidOnes) {
  expect_user_error(
      [] { parse({"train.optimizer=\"lamb\""}); },
      {"train.optimizer = \"lamb\"", "\"adamw\"", "\"adafactor\"", "\"sm3\"", "\"sgd\""});
}

TEST(OptimizerSettings, BadValuesNameTheirKey) {
  const auto rejected = [](const std::vector<std::string>& overrides,
                           const std::vector<std::string>& parts) {
    expect_user_error([&] { parse(overrides); }, parts);
  };
  rejected({"train.lr=0"}, {"train.lr = 0", "adafactor"});
  rejected({"train.optimizer=\"sgd\"", "train.lr=0"}, {"train.lr = 0"});
  rejected({"train.optimizer=\"adafactor\"", "train.lr=0", "train.warmup_steps=10"},
           {"train.warmup_steps = 10", "relative step"});
  rejected({"train.optimizer=\"sgd\"", "train.momentum=1"}, {"train.momentum = 1", "[0, 1)"});
  rejected({"train.optimizer=\"sm3\"", "train.momentum=-0.5"}, {"train.momentum = -0.5"});
  rejected({"train.optimizer=\"adafactor\"", "train.adafactor_beta1=1"},
           {"train.adafactor_beta1 = 1"});
  rejected({"train.optimizer=\"sgd\"", "train.nesterov=true"},
           {"train.nesterov", "train.momentum > 0"});
  rejected({"train.momentum=0.9"}, {"train.momentum = 0.9", "\"adamw\"", "train.beta1"});
  rejected({"train.optimizer=\"adafactor\"", "train.momentum=0.9"},
           {"train.momentum", "train.adafactor_beta1"});
  rejected({"train.optimizer=\"sgd\"", "train.weight_decay=-1"}, {"train.weight_decay = -1"});
  rejected({"train.nesterov=3"}, {"train.nesterov"});
}

}  // namespace
}  // namespace oases::train
