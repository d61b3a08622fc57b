// Helpers for tests that run `oases train` under mpirun and compare runs: the launcher prefix,
// a random initial checkpoint, losses from a metrics file, and per-tensor comparison of two
// safetensors files.
#pragma once

#include "core/device.h"
#include "core/philox.h"
#include "support/command.h"
#include "model/model.h"
#include "plan/run_config.h"
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace oases::testing {

// An empty folder for the current test, <working dir>/<suite_folder>/<test name>: ctest runs
// the tests of one file as separate, possibly concurrent processes, so each needs its own. The
// same test on asynchronous CPU streams (its .async_streams variant, OASES_ASYNC_CPU_STREAMS=1
// in the environment) may run beside it, so it gets <test name>.async_streams.
inline std::filesystem::path fresh_test_folder(const std::string& suite_folder) {
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  if (stream_mode_from_environment() == StreamMode::asynchronous) name += ".async_streams";
  const std::filesystem::path dir = std::filesystem::current_path() / suite_folder / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Token shards <dir>/data_{train,val}.bin from the fortunes text (Debian's fortunes-min),
// written by `binary prepare-data`; the result of that command.
inline CommandResult prepare_fortunes_data(const std::string& binary,
                                           const std::filesystem::path& dir) {
  return run_command(binary + " prepare-data --input /usr/share/games/fortunes/fortunes --output " +
                     (dir / "data").string());
}

// `mpirun ... -np ranks ` over shared memory, as the tests' machine allows (root, more ranks
// than cores).
inline std::string mpirun_prefix(int ranks) {
  return "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np " +
         std::to_string(ranks) + " ";
}

// A TOML string value on a shell command line: parallel.schedule=\"oases\".
inline std::string quoted(const std::string& value) { return "\\\"" + value + "\\\""; }

// The command line of `oases train` (`binary`) on the config `dir`/tiny.toml from
// `dir`/init.safetensors over tp x dp ranks (mpirun when more than one), writing its metrics
// and checkpoints under `out`, with `extra` settings appended to --set.
inline std::string train_command(const std::string& binary, const std::filesystem::path& dir,
                                 int tp, int dp, const std::filesystem::path& out,
                                 const std::string& extra) {
  const int ranks = tp * dp;
  return (ranks > 1 ? mpirun_prefix(ranks) : std::string()) + binary +
         " train --quiet --config " + (dir / "tiny.toml").string() + " --init-from " +
         (dir / "init.safetensors").string() + " --set parallel.tp=" + std::to_string(tp) +
         " parallel.dp=" + std::to_string(dp) + " log.metrics=" +
         quoted((out / "metrics.jsonl").string()) + " checkpoint.dir=" +
         quoted((out / "ckpt").string()) + " " + extra;
}

// A safetensors file for the model of the config at `config_path`, every tensor random:
// weights and biases N(0, 0.02), norm weights (LayerNorm, RMSNorm) 1 + N(0, 0.1). Runs started from it have no
// parameter that is a pure sum of AdamW updates (as zero biases would be), whose last bits
// follow the summation order of each layout and schedule.
inline void write_random_init(const std::filesystem::path& config_path,
                              const std::filesystem::path& out, std::uint64_t seed) {
  const auto config = plan::load_run_config(config_path.string());
  const auto layout = model::model_param_layout(config.model);
  std::vector<float> values(static_cast<std::size_t>(layout.total_numel()));
  io::SafetensorsWriter writer;
  for (const auto& p : layout.params()) {
    const auto key = philox_key(seed, fnv1a64(p.name));
    const bool norm = (p.name.find("ln_") != std::string::npos ||
                       p.name.find("norm") != std::string::npos ||
                       p.name.find("LayerNorm") != std::string::npos) &&
                      p.name.find(".weight") != std::string::npos;
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const double z = normal_from_block(philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key));
      values[static_cast<std::size_t>(p.offset + i)] = static_cast<float>(norm ? 1.0 + 0.1 * z : 0.02 * z);
    }
    writer.add(p.name, DType::f32, p.full_shape.to_vector(), values.data() + p.offset);
  }
  writer.write(out.string());
}

// Step -> loss of every training record of a metrics file (records without a loss, such as
// step 0's, are skipped), failing the test on a step recorded twice.
inline std::map<int, double> losses_by_step(const std::filesystem::path& path) {
  std::map<int, double> losses;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (!record.contains("loss")) continue;
    const int step = record["step"].get<int>();
    EXPECT_EQ(losses.count(step), 0u) << "step " << step << " recorded twice in " << path;
    losses[step] = record["loss"].get<double>();
  }
  return losses;
}

// One value per training step of a metrics JSONL file (the record of step 0, before
// training, is skipped).
inline std::vector<double> metric_values(const std::filesystem::path& metrics, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record.at("step").get<std::int64_t>() == 0) continue;
    out.push_back(record.at(key).get<double>());
  }
  return out;
}

// The verification tolerance of equivalence tests, which run in fp64 (docs/precision.md, "fp64,
// the verification precision"):
// no summation order or BLAS kernel moves an fp64 result by a relative 1e-10, so a difference
// beyond it is a bug.
inline constexpr double kFp64Tolerance = 1e-10;

inline void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want,
                               const std::string& what, double tolerance = kFp64Tolerance) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tolerance * std::abs(want[i])) << what << " step " << i + 1;
}

// Per tensor: ||a - b|| <= tolerance ||b||, over the same set of tensor names and shapes
// (values read in double, whatever the files store).
inline void expect_same_tensors(const std::filesystem::path& a_file,
                                const std::filesystem::path& b_file, const std::string& what,
                                double tolerance = kFp64Tolerance) {
  ASSERT_TRUE(std::filesystem::exists(a_file)) << what << ": " << a_file;
  ASSERT_TRUE(std::filesystem::exists(b_file)) << what << ": " << b_file;
  const auto a = io::SafetensorsFile::open(a_file.string());
  const auto b = io::SafetensorsFile::open(b_file.string());
  ASSERT_EQ(a.names(), b.names()) << what;
  for (const auto& name : a.names()) {
    const auto& info = b.info(name);
    ASSERT_EQ(a.info(name).shape, info.shape) << what << " " << name;
    std::vector<double> x(static_cast<std::size_t>(info.numel())), y(x.size());
    a.read_f64(name, info.shape, x.data());
    b.read_f64(name, info.shape, y.data());
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double d = x[i] - y[i];
      diff += d * d;
      norm += y[i] * y[i];
    }
    EXPECT_LE(std::sqrt(diff), tolerance * std::sqrt(norm) + 1e-300)
        << what << " " << name << ": relative difference "
        << (norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff));
  }
}

}  // namespace oases::testing
