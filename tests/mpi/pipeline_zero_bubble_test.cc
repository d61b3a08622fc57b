// The zero-bubble pipeline (ZB-H1) end to end: `mpirun -np N oases train` with parallel.pp = 2
// and parallel.pipeline = "zero-bubble", whose backward passes run as input parts (what the
// previous stage waits for) and deferred weight parts, gives the losses, validation losses,
// parameters and optimizer state of the single-process run: GPT (word embedding tied to the
// head across the stages) and LLaMA, alone, with tensor parallelism (the vocab-parallel head
// defers its vocabulary GEMM), with data parallelism, and with the oases schedule over two
// sub-batches inside each stage. The activation peak rank 0 measures is the one its schedule
// predicts (run.json), stashed output gradients included.
//
// In fp64 with dropout, from random weights with nonzero biases and norm parameters: every run
// agrees with the single process to relative 1e-10.
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::expect_same_run;
using oases::testing::quoted;

std::vector<double> metric(const fs::path& run, const std::string& name) {
  return oases::testing::metric_values(run / "metrics.jsonl", name);
}

class ZeroBubblePipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("pipeline_zero_bubble_runs");
    const auto r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const std::string arch : {"gpt", "llama"}) {
      // Three layers over two stages: uniform gives 1 and 2, so the stages differ.
      std::ofstream(dir_ / (arch + ".toml"))
          << oases::testing::tiny_fp64_config(arch, 3, dir_ / "data",
                                              "eval_every = 1\neval_steps = 1\n");
      oases::testing::write_random_init(dir_ / (arch + ".toml"),
                                        dir_ / (arch + "_init.safetensors"), 57);
    }
  }

  // Runs `arch` over tp x pp x dp ranks (pp = 1: the plain engine, any other: zero-bubble) with
  // `extra` settings; returns the run's folder (metrics.jsonl, run.json, ckpt/).
  static fs::path train(const std::string& arch, int tp, int pp, int dp, const std::string& name,
                        const std::string& extra = "") {
    return oases::testing::train_run(
        OASES_BINARY, dir_ / (arch + ".toml"), dir_ / (arch + "_init.safetensors"), {tp, pp, dp},
        dir_ / name, (pp > 1 ? "parallel.pipeline=" + quoted("zero-bubble") + " " : "") + extra);
  }

  // Rank 0 (the first stage, which writes run.json and the metrics) measures the activation
  // peak its schedule predicts, received gradient buffers included, every step.
  static void expect_predicted_peak(const fs::path& run, const std::string& what) {
    nlohmann::json info;
    std::ifstream(run / "run.json") >> info;
    const auto predicted = info.at("memory_bytes").at("activations").get<double>();
    const std::vector<double> measured = metric(run, "peak_activation_bytes");
    ASSERT_EQ(measured.size(), 3u) << what;
    for (const double peak : measured) EXPECT_EQ(peak, predicted) << what;
  }

  static inline fs::path dir_;
};

TEST_F(ZeroBubblePipeline, MatchesTheSingleProcessRun) {
  for (const std::string arch : {"gpt", "llama"}) {
    const fs::path reference = train(arch, 1, 1, 1, arch + "_pp1");
    ASSERT_EQ(metric(reference, "loss").size(), 3u) << arch;
    const fs::path run = train(arch, 1, 2, 1, arch + "_pp2_zb");
    expect_same_run(run, reference, arch + " pp=2 zero-bubble");
    expect_predicted_peak(run, arch + " pp=2 zero-bubble");
  }
}

TEST_F(ZeroBubblePipeline, WithTensorOrDataParallelismOrSubBatchesMatchesTheSingleProcessRun) {
  const fs::path reference = train("gpt", 1, 1, 1, "gpt_pp1");
  // Under tensor parallelism the stages run the oases schedule over two sub-batches, and the
  // vocab-parallel head_loss defers the vocabulary GEMM.
  const fs::path tp = train("gpt", 2, 2, 1, "gpt_tp2_pp2_zb");
  expect_same_run(tp, reference, "tp=2 pp=2 zero-bubble");
  expect_predicted_peak(tp, "tp=2 pp=2 zero-bubble");
  expect_same_run(train("gpt", 1, 2, 2, "gpt_dp2_pp2_zb"), reference, "dp=2 pp=2 zero-bubble");
  const fs::path sub_batched =
      train("gpt", 1, 2, 1, "gpt_pp2_zb_oases",
            "parallel.schedule=" + quoted("oases") + " parallel.recompute=" +
                quoted("fine-grained") + " parallel.sub_batches=2");
  expect_same_run(sub_batched, reference, "pp=2 zero-bubble within oases, 2 sub-batches");
  expect_predicted_peak(sub_batched, "pp=2 zero-bubble within oases, 2 sub-batches");
}

}  // namespace
