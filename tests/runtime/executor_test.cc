// The executor running every schedule in one process: same gradients as the plain schedule,
// the activation peak the schedule predicts, and the per-step figures it reports; ZeRO-3's
// parameter instructions reaching their hooks in order; on asynchronous streams, the compute
// stream waiting for a collective's event before it reads the result, failures of the
// streams' work surfacing from run(), and the listener hearing from the calling thread.
//
// Equivalence runs in fp64 (the verification precision): whole micro-batches give bitwise the
// reference, sub-batches (another summation order) agree to relative 1e-10. The tests that
// train through TrainingEngine run on the streams OASES_ASYNC_CPU_STREAMS asks for (ctest runs
// them twice, the second time as *.async_streams); the others run in both modes themselves.
#include "runtime/executor.h"

#include "runtime/trace.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/engine.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace oases {
// Parameterised tests are named after the mode ("ExecutorModes.X/asynchronous").
void PrintTo(StreamMode mode, std::ostream* out) { *out << stream_mode_name(mode); }
}  // namespace oases

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
class ExecutorModes : public ::testing::TestWithParam<StreamMode> {
 protected:
  ExecutorOptions options() const { return {GetParam()}; }
};

INSTANTIATE_TEST_SUITE_P(BothStreamModes, ExecutorModes,
                         ::testing::Values(StreamMode::immediate, StreamMode::asynchronous));

TEST_P(ExecutorModes, ParameterInstructionsCallTheirHooksInOrder) {
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
  Executor executor(segments, program, store, 0, options());
  EXPECT_EQ(executor.stream_mode(), GetParam());
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


// A group of two whose all-reduce of one value doubles it when waited for, `delay` after the
// wait begins; its operations do not time themselves.
class DoublingGroup final : public comm::Communicator {
 public:
  explicit DoublingGroup(std::chrono::duration<double> delay) : delay_(delay) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "doubling"; }
  std::unique_ptr<comm::Work> all_reduce_async(Tensor buffer, comm::ReduceOp) override {
    return std::make_unique<Doubling>(buffer, delay_);
  }
  std::unique_ptr<comm::Work> all_gather_async(Tensor, Tensor) override { return refuse(); }
  std::unique_ptr<comm::Work> reduce_scatter_async(Tensor, Tensor, comm::ReduceOp) override {
    return refuse();
  }
  std::unique_ptr<comm::Work> broadcast_async(Tensor, int) override { return refuse(); }
  std::unique_ptr<comm::Work> send_async(Tensor, int, int) override { return refuse(); }
  std::unique_ptr<comm::Work> recv_async(Tensor, int, int) override { return refuse(); }
  std::unique_ptr<comm::Work> all_to_all_async(Tensor, Tensor) override { return refuse(); }
  std::unique_ptr<comm::Work> all_to_allv_async(Tensor, std::vector<std::int64_t>, Tensor,
                                                std::vector<std::int64_t>) override {
    return refuse();
  }
  std::unique_ptr<comm::Work> barrier_async() override { return refuse(); }

 private:
  struct Doubling final : comm::Work {
    Doubling(Tensor value, std::chrono::duration<double> delay) : value_(value), delay_(delay) {}
    void wait() override {
      if (done_) return;
      std::this_thread::sleep_for(delay_);
      value_.data<double>()[0] *= 2;
      done_ = true;
    }
    bool test() override { return done_; }
    Tensor value_;
    std::chrono::duration<double> delay_;
    bool done_ = false;
  };
  static std::unique_ptr<comm::Work> refuse() {
    throw std::logic_error("DoublingGroup only all-reduces");
  }
  std::chrono::duration<double> delay_;
};

// Writes 1.5 into `value` (the buffer of its forward all-reduce), or reads it into `seen`;
// notes the thread it ran on. Throws from forward() while `failures` is positive.
class ValueSegment : public ops::Segment {
 public:
  ValueSegment(int id, ops::ActivationStore& store, bool writes, double& value,
               comm::Communicator* group)
      : ops::Segment(id, store), name_(writes ? "writer" : "reader"), writes_(writes),
        value_(value), group_(group) {}
  const std::string& name() const override { return name_; }
  ops::SegmentShape shape() const override {
    ops::SegmentShape s{name_};
    s.has_forward_collective = writes_;
    return s;
  }
  void forward(const ops::StepContext&, int, int) override {
    ran_on = std::this_thread::get_id();
    if (failures > 0) {
      --failures;
      throw std::runtime_error("forward failed");
    }
    if (writes_) value_ = 1.5;
    else seen = value_;
  }
  void backward(const ops::StepContext&, int, int, int) override {}
  CollectiveCall forward_collective(int, int) override {
    return {ops::CollectiveKind::all_reduce, comm::ReduceOp::sum, group_, Tensor::of(&value_, {1}),
            {}};
  }
  double seen = 0;
  int failures = 0;
  std::thread::id ran_on;

 private:
  std::string name_;
  bool writes_;
  double& value_;
  comm::Communicator* group_;
};

schedule::Instruction instruction(schedule::Op op, int segment) {
  schedule::Instruction ins{op};
  ins.segment = segment;
  return ins;
}

class ThreadRecordingListener : public InstructionListener {
 public:
  void record(const InstructionRecord& r) override {
    records.push_back(r);
    threads.push_back(std::this_thread::get_id());
  }
  std::vector<InstructionRecord> records;
  std::vector<std::thread::id> threads;
};

// Forward(writer), Start, Wait, Forward(reader): the reader sees the all-reduced value, which
// arrives 20 ms after the wait begins, so the compute stream must have waited for the
// collective's event (on asynchronous streams a missing event reads 1.5, and ThreadSanitizer
// reports the race). The compute stream's wait is exposed communication, the collective's span
// on a group of two is time on the wire, and the listener hears every record on the calling
// thread, in schedule order.
TEST_P(ExecutorModes, TheComputeStreamWaitsForTheCollectiveItStarted) {
  constexpr double kDelay = 0.02;
  DoublingGroup group{std::chrono::duration<double>(kDelay)};
  double value = 0;
  ops::ActivationStore store;
  std::vector<std::unique_ptr<ops::Segment>> segments;
  segments.push_back(std::make_unique<ValueSegment>(0, store, true, value, &group));
  segments.push_back(std::make_unique<ValueSegment>(1, store, false, value, &group));
  ops::Program program;
  for (const auto& segment : segments) program.segments.push_back(segment->shape());
  using schedule::Op;
  const schedule::Schedule s = {instruction(Op::forward, 0), instruction(Op::start, 0),
                                instruction(Op::wait, 0), instruction(Op::forward, 1)};
  Executor executor(segments, program, store, 0, options());
  ThreadRecordingListener listener;
  const ExecutionStats stats = executor.run(s, ops::StepContext{}, StepHooks{}, &listener);
  const auto& reader = static_cast<const ValueSegment&>(*segments[1]);
  EXPECT_EQ(reader.seen, 3.0);
  EXPECT_EQ(stats.collectives, 1);
  EXPECT_GE(stats.exposed_comm_seconds, kDelay);
  EXPECT_GE(stats.comm_seconds, kDelay);
  EXPECT_GT(stats.compute_seconds, 0);
  const bool asynchronous = GetParam() == StreamMode::asynchronous;
  EXPECT_EQ(reader.ran_on != std::this_thread::get_id(), asynchronous);
  ASSERT_EQ(listener.records.size(), 3u);
  EXPECT_EQ(trace_name(listener.records[0]), "F writer mb0 sb0");
  EXPECT_EQ(listener.records[1].lane, Lane::communication);
  EXPECT_GE(listener.records[1].seconds(), kDelay);
  EXPECT_EQ(trace_name(listener.records[2]), "F reader mb0 sb0");
  for (const std::thread::id thread : listener.threads) EXPECT_EQ(thread, std::this_thread::get_id());
}

// A failure of the compute stream's work reaches the caller of run(), before or while a
// collective is in flight, and the executor runs the next schedule as if nothing had happened.
TEST_P(ExecutorModes, AFailureOfTheStreamsWorkSurfacesFromRun) {
  DoublingGroup group{std::chrono::duration<double>(0)};
  double value = 0;
  ops::ActivationStore store;
  std::vector<std::unique_ptr<ops::Segment>> segments;
  segments.push_back(std::make_unique<ValueSegment>(0, store, true, value, &group));
  segments.push_back(std::make_unique<ValueSegment>(1, store, false, value, &group));
  ops::Program program;
  for (const auto& segment : segments) program.segments.push_back(segment->shape());
  using schedule::Op;
  const schedule::Schedule s = {instruction(Op::forward, 0), instruction(Op::start, 0),
                                instruction(Op::wait, 0), instruction(Op::forward, 1)};
  Executor executor(segments, program, store, 0, options());
  auto& writer = static_cast<ValueSegment&>(*segments[0]);
  auto& reader = static_cast<ValueSegment&>(*segments[1]);
  writer.failures = 1;
  EXPECT_THROW(executor.run(s, ops::StepContext{}, StepHooks{}), std::runtime_error);
  EXPECT_EQ(reader.seen, 0.0);  // skipped after the failure
  executor.run(s, ops::StepContext{}, StepHooks{});
  EXPECT_EQ(reader.seen, 3.0);
  // The reader fails between the Start and the Wait: the collective is dropped with the run.
  const schedule::Schedule failing = {instruction(Op::forward, 0), instruction(Op::start, 0),
                                      instruction(Op::forward, 1), instruction(Op::wait, 0)};
  reader.failures = 1;
  reader.seen = 0;
  EXPECT_THROW(executor.run(failing, ops::StepContext{}, StepHooks{}), std::runtime_error);
  executor.run(s, ops::StepContext{}, StepHooks{});
  EXPECT_EQ(reader.seen, 3.0);
}

TEST(Executor, TheStreamModeComesFromTheEnvironment) {
  // Read at each call; this process's environment is whatever ctest gave it.
  const char* value = std::getenv("OASES_ASYNC_CPU_STREAMS");
  const bool asynchronous = value != nullptr && std::string(value) == "1";
  EXPECT_EQ(stream_mode_from_environment(),
            asynchronous ? StreamMode::asynchronous : StreamMode::immediate);
  // Any other value is refused, naming the variable; the environment is restored after.
  const std::optional<std::string> saved = value ? std::optional<std::string>(value) : std::nullopt;
  ASSERT_EQ(setenv("OASES_ASYNC_CPU_STREAMS", "yes", 1), 0);
  try {
    stream_mode_from_environment();
    ADD_FAILURE() << "OASES_ASYNC_CPU_STREAMS=yes was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("OASES_ASYNC_CPU_STREAMS = 'yes'"), std::string::npos)
        << e.what();
  }
  if (saved) setenv("OASES_ASYNC_CPU_STREAMS", saved->c_str(), 1);
  else unsetenv("OASES_ASYNC_CPU_STREAMS");
}

}  // namespace
}  // namespace oases::runtime
