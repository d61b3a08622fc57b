// Sequence parallelism as the schedules see it: the program of one rank of a tensor-parallel
// pair (built by shape alone) has a shard segment before every tensor-parallel region, whose
// all-gathers and the regions' reduce-scatters are collectives like any other: the oases
// schedule overlaps each with the other sub-batch's compute and never replays one; the kept
// activations shrink by the residual-stream values and norm statistics the shards hold.
#include "comm/communicator.h"
#include "model/model.h"
#include "schedule/schedule.h"
#include "support/overlap_checks.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace oases::model {
namespace {

using ops::CollectiveKind;
using schedule::Op;

ModelOptions options(comm::Communicator& tp, int sub_batches, bool sequence_parallel) {
  ModelOptions o;
  o.tp = &tp;
  o.micro_batch = 4;
  o.sub_batches = sub_batches;
  o.sequence_parallel = sequence_parallel;
  o.shape_only = true;
  return o;
}

TEST(SequenceParallelProgram, ShardSegmentsOpenEveryTensorParallelRegion) {
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  const Model model(testing::tiny_model(2), options(tp, 1, true));
  std::vector<std::string> names;
  for (const ops::SegmentShape& s : model.program().segments) names.push_back(s.name);
  const std::vector<std::string> expected{
      "embedding",      "attention_in.0", "attention.0", "mlp_in.0", "mlp.0",
      "attention_in.1", "attention.1",    "mlp_in.1",    "mlp.1",    "head_in",
      "head",           "head_softmax",   "head_loss"};
  ASSERT_EQ(names, expected);
  const auto& segments = model.program().segments;
  EXPECT_EQ(segments[0].forward_kind, CollectiveKind::reduce_scatter);
  for (std::size_t i = 1; i + 3 < segments.size(); ++i) {
    const ops::SegmentShape& s = segments[i];
    const bool shard = s.name.find("_in") != std::string::npos;
    EXPECT_TRUE(s.sequence_sharded) << s.name;
    const CollectiveKind kind = shard ? CollectiveKind::all_gather : CollectiveKind::reduce_scatter;
    EXPECT_EQ(s.forward_kind, kind) << s.name;
    EXPECT_EQ(s.backward_kind, kind) << s.name;
    // A shard's epilogue adds the residual the shard segment before the body in between holds.
    const int expected_residual =
        (s.name == "attention_in.0" || !shard) ? -1 : static_cast<int>(i) - 2;
    EXPECT_EQ(s.residual_of, expected_residual) << s.name;
    // Each rank keeps its half of the residual stream; the body keeps its gathered input.
    EXPECT_EQ(s.checkpoint_replicated, !shard) << s.name;
  }
}

// The products are those of the run without sequence parallelism: only where the memory-bound
// work runs changes.
TEST(SequenceParallelProgram, DoesTheSameProductsAsTensorParallelismAlone) {
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  for (const char* arch : {"gpt", "llama", "bert"}) {
    const Model plain(testing::tiny_model(2, arch), options(tp, 1, false));
    const Model sharded(testing::tiny_model(2, arch), options(tp, 1, true));
    const auto flops = [](const ops::Program& program) {
      double total = 0;
      for (const ops::SegmentShape& s : program.segments) {
        total += s.work.forward().flops();
        for (int stage = 0; stage < s.backward_stages; ++stage)
          total += s.work.backward(stage, false).flops();
      }
      return total;
    };
    EXPECT_EQ(flops(sharded.program()), flops(plain.program())) << arch;
  }
}

// Without recomputation the peak is everything kept at the end of the forward pass. Per layer
// and instance of n tokens of width C, each of the two blocks keeps its residual-stream value
// (r_l, h_l) and its norm's statistics (s per token: 2 for LayerNorm, 1 for RMSNorm) as a
// 1/T shard instead of whole, while its body keeps the gathered norm output as the block
// without sequence parallelism keeps its own: (1 - 1/T)(n C + s n) elements fewer per block.
// The shard segment before the head keeps r_L's shard besides: n C / T more.
TEST(SequenceParallelProgram, KeepsLessByTheResidualStreamAndTheNormStatistics) {
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  schedule::ScheduleSpec spec;
  spec.kind = schedule::ScheduleKind::megatron;
  spec.recompute = schedule::Recompute::none;
  for (const char* arch : {"gpt", "llama"}) {
    const ModelConfig c = testing::tiny_model(2, arch);
    const Model plain(c, options(tp, 1, false));
    const Model sharded(c, options(tp, 1, true));
    const std::size_t without =
        schedule::peak_activation_bytes(plain.program(), schedule::generate(plain.program(), spec));
    const std::size_t with = schedule::peak_activation_bytes(
        sharded.program(), schedule::generate(sharded.program(), spec));
    const double T = 2, n = 4.0 * static_cast<double>(c.seq_len), C = static_cast<double>(c.hidden);
    const double s = std::string(arch) == "llama" ? 1 : 2;
    const double saved_elements =
        2 * static_cast<double>(c.layers) * (1 - 1 / T) * (n * C + s * n) - n * C / T;
    EXPECT_EQ(static_cast<double>(without) - static_cast<double>(with), saved_elements * 4) << arch;
  }
}

// Under oases every forward and backward collective of a sub-batch, the all-gathers and
// reduce-scatters of sequence parallelism included, is in flight while the other sub-batch
// computes, and fine-grained recomputation replays none.
TEST(SequenceParallelProgram, OasesOverlapsEveryGatherAndScatterAndReplaysNone) {
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  const Model model(testing::tiny_model(2), options(tp, 2, true));
  schedule::ScheduleSpec spec;
  spec.kind = schedule::ScheduleKind::oases;
  spec.recompute = schedule::Recompute::fine_grained;
  spec.micro_batches = 2;
  spec.sub_batches = 2;
  const schedule::Schedule steps = schedule::generate(model.program(), spec);
  int sequence_collectives = 0;
  for (const schedule::Instruction& start : testing::expect_every_collective_overlapped(steps))
    if (model.program().segments[static_cast<std::size_t>(start.segment)].sequence_sharded)
      ++sequence_collectives;
  // 2 micro-batches x 2 sub-batches x (2 layers x 8 + the head's 2 + the embedding's 1).
  EXPECT_EQ(sequence_collectives, 2 * 2 * (2 * 8 + 2 + 1));
}

}  // namespace
}  // namespace oases::model
