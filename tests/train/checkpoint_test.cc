#include "train/checkpoint.h"

#include "io/safetensors.h"

#include "support/files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace oases::train {
namespace {

// A checkpoint's reader needs its model, not how the run that wrote it was laid out and
// scheduled; a [parallel] section that no longer validates (an older release accepted
// sub_batches = 2 with the megatron schedule) does not stop it.
TEST(Checkpoint, StoredConfigIsReadWithoutItsParallelSection) {
  testing::TempDir dir("checkpoint_config");
  const std::string file = (dir.path() / "model.safetensors").string();
  io::SafetensorsWriter writer;
  const float value = 1.0f;
  writer.add("ln_f.bias", DType::f32, {1}, &value);
  writer.set_metadata("oases_config",
                      "[model]\nlayers = 3\nhidden = 48\nheads = 4\nffn_hidden = 96\n"
                      "[parallel]\ntp = 2\nschedule = \"megatron\"\nsub_batches = 2\n");
  writer.write(file);
  const plan::RunConfig config = config_from_checkpoint(file);
  EXPECT_EQ(config.model.layers, 3);
  EXPECT_EQ(config.model.hidden, 48);
  EXPECT_EQ(config.parallel.tp, 1);
  EXPECT_EQ(config.parallel.sub_batches, 0);
}

TEST(Checkpoint, StoredConfigKeepsEveryString) {
  testing::TempDir dir("checkpoint_config");
  const std::string file = (dir.path() / "model.safetensors").string();
  plan::RunConfig stored;
  stored.log.metrics = "\nruns/a'''b";
  io::SafetensorsWriter writer;
  const float value = 1.0f;
  writer.add("ln_f.bias", DType::f32, {1}, &value);
  writer.set_metadata("oases_config", to_toml(stored));
  writer.write(file);
  EXPECT_EQ(config_from_checkpoint(file).log.metrics, stored.log.metrics);
}

}  // namespace
}  // namespace oases::train
