// The work each segment reports (ops/program.h SegmentWork): summed over a model's program,
// its matrix products come to the FLOPs of the transformer counted by hand (forward: 2 C (3C)
// for q|k|v, 2 C C for the projection, 2 C F twice for the MLP, 2 S C twice for scores and
// their product with v, per layer and token; 2 C V for the logits; backward: twice each), and a
// Recompute or a zero-bubble split costs exactly its parts.
#include "comm/communicator.h"
#include "model/model.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <utility>

namespace oases::model {
namespace {

ModelOptions options(comm::Communicator& tp, std::int64_t micro_batch, int sub_batches) {
  ModelOptions o;
  o.tp = &tp;
  o.micro_batch = micro_batch;
  o.sub_batches = sub_batches;
  return o;
}

// FLOPs of one training pass (forward, backward) over `tokens` tokens, by hand.
double training_flops(const ModelConfig& c, double tokens, double ffn_projections) {
  const double C = static_cast<double>(c.hidden), F = static_cast<double>(c.ffn_hidden),
               S = static_cast<double>(c.seq_len), V = static_cast<double>(c.vocab_size),
               L = static_cast<double>(c.layers);
  const double kv = static_cast<double>(c.kv_head_count() * c.head_dim());
  const double layer = 2 * C * (C + 2 * kv) + 2 * C * C + ffn_projections * 2 * C * F + 2 * F * C;
  return tokens * 3 * (L * (layer + 4 * S * C) + 2 * C * V);
}

// The tiny GPT of `layers` layers with 4 heads of 8 and sequences of 8.
ModelConfig small(std::int64_t layers) {
  ModelConfig c = testing::tiny_model(layers);
  c.heads = 4;
  c.seq_len = 8;
  return c;
}

double program_flops(const ops::Program& program, int sub_batches) {
  double total = 0;
  for (const ops::SegmentShape& s : program.segments) {
    EXPECT_TRUE(s.work.known) << s.name;
    total += s.work.forward().flops();
    for (int stage = 0; stage < s.backward_stages; ++stage)
      total += s.work.backward(stage, false).flops();
  }
  return total * sub_batches;
}

TEST(ProgramWork, MatrixProductsAddUpToTheTransformersFlops) {
  comm::SelfCommunicator tp;
  for (const char* arch : {"gpt", "llama"}) {
    ModelConfig c;
    c.arch = model::parse_architecture(arch);
    c.layers = 3;
    c.hidden = 48;
    c.heads = 4;
    c.kv_heads = std::string(arch) == "llama" ? 2 : 0;
    c.ffn_hidden = 96;
    c.vocab_size = 80;
    c.seq_len = 16;
    c.validate();
    const Model model(c, options(tp, 4, 2));
    const double tokens = 4.0 * 16;
    EXPECT_NEAR(program_flops(model.program(), 2),
                training_flops(c, tokens, std::string(arch) == "llama" ? 2 : 1),
                1e-12 * training_flops(c, tokens, 1))
        << arch;
  }
}

TEST(ProgramWork, RecomputeAndTheZeroBubbleSplitCostTheirParts) {
  comm::SelfCommunicator tp;
  const ModelConfig c = small(1);
  const Model model(c, options(tp, 2, 1));
  for (const ops::SegmentShape& s : model.program().segments) {
    if (s.name.rfind("attention", 0) != 0) continue;
    const ops::SegmentWork& w = s.work;
    EXPECT_DOUBLE_EQ(w.recompute(ops::kCheckpoint | ops::kInternals | ops::kCore | ops::kOutput).flops(),
                     w.forward().flops());
    EXPECT_DOUBLE_EQ(w.recompute(ops::kCore).flops(), w.core.flops());
    EXPECT_GT(w.core.bytes, 0);
    EXPECT_DOUBLE_EQ(w.backward(0, true).flops() + w.backward_weight.flops(),
                     w.backward(0, false).flops());
    // The weight gradients cost what the input gradients of the same products do.
    EXPECT_DOUBLE_EQ(w.backward_weight.flops(), 2.0 * 2 * 8 * 32 * (3 * 32 + 32));
    EXPECT_GT(w.backward(1, false).bytes, 0);
    EXPECT_TRUE(w.backward(1, false).matmuls.empty());
  }
}

// Attention dropout adds the traffic of a dropout kernel on the [seq, seq] probabilities of
// every (row, head): forward reads them and writes the dropped ones and a one-byte mask;
// backward reads the gradient and the mask and writes. Nothing else changes.
TEST(ProgramWork, AttentionDropoutMovesTheProbabilitiesTwiceMore) {
  comm::SelfCommunicator tp;
  const ModelConfig c = small(1);
  ModelConfig dropped = c;
  dropped.attention_dropout = 0.1;
  const Model plain(c, options(tp, 2, 1)), with(dropped, options(tp, 2, 1));
  const double probabilities = 2.0 * 4 * 8 * 8;  // rows x heads x seq x seq
  const double e = sizeof(float);
  const double traffic = probabilities * (2 * e + 1);
  ASSERT_EQ(plain.program().segments.size(), with.program().segments.size());
  for (std::size_t i = 0; i < plain.program().segments.size(); ++i) {
    const ops::SegmentWork& a = plain.program().segments[i].work;
    const ops::SegmentWork& b = with.program().segments[i].work;
    const bool attention = plain.program().segments[i].name.rfind("attention", 0) == 0;
    EXPECT_DOUBLE_EQ(b.core.bytes - a.core.bytes, attention ? traffic : 0.0);
    if (plain.program().segments[i].backward_stages > 0) {
      EXPECT_DOUBLE_EQ(b.backward(0, false).bytes - a.backward(0, false).bytes,
                       attention ? traffic : 0.0);
    }
    EXPECT_DOUBLE_EQ(b.forward().flops(), a.forward().flops());
  }
}

// Every segment of a pipeline stage describes its work, the stage's boundary included.
TEST(ProgramWork, EverySegmentOfAPipelineStageDescribesItsWork) {
  comm::SelfCommunicator tp;
  const ModelConfig c = small(2);
  for (const ModelOptions& o : [&] {
         ModelOptions first = options(tp, 2, 1), last = options(tp, 2, 1);
         first.layer_ranges = {{0, 1}};
         last.layer_ranges = {{1, 2}};
         return std::vector<ModelOptions>{first, last};
       }()) {
    const Model model(c, o);
    for (const ops::SegmentShape& s : model.program().segments) {
      EXPECT_TRUE(s.work.known) << s.name;
      EXPECT_GT(s.work.forward().bytes + s.work.forward().flops(), 0.0) << s.name;
    }
  }
}

// One rank of a tensor-parallel pair (a group known by its shape alone) does half of every
// product: its heads, its columns and rows of the MLP, its block of the vocabulary. A plan
// with a layer at degree 1 puts reshards around it, which describe their work too.
TEST(ProgramWork, ARankOfATensorParallelGroupDoesItsShare) {
  comm::ShapeOnlyCommunicator tp(1, 2, "tp");
  ModelConfig c = small(2);
  c.vocab_size = 256;  // divides into the two vocabulary blocks without padding
  const Model whole(c, options(tp, 4, 1));
  const double tokens = 4.0 * 8;
  EXPECT_NEAR(program_flops(whole.program(), 1), training_flops(c, tokens, 1) / 2,
              1e-12 * training_flops(c, tokens, 1));
  ModelOptions planned = options(tp, 4, 1);
  planned.layer_degrees = {2, 1};
  // tp_subgroup(span, stride): the ranks r of the pair with this rank's r / span and r % stride.
  std::map<std::pair<int, int>, std::unique_ptr<comm::ShapeOnlyCommunicator>> subgroups;
  planned.tp_subgroup = [&](int span, int stride) -> comm::Communicator& {
    auto& group = subgroups[{span, stride}];
    if (!group) group = std::make_unique<comm::ShapeOnlyCommunicator>((1 % span) / stride, span / stride);
    return *group;
  };
  const Model mixed(c, planned);
  int reshards = 0;
  for (const ops::SegmentShape& s : mixed.program().segments) {
    EXPECT_TRUE(s.work.known) << s.name;
    reshards += s.name.rfind("reshard", 0) == 0;
  }
  EXPECT_EQ(reshards, 2);
}

// An MoE layer's experts multiply every slot of their buffers (the capacity bounds them): a
// token's share is capacity x experts / tokens of a dense FFN pass.
TEST(ProgramWork, MoeSegmentsPriceTheirExpertsOnTheCapacityRows) {
  comm::SelfCommunicator tp;
  ModelConfig c = testing::tiny_moe_model(2);
  c.heads = 4;
  c.moe_gate = ops::MoeGate::switch_top1;
  c.capacity_factor = 2.0;
  c.validate();
  const Model model(c, options(tp, 2, 1));
  bool found = false;
  for (const ops::SegmentShape& s : model.program().segments) {
    EXPECT_TRUE(s.work.known) << s.name;
    if (s.name != "experts.1") continue;
    found = true;
    // 2 sequences of 16 tokens in groups of 16: capacity ceil(2 x 1 x 16 / 4) = 8 per expert
    // and group, so each of 4 experts takes 2 x 8 rows through FC1 and FC2.
    const double rows = 4 * 2 * 8;
    EXPECT_DOUBLE_EQ(s.work.forward().flops(), 2 * (2 * rows * 32 * 64));
    EXPECT_DOUBLE_EQ(s.work.backward(0, false).flops(), 2 * s.work.forward().flops());
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace oases::model
