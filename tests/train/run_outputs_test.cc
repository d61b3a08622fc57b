// A run's outputs are claimed before anything is written: paths that would overwrite one
// another, a directory where a file belongs, a file inside a checkpoint folder, an unwritable
// checkpoint.dir and a folder another run holds are errors naming the setting and the path.
#include "train/run_outputs.h"

#include "support/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace oases::train {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::TempDir;

plan::RunConfig config_in(const fs::path& dir) {
  plan::RunConfig config;
  config.checkpoint.dir = (dir / "ckpt").string();
  config.log.metrics = (dir / "run" / "metrics.jsonl").string();
  config.log.trace = (dir / "run" / "trace.json").string();
  return config;
}

TEST(RunOutputs, AValidRunClaimsItsFoldersAndCreatesThem) {
  TempDir dir("run_outputs");
  const plan::RunConfig config = config_in(dir.path());
  const RunOutputs outputs = claim_run_outputs(config);
  EXPECT_TRUE(fs::is_regular_file(dir.path() / "ckpt" / kCheckpointDirLock));
  EXPECT_TRUE(fs::is_regular_file(dir.path() / "run" / "metrics.jsonl.lock"));
  // Nothing else: the probe for writability leaves no file behind.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path() / "ckpt"))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{kCheckpointDirLock});
}

TEST(RunOutputs, ASecondClaimOfTheSameFoldersNamesTheHolder) {
  TempDir dir("run_outputs");
  plan::RunConfig config = config_in(dir.path());
  std::optional<RunOutputs> first(claim_run_outputs(config));
  expect_user_error([&] { claim_run_outputs(config); },
                    {"checkpoint.dir", "in use by another run", "pid " + std::to_string(getpid()),
                     "LOCK"});
  // Another checkpoint.dir, the same metrics file: the metrics lock refuses.
  config.checkpoint.dir = (dir.path() / "ckpt2").string();
  expect_user_error([&] { claim_run_outputs(config); },
                    {"log.metrics", "in use by another run", "metrics.jsonl.lock"});
  first.reset();
  EXPECT_NO_THROW(claim_run_outputs(config));
}

TEST(RunOutputs, OverlappingOrMisplacedOutputPathsAreRejected) {
  TempDir dir("run_outputs");
  plan::RunConfig config = config_in(dir.path());
  config.log.trace = config.log.metrics;
  expect_user_error([&] { claim_run_outputs(config); },
                    {"log.trace", "same file as log.metrics"});
  // Two spellings of one file are one file.
  config.log.trace = (dir.path() / "run" / "." / "metrics.jsonl").string();
  expect_user_error([&] { claim_run_outputs(config); }, {"same file as log.metrics"});
  config.log.trace = (dir.path() / "run" / "run.json").string();
  expect_user_error([&] { claim_run_outputs(config); }, {"log.trace", "run.json"});
  config.log.trace = (dir.path() / "ckpt" / "step_4" / "model.safetensors").string();
  expect_user_error([&] { claim_run_outputs(config); }, {"log.trace", "lies in checkpoint.dir"});
  // Beside the checkpoints (not in one of them) is fine.
  config.log.trace = (dir.path() / "ckpt" / "trace.json").string();
  EXPECT_NO_THROW(claim_run_outputs(config));
}

TEST(RunOutputs, AnUnwritableCheckpointDirIsFoundAtStartUp) {
  TempDir dir("run_outputs");
  plan::RunConfig config = config_in(dir.path());
  config.checkpoint.dir = "/dev/null/ck";
  expect_user_error([&] { claim_run_outputs(config); },
                    {"checkpoint.dir = '/dev/null/ck'", "cannot be made a folder"});
  testing::write_bytes((dir.path() / "a_file").string(), "x");
  config.checkpoint.dir = (dir.path() / "a_file").string();
  expect_user_error([&] { claim_run_outputs(config); }, {"checkpoint.dir", "a_file"});
  if (geteuid() != 0) {  // root writes through permissions
    fs::create_directories(dir.path() / "read_only");
    fs::permissions(dir.path() / "read_only", fs::perms::owner_read | fs::perms::owner_exec);
    config.checkpoint.dir = (dir.path() / "read_only").string();
    expect_user_error([&] { claim_run_outputs(config); }, {"checkpoint.dir", "not writable"});
  }
}

TEST(RunOutputs, AStepFolderWithoutAMarkerStopsTheRunAndStays) {
  TempDir dir("run_outputs");
  const plan::RunConfig config = config_in(dir.path());
  fs::create_directories(dir.path() / "ckpt" / "step_7");
  testing::write_bytes((dir.path() / "ckpt" / "step_7" / "model.safetensors").string(), "w");
  expect_user_error([&] { claim_run_outputs(config); },
                    {"step_7", "without a COMPLETE marker", "mv "});
  EXPECT_TRUE(fs::exists(dir.path() / "ckpt" / "step_7" / "model.safetensors"));
}

}  // namespace
}  // namespace oases::train
