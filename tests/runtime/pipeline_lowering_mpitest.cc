// Lowered pipeline schedules, executed: a LLaMA and a GPT of three layers cut into two stages
// on two ranks (rank 0: embedding and layer 0; rank 1: layers 1 and 2 and the head), run by the
// GPipe and 1F1B schedules lower_pipeline produces over three micro-batches, each micro-batch
// run by a within-stage schedule (megatron without and with full recomputation, and cross-pass
// over two sub-batches). In fp64 with dropout, the loss and every parameter's gradient equal
// those of the whole model in one process to relative 1e-10 (GPT's tied word embedding, held
// by both stages, once the two stages' gradients are summed). Both stream modes: immediate,
// and asynchronous (compute, collectives and messages each on a thread).
#include "comm/mesh.h"
#include "model/model.h"
#include "mpi_test_support.h"
#include "runtime/executor.h"
#include "schedule/pipeline_lowering.h"
#include "schedule/schedule.h"
#include "support/numbers.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

namespace oases::runtime {
namespace {

namespace mpitest = comm::mpitest;

using schedule::PipelineKind;
using schedule::Recompute;
using schedule::Schedule;
using schedule::ScheduleKind;

constexpr std::int64_t kMicroBatch = 2, kMicroBatches = 3, kSeq = 8, kLayers = 3;
constexpr int kStages = 2;

model::ModelConfig config_of(const std::string& arch) {
  model::ModelConfig c = oases::testing::tiny_equivalence_model(arch, kLayers);
  c.seq_len = kSeq;
  return c;
}

// Stage s holds layers [first, end): rank 0 layer 0, rank 1 layers 1 and 2.
std::int64_t first_layer(int stage) { return stage == 0 ? 0 : 1; }
std::int64_t end_layer(int stage) { return stage == 0 ? 1 : kLayers; }

model::ModelOptions options(comm::Communicator& tp, std::int64_t first, std::int64_t end,
                            int sub_batches) {
  model::ModelOptions o;
  o.dtype = DType::f64;
  o.micro_batch = kMicroBatch;
  o.sub_batches = sub_batches;
  o.seed = 11;
  o.tp = &tp;
  o.first_layer = first;
  o.end_layer = end;
  return o;
}

std::vector<std::int32_t> tokens(std::uint32_t stream, std::int64_t vocab) {
  return oases::testing::philox_tokens(0, stream, kMicroBatch * kMicroBatches * kSeq,
                                       static_cast<std::uint32_t>(vocab), {5, 6});
}

ops::StepContext step_context(const std::vector<std::int32_t>& inputs,
                              const std::vector<std::int32_t>& targets) {
  ops::StepContext ctx;
  ctx.step = 3;
  ctx.loss_gradient_scale = 1.0 / static_cast<double>(targets.size());
  for (std::int64_t mb = 0; mb < kMicroBatches; ++mb) {
    const std::int64_t row = mb * kMicroBatch;
    ctx.micro_batches.push_back({inputs.data() + row * kSeq, targets.data() + row * kSeq, row});
  }
  return ctx;
}

struct WithinStage {
  ScheduleKind kind;
  Recompute recompute;
  int sub_batches;
};

class PipelineLowering : public ::testing::TestWithParam<StreamMode> {};

INSTANTIATE_TEST_SUITE_P(BothStreamModes, PipelineLowering,
                         ::testing::Values(StreamMode::immediate, StreamMode::asynchronous),
                         [](const auto& mode) { return std::string(stream_mode_name(mode.param)); });

TEST_P(PipelineLowering, LoweredGPipeAnd1F1BComputeWhatOneProcessComputes) {
  const ExecutorOptions streams{GetParam()};
  ASSERT_EQ(mpitest::runtime().world_size(), kStages);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 1, kStages, mpitest::test_options());
  const int stage = mesh.pp_rank();
  comm::SelfCommunicator tp;

  for (const std::string arch : {"llama", "gpt"}) {
    const model::ModelConfig config = config_of(arch);
    const auto inputs = tokens(1, config.vocab_size), targets = tokens(2, config.vocab_size);
    const ops::StepContext ctx = step_context(inputs, targets);

    // The whole model in one process, under the plain schedule.
    model::Model whole(config, options(tp, 0, -1, 1));
    schedule::ScheduleSpec plain;
    plain.micro_batches = static_cast<int>(kMicroBatches);
    Executor reference(whole.segments(), whole.program(), whole.activations(),
                       whole.static_activation_bytes(), streams);
    whole.zero_grads();
    reference.run(schedule::generate(whole.program(), plain), ctx, {});

    for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
      for (const WithinStage& w : {WithinStage{ScheduleKind::megatron, Recompute::none, 1},
                                   WithinStage{ScheduleKind::megatron, Recompute::full, 1},
                                   WithinStage{ScheduleKind::cross_pass, Recompute::full, 2}}) {
        const std::string what = fmt::format("{} {} within {}/{} sb={} stage {}", arch,
                                             schedule::name(kind), schedule::name(w.kind),
                                             schedule::name(w.recompute), w.sub_batches, stage);
        const schedule::ScheduleSpec spec{w.kind, w.recompute, static_cast<int>(kMicroBatches),
                                          w.sub_batches, true};
        schedule::PipelineSpec pipeline;
        pipeline.kind = kind;
        pipeline.stages = kStages;
        pipeline.micro_batches = static_cast<int>(kMicroBatches);

        model::Model part(config, options(tp, first_layer(stage), end_layer(stage), w.sub_batches));
        const ops::Program& program = part.program();
        const Schedule mine = schedule::lower_pipeline(program, spec, pipeline, stage);
        EXPECT_NO_THROW(schedule::verify_schedule(program, spec, mine)) << what;
        // Both ranks' lists, for the group check: every rank builds both stages' programs.
        std::vector<Schedule> group;
        std::vector<std::set<std::string>> names_of_stage;
        for (int s = 0; s < kStages; ++s) {
          model::Model other(config, options(tp, first_layer(s), end_layer(s), w.sub_batches));
          group.push_back(schedule::lower_pipeline(other.program(), spec, pipeline, s));
          names_of_stage.emplace_back();
          for (const auto& p : other.layout().params()) names_of_stage.back().insert(p.name);
        }
        EXPECT_NO_THROW(schedule::verify_point_to_point(group)) << what;

        Executor executor(part.segments(), program, part.activations(),
                          part.static_activation_bytes(), streams);
        executor.set_point_to_point(&mesh.pp_group());
        part.zero_grads();
        int reductions = 0;
        executor.run(mine, ctx, {[&](int) { ++reductions; }, {}});
        EXPECT_EQ(reductions, static_cast<int>(part.grad_buckets().size())) << what;
        EXPECT_EQ(part.activations().live_count(), 0u) << what;

        // GPT ties its word embedding to the head: both stages hold a copy, and the whole
        // model's gradient is the sum of the two. Summed in name order on both ranks.
        for (const std::string& name : names_of_stage.front())
          if (names_of_stage.back().contains(name))
            mesh.pp_group().all_reduce(part.layout().view(part.grads(), part.layout().find(name)));

        if (stage == kStages - 1) {  // the loss lives on the last stage
          EXPECT_EQ(part.loss().count, whole.loss().count) << what;
          EXPECT_NEAR(part.loss().sum, whole.loss().sum, 1e-10 * std::abs(whole.loss().sum))
              << what;
        }
        for (const auto& p : part.layout().params()) {
          const Tensor got = part.layout().view(part.grads(), p);
          const Tensor want = whole.layout().view(whole.grads(), whole.layout().find(p.name));
          double diff = 0, norm = 0;
          for (std::int64_t i = 0; i < got.numel(); ++i) {
            diff += std::pow(got.data<double>()[i] - want.data<double>()[i], 2);
            norm += std::pow(want.data<double>()[i], 2);
          }
          EXPECT_GT(norm, 0) << what << " " << p.name;
          EXPECT_LE(std::sqrt(diff), 1e-10 * std::sqrt(norm)) << what << " " << p.name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace oases::runtime
