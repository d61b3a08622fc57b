// Compressed activations (parallel.activation_compression) end to end through `oases train`:
// kept sets held in bf16 or fp8 between the passes change the gradients by about the
// encoding's rounding and no more, the measured activation peak equals the schedule's
// prediction and falls with the encoding's size, under megatron, oases at tp = 2 and a 1F1B
// pipeline; bad settings are rejected.
//
// The gradients are read from a single SGD step (momentum 0, no weight decay, no clipping):
// the parameters move by -lr x gradient, so the relative change between two runs' moves is
// the relative change between their gradients.
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
// Unit roundoffs: half a unit in the last place, relative.
constexpr double kBf16Roundoff = 0x1p-8;  // 8 significant bits
constexpr double kFp8Roundoff = 0x1p-4;   // e4m3: 4 significant bits

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

nlohmann::json run_description(const fs::path& run) {
  std::ifstream in(run / "run.json");
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
}

class ActivationCompression : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("activation_compression_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir_ / "gpt.toml") << oases::testing::tiny_fp64_config(
        "gpt", kLayers, dir_ / "data",
        "optimizer = \"sgd\"\nweight_decay = 0\ngrad_clip = 0\n", 1);
    oases::testing::write_random_init(dir_ / "gpt.toml", dir_ / "init.safetensors", 91);
    init_ = tensors(dir_ / "init.safetensors");
  }

  // One step; returns the run folder.
  fs::path train(RunLayout layout, const std::string& name, const std::string& settings) const {
    return oases::testing::train_run(OASES_BINARY, dir_ / "gpt.toml", dir_ / "init.safetensors",
                                     layout, dir_ / name, settings);
  }
  // The step's parameter move (-lr x gradient).
  std::vector<double> move(const fs::path& run) const {
    std::vector<double> after = tensors(run / "ckpt/step_1/model.safetensors");
    EXPECT_EQ(after.size(), init_.size());
    for (std::size_t i = 0; i < after.size() && i < init_.size(); ++i) after[i] -= init_[i];
    return after;
  }
  static double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      norm += b[i] * b[i];
    }
    return std::sqrt(diff / norm);
  }
  // The measured peak of the step equals run.json's prediction; returns it.
  static double checked_peak(const fs::path& run, const std::string& compression,
                             const std::string& what) {
    const nlohmann::json description = run_description(run);
    EXPECT_EQ(description.value("activation_compression", ""), compression) << what;
    const std::vector<double> peaks =
        oases::testing::metric_values(run / "metrics.jsonl", "peak_activation_bytes");
    EXPECT_EQ(peaks.size(), 1u) << what;
    const double predicted = description["memory_bytes"].value("activations", -1.0);
    for (double peak : peaks) EXPECT_EQ(peak, predicted) << what;
    return peaks.empty() ? 0 : peaks.front();
  }

  // The compressed runs' gradients differ from the plain run's by about the encoding's
  // rounding: more than nothing (the sets were encoded), at most one rounding per kept tensor
  // read along the backward path (two per layer and the head's: (2 L + 2) u, first order), and
  // fp8's difference is about (u_fp8 / u_bf16 = 16) times bf16's (first order: linear in u; a
  // factor 4 either way for how the rounding errors of particular values add up).
  void expect_rounding_sized(RunLayout layout, const std::string& settings,
                             const std::string& label) {
    const std::string compression = " parallel.activation_compression=";
    const fs::path plain = train(layout, label + "_none", settings);
    const fs::path bf16 = train(layout, label + "_bf16", settings + compression + quoted("bf16"));
    const fs::path fp8 = train(layout, label + "_fp8", settings + compression + quoted("fp8"));
    const std::vector<double> want = move(plain);
    const double bf16_error = relative_difference(move(bf16), want);
    const double fp8_error = relative_difference(move(fp8), want);
    const double path = 2.0 * kLayers + 2;
    EXPECT_GT(bf16_error, 0.01 * kBf16Roundoff) << label;
    EXPECT_LE(bf16_error, path * kBf16Roundoff) << label;
    EXPECT_LE(fp8_error, path * kFp8Roundoff) << label;
    EXPECT_GE(fp8_error / bf16_error, 16.0 / 4) << label << ": bf16 " << bf16_error << ", fp8 "
                                                << fp8_error;
    EXPECT_LE(fp8_error / bf16_error, 16.0 * 4) << label << ": bf16 " << bf16_error << ", fp8 "
                                                << fp8_error;
    const double none_peak = checked_peak(plain, "none", label);
    const double bf16_peak = checked_peak(bf16, "bf16", label);
    const double fp8_peak = checked_peak(fp8, "fp8", label);
    EXPECT_LT(bf16_peak, none_peak) << label;
    EXPECT_LT(fp8_peak, bf16_peak) << label;
  }

  fs::path dir_;
  std::vector<double> init_;
};

TEST_F(ActivationCompression, MegatronWithoutRecomputationInOneProcess) {
  expect_rounding_sized({}, "parallel.schedule=" + quoted("megatron") + " parallel.recompute=" +
                                quoted("none"),
                        "megatron");
}

TEST_F(ActivationCompression, OasesAtTensorParallelTwo) {
  expect_rounding_sized({.tp = 2}, "parallel.schedule=" + quoted("oases"), "oases_tp2");
}

TEST_F(ActivationCompression, OneFOneBPipelineOfTwoStages) {
  expect_rounding_sized({.pp = 2}, "parallel.pipeline=" + quoted("1f1b") + " parallel.schedule=" +
                                       quoted("megatron") + " parallel.recompute=" + quoted("none"),
                        "1f1b_pp2");
}

TEST_F(ActivationCompression, BadSettingsAreClearErrors) {
  const std::string base = std::string(OASES_BINARY) + " train --quiet --config " +
                           (dir_ / "gpt.toml").string() + " --set ";
  auto r = oases::testing::run_command(base + "parallel.activation_compression=" + quoted("int4"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("parallel.activation_compression = \"int4\" is not known; valid: "
                          "\"none\", \"bf16\", \"fp8\""),
            std::string::npos)
      << r.output;
  r = oases::testing::run_command(base + "parallel.activation_compression=" + quoted("bf16") +
                                  " parallel.pp=2 parallel.pipeline=" + quoted("2bw") +
                                  " train.global_batch=16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("does not run with parallel.pipeline = \"2bw\""), std::string::npos)
      << r.output;
}

}  // namespace
