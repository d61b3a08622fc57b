// The executor running every schedule in one process: same gradients as the plain schedule,
// the activation peak the schedule predicts, and the per-step figures it reports; ZeRO-3's
// parameter instructions reaching their hooks in order.
//
// Equivalence runs in fp64 (the verification precision): whole micro-batches give bitwise the
// reference, sub-batches (another summation order) agree to relative 1e-10.
#include "runtime/executor.h"

#include "runtime/trace.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/engine.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace oases::runtime {
namespace {

using plan::RunConfig;
using train::TrainingEngine;

// The tiny run of three layers with dropout in fp64 under the given within-stage schedule.
plan::RunConfig tiny(const std::string& schedule, const std::string& recompute, int sub_batches) {
  plan::RunConfig c = oases::testing::tiny_run(oases::testing::tiny_model(3));
  c.model.dropout = 0.1;
  c.train.lr = 1e-2;
  c.parallel.schedule = schedule;
  c.parallel.recompute = recompute;
  c.parallel.sub_batches = sub_batches;
  c.train.precision = "fp64";
  c.validate();
  return c;
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint32_t stream) {
  return oases::testing::philox_tokens(0, stream, static_cast<std::int64_t>(n), 50, {5, 6});
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<double> params;
  std::size_t peak = 0, predicted = 0;
};

TrainedRun train_two_steps(const plan::RunConfig& config) {
  TrainingEngine engine(config);
  const auto in = tokens(8 * 16, 1), out = tokens(8 * 16, 2);
  TrainedRun run;
  run.predicted = engine.activation_bytes();
  for (int step = 0; step < 2; ++step) {
    const train::StepResult r = engine.train_step(step, in.data(), out.data());
    run.losses.push_back(r.loss);
    run.peak = std::max(run.peak, r.peak_activation_bytes);
    EXPECT_GT(r.compute_seconds, 0);
    EXPECT_EQ(r.comm_seconds, 0);  // a group of one puts nothing on a wire
  }
  const double* p = engine.model().params().data<double>();
  run.params.assign(p, p + engine.model().param_count());
  return run;
}

struct Case {
  std::string schedule, recompute;
  int sub_batches;
};
const std::vector<Case> kCases = {
    {"megatron", "none", 1},         {"megatron", "full", 1},        {"megatron", "selective", 1},
    {"fine-grained", "fine-grained", 1}, {"cross-pass", "full", 2},  {"cross-pass", "none", 4},
    {"cross-pass", "selective", 2},  {"oases", "fine-grained", 2},   {"oases", "fine-grained", 4}};

// Recomputation repeats the same arithmetic (dropout masks are keyed, not drawn), so whole
// micro-batches give bitwise the reference; sub-batches change only summation order.
TEST(Executor, EveryScheduleTrainsLikeTheReference) {
  const TrainedRun reference = train_two_steps(tiny("megatron", "none", 1));
  for (const Case& c : kCases) {
    const TrainedRun run = train_two_steps(tiny(c.schedule, c.recompute, c.sub_batches));
    const std::string what = c.schedule + "/" + c.recompute + " sb=" + std::to_string(c.sub_batches);
    const double tolerance = c.sub_batches == 1 ? 0.0 : 1e-10;
    for (std::size_t i = 0; i < run.losses.size(); ++i)
      EXPECT_NEAR(run.losses[i], reference.losses[i], tolerance * reference.losses[i]) << what;
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < run.params.size(); ++i) {
      diff += std::pow(run.params[i] - reference.params[i], 2);
      norm += std::pow(reference.params[i], 2);
    }
    EXPECT_LE(std::sqrt(diff), tolerance * std::sqrt(norm)) << what;
  }
}

TEST(Executor, MeasuredPeakActivationsAreWhatTheScheduleSays) {
  std::map<std::string, std::size_t> peak;
  for (const Case& c : kCases) {
    const TrainedRun run = train_two_steps(tiny(c.schedule, c.recompute, c.sub_batches));
    EXPECT_EQ(run.peak, run.predicted) << c.schedule << "/" << c.recompute;
    peak[c.schedule + "/" + c.recompute + "/" + std::to_string(c.sub_batches)] = run.peak;
  }
  const double none = static_cast<double>(peak["megatron/none/1"]);
  const double full = static_cast<double>(peak["megatron/full/1"]);
  const double oases = static_cast<double>(peak["oases/fine-grained/2"]);
  EXPECT_LE(oases, 1.5 * full);
  EXPECT_LT(oases, none);
  EXPECT_LT(full, none);
  EXPECT_LT(static_cast<double>(peak["megatron/selective/1"]), none);
}

// Every instruction of a step lands in the trace with its lane and name.
TEST(Executor, TracesEveryInstruction) {
  TrainingEngine engine(tiny("oases", "fine-grained", 2));
  TraceRecorder trace;
  engine.set_listener(&trace);
  const auto in = tokens(8 * 16, 1), out = tokens(8 * 16, 2);
  engine.train_step(0, in.data(), out.data());
  std::map<std::string, int> by_prefix;
  for (const auto& e : trace.events()) {
    EXPECT_GE(e.duration_us, 0);
    ++by_prefix[e.name.substr(0, e.name.find(' '))];
  }
  const int instances = 2 * 2;  // micro-batches x sub-batches
  EXPECT_EQ(by_prefix["F"], instances * (1 + 2 * 3 + 1));
  EXPECT_EQ(by_prefix["R"], instances * 2 * 3);
  EXPECT_EQ(by_prefix["AR"], instances * (2 * (1 + 2 * 3) ));  // forward: 7, backward: 6 + head
  EXPECT_EQ(by_prefix["OptimizerStep"], 1);
  const auto json = nlohmann::json::parse(trace.to_json(3));
  EXPECT_EQ(json["traceEvents"][0]["pid"], 3);
}

// A segment that only notes what ran, in the log the hooks write to as well.
class LoggingSegment : public ops::Segment {
 public:
  LoggingSegment(int id, ops::ActivationStore& store, std::string name,
                 std::vector<std::string>& log)
      : ops::Segment(id, store), name_(std::move(name)), log_(log) {}
  const std::string& name() const override { return name_; }
  ops::SegmentShape shape() const override { return {name_}; }
  void forward(const ops::StepContext&, int, int) override { log_.push_back("forward " + name_); }
  void backward(const ops::StepContext&, int, int, int) override {
    log_.push_back("backward " + name_);
  }

 private:
  std::string name_;
  std::vector<std::string>& log_;
};

class RecordingListener : public InstructionListener {
 public:
  void record(const InstructionRecord& r) override { records.push_back(r); }
  std::vector<InstructionRecord> records;
};

// ZeRO-3: GatherParams, WaitParams and ReleaseParams reach their hooks in schedule order,
// between the compute that reads the buckets; WaitParams' blocking is exposed communication
// on the compute lane; null hooks do nothing.
TEST(Executor, ParameterInstructionsCallTheirHooksInOrder) {
  ops::Program program;
  for (int bucket : {0, 1}) {
    ops::SegmentShape shape{bucket == 0 ? "a" : "b"};
    shape.ready_bucket = bucket;
    shape.param_buckets = {bucket};
    program.segments.push_back(shape);
  }
  schedule::ScheduleSpec spec;
  spec.sharded_params = true;
  schedule::Schedule s = schedule::generate(program, spec);
  schedule::shard_parameters(program, spec, s);
  schedule::verify_schedule(program, spec, s);

  std::vector<std::string> log;
  ops::ActivationStore store;
  std::vector<std::unique_ptr<ops::Segment>> segments;
  segments.push_back(std::make_unique<LoggingSegment>(0, store, "a", log));
  segments.push_back(std::make_unique<LoggingSegment>(1, store, "b", log));
  Executor executor(segments, program, store, 0);
  StepHooks hooks;
  hooks.reduce_grads = [&](int bucket) { log.push_back("reduce " + std::to_string(bucket)); };
  hooks.optimizer_step = [&] { log.push_back("step"); };
  hooks.gather_params = [&](int bucket) { log.push_back("gather " + std::to_string(bucket)); };
  constexpr double kWait = 0.01;  // each wait for bucket 1's parameters
  hooks.wait_params = [&](int bucket) {
    log.push_back("wait " + std::to_string(bucket));
    if (bucket == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kWait));
  };
  hooks.release_params = [&](int bucket) { log.push_back("release " + std::to_string(bucket)); };
  RecordingListener listener;
  const ExecutionStats stats = executor.run(s, ops::StepContext{}, hooks, &listener);
  // Resharded after forward: each bucket is gathered for its forward and again for its
  // backward; b's backward follows its forward at once, so its second gather follows its
  // release, and a's backward gather travels while b's backward computes.
  EXPECT_EQ(log, (std::vector<std::string>{
                     "gather 0", "gather 1", "wait 0", "forward a", "release 0", "wait 1",
                     "forward b", "release 1", "gather 0", "gather 1", "wait 1", "backward b",
                     "release 1", "reduce 1", "wait 0", "backward a", "release 0", "reduce 0",
                     "step"}));
  EXPECT_GE(stats.exposed_comm_seconds, 2 * kWait);
  ASSERT_FALSE(listener.records.empty());
  EXPECT_EQ(trace_name(listener.records.front()), "GatherParams bucket0");
  using schedule::Op;
  std::map<std::pair<Op, Lane>, int> lanes;
  for (const InstructionRecord& r : listener.records) {
    if (!schedule::is_parameter_op(r.instruction.op)) continue;
    EXPECT_EQ(r.segment, nullptr) << trace_name(r);
    ++lanes[{r.instruction.op, r.lane}];
    if (r.instruction.op == Op::wait_params && r.instruction.bucket == 1) {
      EXPECT_GE(r.seconds(), kWait);
    }
  }
  const std::map<std::pair<Op, Lane>, int> expected{{{Op::gather_params, Lane::optimizer}, 4},
                                                     {{Op::wait_params, Lane::compute}, 4},
                                                     {{Op::release_params, Lane::optimizer}, 4}};
  EXPECT_EQ(lanes, expected);

  // Without hooks the instructions do nothing.
  log.clear();
  executor.run(s, ops::StepContext{}, StepHooks{});
  EXPECT_EQ(log, (std::vector<std::string>{"forward a", "forward b", "backward b", "backward a"}));
}

}  // namespace
}  // namespace oases::runtime
