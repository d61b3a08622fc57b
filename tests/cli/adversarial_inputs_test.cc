// `oases` given what a careless or hostile user might give it: special files where a file is
// read, settings that would need more memory than the host has, symlinks planted where the
// engine writes, NUL bytes in paths. Each must end at once with an error naming the file or
// setting, never hang, grow without bound or write elsewhere. Every command runs under
// `timeout`, so that a regression fails the test instead of hanging it.
#include "support/command.h"
#include "support/files.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace oases::testing {
namespace {

constexpr int kTimedOut = 124;  // timeout(1)'s exit code

std::string read_text(const fs::path& path) { return read_bytes(path.string()); }
void write_text(const fs::path& path, const std::string& text) { write_bytes(path.string(), text); }

// `oases args`, killed after `seconds`.
CommandResult oases(const std::string& args, int seconds = 60) {
  return run_command("timeout " + std::to_string(seconds) + " " + OASES_BINARY + " " + args);
}

void expect_error(const CommandResult& r, const std::vector<std::string>& fragments) {
  ASSERT_NE(r.exit_code, kTimedOut) << "timed out:\n" << r.output;
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const auto& f : fragments)
    EXPECT_NE(r.output.find(f), std::string::npos) << "expected '" << f << "' in:\n" << r.output;
}

// A tiny GPT's config in a folder of the test's own (ctest runs each test as a process of
// its own, possibly beside the others); its data and a checkpoint (step_1) for the tests that
// need them.
class AdversarialInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_folder("adversarial_inputs_runs");
    write_text(config(), R"([model]
layers = 1
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 256
seq_len = 16
[train]
micro_batch = 2
global_batch = 2
steps = 1
eval_every = 0
threads = 1
[data]
path = ")" + (dir_ / "data").string() + R"("
[checkpoint]
dir = ")" + (dir_ / "ckpt").string() + R"("
every = 1
[log]
peak_tflops = 1.0
)");
  }

  fs::path config() const { return dir_ / "tiny.toml"; }

  // Trains one step: the data and <dir>/ckpt/step_1.
  void make_checkpoint() const {
    const CommandResult data = prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(data.exit_code, 0) << data.output;
    const CommandResult run = oases("train --quiet --config " + config().string(), 300);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    ASSERT_TRUE(fs::exists(checkpoint() / "COMPLETE"));
  }
  fs::path checkpoint() const { return dir_ / "ckpt" / "step_1"; }

  // A copy of the checkpoint as <dir>/<name>/step_1.
  fs::path checkpoint_copy(const std::string& name) const {
    const fs::path copy = dir_ / name / "step_1";
    fs::create_directories(copy.parent_path());
    fs::copy(checkpoint(), copy, fs::copy_options::recursive);
    return copy;
  }

  // An empty folder inside the test's.
  fs::path scratch() const {
    fs::create_directories(dir_ / "scratch");
    return dir_ / "scratch";
  }

  std::string train(const std::string& settings) const {
    return "train --quiet --config " + config().string() + " --set checkpoint.dir=" +
           quoted("") + " " + settings;
  }

  fs::path dir_;
};

TEST_F(AdversarialInputs, ConfigThatIsNotARegularFileIsNamed) {
  const fs::path d = scratch();
  const fs::path fifo = d / "config.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(oases("train --config " + fifo.string(), 20), {fifo.string(), "is a FIFO"});
  expect_error(oases("train --config " + d.string(), 20), {d.string(), "is a directory"});
  expect_error(oases("train --config /dev/zero", 20), {"/dev/zero", "is a character device"});
  // A profile, too.
  expect_error(
      oases("plan --degrees-only --config " + config().string() + " --profile " + fifo.string(),
            20),
      {"profile '" + fifo.string() + "' is a FIFO"});
}

TEST_F(AdversarialInputs, ConfigBeyondSixteenMebibytesIsRefusedBeforeItIsRead) {
  const fs::path huge = scratch() / "huge.toml";
  write_text(huge, "");
  fs::resize_file(huge, std::uint64_t{17} << 20);
  expect_error(oases("train --config " + huge.string(), 20),
               {huge.string(), "17.0 MiB", "16.0 MiB"});
}

TEST_F(AdversarialInputs, RunsBeyondTheHostsMemoryAreRefusedBeforeTheyAllocate) {
  make_checkpoint();
  expect_error(oases(train("model.layers=2000000000"), 30),
               {"model.layers = 2000000000", "of physical memory"});
  expect_error(oases(train("model.vocab_size=2000000000"), 30),
               {"model.vocab_size = 2000000000", "of physical memory"});
  expect_error(oases(train("train.micro_batch=100000000000 train.global_batch=100000000000"), 30),
               {"train.micro_batch = 100000000000", "of physical memory"});
  expect_error(oases("eval --checkpoint " + checkpoint().string() + " --data " +
                         (dir_ / "data").string() + " --batch-size 100000000000",
                     30),
               {"--batch-size per rank = 100000000000", "of physical memory"});
}

TEST_F(AdversarialInputs, SpecialFilesInACheckpointAreNamedWithoutHanging) {
  make_checkpoint();
  const fs::path zero = checkpoint_copy("zero");
  fs::remove(zero / "model.safetensors");
  fs::create_symlink("/dev/zero", zero / "model.safetensors");
  expect_error(oases("verify-checkpoint " + zero.string(), 30),
               {"model.safetensors", "is a character device"});

  const fs::path fifo = checkpoint_copy("fifo");
  fs::remove(fifo / "model.safetensors");
  ASSERT_EQ(::mkfifo((fifo / "model.safetensors").c_str(), 0600), 0);
  expect_error(oases("verify-checkpoint " + fifo.string(), 30), {"model.safetensors", "is a FIFO"});

  const fs::path marker = checkpoint_copy("marker");
  fs::remove(marker / "COMPLETE");
  ASSERT_EQ(::mkfifo((marker / "COMPLETE").c_str(), 0600), 0);
  expect_error(oases("verify-checkpoint " + marker.string(), 30), {"COMPLETE", "is a FIFO"});
}

TEST_F(AdversarialInputs, GenerateNamesWhatItWasGiven) {
  const fs::path fifo = scratch() / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CommandResult r = oases("generate --checkpoint " + fifo.string(), 30);
  expect_error(r, {fifo.string(), "is a FIFO"});
  EXPECT_EQ(r.output.find("does not exist"), std::string::npos) << r.output;
}

TEST_F(AdversarialInputs, GenerateFromAModelFileOfACheckpointChecksItsMarker) {
  make_checkpoint();
  const std::string good = (checkpoint() / "model.safetensors").string();
  ASSERT_EQ(oases("generate --max-new-tokens 2 --checkpoint " + good, 60).exit_code, 0);
  const fs::path damaged = checkpoint_copy("damaged");
  std::string bytes = read_text(damaged / "model.safetensors");
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x10);
  write_text(damaged / "model.safetensors", bytes);
  expect_error(oases("generate --max-new-tokens 2 --checkpoint " +
                         (damaged / "model.safetensors").string(),
                     60),
               {"model.safetensors", "CRC-32"});
}

TEST_F(AdversarialInputs, OutputSettingsThatAreDirectoriesOrHoldNulAreNamed) {
  const fs::path d = scratch();
  expect_error(oases(train("log.trace=" + quoted(d.string())), 30),
               {"log.trace = \"" + d.string() + "\" is a directory"});
  EXPECT_TRUE(fs::is_empty(d));
  EXPECT_FALSE(fs::exists(d.string() + ".tmp"));
  const fs::path with_nul = d / "nul.toml";
  write_text(with_nul, read_text(config()) + "metrics = \"" + (d / "a").string() + "\\u0000b\"\n");
  expect_error(oases("train --quiet --config " + with_nul.string(), 30),
               {"log.metrics holds a NUL byte"});
}

TEST_F(AdversarialInputs, APlantedSymlinkDoesNotRedirectPrepareData) {
  const fs::path d = scratch();
  const fs::path victim = d / "victim";
  write_text(victim, "precious");
  fs::create_symlink(victim, d / "data_train.bin.tmp");
  const CommandResult r = prepare_fortunes_data(OASES_BINARY, d);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_text(victim), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(d / "data_train.bin")));
}

}  // namespace
}  // namespace oases::testing
