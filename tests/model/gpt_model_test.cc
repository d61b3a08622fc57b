#include "comm/communicator.h"
#include "model/gpt_model.h"
#include "model/param_layout.h"
#include "schedule/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace oases::model {
namespace {

GptConfig small() {
  GptConfig c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.ffn_hidden = 64;
  c.vocab_size = 101;
  c.seq_len = 12;
  return c;
}

TEST(ParamLayout, FollowsHuggingFaceGpt2NamesAndShapes) {
  const ParamLayout layout = gpt_param_layout(small());
  EXPECT_EQ(layout.find("wte.weight").shape, Shape({101, 32}));
  EXPECT_EQ(layout.find("wpe.weight").shape, Shape({12, 32}));
  EXPECT_EQ(layout.find("h.1.attn.c_attn.weight").shape, Shape({32, 96}));
  EXPECT_EQ(layout.find("h.1.attn.c_attn.bias").shape, Shape({96}));
  EXPECT_EQ(layout.find("h.0.attn.c_proj.weight").shape, Shape({32, 32}));
  EXPECT_EQ(layout.find("h.0.mlp.c_fc.weight").shape, Shape({32, 64}));
  EXPECT_EQ(layout.find("h.0.mlp.c_proj.weight").shape, Shape({64, 32}));
  EXPECT_EQ(layout.find("ln_f.bias").shape, Shape({32}));
  EXPECT_EQ(layout.params().size(), 2u + 2u * 12u + 2u);
  std::int64_t total = 0;
  for (const auto& p : layout.params()) {
    EXPECT_EQ(p.weight_decay, p.shape.ndim() >= 2) << p.name;
    EXPECT_EQ(p.offset % 16, 0) << p.name;
    total += p.numel();
  }
  EXPECT_EQ(total, small().parameter_count());
}

TEST(Initialization, IsAPureFunctionOfSeedNameAndIndex) {
  const GptConfig c = small();
  const ParamLayout layout = gpt_param_layout(c);
  std::vector<float> a(static_cast<std::size_t>(layout.total_numel())), b(a.size()), d(a.size());
  initialize_parameters(layout, c, 5, a.data());
  initialize_parameters(layout, c, 5, b.data());
  initialize_parameters(layout, c, 6, d.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  // A deeper model draws the same values for the parameters both models have (same name).
  GptConfig deeper = c;
  deeper.layers = 3;
  const ParamLayout deep_layout = gpt_param_layout(deeper);
  std::vector<float> e(static_cast<std::size_t>(deep_layout.total_numel()));
  initialize_parameters(deep_layout, deeper, 5, e.data());
  const auto& w = layout.find("h.1.attn.c_attn.weight");
  const auto& w_deep = deep_layout.find("h.1.attn.c_attn.weight");
  for (std::int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(a[w.offset + i], e[w_deep.offset + i]);
}

TEST(Initialization, FollowsGpt2Statistics) {
  GptConfig c = small();
  c.hidden = 256;
  c.heads = 4;
  c.ffn_hidden = 1024;
  const ParamLayout layout = gpt_param_layout(c);
  std::vector<float> p(static_cast<std::size_t>(layout.total_numel()));
  initialize_parameters(layout, c, 1, p.data());
  auto stddev = [&](const std::string& name) {
    const auto& s = layout.find(name);
    double sum = 0, sq = 0;
    for (std::int64_t i = 0; i < s.numel(); ++i) {
      sum += p[s.offset + i];
      sq += p[s.offset + i] * p[s.offset + i];
    }
    const double n = static_cast<double>(s.numel());
    return std::sqrt(sq / n - (sum / n) * (sum / n));
  };
  EXPECT_NEAR(stddev("h.0.mlp.c_fc.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.0.mlp.c_proj.weight"), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_EQ(p[layout.find("h.1.ln_2.weight").offset], 1.0f);
  EXPECT_EQ(p[layout.find("h.1.attn.c_attn.bias").offset], 0.0f);
}

TEST(GptModel, ProgramHasACollectiveAtEveryTensorParallelBoundary) {
  comm::SelfCommunicator tp;
  GptModel model(small(), 2, 1, tp);
  const ops::Program& shape = model.program();
  ASSERT_EQ(shape.segments.size(), 1u + 2u * 2u + 1u);
  EXPECT_TRUE(shape.segments[5].has_backward_collective);  // vocab-parallel LM head input grad
  EXPECT_EQ(shape.segments[5].backward_stages, 2);
  EXPECT_TRUE(shape.segments[0].has_forward_collective);   // vocab-parallel embedding
  for (std::size_t s = 1; s <= 4; ++s) {
    EXPECT_TRUE(shape.segments[s].has_forward_collective);  // row-parallel outputs
    EXPECT_TRUE(shape.segments[s].has_backward_collective); // column-parallel input grads
    EXPECT_EQ(shape.segments[s].backward_stages, 2);
  }
  // Gradient buckets partition the flat array; each is made ready by exactly one segment.
  const auto& buckets = model.grad_buckets();
  ASSERT_EQ(buckets.size(), 1u + 2u + 1u);
  EXPECT_EQ(buckets.front().first, 0);
  EXPECT_EQ(buckets.back().second, model.param_count());
  for (std::size_t b = 1; b < buckets.size(); ++b) EXPECT_EQ(buckets[b].first, buckets[b - 1].second);
  EXPECT_EQ(buckets[1].first, model.layout().find("h.0.ln_1.weight").offset);
  std::vector<int> ready;
  for (const auto& seg : shape.segments)
    if (seg.ready_bucket >= 0) ready.push_back(seg.ready_bucket);
  EXPECT_EQ(ready, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(model.segments()[1]->name(), "attention.0");
  EXPECT_EQ(model.segments()[4]->name(), "mlp.1");
  // Sets each segment keeps: the layer halves their checkpoint (r_l, h_l) and internals,
  // attention its core, the head its internals, the embedding nothing.
  EXPECT_EQ(shape.segments[0].sets, 0);
  EXPECT_EQ(shape.segments[1].sets, ops::kCheckpoint | ops::kInternals | ops::kCore);
  EXPECT_EQ(shape.segments[2].sets, ops::kCheckpoint | ops::kInternals);
  EXPECT_EQ(shape.segments[5].sets, ops::kInternals);
  EXPECT_EQ(shape.segments[3].layer, 1);
  EXPECT_EQ(shape.segments[4].layer, 1);
  // r_l is [micro_batch * seq, hidden] floats.
  EXPECT_EQ(shape.segments[1].checkpoint_bytes,
            static_cast<std::size_t>(2 * small().seq_len * small().hidden) * sizeof(float));
  schedule::ScheduleSpec spec;
  spec.micro_batches = 3;
  EXPECT_NO_THROW(schedule::verify_schedule(shape, spec, schedule::generate(shape, spec)));
}

// Every tensor-parallel degree draws, shard by shard, exactly the single-process parameters:
// gathering the shards of T ranks through global_index rebuilds the whole tensors.
// A plan may run layers at different degrees (the planner's per-layer choice): each layer's
// shards, one per rank group position r % k, still assemble the single-process parameters,
// and the replicas of a shard hold identical values.
TEST(Initialization, MixedLayerDegreesAssembleTheSingleProcessParameters) {
  GptConfig c = small();
  c.layers = 3;
  const ParamLayout whole = gpt_param_layout(c);
  std::vector<float> reference(static_cast<std::size_t>(whole.total_numel()));
  initialize_parameters(whole, c, 5, reference.data());
  for (const auto& [T, degrees] : std::vector<std::pair<int, std::vector<int>>>{
           {2, {1, 2, 1}}, {4, {4, 2, 1}}, {4, {1, 1, 4}}}) {
    std::vector<float> assembled(reference.size(), -1.0f);
    std::vector<int> holders(reference.size(), 0);
    for (int r = 0; r < T; ++r) {
      const ParamLayout shard = gpt_param_layout(c, r, T, degrees);
      std::vector<float> local(static_cast<std::size_t>(shard.total_numel()));
      initialize_parameters(shard, c, 5, local.data());
      for (const auto& p : shard.params()) {
        const auto& full = whole.find(p.name);
        if (p.name.rfind("h.", 0) == 0 && p.sharding != Sharding::replicated) {
          const int layer = std::stoi(p.name.substr(2));
          EXPECT_EQ(p.parts, degrees[static_cast<std::size_t>(layer)]) << p.name;
          EXPECT_EQ(p.part, r % p.parts) << p.name;
        }
        for (std::int64_t i = 0; i < p.numel(); ++i) {
          const std::int64_t g = shard.global_index(p, i);
          if (g < 0) continue;
          const auto at = static_cast<std::size_t>(full.offset + g);
          if (holders[at] > 0) {
            EXPECT_EQ(local[p.offset + i], assembled[at]) << p.name;
          }
          assembled[at] = local[p.offset + i];
          ++holders[at];
        }
      }
    }
    for (const auto& p : whole.params()) {
      const int expected_holders = [&] {
        if (p.name.rfind("h.", 0) != 0) return p.name == "wte.weight" ? 1 : T;
        const int k = degrees[static_cast<std::size_t>(std::stoi(p.name.substr(2)))];
        const bool sharded = p.name.find("c_attn") != std::string::npos ||
                             p.name.find("c_fc") != std::string::npos ||
                             p.name.find("proj.weight") != std::string::npos;
        return sharded ? T / k : T;
      }();
      for (std::int64_t i = 0; i < p.numel(); ++i) {
        ASSERT_EQ(assembled[p.offset + i], reference[p.offset + i]) << "T=" << T << " " << p.name;
        ASSERT_EQ(holders[p.offset + i], expected_holders) << "T=" << T << " " << p.name;
      }
    }
  }
}

TEST(Initialization, ShardsOfEveryDegreeAssembleTheSingleProcessParameters) {
  GptConfig c = small();  // vocab 101: padded for every degree > 1
  const ParamLayout whole = gpt_param_layout(c);
  std::vector<float> reference(static_cast<std::size_t>(whole.total_numel()));
  initialize_parameters(whole, c, 9, reference.data());
  for (int T : {2, 4}) {
    std::vector<float> assembled(reference.size(), -1.0f);
    for (int r = 0; r < T; ++r) {
      const ParamLayout shard = gpt_param_layout(c, r, T);
      std::vector<float> local(static_cast<std::size_t>(shard.total_numel()));
      initialize_parameters(shard, c, 9, local.data());
      for (const auto& p : shard.params()) {
        const auto& full = whole.find(p.name);
        EXPECT_EQ(p.full_shape, full.shape) << p.name;
        for (std::int64_t i = 0; i < p.numel(); ++i) {
          const std::int64_t g = shard.global_index(p, i);
          if (g < 0) {
            EXPECT_EQ(local[p.offset + i], 0.0f) << p.name << " padding";
            continue;
          }
          ASSERT_LT(g, full.numel()) << p.name;
          if (p.sharding == Sharding::replicated && r > 0) {
            EXPECT_EQ(local[p.offset + i], assembled[full.offset + g]);
          }
          assembled[full.offset + g] = local[p.offset + i];
        }
      }
    }
    for (const auto& p : whole.params())
      for (std::int64_t i = 0; i < p.numel(); ++i)
        ASSERT_EQ(assembled[p.offset + i], reference[p.offset + i]) << "T=" << T << " " << p.name << "[" << i << "]";
  }
}

TEST(ParamLayout, ShardShapesFollowMegatron) {
  const ParamLayout l = gpt_param_layout(small(), 1, 4);
  EXPECT_EQ(l.find("wte.weight").shape, Shape({26, 32}));   // 101 padded to 104, / 4
  EXPECT_EQ(l.find("h.0.attn.c_attn.weight").shape, Shape({32, 24}));
  EXPECT_EQ(l.find("h.0.attn.c_attn.bias").shape, Shape({24}));
  EXPECT_EQ(l.find("h.0.attn.c_proj.weight").shape, Shape({8, 32}));
  EXPECT_EQ(l.find("h.0.attn.c_proj.bias").shape, Shape({32}));
  EXPECT_EQ(l.find("h.0.mlp.c_fc.weight").shape, Shape({32, 16}));
  EXPECT_EQ(l.find("h.0.mlp.c_proj.weight").shape, Shape({16, 32}));
  EXPECT_EQ(l.find("h.0.ln_1.weight").shape, Shape({32}));
  // Rank 1 of 4 holds q columns 8..15, k columns 40..47, v columns 72..79.
  const auto& qkv = l.find("h.0.attn.c_attn.weight");
  EXPECT_EQ(l.global_index(qkv, 0), 8);
  EXPECT_EQ(l.global_index(qkv, 8), 40);
  EXPECT_EQ(l.global_index(qkv, 16), 72);
  EXPECT_EQ(l.global_index(qkv, 24), 96 + 8);
}

TEST(GptConfig, ValidationNamesTheKey) {
  GptConfig c = small();
  c.heads = 5;
  try {
    c.validate();
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.heads = 5 must divide model.hidden = 32"), std::string::npos);
  }
}

}  // namespace
}  // namespace oases::model
