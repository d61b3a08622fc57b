// The engine when things go wrong around it, tried as a user would meet it: a kill at any
// system call of a checkpoint save leaves only checkpoints that verify and resume exactly;
// training that goes non-finite stops before anything non-finite is saved; a full disk under
// the metrics is an error; a rank that never starts ends the job within the start-up timeout;
// damaged files of every kind are rejected, naming the file and what is wrong.
#include "core/checksum.h"
#include "io/safetensors.h"
#include "support/command.h"
#include "support/runs.h"

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;

namespace oases::testing {
namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Flips one bit of the byte at `offset` (from the end when negative).
void flip_bit(const fs::path& path, std::int64_t offset) {
  std::string bytes = read_text(path);
  const auto at = static_cast<std::size_t>(
      offset >= 0 ? offset : static_cast<std::int64_t>(bytes.size()) + offset);
  ASSERT_LT(at, bytes.size());
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  write_text(path, bytes);
}


void expect_mentions(const CommandResult& r, const std::vector<std::string>& fragments) {
  for (const auto& f : fragments)
    EXPECT_NE(r.output.find(f), std::string::npos) << "expected '" << f << "' in:\n" << r.output;
}

class Reliability : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_folder("reliability_runs");
    const CommandResult data = prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(data.exit_code, 0) << data.output;
    // Paths inside the run (checkpoints, metrics) are relative, so that runs started in
    // different folders store the same configuration and write byte-identical checkpoints.
    write_text(dir_ / "tiny.toml", R"(
[model]
layers = 1
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 256
seq_len = 16
dropout = 0.1
[train]
micro_batch = 2
global_batch = 2
steps = 4
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
lr_decay_steps = 8
eval_every = 0
threads = 1
[data]
path = ")" + (dir_ / "data").string() + R"("
[checkpoint]
dir = "ckpt"
every = 1
keep = 2
resume = true
[log]
metrics = "metrics.jsonl"
peak_tflops = 1.0
)");
  }

  // `oases train` on tiny.toml, run inside `run_dir`, behind `prefix` (strace, sh -c ...).
  std::string train_in(const fs::path& run_dir, const std::string& settings,
                       const std::string& prefix = "") const {
    return "cd " + run_dir.string() + " && " + prefix + OASES_BINARY +
           " train --quiet --config " + (dir_ / "tiny.toml").string() +
           (settings.empty() ? "" : " --set " + settings);
  }

  CommandResult oases(const std::string& args) const {
    return run_command(std::string(OASES_BINARY) + " " + args);
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------
// A kill at every rename, unlink, rmdir, mkdir, fsync and write of a save-and-prune cycle.

// How many calls of each system call a traced command made (strace -f -o trace), in the
// thread that made the most: strace counts the invocations of `when=` per thread, and an
// asynchronous save writes on a thread of its own.
std::map<std::string, int> count_calls(const fs::path& trace) {
  std::map<std::pair<std::string, std::string>, int> per_thread;  // (thread, call) -> count
  std::ifstream in(trace);
  for (std::string line; std::getline(in, line);) {
    std::size_t at = line.find_first_not_of("0123456789 ");
    if (at == std::string::npos || line.compare(at, 4, "<...") == 0) continue;  // resumptions
    const std::size_t paren = line.find('(', at);
    if (paren == std::string::npos) continue;
    const std::string thread = line.substr(0, line.find(' '));
    ++per_thread[{thread, line.substr(at, paren - at)}];
  }
  std::map<std::string, int> counts;
  for (const auto& [key, count] : per_thread)
    counts[key.second] = std::max(counts[key.second], count);
  return counts;
}

// The run is resumed from step_2 (step_1 and step_2 exist) to step 3: it saves step_3 and
// prunes step_1, with a kill at the k-th call of `syscall`. After each kill, every folder that
// claims to be complete must verify, and the resumed run must clean what the kill left and end
// bitwise where the uninterrupted run ended. Synchronous saves, and asynchronous ones
// (checkpoint.async: the kill lands on the writer thread while training goes on).
class KillDuringCheckpoint
    : public Reliability,
      public ::testing::WithParamInterface<std::tuple<std::string, bool>> {};

TEST_P(KillDuringCheckpoint, LeavesOnlyVerifiableCheckpointsAndResumesBitwise) {
  const std::string syscall = std::get<0>(GetParam());
  const std::string async = std::get<1>(GetParam()) ? " checkpoint.async=true" : "";
  ASSERT_EQ(run_command("strace -o /dev/null true").exit_code, 0)
      << "strace is needed (Debian's strace package, installed by scripts/install-deps.sh) and "
         "must be allowed to trace";

  const fs::path reference = dir_ / "reference", base = dir_ / "base";
  for (const auto& d : {reference, base}) fs::create_directories(d);
  CommandResult r = run_command(train_in(reference, "train.steps=4" + async));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string reference_marker = read_text(reference / "ckpt/step_4/COMPLETE");
  const std::map<int, double> reference_losses = losses_by_step(reference / "metrics.jsonl");
  ASSERT_EQ(reference_losses.size(), 4u);
  r = run_command(train_in(base, "train.steps=2" + async));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto fresh_copy_of_base = [&](const fs::path& to) {
    fs::remove_all(to);
    fs::copy(base, to, fs::copy_options::recursive);
  };
  const fs::path dry = dir_ / "dry";
  fresh_copy_of_base(dry);
  // LeakSanitizer cannot work in a traced process, so sanitized builds (scripts/test-sanitize.sh)
  // check leaks of these runs untraced, in the other tests, and not here.
  const std::string without_leak_check = "env ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 ";
  r = run_command(train_in(dry, "train.steps=3" + async,
                           without_leak_check + "strace -f -o " + (dir_ / "trace").string() +
                               " -e trace=" + syscall + " "));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int calls = count_calls(dir_ / "trace")[syscall];
  ASSERT_GT(calls, 0) << "the save made no " << syscall << " call";

  for (int k = 1; k <= calls; ++k) {
    SCOPED_TRACE(syscall + " call " + std::to_string(k) + " of " + std::to_string(calls));
    const fs::path trial = dir_ / "trial";
    fresh_copy_of_base(trial);
    r = run_command(train_in(trial, "train.steps=3" + async,
                             without_leak_check + "strace -f -o /dev/null -e trace=" + syscall +
                                 " -e inject=" +
                                 syscall + ":signal=KILL:when=" + std::to_string(k) + " "));
    ASSERT_NE(r.exit_code, 0) << "the kill did not happen:\n" << r.output;

    r = oases("verify-checkpoint " + (trial / "ckpt").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;

    r = run_command(train_in(trial, "train.steps=4" + async));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::set<std::string> left;
    for (const auto& entry : fs::directory_iterator(trial / "ckpt"))
      if (entry.path().filename() != "LOCK") left.insert(entry.path().filename().string());
    EXPECT_EQ(left, (std::set<std::string>{"step_3", "step_4"}));
    EXPECT_EQ(read_text(trial / "ckpt/step_4/COMPLETE"), reference_marker)
        << "the resumed run's step_4 differs from the uninterrupted run's";
    EXPECT_EQ(losses_by_step(trial / "metrics.jsonl"), reference_losses);
  }
}

INSTANTIATE_TEST_SUITE_P(EverySyscall, KillDuringCheckpoint,
                         ::testing::Combine(::testing::Values("write", "fsync", "rename",
                                                              "unlink", "unlinkat", "rmdir",
                                                              "mkdir"),
                                            ::testing::Bool()),
                         [](const auto& param_info) {
                           return std::get<0>(param_info.param) +
                                  (std::get<1>(param_info.param) ? "_async" : "");
                         });

// checkpoint.async writes the same files as a synchronous save, and the metrics say how long
// each save held training up.
TEST_F(Reliability, AsynchronousSavesWriteTheSameFilesAsSynchronousOnes) {
  for (const std::string mode : {"sync", "async"}) {
    fs::create_directories(dir_ / mode);
    const CommandResult r = run_command(train_in(
        dir_ / mode, "checkpoint.keep=0 checkpoint.async=" +
                         std::string(mode == "async" ? "true" : "false")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // The files differ only in the config they store (checkpoint.async): every tensor and
  // every other metadata entry is the same, byte for byte.
  for (int step = 1; step <= 4; ++step)
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      const std::string name = "ckpt/step_" + std::to_string(step) + "/" + file;
      const auto async = io::SafetensorsFile::open((dir_ / "async" / name).string());
      const auto sync = io::SafetensorsFile::open((dir_ / "sync" / name).string());
      ASSERT_EQ(async.names(), sync.names()) << name;
      for (const std::string& tensor : sync.names())
        EXPECT_EQ(async.read_raw(tensor), sync.read_raw(tensor)) << name << " " << tensor;
      auto async_metadata = async.metadata(), sync_metadata = sync.metadata();
      EXPECT_NE(async_metadata.at("oases_config").find("async = true"), std::string::npos);
      async_metadata.erase("oases_config");
      sync_metadata.erase("oases_config");
      EXPECT_EQ(async_metadata, sync_metadata) << name;
    }
  std::ifstream in(dir_ / "async" / "metrics.jsonl");
  int with_stall = 0;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("checkpoint_s")) {
      EXPECT_GE(record["checkpoint_s"].get<double>(), 0.0);
      ++with_stall;
    }
  }
  EXPECT_EQ(with_stall, 3) << "steps 2 to 4 each follow a save";
}

// ---------------------------------------------------------------------------------------
// Non-finite training

TEST_F(Reliability, DivergingRunStopsBeforeSavingAnythingNonFinite) {
  for (const std::string clip : {"1.0", "0"}) {
    SCOPED_TRACE("train.grad_clip = " + clip);
    const fs::path run = dir_ / ("clip_" + clip);
    fs::create_directories(run);
    const CommandResult r = run_command(
        train_in(run, "train.steps=30 train.lr=1e4 train.warmup_steps=0 train.grad_clip=" + clip));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    expect_mentions(r, {"step", "train.lr"});
    if (clip == "1.0") {
      // Clipping is on: the advice must not be to turn it on.
      EXPECT_EQ(r.output.find("enable train.grad_clip"), std::string::npos) << r.output;
    }
    // Every checkpoint written before the stop verifies, finiteness included.
    const CommandResult verify = oases("verify-checkpoint " + (run / "ckpt").string());
    EXPECT_EQ(verify.exit_code, 0) << verify.output;
    // And the metrics never hold a null (a non-finite value printed as JSON).
    EXPECT_EQ(read_text(run / "metrics.jsonl").find("null"), std::string::npos);
  }
}

TEST_F(Reliability, LossAboveMaxLossStopsTheRun) {
  const CommandResult r = run_command(train_in(dir_, "train.max_loss=2.0"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"step 1", "train.max_loss = 2"});
  EXPECT_FALSE(fs::exists(dir_ / "ckpt/step_1"));
}

// ---------------------------------------------------------------------------------------
// Metrics

TEST_F(Reliability, MetricsOnAFullDiskIsAnError) {
  // A file-size limit makes the metrics file's write fail part-way, as a full disk does
  // (EFBIG instead of ENOSPC through the same checked write); checkpoints go nowhere.
  const CommandResult r = run_command(train_in(
      dir_, "train.steps=40 checkpoint.resume=false checkpoint.dir=\\\"\\\"", "ulimit -f 8 && trap '' XFSZ && "));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"metrics.jsonl", "File too large"});
}

// A command run in a private mount namespace with a tmpfs of `size` mounted at `mount_point`:
// a real small disk, gone when the command ends. `body` holds no single quote.
std::string on_small_disk(const fs::path& mount_point, const std::string& size,
                          const std::string& body) {
  fs::create_directories(mount_point);
  return "unshare -m sh -c 'mount -t tmpfs -o size=" + size + " tmpfs " + mount_point.string() +
         " && " + body + "'";
}

bool small_disks_available(const fs::path& dir) {
  return run_command(on_small_disk(dir / "probe", "64k", "true")).exit_code == 0;
}

TEST_F(Reliability, MetricsOnARealFullDiskIsAnError) {
  if (!small_disks_available(dir_)) GTEST_SKIP() << "needs unshare -m and mount (root)";
  const fs::path disk = dir_ / "disk";
  const CommandResult r = run_command(on_small_disk(
      disk, "8k",
      train_in(dir_, "train.steps=40 checkpoint.resume=false checkpoint.dir=\\\"\\\" "
                     "log.metrics=" + quoted((disk / "metrics.jsonl").string()))));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"metrics.jsonl", "No space left on device"});
}

TEST_F(Reliability, CheckpointsFitADiskThatHoldsOnlyOne) {
  if (!small_disks_available(dir_)) GTEST_SKIP() << "needs unshare -m and mount (root)";
  // One checkpoint of the tiny model takes about 215 kB: 400 kB holds one, not two.
  const fs::path disk = dir_ / "disk";
  const std::string ckpt = (disk / "ckpt").string();
  CommandResult r = run_command(on_small_disk(
      disk, "400k",
      train_in(dir_, "train.steps=3 checkpoint.keep=1 checkpoint.dir=" + quoted(ckpt)) +
          "; echo train-exit=$?; " + OASES_BINARY + " verify-checkpoint " + ckpt + "; ls " +
          ckpt));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_mentions(r, {"train-exit=0", "pruned", "before writing step_2", "step_3: ok"});
  EXPECT_EQ(r.output.find("step_2\n"), std::string::npos) << r.output;

  // With every checkpoint kept, the second save cannot fit: a clear error, the first
  // checkpoint intact and nothing of the failed save left to hold space.
  r = run_command(on_small_disk(
      disk, "400k",
      train_in(dir_, "train.steps=3 checkpoint.keep=0 checkpoint.dir=" + quoted(ckpt)) +
          "; echo train-exit=$?; " + OASES_BINARY + " verify-checkpoint " + ckpt +
          "; echo listing:; ls " + ckpt));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_mentions(r, {"train-exit=2", "No space left on device", "step_2 was not saved",
                      "step_1: ok"});
  // LOCK: the run's lock file (one writer per folder), which stays.
  EXPECT_EQ(r.output.substr(r.output.find("listing:")), "listing:\nLOCK\nstep_1\n");
}

TEST_F(Reliability, ALogThatCannotBeWrittenStopsTheRunWithoutACrash) {
  // stderr on a full device: the first progress line fails; the run must stop with the exit
  // code of an error, not abort on an unhandled exception.
  std::string command =
      train_in(dir_, "train.steps=2 checkpoint.resume=false checkpoint.dir=\\\"\\\"");
  command.erase(command.find(" --quiet"), 8);
  const CommandResult r = run_command(command + " 2>/dev/full; echo exit=$?");
  EXPECT_NE(r.output.find("exit=2"), std::string::npos) << r.output;
}

TEST_F(Reliability, OutputThatCannotBeWrittenIsAnError) {
  // stdout on a full device: what a verb prints is still buffered when it returns, so only
  // the final flush can tell; that must be an error too, not exit 0.
  const CommandResult r = run_command(std::string(OASES_BINARY) + " train --print-config --config " +
                                      (dir_ / "tiny.toml").string() +
                                      " 2>&1 >/dev/full; echo exit=$?");
  EXPECT_NE(r.output.find("could not write the standard output: No space left on device"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("exit=2"), std::string::npos) << r.output;
}

TEST_F(Reliability, ResumedRunRewritesTheMetricsFromItsStep) {
  CommandResult r = run_command(train_in(dir_, "train.steps=4 checkpoint.keep=0"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto full = losses_by_step(dir_ / "metrics.jsonl");
  // As if the run had stopped after writing step 4's metrics but before its checkpoint.
  fs::remove_all(dir_ / "ckpt/step_4");
  fs::remove_all(dir_ / "ckpt/step_3");
  r = run_command(train_in(dir_, "train.steps=4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses_by_step(dir_ / "metrics.jsonl"), full);  // each step once, same values
}

// A run's numbers do not depend on train.threads: trained at 2 threads and resumed halfway at
// 1 (as on a machine with fewer cores), it matches the run trained at 1 thread throughout.
// The model is large enough that its matrix products are shared among threads, and uneven
// (OpenBLAS's own threading gave other losses from step 2 on at these sizes).
TEST_F(Reliability, ResumedAtAnotherThreadCountIsBitwiseTheRunAtOneThread) {
  const std::string model =
      "model.hidden=96 model.heads=4 model.ffn_hidden=400 model.seq_len=100 "
      "train.micro_batch=7 train.global_batch=14 train.steps=4 train.grad_clip=0.5 ";
  fs::create_directories(dir_ / "one");
  CommandResult r = run_command(train_in(dir_ / "one", model + "train.threads=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::create_directories(dir_ / "split");
  r = run_command(train_in(dir_ / "split", model + "train.threads=2 train.steps=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command(train_in(dir_ / "split", model + "train.threads=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto one = losses_by_step(dir_ / "one/metrics.jsonl");
  ASSERT_EQ(one.size(), 4u);
  EXPECT_EQ(losses_by_step(dir_ / "split/metrics.jsonl"), one);
  const auto tensors = [](const fs::path& file) {
    const auto opened = io::SafetensorsFile::open(file.string());
    std::map<std::string, std::vector<std::byte>> bytes;
    for (const std::string& name : opened.names()) bytes[name] = opened.read_raw(name);
    return bytes;
  };
  EXPECT_EQ(tensors(dir_ / "split/ckpt/step_4/model.safetensors"),
            tensors(dir_ / "one/ckpt/step_4/model.safetensors"));
  EXPECT_EQ(tensors(dir_ / "split/ckpt/step_4/optimizer.safetensors"),
            tensors(dir_ / "one/ckpt/step_4/optimizer.safetensors"));
}

// ---------------------------------------------------------------------------------------
// Damaged checkpoints and resume metadata

class DamagedCheckpoint : public Reliability {
 protected:
  void SetUp() override {
    Reliability::SetUp();
    const CommandResult r = run_command(train_in(dir_, "train.steps=2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    step_ = dir_ / "ckpt/step_2";
  }

  // Rewrites the optimizer file with changed metadata and a marker that vouches for it, as a
  // careless tool would: only the metadata checks can catch it.
  void rewrite_optimizer_metadata(const std::string& key, const std::string& value) {
    const std::string path = (step_ / "optimizer.safetensors").string();
    std::vector<std::vector<std::byte>> bytes;
    io::SafetensorsWriter writer;
    {
      const io::SafetensorsFile file = io::SafetensorsFile::open(path);
      for (const auto& name : file.names()) {
        const auto& info = file.info(name);
        const std::vector<std::byte> raw = file.read_raw(name);
        writer.add_copy(name, info.dtype, info.shape, raw.data());
      }
      for (const auto& [k, v] : file.metadata()) writer.set_metadata(k, v);
    }
    writer.set_metadata(key, value);
    writer.write(path);
    std::string marker = "oases-checkpoint 1\nstep 2\n";
    for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
      const FileChecksum sum = file_checksum((step_ / name).string());
      marker += "file " + std::string(name) + " " + std::to_string(sum.bytes) + " " +
                fmt::format("{:08x}", sum.crc32) + "\n";
    }
    write_text(step_ / "COMPLETE", marker);
  }

  CommandResult resume() const { return run_command(train_in(dir_, "train.steps=4")); }

  fs::path step_;
};

TEST_F(DamagedCheckpoint, BitFlipInEitherFileIsRejectedByItsChecksum) {
  for (const std::string name : {"model.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(name);
    const std::string original = read_text(step_ / name);
    flip_bit(step_ / name, -5);  // inside the last tensor's values
    CommandResult r = resume();
    EXPECT_EQ(r.exit_code, 2) << r.output;
    expect_mentions(r, {"step_2", name, "CRC-32"});
    r = oases("verify-checkpoint " + step_.string());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    expect_mentions(r, {name, "CRC-32"});
    write_text(step_ / name, original);
  }
  EXPECT_EQ(oases("verify-checkpoint " + step_.string()).exit_code, 0);
}

TEST_F(DamagedCheckpoint, AppendedBytesAreRejected) {
  write_text(step_ / "model.safetensors", read_text(step_ / "model.safetensors") + "extra");
  CommandResult r = resume();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"model.safetensors", "its marker says", "truncated or altered"});
  // Under a marker without checksums (older checkpoints) the reader itself refuses them.
  write_text(step_ / "COMPLETE", "step 2\n");
  r = resume();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"model.safetensors", "holds 5 bytes after its tensors' data"});
}

TEST_F(DamagedCheckpoint, ResumeMetadataIsCheckedAgainstTheCheckpoint) {
  const std::string original = read_text(step_ / "optimizer.safetensors");
  const std::string marker = read_text(step_ / "COMPLETE");
  const auto restore = [&] {
    write_text(step_ / "optimizer.safetensors", original);
    write_text(step_ / "COMPLETE", marker);
  };
  struct Case {
    std::string key, value;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases{
      {"data_position", "-7", {"data position -7", "step 2"}},
      {"data_position", "9223372036854775807", {"data position 9223372036854775807"}},
      {"step", "5", {"says step 5", "folder step 2"}},
      {"step", "2x", {"step", "not an integer"}},
      {"data_tokens", "12", {"12 tokens", "--init-from"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    rewrite_optimizer_metadata(c.key, c.value);
    const CommandResult r = resume();
    EXPECT_EQ(r.exit_code, 2) << r.output;  // a clear error, not an internal one
    expect_mentions(r, c.expected);
    EXPECT_EQ(r.output.find("this is a bug"), std::string::npos) << r.output;
    restore();
  }
  const CommandResult r = resume();
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(DamagedCheckpoint, InterruptedSavesAreCleanedAndVerifyReportsThem) {
  fs::create_directories(dir_ / "ckpt/step_7");               // not the protocol's: kept
  fs::create_directories(dir_ / "ckpt/step_8.partial");       // a save that never finished
  fs::copy(step_, dir_ / "ckpt/step_1.deleting", fs::copy_options::recursive);  // half pruned
  CommandResult r = oases("verify-checkpoint " + (dir_ / "ckpt").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_mentions(r, {"step_7: a step folder without a COMPLETE marker", "step_8.partial",
                      "step_1.deleting", "step_2: ok"});
  r = run_command(train_in(dir_, "train.steps=3"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"step_7", "without a COMPLETE marker"});
  fs::remove(dir_ / "ckpt/step_7");  // as the message says: move it away
  r = run_command(train_in(dir_, "train.steps=3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_ / "ckpt"))
    left.insert(entry.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"LOCK", "step_2", "step_3"}));
}

// ---------------------------------------------------------------------------------------
// Damaged data, plan and profile files

TEST_F(Reliability, DamagedShardIsRejected) {
  const fs::path shard = dir_ / "data_train.bin";
  const std::string original = read_text(shard);
  flip_bit(shard, -100);  // a token changed, still inside the vocabulary
  CommandResult r = run_command(train_in(dir_, "train.steps=1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"data_train.bin", "CRC-32", "prepare-data"});
  write_text(shard, original + "x");
  r = run_command(train_in(dir_, "train.steps=1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"data_train.bin", "1 unexpected bytes"});
}

TEST_F(Reliability, DamagedPlanAndProfileFilesAreRejected) {
  const fs::path plan = dir_ / "plan.json";
  const std::string good_plan =
      R"({"format": "oases-plan", "version": 1, "tp": 1, "degrees": [1]})";
  write_text(plan, good_plan);
  CommandResult r = run_command(
      train_in(dir_, "train.steps=1 checkpoint.resume=false checkpoint.dir=\\\"\\\" parallel.plan=" + quoted(plan.string())));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  write_text(plan, good_plan + "}");
  r = run_command(
      train_in(dir_, "train.steps=1 checkpoint.resume=false checkpoint.dir=\\\"\\\" parallel.plan=" + quoted(plan.string())));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"plan.json", "not JSON"});

  const fs::path profile = dir_ / "profile.json";
  write_text(profile, "{\"format\": \"oases-profile\"} trailing");
  r = oases("plan --degrees-only --config " + (dir_ / "tiny.toml").string() + " --profile " +
            profile.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"profile.json", "not valid JSON"});
}

TEST_F(Reliability, OutOfRangeIntegerSettingIsNamedAsSuch) {
  const CommandResult r = run_command(train_in(dir_, "model.layers=99999999999999999999"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_mentions(r, {"model.layers", "99999999999999999999", "64 bits"});
  EXPECT_EQ(r.output.find("is a string"), std::string::npos) << r.output;
}

// ---------------------------------------------------------------------------------------
// Start-up

TEST_F(Reliability, RankThatNeverStartsEndsTheJobWithinTheStartupTimeout) {
  // Rank 1 stops itself before the binary starts; without the timeout rank 0 would wait in
  // MPI_Init forever.
  const std::string command =
      mpirun_prefix(2) + "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then kill -STOP $$; fi; exec " +
      OASES_BINARY + " train --quiet --config " + (dir_ / "tiny.toml").string() +
      " --set checkpoint.resume=false checkpoint.dir=\\\"\\\" parallel.tp=2 parallel.startup_timeout_s=3'";
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = run_command("timeout -s KILL 60 " + command);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 30) << "the job did not end at the start-up timeout:\n" << r.output;
  expect_mentions(r, {"parallel.startup_timeout_s = 3", "rank 1 did not start"});
}

}  // namespace
}  // namespace oases::testing
