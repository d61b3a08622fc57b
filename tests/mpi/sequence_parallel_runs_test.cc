// Sequence parallelism (parallel.sequence_parallel): `mpirun -np N oases train` with norms,
// dropout and residuals on each rank's 1/tp of the tokens, under the megatron and oases
// schedules, each recomputation policy, data parallelism, ZeRO, partitioned checkpoints,
// pipelines (1F1B, zero-bubble: stage messages carry the shard) and per-layer plans of mixed
// degrees, validation losses and the predicted activation peak included,
// gives the losses, parameters and AdamW moments of the single-process run in fp64 to relative
// 1e-10, for GPT, LLaMA (grouped-query attention) and BERT (post-norms, masked-LM head), with
// dropout 0.1: the masks are keyed by each token's global sample and position, whichever rank
// holds it. Settings it cannot honour are refused with the valid values.
#include "support/command.h"
#include "support/runs.h"
#include "support/trace_events.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;
using oases::testing::quoted;
using oases::testing::run_command;

class SequenceParallel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("sequence_parallel_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const bool llama = GetParam() == "llama";
    std::ofstream(dir_ / "tiny.toml") << "[model]\narch = \"" << GetParam() << "\"\n"
                                      << (llama ? "kv_heads = 2\n" : "") << R"(layers = 2
hidden = 64
heads = 4
ffn_hidden = 96
vocab_size = 263    # bytes + BERT's four special tokens + 3: padded under tp = 2 and 4
seq_len = 20        # 10 tokens per rank at tp 2, 5 at tp 4: shards start mid-sequence
dropout = 0.1
[train]
precision = "fp64"  # the verification precision: every layout agrees to 1e-10
micro_batch = 4
global_batch = 8
steps = 3
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 1
[data]
path = ")" << (dir_ / "data").string() << "\"\n";
    oases::testing::write_random_init(dir_ / "tiny.toml", dir_ / "init.safetensors", 99);
  }

  // tp x dp x pp ranks under mpirun; with `validate`, validation after every step.
  std::optional<fs::path> train(int tp, int dp, int pp, const std::string& name,
                                const std::string& extra = "", bool validate = true) const {
    const fs::path out = dir_ / name;
    const int ranks = tp * dp * pp;
    const Result r = run_command(
        (ranks > 1 ? oases::testing::mpirun_prefix(ranks) : std::string()) + OASES_BINARY +
        " train --quiet --config " + (dir_ / "tiny.toml").string() + " --init-from " +
        (dir_ / "init.safetensors").string() + " --set parallel.tp=" + std::to_string(tp) +
        " parallel.dp=" + std::to_string(dp) + " parallel.pp=" + std::to_string(pp) +
        " log.metrics=" + oases::testing::quoted((out / "metrics.jsonl").string()) +
        " checkpoint.dir=" + oases::testing::quoted((out / "ckpt").string()) +
        (validate ? " train.eval_every=1 train.eval_steps=1 " : " ") + extra);
    EXPECT_EQ(r.exit_code, 0) << name << " " << extra << "\n" << r.output;
    if (r.exit_code != 0) return std::nullopt;
    return out;
  }

  void expect_matches(const fs::path& reference, const fs::path& run,
                      const std::string& what) const {
    for (const char* metric : {"loss", "val_loss"})
      expect_same_losses(oases::testing::metric_values(run / "metrics.jsonl", metric),
                         oases::testing::metric_values(reference / "metrics.jsonl", metric),
                         what + " " + metric);
    // Rank 0 measures the activation peak its schedule predicts, every step.
    nlohmann::json info;
    std::ifstream(run / "run.json") >> info;
    const auto predicted = info.at("memory_bytes").at("activations").get<double>();
    const std::vector<double> measured =
        oases::testing::metric_values(run / "metrics.jsonl", "peak_activation_bytes");
    ASSERT_EQ(measured.size(), 3u) << what;
    for (const double peak : measured) EXPECT_EQ(peak, predicted) << what << " activation peak";
    const fs::path last = fs::path("ckpt") / "step_3";
    expect_same_tensors(run / last / "model.safetensors", reference / last / "model.safetensors",
                        what);
    expect_same_tensors(run / last / "optimizer.safetensors",
                        reference / last / "optimizer.safetensors", what + " optimizer");
  }

  fs::path dir_;
};

TEST_P(SequenceParallel, EveryScheduleAndRecomputationMatchesTheSingleProcessRun) {
  const auto reference = train(1, 1, 1, "single");
  ASSERT_TRUE(reference.has_value());
  // name, tp, dp, pp, settings (sequence parallelism on in every one)
  const std::vector<std::tuple<std::string, int, int, int, std::string>> runs{
      {"tp2_megatron", 2, 1, 1, "parallel.schedule=megatron"},
      {"tp2_megatron_full", 2, 1, 1, "parallel.schedule=megatron parallel.recompute=full"},
      {"tp2_megatron_selective", 2, 1, 1,
       "parallel.schedule=megatron parallel.recompute=selective"},
      {"tp2_megatron_sqrt", 2, 1, 1, "parallel.schedule=megatron parallel.recompute=sqrt"},
      {"tp2_fine_grained", 2, 1, 1, "parallel.schedule=fine-grained"},
      {"tp2_cross_pass", 2, 1, 1, "parallel.schedule=cross-pass"},
      {"tp2_oases", 2, 1, 1, "parallel.schedule=oases"},
      {"tp4_oases", 4, 1, 1, "parallel.schedule=oases"},
      {"tp2_dp2_oases_zero1", 2, 2, 1, "parallel.schedule=oases parallel.zero=1"},
      {"tp2_dp2_megatron_zero3", 2, 2, 1, "parallel.schedule=megatron parallel.zero=3"},
      {"tp2_oases_partitioned", 2, 1, 1,
       "parallel.schedule=oases parallel.partition_activations=true"},
      {"tp2_pp2_1f1b", 2, 1, 2, "parallel.schedule=megatron parallel.pipeline=1f1b"},
      {"tp2_pp2_zero_bubble", 2, 1, 2, "parallel.schedule=megatron parallel.pipeline=zero-bubble"},
      // Per-layer plans: a rank holds the same tokens at every degree, so nothing moves
      // between ranks where the degree changes.
      {"tp2_plan_oases", 2, 1, 1, "parallel.schedule=oases parallel.plan=" + quoted("1,2")},
      {"tp4_plan_megatron_full", 4, 1, 1,
       "parallel.schedule=megatron parallel.recompute=full parallel.plan=" + quoted("2,4")},
      {"tp2_pp2_plan", 2, 1, 2,
       "parallel.schedule=megatron parallel.pipeline=1f1b parallel.plan=" + quoted("2,1")},
      // The start-up planner profiles the sequence-parallel segments and prices its own
      // program (degree 2 the only candidate at tp 2).
      {"tp2_plan_auto", 2, 1, 1, "parallel.schedule=oases parallel.plan=" + quoted("auto")},
  };
  for (const auto& [name, tp, dp, pp, settings] : runs) {
    // LLaMA's two key/value heads allow tp 2 at most.
    if (GetParam() == "llama" && tp > 2) continue;
    const auto run = train(tp, dp, pp, name, settings + " parallel.sequence_parallel=true");
    if (run) expect_matches(*reference, *run, GetParam() + " " + name);
  }
}

// The trace of one oases step at tp 2: every instance issues each all-gather and
// reduce-scatter of sequence parallelism (and the head's all-reduces) exactly once, replays
// none, and no collective of an instance starts while that instance recomputes.
using SequenceParallelTrace = SequenceParallel;  // one architecture suffices for the trace

TEST_P(SequenceParallelTrace, OasesShowsEachGatherAndScatterOnceAndNoneReplayed) {
  const fs::path trace_file = dir_ / "traced" / "trace.json";
  const auto run = train(2, 1, 1, "traced",
                         "parallel.schedule=oases parallel.sequence_parallel=true train.steps=1 "
                         "log.trace=" +
                             oases::testing::quoted(trace_file.string()),
                         false);
  ASSERT_TRUE(run.has_value());
  std::ifstream in(trace_file);
  ASSERT_TRUE(in.good()) << trace_file;
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> expected;
  for (int mb = 0; mb < 2; ++mb) {
    for (int sb = 0; sb < 2; ++sb) {
      const std::string at = oases::testing::instance_suffix(mb, sb);
      expected["RS fwd embedding" + at] = 1;
      for (const std::string dir : {"fwd ", "bwd "}) {
        expected["AG " + dir + "head_in" + at] = 1;
        for (int l = 0; l < 2; ++l)
          for (const std::string block : {"attention", "mlp"}) {
            expected["AG " + dir + block + "_in." + std::to_string(l) + at] = 1;
            expected["RS " + dir + block + "." + std::to_string(l) + at] = 1;
          }
      }
      expected["AR bwd head" + at] = 1;
      expected["AR-max fwd head" + at] = 1;
      expected["AR fwd head_softmax" + at] = 1;
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, int> counted;
    const auto comm = oases::testing::lane_events(trace, rank, 1);
    for (const auto& e : comm) ++counted[e.name];
    EXPECT_EQ(counted, expected) << "rank " << rank;
    oases::testing::expect_no_collective_during_own_recompute(trace, rank);
  }
}

INSTANTIATE_TEST_SUITE_P(Gpt, SequenceParallelTrace, ::testing::Values("gpt"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });
INSTANTIATE_TEST_SUITE_P(Architectures, SequenceParallel, ::testing::Values("gpt", "llama", "bert"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });

// Bad settings stop the run before it starts, naming the setting, the value and what is valid.
TEST(SequenceParallelSettings, AreRefusedWithTheValidValues) {
  const fs::path dir = oases::testing::fresh_test_folder("sequence_parallel_settings");
  const Result data = oases::testing::prepare_fortunes_data(OASES_BINARY, dir);
  ASSERT_EQ(data.exit_code, 0) << data.output;
  std::ofstream(dir / "tiny.toml") << R"([model]
layers = 2
hidden = 64
heads = 4
ffn_hidden = 96
vocab_size = 263
seq_len = 18
[train]
micro_batch = 2
global_batch = 2
steps = 1
threads = 1
[data]
path = ")" << (dir / "data").string()
                                   << "\"\n";
  oases::testing::write_random_init(dir / "tiny.toml", dir / "init.safetensors", 7);
  const auto refused = [&](int tp, const std::string& extra, const std::string& expected) {
    const Result r = run_command(oases::testing::train_command(
        OASES_BINARY, dir, tp, 1, dir / "out", "parallel.sequence_parallel=true " + extra));
    EXPECT_NE(r.exit_code, 0) << extra;
    EXPECT_NE(r.output.find(expected), std::string::npos) << extra << "\n" << r.output;
  };
  refused(1, "", "parallel.tp = 1; valid: parallel.tp > 1");
  refused(4, "", "model.seq_len = 18 must be divisible by parallel.tp = 4");
}

}  // namespace
