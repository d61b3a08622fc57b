// Recomputation and compression chosen per transformer layer, end to end through `oases
// train`: mixed recomputation policies (parallel.recompute as a list) under tensor
// parallelism, the overlapped schedules and a pipeline give the losses and parameters of the
// single-process run without recomputation to a relative 1e-10 in fp64, with the measured
// activation peak equal to the schedule's prediction; compression of some layers
// (parallel.activation_compression as a list) changes the gradients by no more than
// compressing every layer does, and the peak lies between the two.
#include "io/safetensors.h"
#include "support/command.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::quoted;
using oases::testing::RunLayout;

constexpr int kLayers = 4;
constexpr int kSteps = 2;

nlohmann::json run_description(const fs::path& run) {
  std::ifstream in(run / "run.json");
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
}

// The measured peak of every step equals run.json's prediction; returns it.
double checked_peak(const fs::path& run, const std::string& what) {
  const nlohmann::json description = run_description(run);
  const std::vector<double> peaks =
      oases::testing::metric_values(run / "metrics.jsonl", "peak_activation_bytes");
  EXPECT_FALSE(peaks.empty()) << what;
  const double predicted = description["memory_bytes"].value("activations", -1.0);
  for (double peak : peaks) EXPECT_EQ(peak, predicted) << what;
  return peaks.empty() ? 0 : peaks.front();
}

class LayerPolicies : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("layer_policies_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  void write_config(const std::string& train_extra, int steps) {
    std::ofstream(dir_ / "gpt.toml")
        << oases::testing::tiny_fp64_config("gpt", kLayers, dir_ / "data", train_extra, steps);
    oases::testing::write_random_init(dir_ / "gpt.toml", dir_ / "init.safetensors", 37);
  }
  fs::path train(RunLayout layout, const std::string& name, const std::string& settings) const {
    return oases::testing::train_run(OASES_BINARY, dir_ / "gpt.toml", dir_ / "init.safetensors",
                                     layout, dir_ / name, settings);
  }
  static std::string schedule(const std::string& kind, const std::string& recompute) {
    return "parallel.schedule=" + quoted(kind) + " parallel.recompute=" + quoted(recompute);
  }

  fs::path dir_;
};

// Under megatron and cross-pass every policy mixes; under the fine-grained kinds a layer
// recomputes fine-grained or keeps everything.
TEST_F(LayerPolicies, MixedRecomputationMatchesTheSingleProcessRun) {
  write_config("", kSteps);
  const fs::path reference = train({}, "reference", schedule("megatron", "none"));
  struct Run {
    RunLayout layout;
    std::string label, settings;
  };
  const std::string mixed = "full,none,selective,none";
  const std::vector<Run> runs{
      {{.tp = 2}, "megatron", schedule("megatron", mixed)},
      {{.tp = 2}, "cross_pass", schedule("cross-pass", mixed) + " parallel.sub_batches=2"},
      {{.tp = 2},
       "cross_pass_full_last",
       schedule("cross-pass", "selective,none,fine-grained,full")},
      {{.tp = 2}, "oases", schedule("oases", "fine-grained,none,none,fine-grained")},
      {{.tp = 2}, "oases_none", schedule("oases", "none")},
      {{.tp = 2},
       "oases_interleaved",
       schedule("oases-interleaved", "none,fine-grained,fine-grained,none")},
      {{.tp = 2},
       "oases_deferred",
       schedule("oases-deferred", "fine-grained,none,fine-grained,none")},
      // Each stage runs the entries of its own layers: full on the first, none on the second.
      {{.pp = 2}, "pipeline", schedule("megatron", "full,full,none,selective")},
  };
  for (const Run& run : runs) {
    const fs::path out = train(run.layout, run.label, run.settings);
    oases::testing::expect_same_run(out, reference, run.label, kSteps);
    checked_peak(out, run.label);
    const std::string recompute =
        run_description(out)["schedule"].value("recompute", std::string());
    EXPECT_NE(run.settings.find(recompute), std::string::npos)
        << run.label << ": run.json's recompute " << recompute;
  }
}

// Every parameter's value, in checkpoint order, read in double.
std::vector<double> tensors(const fs::path& file) {
  const auto f = oases::io::SafetensorsFile::open(file.string());
  std::vector<double> all;
  for (const auto& name : f.names()) {
    const auto& info = f.info(name);
    std::vector<double> v(static_cast<std::size_t>(info.numel()));
    f.read_f64(name, info.shape, v.data());
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

// One SGD step (no momentum, decay or clipping), so that the parameters' move is -lr x the
// gradient. Compressing layers 1 (bf16) and 3 (fp8) rounds a subset of the sets that
// compressing every layer in fp8 rounds, each no more coarsely, so its gradient moves by less;
// and by more than nothing, at most one rounding per kept tensor its backward reads (two per
// compressed layer, first order). Its peak lies between the uncompressed and the fp8 runs'.
TEST_F(LayerPolicies, CompressingSomeLayersChangesLessThanCompressingAll) {
  write_config("optimizer = \"sgd\"\nweight_decay = 0\ngrad_clip = 0\n", 1);
  const std::vector<double> init = tensors(dir_ / "init.safetensors");
  const auto move = [&](const fs::path& run) {
    std::vector<double> after = tensors(run / "ckpt/step_1/model.safetensors");
    EXPECT_EQ(after.size(), init.size());
    for (std::size_t i = 0; i < after.size() && i < init.size(); ++i) after[i] -= init[i];
    return after;
  };
  const std::string base = schedule("oases", "fine-grained");
  const std::string compression = " parallel.activation_compression=";
  const RunLayout tp2{.tp = 2};
  const fs::path plain = train(tp2, "none", base);
  const fs::path all = train(tp2, "fp8", base + compression + quoted("fp8"));
  const fs::path some = train(tp2, "some", base + compression + quoted("none,bf16,none,fp8"));
  const std::vector<double> want = move(plain);
  const double all_error = relative_difference(move(all), want);
  const double some_error = relative_difference(move(some), want);
  constexpr double kBf16Roundoff = 0x1p-8, kFp8Roundoff = 0x1p-4;
  EXPECT_GT(some_error, 0.01 * kBf16Roundoff);
  EXPECT_LE(some_error, 2 * (kBf16Roundoff + kFp8Roundoff));
  EXPECT_LT(some_error, all_error) << "fp8 everywhere " << all_error;
  const double none_peak = checked_peak(plain, "none");
  const double all_peak = checked_peak(all, "fp8");
  const double some_peak = checked_peak(some, "some");
  EXPECT_LT(all_peak, some_peak);
  EXPECT_LT(some_peak, none_peak);
  EXPECT_EQ(run_description(some).value("activation_compression", ""), "none,bf16,none,fp8");
}

TEST_F(LayerPolicies, BadListsAreClearErrors) {
  write_config("", kSteps);
  const std::string base = std::string(OASES_BINARY) + " train --quiet --config " +
                           (dir_ / "gpt.toml").string() + " --set ";
  auto r = oases::testing::run_command(base + "parallel.tp=2 " +
                                       schedule("oases", "fine-grained,full,none,none"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("parallel.recompute = \"fine-grained,full,none,none\" gives layer 1 "
                          "\"full\""),
            std::string::npos)
      << r.output;
  r = oases::testing::run_command(base + "parallel.activation_compression=" + quoted("bf16,none"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("parallel.activation_compression = \"bf16,none\" gives 2 words"),
            std::string::npos)
      << r.output;
}

}  // namespace
