// The per-host peak file (train/peaks.h): records kept and reused under an equal key only,
// measured again when the key changes or on request, the environment seams, the "auto"
// precision choice and the `oases peak` table.
#include "train/peaks.h"

#include "comm/mesh.h"
#include "core/error.h"
#include "support/runs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace oases::train {
namespace {

namespace fs = std::filesystem;

// A measurement that counts its calls and returns a rate per precision word.
struct CountingMeasure {
  std::map<std::string, double> rates;
  std::vector<std::string>* calls;
  kernels::ProductPeak operator()(DType operands, kernels::Gemm16Path path, double) const {
    const std::string word = precision_word(operands) + "/" + product_path_word(operands, path);
    calls->push_back(word);
    return kernels::ProductPeak{rates.at(precision_word(operands)), 0.01, 1.0, false, 3, "8x8x8"};
  }
};

class Peaks : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = oases::testing::fresh_test_folder("peaks_runs"); }
  HostPeaks peaks(int threads, std::map<std::string, double> rates) {
    return HostPeaks(PeakFile(dir_ / "peaks.json"), threads, 0.01,
                     CountingMeasure{std::move(rates), &calls_},
                     [this](const std::string& w) { warnings_.push_back(w); });
  }
  fs::path dir_;
  std::vector<std::string> calls_, warnings_;
};

TEST_F(Peaks, AKeptPeakIsReusedAndAChangedKeyMeasuresAgain) {
  HostPeaks two = peaks(2, {{"fp32", 1e11}, {"fp64", 5e10}});
  const HostPeak first = two.get(DType::f32, kernels::Gemm16Path::convert_sgemm);
  EXPECT_TRUE(first.measured_now);
  EXPECT_DOUBLE_EQ(first.record.peak.flops_per_s, 1e11);
  EXPECT_EQ(first.record.key.precision, "fp32");
  EXPECT_EQ(first.record.key.path, "sgemm");
  EXPECT_EQ(first.record.key.threads, 2);
  EXPECT_TRUE(std::regex_match(first.record.measured_at,
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  ASSERT_EQ(calls_.size(), 1u);

  // Another object on the same file (another run): read, not measured.
  HostPeaks again = peaks(2, {{"fp32", 7e11}});
  const HostPeak kept = again.get(DType::f32, kernels::Gemm16Path::onednn);  // path: f32 ignores it
  EXPECT_FALSE(kept.measured_now);
  EXPECT_DOUBLE_EQ(kept.record.peak.flops_per_s, 1e11);
  EXPECT_EQ(kept.record.measured_at, first.record.measured_at);
  EXPECT_EQ(calls_.size(), 1u);

  // A changed key measures: another thread count, another precision.
  HostPeaks one = peaks(1, {{"fp32", 6e10}, {"fp64", 3e10}});
  EXPECT_TRUE(one.get(DType::f32, kernels::Gemm16Path::convert_sgemm).measured_now);
  EXPECT_TRUE(two.get(DType::f64, kernels::Gemm16Path::convert_sgemm).measured_now);
  ASSERT_EQ(calls_.size(), 3u);
  EXPECT_EQ(calls_[2], "fp64/dgemm");
  // All three records are in the file, under their own keys.
  EXPECT_EQ(PeakFile(dir_ / "peaks.json").all().size(), 3u);
  EXPECT_DOUBLE_EQ(two.get(DType::f32, kernels::Gemm16Path::convert_sgemm).record.peak.flops_per_s, 1e11);
  EXPECT_DOUBLE_EQ(one.get(DType::f32, kernels::Gemm16Path::convert_sgemm).record.peak.flops_per_s, 6e10);
  EXPECT_EQ(calls_.size(), 3u);

  // A record of another CPU or BLAS build is not this host's.
  PeakRecord foreign = first.record;
  foreign.key.blas = "OpenBLAS 0.3.99 SkylakeX";
  foreign.peak.flops_per_s = 9e12;
  PeakFile(dir_ / "peaks.json").store(foreign, nullptr);
  EXPECT_DOUBLE_EQ(two.get(DType::f32, kernels::Gemm16Path::convert_sgemm).record.peak.flops_per_s, 1e11);
  EXPECT_EQ(PeakFile(dir_ / "peaks.json").all().size(), 4u);
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(Peaks, RemeasuringReplacesTheRecord) {
  HostPeaks low = peaks(2, {{"fp32", 1e11}});
  low.get(DType::f32, kernels::Gemm16Path::convert_sgemm);
  HostPeaks high = peaks(2, {{"fp32", 3e11}});
  EXPECT_DOUBLE_EQ(high.get(DType::f32, kernels::Gemm16Path::convert_sgemm).record.peak.flops_per_s, 1e11);
  const HostPeak fresh = high.get(DType::f32, kernels::Gemm16Path::convert_sgemm, true);
  EXPECT_TRUE(fresh.measured_now);
  EXPECT_DOUBLE_EQ(fresh.record.peak.flops_per_s, 3e11);
  EXPECT_EQ(PeakFile(dir_ / "peaks.json").all().size(), 1u);
  EXPECT_DOUBLE_EQ(low.get(DType::f32, kernels::Gemm16Path::convert_sgemm).record.peak.flops_per_s, 3e11);
}

TEST_F(Peaks, AnUnreadableFileIsReportedAndWrittenAnew) {
  std::ofstream(dir_ / "peaks.json") << "{ not json";
  HostPeaks p = peaks(1, {{"fp32", 1e11}});
  EXPECT_TRUE(p.get(DType::f32, kernels::Gemm16Path::convert_sgemm).measured_now);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("could not be read"), std::string::npos) << warnings_[0];
  EXPECT_FALSE(p.get(DType::f32, kernels::Gemm16Path::convert_sgemm).measured_now);
  const auto j = nlohmann::json::parse(std::ifstream(dir_ / "peaks.json"));
  EXPECT_EQ(j["format"], 2);
  EXPECT_EQ(j["peaks"].size(), 1u);
}

// Records of an earlier format (measured over other shapes) are measured again, quietly.
TEST_F(Peaks, RecordsOfAnotherFormatAreMeasuredAgain) {
  HostPeaks p = peaks(1, {{"fp32", 1e11}});
  p.get(DType::f32, kernels::Gemm16Path::convert_sgemm);
  auto j = nlohmann::json::parse(std::ifstream(dir_ / "peaks.json"));
  j["format"] = 1;
  std::ofstream(dir_ / "peaks.json") << j.dump();
  EXPECT_TRUE(p.get(DType::f32, kernels::Gemm16Path::convert_sgemm).measured_now);
  EXPECT_EQ(calls_.size(), 2u);
  EXPECT_TRUE(warnings_.empty());
  EXPECT_FALSE(p.get(DType::f32, kernels::Gemm16Path::convert_sgemm).measured_now);
}

TEST_F(Peaks, TheFileFollowsOasesCacheElseHome) {
  setenv("OASES_CACHE", (dir_ / "cache").c_str(), 1);
  EXPECT_EQ(default_peak_file(), dir_ / "cache" / "peaks.json");
  unsetenv("OASES_CACHE");
  setenv("HOME", dir_.c_str(), 1);
  EXPECT_EQ(default_peak_file(), dir_ / ".cache" / "oases" / "peaks.json");
}

TEST_F(Peaks, TheEnvironmentSeamsParseOrNameTheirVariable) {
  setenv("OASES_PEAK_SECONDS", "0.25", 1);
  EXPECT_DOUBLE_EQ(peak_seconds_from_environment(), 0.25);
  for (const char* bad : {"0", "-1", "fast", "1e9"}) {
    setenv("OASES_PEAK_SECONDS", bad, 1);
    try {
      peak_seconds_from_environment();
      ADD_FAILURE() << bad;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("OASES_PEAK_SECONDS"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  unsetenv("OASES_PEAK_SECONDS");
  EXPECT_DOUBLE_EQ(peak_seconds_from_environment(), kDefaultPeakSeconds);

  setenv("OASES_TEST_PEAKS", "fp32=2e11,bf16=5e11", 1);
  const MeasurePeak measure = peak_measurement_from_environment();
  EXPECT_DOUBLE_EQ(measure(DType::f32, kernels::Gemm16Path::convert_sgemm, 1).flops_per_s, 2e11);
  EXPECT_DOUBLE_EQ(measure(DType::bf16, kernels::Gemm16Path::onednn, 1).flops_per_s, 5e11);
  for (const char* bad : {"fp32", "fp8=1e11", "fp32=-3", "fp32=1e11x"}) {
    setenv("OASES_TEST_PEAKS", bad, 1);
    EXPECT_THROW(peak_measurement_from_environment(), UserError) << bad;
  }
  unsetenv("OASES_TEST_PEAKS");
}

// "auto" picks bf16 from a measured speedup of kAutoBf16Speedup, fp32 below it, and pins the
// bf16 path it measured.
TEST_F(Peaks, AutoPrecisionPicksByTheMeasuredRatio) {
  comm::Mesh mesh = comm::Mesh::single_process();
  plan::RunConfig config;
  config.train.precision = "auto";
  struct Case {
    double bf16;
    const char* chosen;
  };
  for (const Case& c : {Case{2.0e11, "bf16"}, Case{1.3e11, "bf16"}, Case{1.29e11, "fp32"},
                        Case{0.5e11, "fp32"}}) {
    fs::remove(dir_ / "peaks.json");
    HostPeaks p = peaks(1, {{"fp32", 1e11}, {"bf16", c.bf16}});
    std::string why;
    config.train.gemm16_path = "convert+sgemm";
    const plan::RunConfig resolved = resolve_auto_precision(config, &p, mesh.world(), &why);
    EXPECT_EQ(resolved.train.precision, c.chosen) << c.bf16;
    EXPECT_EQ(resolved.train.gemm16_path, "convert+sgemm");
    EXPECT_NE(why.find(fmt::format("{:.2f}x", c.bf16 / 1e11)), std::string::npos) << why;
    EXPECT_NE(why.find(c.chosen[0] == 'b' ? "bf16 mixed precision" : ": fp32"), std::string::npos)
        << why;
  }
  // A config that is not "auto" is left as it is, without measuring.
  calls_.clear();
  config.train.precision = "fp64";
  HostPeaks p = peaks(1, {});
  EXPECT_EQ(resolve_auto_precision(config, &p, mesh.world(), nullptr).train.precision, "fp64");
  EXPECT_TRUE(calls_.empty());
}

TEST_F(Peaks, TheTableShowsEachPeakAndTheJsonParses) {
  HostPeaks p = peaks(2, {{"fp32", 1.5e11}, {"fp64", 0.7e11}});
  const PeakTable measured = host_peak_table(p, {"fp32", "fp64"}, true, std::nullopt);
  ASSERT_EQ(measured.peaks.size(), 2u);
  const std::string text = format_peak_table(measured);
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(fp32\s+sgemm\s+150\.0\s)"))) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(fp64\s+dgemm\s+70\.0\s)"))) << text;
  EXPECT_NE(text.find("2 threads"), std::string::npos) << text;
  EXPECT_NE(text.find((dir_ / "peaks.json").string()), std::string::npos) << text;

  const PeakTable cached = host_peak_table(p, {"all"}, false, std::nullopt);
  const auto j = nlohmann::json::parse(peak_table_json(cached));
  EXPECT_DOUBLE_EQ(j["peaks"]["fp32"]["flops_per_s"].get<double>(), 1.5e11);
  EXPECT_EQ(j["peaks"]["fp64"]["path"], "dgemm");
  EXPECT_FALSE(j["peaks"]["fp32"]["measured_now"].get<bool>());
  EXPECT_EQ(j["host"]["threads"], 2);
  EXPECT_EQ(j["missing"].size(), 2u);  // bf16 and fp16 were never measured
  EXPECT_EQ(calls_.size(), 2u);

  try {
    host_peak_table(p, {"fp8"}, true, std::nullopt);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--precision fp8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace oases::train
