// The checkpoint folder protocol: what a complete folder holds, how its marker is checked, and
// what counts as a leftover of an interrupted save or prune.
#include "io/checkpoint_dir.h"

#include "io/safetensors.h"
#include "support/files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace oases::io {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::read_bytes;
using testing::write_bytes;

class CheckpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.add_copy("w", DType::f32, {4}, weights_.data());
    optimizer_.add_copy("exp_avg.w", DType::f32, {4}, weights_.data());
    optimizer_.set_metadata("step", "1");
  }
  std::string save(std::int64_t step, std::int64_t keep) {
    return write_checkpoint(dir_.path().string(), step, model_, optimizer_, keep);
  }
  std::vector<std::int64_t> steps() const {
    std::vector<std::int64_t> out;
    for (const auto& [step, folder] : complete_checkpoints(dir_.path().string()))
      out.push_back(step);
    return out;
  }

  testing::TempDir dir_{"checkpoint_dir"};
  std::vector<float> weights_{1, 2, 3, 4};
  SafetensorsWriter model_, optimizer_;
};

TEST_F(CheckpointDir, MarkerListsEveryFileWithItsSizeAndChecksum) {
  const std::string folder = save(3, 0);
  EXPECT_EQ(fs::path(folder).filename(), "step_3");
  const std::string marker = read_bytes((fs::path(folder) / kCompleteMarker).string());
  EXPECT_EQ(marker.rfind("oases-checkpoint 1\nstep 3\nfile model.safetensors ", 0), 0u) << marker;
  EXPECT_NE(marker.find("\nfile optimizer.safetensors "), std::string::npos) << marker;
  const CheckpointFiles files = verify_checkpoint_files(folder);
  EXPECT_EQ(files.step, 3);
  EXPECT_TRUE(files.checksummed);
}

TEST_F(CheckpointDir, KeepsTheNewestAndNeverLeavesTemporaryFolders) {
  for (std::int64_t step = 1; step <= 5; ++step) save(step, 2);
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{4, 5}));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_.path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_4", "step_5"}));
  EXPECT_EQ(fs::path(*latest_checkpoint(dir_.path().string())).filename(), "step_5");
}

TEST_F(CheckpointDir, LeftoversAreListedThenCleaned) {
  save(2, 0);
  fs::create_directories(dir_.path() / "step_4.partial");   // a save that never finished
  fs::create_directories(dir_.path() / "step_1.deleting");  // a prune that never finished
  fs::create_directories(dir_.path() / "notes");            // not ours: left alone
  const std::string root = dir_.path().string();
  const auto leftovers = checkpoint_leftovers(root);
  ASSERT_EQ(leftovers.size(), 2u);
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{2}));  // leftovers never count as complete
  EXPECT_EQ(clean_checkpoint_dir(root), leftovers);
  EXPECT_TRUE(checkpoint_leftovers(root).empty());
  EXPECT_TRUE(fs::exists(dir_.path() / "notes"));
  EXPECT_TRUE(fs::exists(dir_.path() / "step_2" / kModelFile));
}

// A step folder without a marker is not the protocol's (a save never leaves one): it is
// neither complete nor a leftover, nothing removes it, and a save beside it is refused with
// its name and what to do.
TEST_F(CheckpointDir, AStepFolderWithoutAMarkerIsNeverDeletedAndStopsTheSave) {
  save(2, 0);
  const fs::path unmarked = dir_.path() / "step_3";
  fs::create_directories(unmarked);
  write_bytes((unmarked / kModelFile).string(), "weights someone copied by hand");
  const std::string root = dir_.path().string();
  EXPECT_EQ(unmarked_step_folders(root), std::vector<std::string>{unmarked.string()});
  EXPECT_TRUE(checkpoint_leftovers(root).empty());
  EXPECT_TRUE(clean_checkpoint_dir(root).empty());
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{2}));
  expect_user_error([&] { save(4, 1); },
                    {unmarked.string(), "without a COMPLETE marker", "mv "});
  EXPECT_TRUE(fs::exists(unmarked / kModelFile));
  EXPECT_FALSE(fs::exists(dir_.path() / "step_4"));
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{2}));  // keep = 1 pruned nothing either
  fs::rename(unmarked, dir_.path() / "step_3.kept");  // what the message suggests
  save(4, 1);
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{4}));
}

TEST_F(CheckpointDir, DamagedMarkersAndFilesAreRejectedNamingWhatDiffers) {
  const std::string folder = save(7, 0);
  const std::string marker_path = (fs::path(folder) / kCompleteMarker).string();
  const std::string marker = read_bytes(marker_path);
  const auto with_marker = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_bytes(marker_path, text);
    expect_user_error([&] { verify_checkpoint_files(folder); }, parts);
    write_bytes(marker_path, marker);
  };
  with_marker("oases-checkpoint 9\n", {"starts with 'oases-checkpoint 9'"});
  with_marker("oases-checkpoint 1\nstep 6\n", {"marker says 'step 6'", "step 7"});
  std::string only_model = marker.substr(0, marker.find("\nfile optimizer") + 1);
  with_marker(only_model, {"does not list optimizer.safetensors"});
  std::string bad_hex = marker;
  bad_hex.replace(bad_hex.size() - 9, 8, "zzzzzzzz");
  with_marker(bad_hex, {"is not 'file <name> <bytes> <crc32>'"});
  with_marker(marker + "file ../escape 1 00000000\n", {"is not 'file"});

  // A marker from before checksums: only the step is checked.
  write_bytes(marker_path, "step 7\n");
  EXPECT_FALSE(verify_checkpoint_files(folder).checksummed);
  write_bytes(marker_path, marker);

  const std::string model_path = (fs::path(folder) / kModelFile).string();
  std::string bytes = read_bytes(model_path);
  bytes[bytes.size() - 2] ^= 1;
  write_bytes(model_path, bytes);
  expect_user_error([&] { verify_checkpoint_files(folder); },
                    {"model.safetensors has CRC-32", "damaged"});
  fs::remove(model_path);
  expect_user_error([&] { verify_checkpoint_files(folder); },
                    {"model.safetensors, which is missing"});
  fs::remove(marker_path);
  expect_user_error([&] { verify_checkpoint_files(folder); }, {"no COMPLETE marker"});
}

TEST(CheckpointStep, ReadsOnlyStepFolderNames) {
  EXPECT_EQ(checkpoint_step("/runs/a/step_12"), 12);
  expect_user_error([] { checkpoint_step("/runs/a/step_12.partial"); }, {"step_<N>"});
  expect_user_error([] { checkpoint_step("/runs/a/latest"); }, {"step_<N>"});
}

}  // namespace
}  // namespace oases::io
