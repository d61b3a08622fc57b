// The zero-bubble split of the backward pass, segment by segment: running every segment's
// backward input-only (ops::Segment::backward_input) and its deferred weight part later
// (backward_weight) gives the loss and every parameter gradient the whole backward gives, for
// GPT, LLaMA and BERT, whole micro-batches and two sub-batches, with the single-rank head and
// with the vocab-parallel head (whose head_loss defers the vocabulary GEMM); the activation
// store's peak is the one the schedule predicts, stashed output gradients included.
//
// The input gradient is covered too: the embedding's gradient is the scatter of the first
// layer's input gradient, which every input part hands down the model.
//
// In fp64 with dropout, relative 1e-12 (the GEMMs are the same calls split in two; only
// where the weight parts run later does a gradient sum its instances in another order).
#include "comm/communicator.h"
#include "model/model.h"
#include "runtime/executor.h"
#include "schedule/schedule.h"
#include "support/numbers.h"
#include "support/tiny_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace oases::model {
namespace {

using schedule::Instruction;
using schedule::Op;
using schedule::Schedule;
using schedule::ScheduleSpec;

// A group of `size` ranks whose collectives leave every buffer as it is: each rank's partial
// results stand in for the totals. Both schedules compared run the same arithmetic through it,
// which is all a comparison of the two needs; tests/mpi runs real groups.
class LocalOnlyGroup final : public comm::Communicator {
 public:
  explicit LocalOnlyGroup(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string name() const override { return "tp"; }
  std::unique_ptr<comm::Work> all_reduce_async(Tensor, comm::ReduceOp) override { return done(); }
  std::unique_ptr<comm::Work> all_gather_async(Tensor, Tensor) override { return unused(); }
  std::unique_ptr<comm::Work> reduce_scatter_async(Tensor, Tensor, comm::ReduceOp) override {
    return unused();
  }
  std::unique_ptr<comm::Work> broadcast_async(Tensor, int) override { return unused(); }
  std::unique_ptr<comm::Work> send_async(Tensor, int, int) override { return unused(); }
  std::unique_ptr<comm::Work> recv_async(Tensor, int, int) override { return unused(); }
  std::unique_ptr<comm::Work> all_to_all_async(Tensor, Tensor) override { return unused(); }
  std::unique_ptr<comm::Work> all_to_allv_async(Tensor, std::vector<std::int64_t>, Tensor,
                                                std::vector<std::int64_t>) override {
    return unused();
  }
  std::unique_ptr<comm::Work> barrier_async() override { return unused(); }

 private:
  struct Done final : comm::Work {
    void wait() override {}
    bool test() override { return true; }
  };
  static std::unique_ptr<comm::Work> done() { return std::make_unique<Done>(); }
  static std::unique_ptr<comm::Work> unused() {
    ADD_FAILURE() << "a uniform single-stage model only all-reduces";
    return done();
  }
  int size_;
};

constexpr std::int64_t kMicroBatch = 2, kMicroBatches = 3, kSeq = 8;

ModelConfig config_of(const std::string& arch) {
  ModelConfig c = testing::tiny_equivalence_model(arch, 2);
  c.seq_len = kSeq;
  return c;
}

std::vector<std::int32_t> tokens(std::uint32_t stream, std::int64_t vocab) {
  return testing::philox_tokens(0, stream, kMicroBatch * kMicroBatches * kSeq,
                                static_cast<std::uint32_t>(vocab), {7, 8});
}

// F, input parts and weight parts in a zero-bubble-like order: micro-batch k's weight part
// after micro-batch k + 1's input part, the last ones at the end.
Schedule split_schedule(const ops::Program& program, const ScheduleSpec& spec) {
  Schedule out;
  const auto add = [&](const Schedule& part) { out.insert(out.end(), part.begin(), part.end()); };
  for (int mb = 0; mb < spec.micro_batches; ++mb) {
    add(schedule::micro_batch_forward(program, spec, mb));
    add(schedule::micro_batch_backward_input(program, spec, mb));
    if (mb > 0) add(schedule::micro_batch_backward_weight(program, spec, mb - 1));
  }
  add(schedule::micro_batch_backward_weight(program, spec, spec.micro_batches - 1));
  schedule::append_gradient_reductions(program, out);
  return out;
}

struct Outcome {
  double loss = 0;
  std::vector<double> grads;
  std::size_t peak = 0;
};

Outcome run(Model& model, const Schedule& schedule, const ops::StepContext& ctx) {
  runtime::Executor executor(model.segments(), model.program(), model.activations(),
                             model.static_activation_bytes());
  model.zero_grads();
  model.loss().reset();
  Outcome out;
  out.peak = executor.run(schedule, ctx, {}).peak_activation_bytes;
  EXPECT_EQ(model.activations().live_count(), 0u);
  out.loss = model.loss().sum;
  const double* g = model.grads().data<double>();
  out.grads.assign(g, g + model.param_count());
  return out;
}

struct WithinStage {
  schedule::ScheduleKind kind;
  schedule::Recompute recompute;
  int sub_batches;
};

TEST(BackwardSplit, InputPartThenWeightPartGiveTheWholeBackwardsGradients) {
  for (const std::string arch : {"gpt", "llama", "bert"}) {
    const ModelConfig config = config_of(arch);
    const auto inputs = tokens(1, config.vocab_size), targets = tokens(2, config.vocab_size);
    ops::StepContext ctx;
    ctx.step = 2;
    ctx.loss_gradient_scale = 1.0 / static_cast<double>(targets.size());
    for (std::int64_t mb = 0; mb < kMicroBatches; ++mb) {
      const std::int64_t row = mb * kMicroBatch;
      ctx.micro_batches.push_back({inputs.data() + row * kSeq, targets.data() + row * kSeq, row});
    }
    for (const int tp_size : {1, 2}) {
      for (const WithinStage& w :
           {WithinStage{schedule::ScheduleKind::megatron, schedule::Recompute::none, 1},
            WithinStage{schedule::ScheduleKind::oases, schedule::Recompute::fine_grained, 2}}) {
        const std::string what = fmt::format("{} tp={} {} sb={}", arch, tp_size,
                                             schedule::name(w.kind), w.sub_batches);
        LocalOnlyGroup tp(tp_size);
        ModelOptions o;
        o.dtype = DType::f64;
        o.micro_batch = kMicroBatch;
        o.sub_batches = w.sub_batches;
        o.seed = 5;
        o.tp = &tp;
        Model model(config, o);
        const ops::Program& program = model.program();
        const ScheduleSpec spec{w.kind, w.recompute, static_cast<int>(kMicroBatches),
                                w.sub_batches, true};
        const Schedule whole = schedule::generate(program, spec);
        const Schedule split = split_schedule(program, spec);
        ASSERT_NO_THROW(schedule::verify_schedule(program, spec, split)) << what;

        // Not vacuous: layers (and under tensor parallelism head_loss) defer their weights.
        int weight_parts = 0, head_loss_weight_parts = 0;
        for (const Instruction& ins : split) {
          if (ins.op != Op::backward_weight) continue;
          ++weight_parts;
          head_loss_weight_parts +=
              program.segments[static_cast<std::size_t>(ins.segment)].name == "head_loss";
        }
        const int instances = static_cast<int>(kMicroBatches) * w.sub_batches;
        EXPECT_EQ(weight_parts, (2 * static_cast<int>(config.layers) + (tp_size > 1)) * instances)
            << what;
        EXPECT_EQ(head_loss_weight_parts, tp_size > 1 ? instances : 0) << what;

        const Outcome want = run(model, whole, ctx);
        const Outcome got = run(model, split, ctx);
        EXPECT_NEAR(got.loss, want.loss, 1e-12 * std::abs(want.loss)) << what;
        for (const auto& p : model.layout().params()) {
          const Tensor view = model.layout().view(model.grads(), p);
          const auto begin = static_cast<std::size_t>(view.data<double>() - model.grads().data<double>());
          double diff = 0, norm = 0;
          for (std::size_t i = begin; i < begin + static_cast<std::size_t>(view.numel()); ++i) {
            diff += std::pow(got.grads[i] - want.grads[i], 2);
            norm += std::pow(want.grads[i], 2);
          }
          // A key bias's gradient is exactly zero (ops/layer_segments.h).
          if (p.name.find("key.bias") == std::string::npos) {
            EXPECT_GT(norm, 0) << what << " " << p.name;
          }
          EXPECT_LE(std::sqrt(diff), 1e-12 * std::sqrt(norm)) << what << " " << p.name;
        }
        // The stashes and the sets kept for the weight parts are what the schedule predicts.
        EXPECT_EQ(got.peak,
                  model.static_activation_bytes() + schedule::peak_activation_bytes(program, split))
            << what;
        EXPECT_GT(schedule::peak_activation_bytes(program, split),
                  schedule::peak_activation_bytes(program, whole))
            << what;
      }
    }
  }
}

}  // namespace
}  // namespace oases::model
