// Offloading (parallel.offload): the optimizer state, and under mixed precision the fp32 master
// weights, live in a scratch file between optimizer steps. Training is bitwise the run without
// it (fp32 and bf16, AdamW and Adafactor); after a step none of the offloaded bytes is resident
// (mincore over the store), and the state reads back intact from the file (through the whole
// state a checkpoint gathers); the scratch file has no name on disk; bad settings are clear
// errors.
#include "core/offload_store.h"
#include "kernels/kernels.h"
#include "support/files.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace oases::train {
namespace {

namespace fs = std::filesystem;

fs::path scratch_dir() {
  const fs::path dir = fs::temp_directory_path() / "oases_offload_test";
  fs::create_directories(dir);
  return dir;
}

// The tiny run (its 16-bit products pinned to "convert+sgemm") in `precision` with
// `optimizer`, offloading `offload`.
plan::RunConfig config(const std::string& precision, const std::string& optimizer,
                       const std::string& offload) {
  plan::RunConfig c = testing::tiny_run();
  c.train.steps = 4;
  c.train.lr = 1e-2;
  c.train.grad_clip = 1.0;
  c.train.precision = precision;
  c.train.optimizer = optimizer;
  c.parallel.offload = offload;
  if (offload != "none") c.parallel.offload_dir = scratch_dir().string();
  return c;
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint32_t stream, std::int64_t step) {
  return testing::philox_tokens(step, stream, static_cast<std::int64_t>(n), 50, {5, 3});
}

struct Trained {
  std::vector<double> losses;
  std::vector<char> params;
  std::map<std::string, std::vector<char>> state;
  std::size_t resident = 0, offloaded = 0;
};

std::vector<char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const char*>(t.raw());
  return {p, p + t.nbytes()};
}

Trained train(const plan::RunConfig& c) {
  TrainingEngine engine(c);
  Trained out;
  for (std::int64_t step = 0; step < c.train.steps; ++step) {
    const auto in = tokens(8 * 16, 1, step), target = tokens(8 * 16, 2, step);
    out.losses.push_back(engine.train_step(step, in.data(), target.data()).loss);
  }
  if (const OffloadStore* store = engine.offload_store()) {
    out.resident = store->resident_bytes();
    out.offloaded = store->allocated_bytes();
  }
  out.params = bytes_of(engine.model().params());
  // Read back from the scratch file: every value survived its trip to disk.
  engine.save_whole_optimizer_state([&](optim::Optimizer& whole) {
    for (const optim::StateTensor& s : whole.state_tensors()) out.state[s.name] = bytes_of(s.view);
  });
  return out;
}

TEST(Offload, TrainsBitwiseLikeTheRunWithoutAndKeepsNothingResident) {
  struct Case {
    std::string precision, optimizer, offload;
  };
  for (const Case& c : {Case{"fp32", "adamw", "optimizer"}, Case{"fp32", "adafactor", "optimizer"},
                        Case{"bf16", "adamw", "optimizer+params"}}) {
    const std::string what = c.precision + " " + c.optimizer + " " + c.offload;
    const Trained reference = train(config(c.precision, c.optimizer, "none"));
    const Trained offloaded = train(config(c.precision, c.optimizer, c.offload));
    EXPECT_EQ(offloaded.losses, reference.losses) << what;
    EXPECT_EQ(offloaded.params, reference.params) << what;
    EXPECT_EQ(offloaded.state, reference.state) << what;
    EXPECT_EQ(offloaded.resident, 0u) << what;
    // The store holds the optimizer state (and the master weights).
    std::size_t state = 0;
    for (const auto& [name, bytes] : reference.state) state += bytes.size();
    const std::size_t master = c.offload == "optimizer+params" ? reference.params.size() : 0;
    EXPECT_EQ(offloaded.offloaded, state + master) << what;
  }
}

TEST(Offload, MemoryFiguresCountTheOffloadedBytesOutOfTheTotal) {
  TrainingEngine plain(config("bf16", "adamw", "none"));
  TrainingEngine offloaded(config("bf16", "adamw", "optimizer+params"));
  const planner::MemoryFigures a = plain.memory_figures(), b = offloaded.memory_figures();
  EXPECT_EQ(b.offloaded, b.optimizer + b.params - b.working_copy);
  EXPECT_EQ(a.total() - b.total(), b.offloaded);
}

TEST(OffloadStore, RegionsStartZeroAndSurviveEvictionWithoutAName) {
  const fs::path dir = scratch_dir() / "store";
  fs::remove_all(dir);
  fs::create_directories(dir);
  OffloadStore store(dir.string(), "parallel.offload_dir");
  Buffer a = store.allocate(10000), b = store.allocate(3);
  EXPECT_TRUE(fs::is_empty(dir));  // unlinked at once: a crash leaves nothing behind
  std::vector<unsigned char> zeros(10000, 0);
  EXPECT_EQ(std::memcmp(a.data(), zeros.data(), zeros.size()), 0);
  for (std::size_t i = 0; i < 10000; ++i) a.as<unsigned char>()[i] = static_cast<unsigned char>(i * 7);
  b.as<unsigned char>()[2] = 42;
  EXPECT_GT(store.resident_bytes(), 0u);
  store.evict_all();
  EXPECT_EQ(store.resident_bytes(), 0u);
  store.prefetch(a.data(), 10000);
  for (std::size_t i = 0; i < 10000; ++i)
    ASSERT_EQ(a.as<unsigned char>()[i], static_cast<unsigned char>(i * 7)) << i;
  EXPECT_EQ(b.as<unsigned char>()[2], 42);
  EXPECT_EQ(store.allocated_bytes(), 10003u);
}

TEST(Offload, BadSettingsAreClearErrors) {
  using oases::testing::expect_user_error;
  expect_user_error(
      [] { OffloadStore("/nonexistent/oases_offload", "parallel.offload_dir"); },
      {"parallel.offload_dir = \"/nonexistent/oases_offload\"", "cannot create"});
  plan::RunConfig c = config("fp32", "adamw", "optimizer");
  c.parallel.offload_dir = "/nonexistent/oases_offload";
  expect_user_error([&] { TrainingEngine engine(c); }, {"parallel.offload_dir"});
  c = config("fp32", "adamw", "disk");
  expect_user_error([&] { c.validate(); }, {"parallel.offload = \"disk\" is not known"});
  c = config("fp32", "adamw", "optimizer");
  c.parallel.offload_dir = "";
  expect_user_error([&] { c.validate(); }, {"parallel.offload_dir"});
  c = config("fp32", "adamw", "optimizer+params");
  expect_user_error([&] { c.validate(); }, {"needs train.precision = \"bf16\" or \"fp16\""});
}

}  // namespace
}  // namespace oases::train
