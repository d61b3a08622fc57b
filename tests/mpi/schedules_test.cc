// Schedules, end to end: every schedule x recomputation policy x sub-batch count, under
// tensor parallelism (`mpirun -np tp oases train`), gives the losses and parameters of the
// single-process Megatron run without recomputation; fine-grained recomputation (fine-grained
// and oases) never replays a forward collective, as the trace of the communication lane shows;
// combinations that cannot run are rejected with the setting, the value and the valid values.
//
// The runs are in fp64, the verification precision, and agree to relative 1e-10 per tensor
// (||a - b|| <= 1e-10 ||b||) and per loss, whatever the BLAS kernels and summation orders. As
// in layouts_test.cc, they start from random weights with nonzero biases and LayerNorm
// parameters, so that no parameter is a pure sum of AdamW updates.
#include "core/philox.h"
#include "io/safetensors.h"
#include "model/param_layout.h"
#include "plan/run_config.h"
#include "support/command.h"
#include "support/runs.h"
#include "support/trace_events.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::run_command;

constexpr int kLayers = 2;
constexpr int kMicroBatches = 2;  // global_batch 8 / micro_batch 4
constexpr int kSteps = 2;


using oases::testing::quoted;

struct Metrics {
  std::vector<double> losses;
  std::vector<double> peak_activation_bytes;
};

Metrics read_metrics(const fs::path& file) {
  return {oases::testing::metric_values(file, "loss"),
          oases::testing::metric_values(file, "peak_activation_bytes")};
}

using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;

// One schedule setting, as `--set` overrides.
struct Combination {
  std::string label;
  std::string settings;
};

Combination combination(const std::string& schedule, const std::string& recompute,
                        int sub_batches) {
  std::string label = schedule;
  std::string settings = "parallel.schedule=" + quoted(schedule);
  if (!recompute.empty()) {
    label += "+" + recompute;
    settings += " parallel.recompute=" + quoted(recompute);
  }
  if (sub_batches > 0) {
    label += "+sb" + std::to_string(sub_batches);
    settings += " parallel.sub_batches=" + std::to_string(sub_batches);
  }
  return {label, settings};
}

Combination with_settings(Combination c, const std::string& settings, const std::string& label) {
  c.label += "+" + label;
  c.settings += " " + settings;
  return c;
}

// The combinations under test (recompute "": automatic; sub_batches 0: automatic).
std::vector<Combination> every_combination() {
  return {
      combination("megatron", "none", 0),
      combination("megatron", "full", 0),
      combination("megatron", "selective", 0),
      combination("fine-grained", "", 0),
      combination("fine-grained", "fine-grained", 1),
      combination("cross-pass", "full", 2),
      combination("cross-pass", "none", 2),
      combination("cross-pass", "selective", 4),
      combination("oases", "", 2),
      combination("oases", "fine-grained", 4),
      combination("oases-interleaved", "", 2),
      combination("oases-interleaved", "fine-grained", 1),
      combination("oases-deferred", "", 2),
      // Both layers in one recomputation group (the default for 2 layers is groups of 1: full).
      with_settings(combination("megatron", "sqrt", 0), "parallel.recompute_every=2", "k2"),
      with_settings(combination("cross-pass", "sqrt", 2), "parallel.recompute_every=2", "k2"),
  };
}

class Schedules : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("schedules_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir_ / "tiny.toml") << R"(
[model]
layers = 2
hidden = 64
heads = 4
ffn_hidden = 128
vocab_size = 257    # not a multiple of 2 or 4: the vocab-parallel padding is exercised
seq_len = 24
dropout = 0.1
[train]
precision = "fp64"  # the verification precision: every layout agrees to 1e-10
micro_batch = 4     # sub-batches of 1, 2 or 4 sequences
global_batch = 8    # two micro-batches per step
steps = 2
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 1
[data]
path = ")" + (dir_ / "data").string() + R"("
[log]
peak_tflops = 1.0
)";
    write_random_init(dir_ / "init.safetensors");
  }

  void write_random_init(const fs::path& path) const {
    oases::testing::write_random_init(dir_ / "tiny.toml", path, 2024);
  }

  // Trains under tensor-parallel degree tp with the given overrides; returns the run's folder,
  // or nothing (after a failure) when the run failed.
  std::optional<fs::path> train(int tp, const std::string& name, const std::string& extra) const {
    const fs::path out = dir_ / name;
    const std::string command =
        oases::testing::train_command(OASES_BINARY, dir_, tp, 1, out, extra);
    const Result r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    if (r.exit_code != 0) return std::nullopt;
    return out;
  }

  // Every combination under tp against the single-process megatron run without recomputation.
  void expect_every_combination_matches_reference(int tp) const {
    const auto reference =
        train(1, "reference", combination("megatron", "none", 0).settings);
    ASSERT_TRUE(reference.has_value());
    const Metrics want = read_metrics(*reference / "metrics.jsonl");
    ASSERT_EQ(want.losses.size(), static_cast<std::size_t>(kSteps));
    const fs::path final_step = fs::path("ckpt") / ("step_" + std::to_string(kSteps));
    std::map<std::string, double> peak;
    for (const Combination& c : every_combination()) {
      const std::string what = "tp" + std::to_string(tp) + " " + c.label;
      const auto run = train(tp, "tp" + std::to_string(tp) + "_" + c.label, c.settings);
      if (!run) continue;
      const Metrics got = read_metrics(*run / "metrics.jsonl");
      expect_same_losses(got.losses, want.losses, what);
      expect_same_tensors(*run / final_step / "model.safetensors",
                          *reference / final_step / "model.safetensors", what + " model");
      expect_same_tensors(*run / final_step / "optimizer.safetensors",
                          *reference / final_step / "optimizer.safetensors", what + " optimizer");
      if (!got.peak_activation_bytes.empty()) peak[c.label] = got.peak_activation_bytes.front();
    }
    // The settings took effect: recomputation lowers the activation peak (otherwise the
    // comparisons above could pass with every run being the same schedule).
    if (peak.contains("megatron+none") && peak.contains("megatron+full") &&
        peak.contains("megatron+selective")) {
      EXPECT_LT(peak["megatron+full"], peak["megatron+none"]) << "tp" << tp;
      EXPECT_LT(peak["megatron+selective"], peak["megatron+none"]) << "tp" << tp;
    }
  }

  fs::path dir_;  // the current test's folder
};

TEST_F(Schedules, EveryScheduleMatchesTheSingleProcessRunAtTp1) {
  expect_every_combination_matches_reference(1);
}
TEST_F(Schedules, EveryScheduleMatchesTheSingleProcessRunAtTp2) {
  expect_every_combination_matches_reference(2);
}
TEST_F(Schedules, EveryScheduleMatchesTheSingleProcessRunAtTp4) {
  expect_every_combination_matches_reference(4);
}

// Under oases-interleaved the forward of micro-batch k + 1 runs during the backward of k,
// reshards included: where per-layer degrees alternate, a reshard's forward fills rows to
// gather while another reshard's backward gathers gradients, in buffers that must not be
// shared (with one shared reshard buffer these runs differ from the reference by ~30%). Four
// layers, so that the two passes meet at a reshard; three micro-batches, so that the first
// phases of the forward of k + 2 run beside the end of the forward of k + 1, in slots of their
// own (with one set of slots per sub-batch the verifier rejects the schedule).
TEST_F(Schedules, InterleavedMicroBatchesMatchTheSingleProcessRunUnderMixedPlans) {
  {
    std::ifstream in(dir_ / "tiny.toml");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t at = text.find("layers = 2");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 10, "layers = 4");
    const std::size_t batch = text.find("global_batch = 8");
    ASSERT_NE(batch, std::string::npos);
    text.replace(batch, 16, "global_batch = 12");
    std::ofstream(dir_ / "tiny.toml") << text;
    write_random_init(dir_ / "init.safetensors");
  }
  const auto reference = train(1, "reference", combination("megatron", "none", 0).settings);
  ASSERT_TRUE(reference.has_value());
  const Metrics want = read_metrics(*reference / "metrics.jsonl");
  const fs::path final_step = fs::path("ckpt") / ("step_" + std::to_string(kSteps));
  // (tp, plan, sub-batches); a layer at degree k needs sub-batches of a multiple of tp / k rows.
  const std::vector<std::tuple<int, std::string, int>> runs{
      {2, "1,2,1,2", 1}, {2, "1,2,1,2", 2}, {2, "2,1,2,1", 2}, {2, "2,1,1,2", 2},
      {4, "4,2,4,2", 2}};
  for (const auto& [tp, plan, sb] : runs) {
    const std::string label =
        "tp" + std::to_string(tp) + "_plan" + plan + "_sb" + std::to_string(sb);
    // oases-deferred once: its weight parts run in another order, on the same slots.
    for (const std::string schedule : {"oases-interleaved", "oases-deferred"}) {
      if (schedule == "oases-deferred" && (tp != 2 || plan != "1,2,1,2" || sb != 2)) continue;
      const std::string what = schedule + " " + label;
      const auto run = train(tp, schedule + "_" + label,
                             combination(schedule, "", sb).settings +
                                 " parallel.plan=" + quoted(plan));
      if (!run) continue;
      expect_same_losses(read_metrics(*run / "metrics.jsonl").losses, want.losses, what);
      expect_same_tensors(*run / final_step / "model.safetensors",
                          *reference / final_step / "model.safetensors", what + " model");
    }
  }
}

// ---- The trace: which collectives run, and when ----

using oases::testing::instance_of;
using oases::testing::lane_events;
using oases::testing::TraceEvent;

std::string suffix(int mb, int sb) {
  return oases::testing::instance_suffix(mb, sb);
}

// The communication-lane events each instance must show exactly once: the forward collectives
// of the embedding and of every attention and MLP segment, the backward collectives of every
// attention and MLP segment and of the head, the vocab-parallel loss's two reductions (row
// maxima after the head, sums after head_softmax: instructions of the schedule like the
// others); with `replay`, whole-layer recomputation's replayed forward collectives of every
// attention and MLP segment as well.
std::map<std::string, int> expected_collectives(int sub_batches, bool replay) {
  std::map<std::string, int> out;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    for (int sb = 0; sb < sub_batches; ++sb) {
      const std::string at = suffix(mb, sb);
      out["AR fwd embedding" + at] = 1;
      out["AR bwd head" + at] = 1;
      out["AR-max fwd head" + at] = 1;
      out["AR fwd head_softmax" + at] = 1;
      for (int l = 0; l < kLayers; ++l) {
        for (const std::string segment : {"attention.", "mlp."}) {
          const std::string seg = segment + std::to_string(l);
          out["AR fwd " + seg + at] = 1;
          out["AR bwd " + seg + at] = 1;
          if (replay) out["AR fwd replay " + seg + at] = 1;
        }
      }
    }
  }
  return out;
}

// The communication lane of each rank holds exactly the expected collectives, once each.
void expect_collectives(const nlohmann::json& trace, int sub_batches, bool replay,
                        const std::string& what) {
  const auto expected = expected_collectives(sub_batches, replay);
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, int> counted;
    for (const TraceEvent& e : lane_events(trace, rank, 1)) ++counted[e.name];
    for (const auto& [name, count] : counted) {
      if (!replay) {
        EXPECT_EQ(name.find("replay"), std::string::npos)
            << what << " rank " << rank << " replays a collective: " << name;
      }
      EXPECT_TRUE(expected.contains(name))
          << what << " rank " << rank << ": unexpected collective " << name << " (x" << count
          << ")";
    }
    for (const auto& [name, count] : expected)
      EXPECT_EQ(counted.contains(name) ? counted.at(name) : 0, count)
          << what << " rank " << rank << ": " << name;
  }
}

// Every attention and MLP segment of every instance is recomputed exactly once, and no
// collective of an instance begins while that instance recomputes (collectives of other
// sub-batches may: that is the overlap).
void expect_recompute_without_collectives(const nlohmann::json& trace, int sub_batches,
                                          const std::string& what) {
  for (int rank = 0; rank < 2; ++rank) {
    const auto compute = lane_events(trace, rank, 0);
    const auto comm = lane_events(trace, rank, 1);
    std::map<std::string, int> recomputed;  // "R <segment> mb<m> sb<s>" -> count
    std::vector<TraceEvent> recomputes;
    for (const TraceEvent& e : compute) {
      if (e.name.rfind("R ", 0) != 0) continue;
      recomputes.push_back(e);
      ++recomputed[e.name.substr(0, e.name.find(" ["))];
    }
    for (int mb = 0; mb < kMicroBatches; ++mb)
      for (int sb = 0; sb < sub_batches; ++sb)
        for (int l = 0; l < kLayers; ++l)
          for (const std::string segment : {"attention.", "mlp."}) {
            const std::string name = "R " + segment + std::to_string(l) + suffix(mb, sb);
            EXPECT_EQ(recomputed.contains(name) ? recomputed.at(name) : 0, 1)
                << what << " rank " << rank << ": " << name;
          }
    for (const TraceEvent& r : recomputes) {
      const auto instance = instance_of(r.name);
      EXPECT_TRUE(instance.has_value()) << what << ": cannot read " << r.name;
      if (!instance) continue;
      for (const TraceEvent& c : comm) {
        if (instance_of(c.name) != instance) continue;
        if (c.start_us > r.start_us && c.start_us < r.start_us + r.duration_us) {
          ADD_FAILURE() << what << " rank " << rank << ": " << c.name << " begins at "
                        << c.start_us << " us, during " << r.name << " [" << r.start_us
                        << ", " << r.start_us + r.duration_us << "] us";
        }
      }
    }
  }
}

class SchedulesTrace : public Schedules {
 protected:
  // Trains one step under tp = 2 with a trace; returns the parsed trace.
  std::optional<nlohmann::json> traced(const std::string& name, const std::string& settings) {
    const fs::path trace_file = dir_ / name / "trace.json";
    const auto run = train(2, name, settings + " train.steps=1 log.trace=" +
                                       quoted(trace_file.string()));
    if (!run) return std::nullopt;
    std::ifstream in(trace_file);
    EXPECT_TRUE(in.good()) << "no trace at " << trace_file;
    if (!in.good()) return std::nullopt;
    return nlohmann::json::parse(in);
  }
};

TEST_F(SchedulesTrace, FineGrainedRecomputationNeverReplaysACollective) {
  const auto fine_grained = traced("fine-grained", combination("fine-grained", "", 0).settings);
  if (fine_grained) {
    expect_collectives(*fine_grained, 1, false, "fine-grained");
    expect_recompute_without_collectives(*fine_grained, 1, "fine-grained");
  }
  const auto oases = traced("oases", combination("oases", "", 2).settings);
  if (oases) {
    expect_collectives(*oases, 2, false, "oases");
    expect_recompute_without_collectives(*oases, 2, "oases");
  }
  // Positive control: whole-layer recomputation replays both forward collectives of every
  // layer of every instance, and the counting sees them.
  const auto full = traced("megatron_full", combination("megatron", "full", 0).settings);
  if (full) {
    expect_collectives(*full, 1, true, "megatron+full");
    for (int rank = 0; rank < 2; ++rank) {
      int replayed = 0;
      for (const TraceEvent& e : lane_events(*full, rank, 1))
        if (e.name.rfind("AR fwd replay ", 0) == 0) ++replayed;
      EXPECT_EQ(replayed, 2 * kLayers * kMicroBatches) << "megatron+full rank " << rank;
    }
  }
}

// The checkers above catch what they look for: a synthetic two-rank trace of a correct
// schedule passes, and each violation planted in it is reported.
nlohmann::json synthetic_trace(int sub_batches) {
  nlohmann::json events = nlohmann::json::array();
  for (int rank = 0; rank < 2; ++rank) {
    double t = 0;
    for (const auto& [name, count] : expected_collectives(sub_batches, false))
      events.push_back({{"name", name}, {"ph", "X"}, {"pid", rank}, {"tid", 1}, {"ts", t += 10},
                        {"dur", 5}});
    for (int mb = 0; mb < kMicroBatches; ++mb)
      for (int sb = 0; sb < sub_batches; ++sb)
        for (int l = 0; l < kLayers; ++l)
          for (const std::string segment : {"attention.", "mlp."})
            events.push_back({{"name", "R " + segment + std::to_string(l) + suffix(mb, sb) +
                                           " [internals]"},
                              {"ph", "X"}, {"pid", rank}, {"tid", 0}, {"ts", 100000 + (t += 10)},
                              {"dur", 5}});
  }
  return {{"traceEvents", events}};
}

void plant(nlohmann::json& trace, const std::string& name, double ts) {
  trace["traceEvents"].push_back(
      {{"name", name}, {"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", ts}, {"dur", 1}});
}

double start_of(const nlohmann::json& trace, const std::string& name) {
  for (const auto& e : trace["traceEvents"])
    if (e["name"] == name) return e["ts"].get<double>();
  ADD_FAILURE() << "no event " << name;
  return -1;
}

// The messages of the failures `check` reports, intercepted.
std::vector<std::string> failures_of(const std::function<void()>& check) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    check();
  }
  std::vector<std::string> out;
  for (int i = 0; i < results.size(); ++i) out.emplace_back(results.GetTestPartResult(i).message());
  return out;
}

// Whether some failure message contains `phrase`.
bool reported(const std::vector<std::string>& failures, const std::string& phrase) {
  for (const std::string& f : failures)
    if (f.find(phrase) != std::string::npos) return true;
  return false;
}

TEST(SchedulesTraceCheckers, ReportReplaysMissingCollectivesAndCollectivesDuringRecompute) {
  const nlohmann::json clean = synthetic_trace(2);
  expect_collectives(clean, 2, false, "clean");
  expect_recompute_without_collectives(clean, 2, "clean");

  nlohmann::json trace = clean;
  plant(trace, "AR fwd replay mlp.1 mb1 sb0", 1);
  auto failures = failures_of([&] { expect_collectives(trace, 2, false, "planted"); });
  EXPECT_TRUE(reported(failures, "replays a collective: AR fwd replay mlp.1 mb1 sb0"))
      << ::testing::PrintToString(failures);

  trace = clean;
  plant(trace, "AR bwd head mb0 sb1", 2);  // a backward collective issued twice
  failures = failures_of([&] { expect_collectives(trace, 2, false, "planted"); });
  EXPECT_EQ(failures.size(), 1u) << ::testing::PrintToString(failures);
  EXPECT_TRUE(reported(failures, "AR bwd head mb0 sb1")) << ::testing::PrintToString(failures);

  trace = synthetic_trace(1);  // the collectives of sub-batch 1 are missing
  failures = failures_of([&] { expect_collectives(trace, 2, false, "planted"); });
  EXPECT_TRUE(reported(failures, "AR fwd embedding mb0 sb1")) << ::testing::PrintToString(failures);
  // ... and so are its recomputations.
  failures = failures_of([&] { expect_recompute_without_collectives(trace, 2, "planted"); });
  EXPECT_TRUE(reported(failures, "R mlp.1 mb1 sb1")) << ::testing::PrintToString(failures);

  // A collective of another sub-batch, or of another micro-batch, beginning inside a
  // recomputation is the overlap: not reported. One of the instance being recomputed is.
  trace = clean;
  plant(trace, "AR bwd mlp.0 mb1 sb0", start_of(trace, "R attention.1 mb0 sb0 [internals]") + 1);
  plant(trace, "AR bwd mlp.0 mb0 sb0", start_of(trace, "R attention.1 mb0 sb1 [internals]") + 1);
  expect_recompute_without_collectives(trace, 2, "overlap");
  plant(trace, "AR fwd replay attention.1 mb0 sb0",
        start_of(trace, "R attention.1 mb0 sb0 [internals]") + 2);
  failures = failures_of([&] { expect_recompute_without_collectives(trace, 2, "planted"); });
  EXPECT_EQ(failures.size(), 1u) << ::testing::PrintToString(failures);
  EXPECT_TRUE(reported(failures, "rank 1: AR fwd replay attention.1 mb0 sb0 begins at"))
      << ::testing::PrintToString(failures);
}

// ---- Combinations that cannot run ----

class SchedulesRejected : public Schedules {
 protected:
  // Runs single-process training with `settings`; expects it to fail without training and to
  // print every one of `phrases`.
  void expect_rejected(const std::string& settings, const std::vector<std::string>& phrases) {
    const fs::path metrics = dir_ / "rejected.jsonl";
    fs::remove(metrics);
    const std::string command = std::string(OASES_BINARY) + " train --quiet --config " +
                                (dir_ / "tiny.toml").string() + " --set " + settings +
                                " log.metrics=" + quoted(metrics.string()) + " checkpoint.dir=" +
                                quoted((dir_ / "ckpt").string());
    const Result r = run_command(command);
    EXPECT_NE(r.exit_code, 0) << command << "\n" << r.output;
    for (const std::string& phrase : phrases)
      EXPECT_NE(r.output.find(phrase), std::string::npos)
          << command << "\nexpected \"" << phrase << "\" in:\n" << r.output;
    EXPECT_FALSE(fs::exists(metrics)) << command << ": a step ran";
  }
};

TEST_F(SchedulesRejected, BadCombinationsNameTheSettingAndTheValidValues) {
  expect_rejected("parallel.sub_batches=3",
                  {"parallel.sub_batches = 3 must divide train.micro_batch = 4", "valid: 1, 2, 4"});
  expect_rejected(combination("oases", "full", 0).settings,
                  {"parallel.recompute = \"full\"", "parallel.schedule = \"oases\"",
                   "valid: recompute = \"fine-grained\""});
  expect_rejected(combination("fine-grained", "selective", 0).settings,
                  {"parallel.recompute = \"selective\"", "parallel.schedule = \"fine-grained\"",
                   "valid: recompute = \"fine-grained\" or \"none\""});
  expect_rejected(combination("megatron", "", 2).settings,
                  {"parallel.sub_batches = 2", "parallel.schedule = \"megatron\"",
                   "valid: sub_batches = 1", "\"cross-pass\"", "\"oases\""});
  expect_rejected(combination("fine-grained", "", 2).settings,
                  {"parallel.sub_batches = 2", "parallel.schedule = \"fine-grained\"",
                   "valid: sub_batches = 1"});
  expect_rejected(combination("bogus", "", 0).settings,
                  {"parallel.schedule = \"bogus\"",
                   "valid: \"megatron\", \"fine-grained\", \"cross-pass\", \"oases\", "
                   "\"oases-interleaved\", \"oases-deferred\""});
  expect_rejected(combination("oases-interleaved", "full", 0).settings,
                  {"parallel.recompute = \"full\"", "parallel.schedule = \"oases-interleaved\"",
                   "valid: recompute = \"fine-grained\""});
  expect_rejected(combination("megatron", "bogus", 0).settings,
                  {"parallel.recompute = \"bogus\"",
                   "valid: \"none\", \"full\", \"selective\", \"fine-grained\""});
}

}  // namespace
