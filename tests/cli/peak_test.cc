// `oases peak` and the figures a run derives from it: the table and its JSON parse, MFU stays
// within (0, 1] when the machine is busy while a run starts (and idle afterwards), and
// train.precision = "auto" chooses by the measured ratio, is stored in run.json and the
// checkpoint, and is kept by a resume.
#include "support/command.h"
#include "support/runs.h"
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using oases::testing::CommandResult;
using oases::testing::run_command;

class Peak : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = oases::testing::fresh_test_folder("peak_runs"); }
  // `oases ARGS` with the peak file in this test's folder and short measurements.
  CommandResult oases(const std::string& args, const std::string& env = "") const {
    return run_command("OASES_CACHE=" + (dir_ / "cache").string() + " OASES_PEAK_SECONDS=0.3 " +
                       env + " " + OASES_BINARY + " " + args);
  }
  fs::path dir_;
};

TEST_F(Peak, TheTableAndItsJsonShowTheSamePeaksAndTheFileKeepsThem) {
  const CommandResult measured = oases("peak --json --precision fp32 --precision bf16 --threads 1");
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  const auto j = nlohmann::json::parse(measured.output);
  EXPECT_EQ(j["host"]["threads"], 1);
  EXPECT_EQ(j["cache"], (dir_ / "cache" / "peaks.json").string());
  const double fp32 = j["peaks"]["fp32"]["flops_per_s"].get<double>();
  EXPECT_GT(fp32, 1e8);
  EXPECT_TRUE(j["peaks"]["fp32"]["measured_now"].get<bool>());
  EXPECT_EQ(j["peaks"]["fp32"]["path"], "sgemm");
  const std::string bf16_path = j["peaks"]["bf16"]["path"].get<std::string>();
  EXPECT_TRUE(bf16_path == "oneDNN" || bf16_path == "convert+sgemm") << bf16_path;
  EXPECT_GT(j["peaks"]["bf16"]["flops_per_s"].get<double>(), 1e8);
  EXPECT_FALSE(j.contains("fp64"));

  // --cached reads them back without measuring; the table's figures are the JSON's.
  const CommandResult table = oases("peak --cached --threads 1");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(table.output, m, std::regex(R"(\nfp32\s+sgemm\s+([0-9.]+)\s)")))
      << table.output;
  EXPECT_NEAR(std::stod(m[1]), fp32 / 1e9, 0.05 + 1e-3 * fp32 / 1e9) << table.output;
  EXPECT_TRUE(std::regex_search(table.output, std::regex("\\nbf16\\s+" + std::regex_replace(bf16_path, std::regex(R"(\+)"), R"(\+)") + R"(\s+[0-9.]+\s)")))
      << table.output;
  EXPECT_EQ(table.output.find("measured now"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("not shown: fp64 (not measured yet)"), std::string::npos) << table.output;

  // Another thread count is another key: nothing kept for it yet.
  const CommandResult other = oases("peak --cached --json --threads 2 --precision fp32");
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_TRUE(nlohmann::json::parse(other.output)["peaks"].empty()) << other.output;

  const CommandResult bad = oases("peak --precision fp8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--precision fp8"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("fp32, fp64, bf16, fp16"), std::string::npos) << bad.output;
}

// Processes that spin on every core for `seconds`, then exit.
class BusyCores {
 public:
  explicit BusyCores(int count, double seconds) {
    for (int i = 0; i < count; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        volatile unsigned long spin = 0;
        while (std::chrono::steady_clock::now() < end)
          for (int k = 0; k < 100000; ++k) spin = spin + 1;
        _exit(0);
      }
      pids_.push_back(pid);
    }
  }
  ~BusyCores() {
    for (const pid_t pid : pids_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

 private:
  std::vector<pid_t> pids_;
};

class PeakRuns : public Peak {
 protected:
  void SetUp() override {
    Peak::SetUp();
    const CommandResult data = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(data.exit_code, 0) << data.output;
    // Products big enough for the step to reach a good share of the peak.
    std::ofstream(dir_ / "model.toml") << R"(
[model]
layers = 2
hidden = 256
heads = 4
ffn_hidden = 1024
vocab_size = 512
seq_len = 64
dropout = 0.0
[train]
micro_batch = 16
global_batch = 16
lr = 1e-3
threads = 2
eval_every = 1000
[data]
path = ")" + (dir_ / "data").string() + R"("
)";
  }
  CommandResult train(const std::string& settings, const std::string& env = "") const {
    return oases("train --config " + (dir_ / "model.toml").string() + " --set " + settings, env);
  }
  std::vector<nlohmann::json> records(const std::string& metrics) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir_ / metrics);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
};

// The peak is measured while two processes spin on the cores, which stop a moment later: a
// peak taken at face value under that load would make the idle steps' MFU exceed 1 (the old
// 0.3 s start-up sgemm printed "mfu 222%" so).
TEST_F(PeakRuns, MfuStaysWithinZeroAndOneWhenTheMachineIsBusyAtStartUp) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::string metrics = std::string(precision) + ".jsonl";
    CommandResult r{};
    {
      const BusyCores busy(2, 3.0);
      r = train(std::string("train.steps=20 train.precision=") + oases::testing::quoted(precision) +
                " log.every=1 log.metrics=" + oases::testing::quoted((dir_ / metrics).string()));
    }
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("peak: "), std::string::npos) << r.output;
    const std::regex shown(R"(mfu (\d+)%)");
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), shown);
         it != std::sregex_iterator(); ++it)
      EXPECT_LE(std::stoi((*it)[1]), 100) << it->str();
    int reported = 0;
    for (const nlohmann::json& record : records(metrics)) {
      if (!record.contains("mfu")) continue;
      const double mfu = record["mfu"].get<double>();
      EXPECT_GT(mfu, 0.0) << record.dump();
      EXPECT_LE(mfu, 1.0) << record.dump();
      ++reported;
    }
    EXPECT_GE(reported, 15) << r.output;
    const auto run = nlohmann::json::parse(std::ifstream(dir_ / "run.json"));
    EXPECT_EQ(run["peak"]["precision"], precision);
    EXPECT_GT(run["peak"]["flops_per_s"].get<double>(), 1e8);
  }
}

TEST_F(PeakRuns, AutoPrecisionIsChosenByTheRatioStoredAndKeptByAResume) {
  const std::string out = oases::testing::quoted((dir_ / "run" / "metrics.jsonl").string());
  const std::string ckpt = oases::testing::quoted((dir_ / "run" / "ckpt").string());
  const std::string common = "train.precision=\\\"auto\\\" log.metrics=" + out +
                             " checkpoint.dir=" + ckpt + " checkpoint.every=2";
  // bf16 products twice as fast: bf16.
  const CommandResult fast = train("train.steps=4 " + common, "OASES_TEST_PEAKS=fp32=1e11,bf16=2e11");
  ASSERT_EQ(fast.exit_code, 0) << fast.output;
  EXPECT_NE(fast.output.find("train.precision = \"auto\": bf16 mixed precision (bf16 products 2.00x"),
            std::string::npos)
      << fast.output;
  auto run = nlohmann::json::parse(std::ifstream(dir_ / "run" / "run.json"));
  EXPECT_NE(run["config"].get<std::string>().find("precision = \"bf16\""), std::string::npos)
      << run["config"];
  EXPECT_EQ(run["peak"]["precision"], "bf16");
  const oases::plan::RunConfig stored =
      oases::train::config_from_checkpoint((dir_ / "run" / "ckpt" / "step_2").string());
  EXPECT_EQ(stored.train.precision, "bf16");

  // Resumed where bf16 would no longer pay: the run keeps bf16.
  fs::remove_all(dir_ / "run" / "ckpt" / "step_4");
  const CommandResult resumed = train("train.steps=4 checkpoint.resume=true " + common,
                                      "OASES_TEST_PEAKS=fp32=1e11,bf16=1.1e11");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("train.precision = \"auto\": bf16, as the run it resumes chose"),
            std::string::npos)
      << resumed.output;
  run = nlohmann::json::parse(std::ifstream(dir_ / "run" / "run.json"));
  EXPECT_EQ(run["start_step"], 2);
  EXPECT_NE(run["config"].get<std::string>().find("precision = \"bf16\""), std::string::npos);

  // A fresh run on a host measured so (the seam stands for the measurement, so the kept peaks
  // go too): fp32, and said so.
  fs::remove_all(dir_ / "run");
  fs::remove_all(dir_ / "cache");
  const CommandResult slow = train("train.steps=4 " + common, "OASES_TEST_PEAKS=fp32=1e11,bf16=1.2e11");
  ASSERT_EQ(slow.exit_code, 0) << slow.output;
  EXPECT_NE(slow.output.find("train.precision = \"auto\": fp32 (bf16 products 1.20x"),
            std::string::npos)
      << slow.output;
  run = nlohmann::json::parse(std::ifstream(dir_ / "run" / "run.json"));
  EXPECT_NE(run["config"].get<std::string>().find("precision = \"fp32\""), std::string::npos);
  EXPECT_EQ(oases::train::config_from_checkpoint((dir_ / "run" / "ckpt" / "step_2").string())
                .train.precision,
            "fp32");
}

}  // namespace
