// Context parallelism (parallel.cp, cp_kind = "all-to-all" and "ring"): `mpirun -np N oases
// train` with every sequence split over cp ranks (chunks i and 2cp - 1 - i of each), attention
// computed by head groups after an all-to-all and turned back after it, or by passing key/value
// blocks around the cp group (ring), alone and with tensor (and
// sequence), data and pipeline parallelism, per-layer plans, every recomputation policy and
// ZeRO, validation losses and the
// predicted activation peak included, gives the losses, parameters and AdamW moments of the
// single-process run in fp64 to relative 1e-10, for GPT, LLaMA (grouped-query attention) and
// BERT (bidirectional attention, masked-LM targets), with dropout 0.1 on the residual stream
// and on attention probabilities: masks are keyed by each token's global sample and position
// and each head's global index, whichever rank holds them. Checkpoints move between cp layouts
// and one process; evaluation and generation read a cp checkpoint. Settings it cannot honour
// are refused with the valid values.
#include "support/command.h"
#include "support/runs.h"
#include "support/trace_events.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
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

struct Layout {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int ranks() const { return tp * cp * dp * pp; }
};

class ContextParallel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("context_parallel_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // LLaMA: 8 query heads over 4 key/value heads, so that tp 2 x cp 2 leaves each rank's head
    // group two query heads sharing one key/value head.
    const bool llama = GetParam() == "llama";
    std::ofstream(dir_ / "tiny.toml") << "[model]\narch = \"" << GetParam() << "\"\n"
                                      << (llama ? "heads = 8\nkv_heads = 4\n" : "heads = 4\n")
                                      << R"(layers = 2
hidden = 64
ffn_hidden = 96
vocab_size = 263    # bytes + BERT's four special tokens + 3: padded under tp = 2
seq_len = 24        # chunks of 6 tokens at cp 2, of 3 at cp 4
dropout = 0.1
attention_dropout = 0.1
[train]
precision = "fp64"  # the verification precision: every layout agrees to 1e-10
micro_batch = 4
global_batch = 8
steps = 3
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 0
[data]
path = ")" << (dir_ / "data").string() << "\"\n";
    oases::testing::write_random_init(dir_ / "tiny.toml", dir_ / "init.safetensors", 99);
  }

  // Under mpirun when the layout has more than one rank; with `validate`, validation after
  // every step.
  std::optional<fs::path> train(Layout at, const std::string& name, const std::string& extra = "",
                                bool validate = true) const {
    const fs::path out = dir_ / name;
    const Result r = run_command(
        (at.ranks() > 1 ? oases::testing::mpirun_prefix(at.ranks()) : std::string()) +
        OASES_BINARY + " train --quiet --config " + (dir_ / "tiny.toml").string() +
        " --init-from " + (dir_ / "init.safetensors").string() +
        " --set parallel.tp=" + std::to_string(at.tp) + " parallel.cp=" + std::to_string(at.cp) +
        " parallel.dp=" + std::to_string(at.dp) + " parallel.pp=" + std::to_string(at.pp) +
        " log.metrics=" + quoted((out / "metrics.jsonl").string()) +
        " checkpoint.dir=" + quoted((out / "ckpt").string()) +
        (validate ? " train.eval_every=1 train.eval_steps=1 " : " ") + extra);
    EXPECT_EQ(r.exit_code, 0) << name << " " << extra << "\n" << r.output;
    if (r.exit_code != 0) return std::nullopt;
    return out;
  }

  // The run's last `steps` losses (and validation losses), the step-3 parameters and AdamW
  // moments are the reference's; rank 0's measured activation peak is the one its schedule
  // predicts.
  void expect_matches(const fs::path& reference, const fs::path& run, const std::string& what,
                      std::size_t steps = 3) const {
    for (const char* metric : {"loss", "val_loss"}) {
      const auto want = oases::testing::metric_values(reference / "metrics.jsonl", metric);
      ASSERT_GE(want.size(), steps) << what;
      expect_same_losses(oases::testing::metric_values(run / "metrics.jsonl", metric),
                         {want.end() - static_cast<std::ptrdiff_t>(steps), want.end()},
                         what + " " + metric);
    }
    nlohmann::json info;
    std::ifstream(run / "run.json") >> info;
    const auto predicted = info.at("memory_bytes").at("activations").get<double>();
    for (const double peak :
         oases::testing::metric_values(run / "metrics.jsonl", "peak_activation_bytes"))
      EXPECT_EQ(peak, predicted) << what << " activation peak";
    const fs::path last = fs::path("ckpt") / "step_3";
    expect_same_tensors(run / last / "model.safetensors", reference / last / "model.safetensors",
                        what);
    expect_same_tensors(run / last / "optimizer.safetensors",
                        reference / last / "optimizer.safetensors", what + " optimizer");
  }

  fs::path dir_;
};

TEST_P(ContextParallel, EveryLayoutAndScheduleMatchesTheSingleProcessRun) {
  const auto reference = train({}, "single", "checkpoint.every=1 checkpoint.keep=0");
  ASSERT_TRUE(reference.has_value());
  const std::vector<std::tuple<std::string, Layout, std::string>> runs{
      {"cp2", {1, 2, 1, 1}, ""},
      {"cp2_full", {1, 2, 1, 1}, "parallel.schedule=megatron parallel.recompute=full"},
      {"cp2_selective", {1, 2, 1, 1}, "parallel.schedule=megatron parallel.recompute=selective"},
      {"cp2_cross_pass", {1, 2, 1, 1}, "parallel.schedule=cross-pass"},
      {"cp4", {1, 4, 1, 1}, ""},
      {"tp2_cp2_oases", {2, 2, 1, 1}, "parallel.schedule=oases"},
      // Sequence parallelism inside each cp rank's tokens: norms, dropout and residuals on 1/tp
      // of them, the output projection reduce-scattered.
      {"tp2_cp2_sp_oases", {2, 2, 1, 1}, "parallel.schedule=oases parallel.sequence_parallel=true"},
      {"tp2_cp2_sp_full",
       {2, 2, 1, 1},
       "parallel.schedule=megatron parallel.recompute=full parallel.sequence_parallel=true"},
      // Per-layer plans: a layer at degree 1 runs whole on each tensor-parallel rank, with its
      // own head groups over the same cp pair.
      {"tp2_cp2_plan_oases",
       {2, 2, 1, 1},
       "parallel.schedule=oases parallel.plan=" + quoted("1,2")},
      {"tp2_cp2_sp_plan",
       {2, 2, 1, 1},
       "parallel.sequence_parallel=true parallel.plan=" + quoted("2,1")},
      // The start-up planner profiles the cp layout itself and prices its own program.
      {"tp2_cp2_plan_auto",
       {2, 2, 1, 1},
       "parallel.schedule=oases parallel.plan=" + quoted("auto")},
      {"cp2_dp2_zero1", {1, 2, 2, 1}, "parallel.zero=1"},
      {"cp2_dp2_zero3", {1, 2, 2, 1}, "parallel.zero=3"},
      {"cp2_pp2_1f1b", {1, 2, 1, 2}, "parallel.pipeline=1f1b"},
      {"cp2_pp2_zero_bubble", {1, 2, 1, 2}, "parallel.pipeline=zero-bubble"},
  };
  for (const auto& [name, layout, settings] : runs) {
    const auto run =
        train(layout, name, "parallel.cp_kind=" + quoted("all-to-all") + " " + settings);
    if (run) expect_matches(*reference, *run, GetParam() + " " + name);
  }
  // The single process's step-1 checkpoint resumes at tp 2 x cp 2.
  fs::create_directories(dir_ / "resumed" / "ckpt");
  fs::copy(*reference / "ckpt" / "step_1", dir_ / "resumed" / "ckpt" / "step_1",
           fs::copy_options::recursive);
  const auto resumed = train({2, 2, 1, 1}, "resumed", "checkpoint.resume=true");
  if (resumed) expect_matches(*reference, *resumed, GetParam() + " resumed at tp 2 x cp 2", 2);
}

// The ring kind: key/value blocks passed around the cp group, the steps' partial attention
// merged by log-sum-exp, dk|dv passed back to their owners. cp 4 runs the receive segments
// (blocks passed on); the LLaMA model's 8 query heads over 4 key/value heads need not divide
// by cp here. A checkpoint of the ring run resumes at tp 2 x cp 2 (ring) and in one process.
TEST_P(ContextParallel, RingMatchesTheSingleProcessRun) {
  const auto reference = train({}, "single", "checkpoint.every=1 checkpoint.keep=0");
  ASSERT_TRUE(reference.has_value());
  const std::vector<std::tuple<std::string, Layout, std::string>> runs{
      {"ring_cp2", {1, 2, 1, 1}, "checkpoint.every=1 checkpoint.keep=0"},
      {"ring_cp2_full", {1, 2, 1, 1}, "parallel.schedule=megatron parallel.recompute=full"},
      {"ring_cp2_selective",
       {1, 2, 1, 1},
       "parallel.schedule=megatron parallel.recompute=selective"},
      {"ring_cp2_cross_pass", {1, 2, 1, 1}, "parallel.schedule=cross-pass"},
      {"ring_cp4", {1, 4, 1, 1}, "parallel.schedule=megatron parallel.recompute=full"},
      {"ring_cp4_fine_grained", {1, 4, 1, 1}, "parallel.schedule=fine-grained"},
      {"ring_tp2_cp2_oases", {2, 2, 1, 1}, "parallel.schedule=oases"},
      {"ring_tp2_cp2_sp_plan",
       {2, 2, 1, 1},
       "parallel.sequence_parallel=true parallel.plan=" + quoted("2,1")},
      {"ring_cp2_dp2_zero3", {1, 2, 2, 1}, "parallel.zero=3"},
      {"ring_cp2_pp2_zero_bubble", {1, 2, 1, 2}, "parallel.pipeline=zero-bubble"},
  };
  for (const auto& [name, layout, settings] : runs) {
    const auto run = train(layout, name, "parallel.cp_kind=ring " + settings);
    if (!run) continue;
    expect_matches(*reference, *run, GetParam() + " " + name);
    // Every step records its wait on the shifts (part of all its waits) and their wire time.
    const auto exposed = oases::testing::metric_values(*run / "metrics.jsonl", "exposed_cp_s");
    const auto all = oases::testing::metric_values(*run / "metrics.jsonl", "exposed_comm_s");
    const auto wire = oases::testing::metric_values(*run / "metrics.jsonl", "cp_s");
    ASSERT_EQ(exposed.size(), 3u) << name;
    ASSERT_EQ(all.size(), 3u) << name;
    ASSERT_EQ(wire.size(), 3u) << name;
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_GE(exposed[i], 0) << name;
      EXPECT_LE(exposed[i], all[i]) << name;
      EXPECT_GT(wire[i], 0) << name;
    }
  }
  // The ring run's step-1 checkpoint resumes at tp 2 x cp 2 (ring) and in one process.
  for (const auto& [name, layout, kind] :
       {std::tuple{"ring_resumed_tp2_cp2", Layout{2, 2, 1, 1}, "ring"},
        std::tuple{"ring_resumed_single", Layout{}, "all-to-all"}}) {
    fs::create_directories(dir_ / name / "ckpt");
    fs::copy(dir_ / "ring_cp2" / "ckpt" / "step_1", dir_ / name / "ckpt" / "step_1",
             fs::copy_options::recursive);
    const auto resumed =
        train(layout, name, "checkpoint.resume=true parallel.cp_kind=" + quoted(kind));
    if (resumed) expect_matches(*reference, *resumed, GetParam() + " " + name, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, ContextParallel, ::testing::Values("gpt", "llama", "bert"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });

// The trace of one oases step at tp 2 x cp 2: every instance issues each of its layers' four
// all-to-alls exactly once, replays none, and no collective of an instance starts while that
// instance recomputes.
using ContextParallelTrace = ContextParallel;  // one architecture suffices for the trace

TEST_P(ContextParallelTrace, OasesShowsEachAllToAllOnceAndNoneReplayed) {
  const fs::path trace_file = dir_ / "traced" / "trace.json";
  const auto run = train({2, 2, 1, 1}, "traced",
                         "parallel.schedule=oases train.steps=1 log.trace=" +
                             quoted(trace_file.string()),
                         false);
  ASSERT_TRUE(run.has_value());
  std::ifstream in(trace_file);
  ASSERT_TRUE(in.good()) << trace_file;
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> expected;
  for (int mb = 0; mb < 2; ++mb)
    for (int sb = 0; sb < 2; ++sb)
      for (int l = 0; l < 2; ++l) {
        std::string at = ".";  // (one append at a time: GCC 12's -Wrestrict misreads "." + s)
        at += std::to_string(l);
        at += oases::testing::instance_suffix(mb, sb);
        expected["A2A fwd attention" + at] = 1;
        expected["A2A fwd attention_core" + at] = 1;
        expected["A2A bwd attention_core" + at] = 1;
        expected["A2A bwd attention_out" + at] = 1;
      }
  for (int rank = 0; rank < 4; ++rank) {
    std::map<std::string, int> counted;
    const auto comm = oases::testing::lane_events(trace, rank, 1);
    for (const auto& e : comm)
      if (e.name.rfind("A2A ", 0) == 0) ++counted[e.name];
    EXPECT_EQ(counted, expected) << "rank " << rank;
    oases::testing::expect_no_collective_during_own_recompute(trace, rank);
  }
}

// The trace of one ring step at cp 2 under the megatron schedule, which overlaps nothing across
// instances: each instance shifts each layer's block once forward and its dk|dv once backward
// (no replay), and the step over the local block runs on the compute lane between the
// projections that issue the shift and the output segment that reads the block that arrived.
// (When the wire begins a shift depends on the communicator's progress; the schedule test
// tests/model/context_parallel_program_test.cc checks that every shift's Wait follows its
// step.)
TEST_P(ContextParallelTrace, RingShiftsTravelWhileTheLocalBlocksAttentionRuns) {
  const fs::path trace_file = dir_ / "ring_traced" / "trace.json";
  const auto run = train({1, 2, 1, 1}, "ring_traced",
                         "parallel.cp_kind=ring parallel.schedule=megatron train.steps=1 "
                         "log.trace=" +
                             quoted(trace_file.string()),
                         false);
  ASSERT_TRUE(run.has_value());
  std::ifstream in(trace_file);
  ASSERT_TRUE(in.good()) << trace_file;
  const nlohmann::json trace = nlohmann::json::parse(in);
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, int> counted;
    const auto comm = oases::testing::lane_events(trace, rank, 1);
    const auto compute = oases::testing::lane_events(trace, rank, 0);
    const auto find = [](const std::vector<oases::testing::TraceEvent>& events,
                         const std::string& name) {
      return std::find_if(events.begin(), events.end(),
                          [&](const oases::testing::TraceEvent& e) { return e.name == name; });
    };
    for (const auto& e : comm)
      if (e.name.rfind("SHIFT ", 0) == 0) ++counted[e.name];
    std::map<std::string, int> expected;
    for (int mb = 0; mb < 2; ++mb)
      for (int l = 0; l < 2; ++l) {
        std::string layer = std::to_string(l);
        std::string at = layer;
        at += oases::testing::instance_suffix(mb, 0);
        expected["SHIFT fwd attention." + at] = 1;
        expected["SHIFT bwd attention_out." + at] = 1;
        const auto shift = find(comm, "SHIFT fwd attention." + at);
        std::string step_name = "F attention_ring." + layer;
        step_name += ".0";
        step_name += oases::testing::instance_suffix(mb, 0);
        const auto projections = find(compute, "F attention." + at);
        const auto step = find(compute, step_name);
        const auto out = find(compute, "F attention_out." + at);
        ASSERT_TRUE(shift != comm.end() && projections != compute.end() && step != compute.end() &&
                    out != compute.end())
            << at;
        EXPECT_LE(projections->start_us + projections->duration_us, step->start_us)
            << "rank " << rank << " " << at;
        EXPECT_LE(step->start_us + step->duration_us, out->start_us)
            << "rank " << rank << " " << at;
      }
    EXPECT_EQ(counted, expected) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Gpt, ContextParallelTrace, ::testing::Values("gpt"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });

// A checkpoint written at tp 2 x cp 2 resumes in one process with the losses and parameters of
// the run that never stopped; `oases eval` reads it (in one process) with the loss of the
// single-process checkpoint of the same step, and `oases generate` continues a prompt from it.
using ContextParallelCheckpoints = ContextParallel;

TEST_P(ContextParallelCheckpoints, ResumeEvaluateAndGenerateInOneProcess) {
  const auto reference = train({}, "single", "checkpoint.every=1 checkpoint.keep=0", false);
  ASSERT_TRUE(reference.has_value());
  const auto source = train({2, 2, 1, 1}, "source",
                            "parallel.schedule=oases checkpoint.every=1 checkpoint.keep=0", false);
  ASSERT_TRUE(source.has_value());
  fs::create_directories(dir_ / "resumed" / "ckpt");
  fs::copy(*source / "ckpt" / "step_1", dir_ / "resumed" / "ckpt" / "step_1",
           fs::copy_options::recursive);
  const auto resumed = train({}, "resumed", "checkpoint.resume=true", false);
  ASSERT_TRUE(resumed.has_value());
  expect_same_losses(
      oases::testing::metric_values(*resumed / "metrics.jsonl", "loss"),
      [&] {
        const auto all = oases::testing::metric_values(*reference / "metrics.jsonl", "loss");
        return std::vector<double>(all.begin() + 1, all.end());
      }(),
      "resumed in one process");
  const fs::path last = fs::path("ckpt") / "step_3";
  expect_same_tensors(*resumed / last / "model.safetensors",
                      *reference / last / "model.safetensors", "resumed in one process");

  const auto eval_loss = [&](const fs::path& checkpoint) {
    const Result r =
        run_command(std::string(OASES_BINARY) + " eval --json --checkpoint " + checkpoint.string() +
                    " --data " + (dir_ / "data").string() + " --batches 2");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto json = nlohmann::json::parse(r.output.substr(r.output.find('{')), nullptr, false);
    return json.is_discarded() ? -1.0 : json.at("loss").get<double>();
  };
  const double from_cp = eval_loss(*source / "ckpt" / "step_1");
  const double from_single = eval_loss(*reference / "ckpt" / "step_1");
  EXPECT_GT(from_single, 0);
  EXPECT_NEAR(from_cp, from_single, 1e-10 * from_single);
  const Result generated = run_command(std::string(OASES_BINARY) + " generate --checkpoint " +
                                       (*source / "ckpt" / "step_1").string() +
                                       " --prompt Hello --max-new-tokens 4 --temperature 0");
  EXPECT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_EQ(generated.output.rfind("Hello", 0), 0u) << generated.output;
}

INSTANTIATE_TEST_SUITE_P(GptAndLlama, ContextParallelCheckpoints, ::testing::Values("gpt", "llama"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });

// A sequence of 2048 tokens: the memory one process needs is refused under a limit between it
// and what each of two cp ranks needs, and the cp run trains under it, its measured activation
// peak the predicted one.
TEST(ContextParallelMemory, TwoRanksHoldASequenceOneProcessCannot) {
  const fs::path dir = oases::testing::fresh_test_folder("context_parallel_memory");
  const Result data = oases::testing::prepare_fortunes_data(OASES_BINARY, dir);
  ASSERT_EQ(data.exit_code, 0) << data.output;
  std::ofstream(dir / "long.toml") << R"([model]
layers = 2
hidden = 64
heads = 4
ffn_hidden = 256
vocab_size = 256
seq_len = 2048
[train]
micro_batch = 1
global_batch = 1
steps = 1
threads = 0
[data]
path = ")" << (dir / "data").string()
                                   << "\"\n";
  const auto train = [&](int cp, std::int64_t limit) {
    return run_command((cp > 1 ? oases::testing::mpirun_prefix(cp) : std::string()) + OASES_BINARY +
                       " train --quiet --config " + (dir / "long.toml").string() +
                       " --set parallel.cp=" + std::to_string(cp) +
                       " parallel.memory_limit=" + std::to_string(limit) + " log.metrics=" +
                       quoted((dir / ("cp" + std::to_string(cp)) / "metrics.jsonl").string()));
  };
  // What a run needs, from the refusal under a limit of one byte.
  const auto needed = [&](int cp) -> std::int64_t {
    const Result r = train(cp, 1);
    const std::string marker = "this model needs ";
    const auto at = r.output.find(marker);
    EXPECT_NE(at, std::string::npos) << r.output;
    return at == std::string::npos ? 0 : std::stoll(r.output.substr(at + marker.size()));
  };
  const std::int64_t one = needed(1), two = needed(2);
  ASSERT_GT(two, 0);
  EXPECT_LT(two, one);
  const std::int64_t limit = (one + two) / 2;
  const Result refused = train(1, limit);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("parallel.memory_limit = " + std::to_string(limit) +
                                " bytes is too small"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("parallel.cp (now 1)"), std::string::npos) << refused.output;
  const Result fits = train(2, limit);
  ASSERT_EQ(fits.exit_code, 0) << fits.output;
  nlohmann::json info;
  std::ifstream(dir / "cp2" / "run.json") >> info;
  const auto predicted = info.at("memory_bytes").at("activations").get<double>();
  const auto measured =
      oases::testing::metric_values(dir / "cp2" / "metrics.jsonl", "peak_activation_bytes");
  ASSERT_EQ(measured.size(), 1u);
  EXPECT_EQ(measured.front(), predicted);
  EXPECT_EQ(info.at("cp").get<int>(), 2);
}

// Bad settings stop the run before it starts, naming the setting, the value and what is valid.
TEST(ContextParallelSettings, AreRefusedWithTheValidValues) {
  const fs::path dir = oases::testing::fresh_test_folder("context_parallel_settings");
  const Result data = oases::testing::prepare_fortunes_data(OASES_BINARY, dir);
  ASSERT_EQ(data.exit_code, 0) << data.output;
  std::ofstream(dir / "tiny.toml") << R"([model]
arch = "llama"
layers = 2
hidden = 64
heads = 4
kv_heads = 2
ffn_hidden = 96
vocab_size = 263
seq_len = 20
[train]
micro_batch = 2
global_batch = 2
steps = 1
threads = 1
[data]
path = ")" << (dir / "data").string()
                                   << "\"\n";
  const auto refused = [&](int ranks, const std::string& settings, const std::string& expected) {
    const Result r =
        run_command((ranks > 1 ? oases::testing::mpirun_prefix(ranks) : std::string()) +
                    OASES_BINARY + " train --quiet --config " + (dir / "tiny.toml").string() +
                    " --set " + settings + " checkpoint.dir=" + quoted((dir / "out").string()));
    EXPECT_NE(r.exit_code, 0) << settings;
    EXPECT_NE(r.output.find(expected), std::string::npos) << settings << "\n" << r.output;
  };
  // 2 x 3 chunks do not split 20 tokens evenly.
  refused(3, "parallel.cp=3",
          "model.seq_len = 20 must be divisible by 2 x cp = 6 (each rank holds two of 2 x cp "
          "equal chunks");
  // Two key/value heads over tp 2 leave one per rank: no all-to-all over 2 head groups.
  refused(4, "parallel.cp=2 parallel.tp=2",
          "the heads (2) and kv heads (1) of each tensor-parallel rank (model.heads = 4, kv heads "
          "= 2, parallel.tp = 2) must both be divisible by parallel.cp = 2; valid cp: a common "
          "divisor of 2 and 1, or parallel.cp_kind = \"ring\"");
  refused(1, "parallel.cp_kind=" + quoted("ulysses"), "parallel.cp_kind = \"ulysses\"");
  // The ring splits no heads: what the all-to-all refuses above it runs (and the seq_len
  // rule holds for both kinds).
  refused(3, "parallel.cp=3 parallel.cp_kind=" + quoted("ring"),
          "model.seq_len = 20 must be divisible by 2 x cp = 6");
  refused(1, "parallel.cp=2", "needs 2 processes");
  refused(3, "parallel.cp=2", "must equal the number of processes, 3");
  refused(1, "parallel.cp=0", "parallel.cp = 0 must be at least 1");
  const Result ring =
      run_command(oases::testing::mpirun_prefix(4) + OASES_BINARY + " train --quiet --config " +
                  (dir / "tiny.toml").string() +
                  " --set parallel.cp=2 parallel.tp=2 parallel.cp_kind=" + quoted("ring") +
                  " checkpoint.dir=" + quoted((dir / "ring").string()));
  EXPECT_EQ(ring.exit_code, 0) << ring.output;
  // The degree planner prices context-parallel plans as the run's own program; the pipeline
  // predictions build stages of plain layers, so with pp > 1 it refuses them.
  const std::string plan_command = std::string(OASES_BINARY) + " plan --degrees-only --config " +
                                   (dir / "tiny.toml").string() + " --cluster " + OASES_SOURCE_DIR +
                                   "/clusters/dgx-h100.toml --set parallel.cp=2";
  const Result plan = run_command(plan_command);
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("every plan predicted from the run's own program, with "
                             "parallel.cp = 2 (all-to-all)"),
            std::string::npos)
      << plan.output;
  const Result staged = run_command(plan_command + " parallel.pp=2");
  EXPECT_NE(staged.exit_code, 0);
  EXPECT_NE(staged.output.find("oases plan with parallel.pp = 2 predicts pipeline stages of "
                               "plain tensor-parallel layers, not context-parallel ones "
                               "(parallel.cp = 2)"),
            std::string::npos)
      << staged.output;
}

}  // namespace
