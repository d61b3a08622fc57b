#include "model/model.h"
#include "comm/communicator.h"
#include "model/param_layout.h"
#include "schedule/schedule.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace oases::model {
namespace {

// The tiny GPT with 4 heads of 8, a vocabulary of 101 (prime: padded under every tensor-
// parallel degree) and sequences of 12.
ModelConfig small() {
  ModelConfig c = testing::tiny_model(2);
  c.heads = 4;
  c.vocab_size = 101;
  c.seq_len = 12;
  return c;
}

// Initial parameters of `layout` as floats.
std::vector<float> initial(const ParamLayout& layout, const ModelConfig& c, std::uint64_t seed) {
  std::vector<float> values(static_cast<std::size_t>(layout.total_numel()));
  initialize_parameters(layout, c.layers, seed,
                        Tensor::of(values.data(), {static_cast<std::int64_t>(values.size())}));
  return values;
}

TEST(ParamLayout, FollowsHuggingFaceGpt2NamesAndShapes) {
  const ParamLayout layout = model_param_layout(small());
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
  const ModelConfig c = small();
  const ParamLayout layout = model_param_layout(c);
  const std::vector<float> a = initial(layout, c, 5), b = initial(layout, c, 5),
                           d = initial(layout, c, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  // A deeper model draws the same values for the parameters both models have (same name).
  ModelConfig deeper = c;
  deeper.layers = 3;
  const ParamLayout deep_layout = model_param_layout(deeper);
  const std::vector<float> e = initial(deep_layout, deeper, 5);
  const auto& w = layout.find("h.1.attn.c_attn.weight");
  const auto& w_deep = deep_layout.find("h.1.attn.c_attn.weight");
  for (std::int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(a[w.offset + i], e[w_deep.offset + i]);
}

TEST(Initialization, FollowsGpt2Statistics) {
  ModelConfig c = small();
  c.hidden = 256;
  c.heads = 4;
  c.ffn_hidden = 1024;
  const ParamLayout layout = model_param_layout(c);
  const std::vector<float> p = initial(layout, c, 1);
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

ModelOptions options(comm::Communicator& tp, std::int64_t micro_batch, DType dtype = DType::f32) {
  ModelOptions o;
  o.dtype = dtype;
  o.micro_batch = micro_batch;
  o.seed = 1;
  o.tp = &tp;
  return o;
}

TEST(Model, ProgramHasACollectiveAtEveryTensorParallelBoundary) {
  comm::SelfCommunicator tp;
  Model model(small(), options(tp, 2));
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
  EXPECT_EQ(buckets.front().begin, 0);
  EXPECT_EQ(buckets.back().end, model.param_count());
  for (std::size_t b = 1; b < buckets.size(); ++b) EXPECT_EQ(buckets[b].begin, buckets[b - 1].end);
  EXPECT_EQ(buckets[1].begin, model.layout().find("h.0.ln_1.weight").offset);
  EXPECT_EQ(buckets[1].layer, 0);
  EXPECT_EQ(buckets[3].layer, -1);
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
  // r_l is [micro_batch * seq, hidden] elements.
  EXPECT_EQ(shape.segments[1].checkpoint_bytes,
            static_cast<std::size_t>(2 * small().seq_len * small().hidden) * sizeof(float));
  schedule::ScheduleSpec spec;
  spec.micro_batches = 3;
  EXPECT_NO_THROW(schedule::verify_schedule(shape, spec, schedule::generate(shape, spec)));
  // In fp64 every kept set doubles.
  Model wide(small(), options(tp, 2, DType::f64));
  EXPECT_EQ(wide.program().segments[1].checkpoint_bytes, 2 * shape.segments[1].checkpoint_bytes);
  EXPECT_EQ(wide.params().dtype(), DType::f64);
}

// Every tensor-parallel degree draws, shard by shard, exactly the single-process parameters:
// gathering the shards of T ranks through global_index rebuilds the whole tensors.
// A plan may run layers at different degrees (the planner's per-layer choice): each layer's
// shards, one per rank group position r % k, still assemble the single-process parameters,
// and the replicas of a shard hold identical values.
TEST(Initialization, MixedLayerDegreesAssembleTheSingleProcessParameters) {
  ModelConfig c = small();
  c.layers = 3;
  const ParamLayout whole = model_param_layout(c);
  const std::vector<float> reference = initial(whole, c, 5);
  for (const auto& [T, degrees] : std::vector<std::pair<int, std::vector<int>>>{
           {2, {1, 2, 1}}, {4, {4, 2, 1}}, {4, {1, 1, 4}}}) {
    std::vector<float> assembled(reference.size(), -1.0f);
    std::vector<int> holders(reference.size(), 0);
    for (int r = 0; r < T; ++r) {
      const ParamLayout shard = model_param_layout(c, r, T, degrees);
      const std::vector<float> local = initial(shard, c, 5);
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
  ModelConfig c = small();  // vocab 101: padded for every degree > 1
  const ParamLayout whole = model_param_layout(c);
  const std::vector<float> reference = initial(whole, c, 9);
  for (int T : {2, 4}) {
    std::vector<float> assembled(reference.size(), -1.0f);
    for (int r = 0; r < T; ++r) {
      const ParamLayout shard = model_param_layout(c, r, T);
      const std::vector<float> local = initial(shard, c, 9);
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
  const ParamLayout l = model_param_layout(small(), 1, 4);
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

// A group of `size` ranks that never communicates: enough to build a rank's model and read
// its program.
class ShapeOnlyGroup final : public comm::Communicator {
 public:
  ShapeOnlyGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "tp"; }
  std::unique_ptr<comm::Work> all_reduce_async(Tensor, comm::ReduceOp) override { return fail(); }
  std::unique_ptr<comm::Work> all_gather_async(Tensor, Tensor) override { return fail(); }
  std::unique_ptr<comm::Work> reduce_scatter_async(Tensor, Tensor, comm::ReduceOp) override {
    return fail();
  }
  std::unique_ptr<comm::Work> broadcast_async(Tensor, int) override { return fail(); }
  std::unique_ptr<comm::Work> send_async(Tensor, int, int) override { return fail(); }
  std::unique_ptr<comm::Work> recv_async(Tensor, int, int) override { return fail(); }
  std::unique_ptr<comm::Work> all_to_all_async(Tensor, Tensor) override { return fail(); }
  std::unique_ptr<comm::Work> all_to_allv_async(Tensor, std::vector<std::int64_t>, Tensor,
                                                std::vector<std::int64_t>) override {
    return fail();
  }
  std::unique_ptr<comm::Work> barrier_async() override { return fail(); }

 private:
  static std::unique_ptr<comm::Work> fail() {
    ADD_FAILURE() << "building a model must not communicate";
    return nullptr;
  }
  int rank_, size_;
};

TEST(Model, TensorParallelHeadRunsTheLossReductionsAsCollectivesOfTheProgram) {
  ShapeOnlyGroup tp(1, 2);
  Model model(small(), options(tp, 2));
  const ops::Program& program = model.program();
  ASSERT_EQ(program.segments.size(), 1u + 2u * 2u + 3u);
  const ops::SegmentShape& head = program.segments[5];
  const ops::SegmentShape& softmax = program.segments[6];
  const ops::SegmentShape& loss = program.segments[7];
  EXPECT_EQ(head.name, "head");
  EXPECT_TRUE(head.has_forward_collective);  // row maxima
  EXPECT_EQ(head.forward_reduce, ops::ReduceKind::max);
  EXPECT_EQ(head.forward_collective_elements, 2 * small().seq_len);
  EXPECT_TRUE(head.has_backward_collective);  // d(LN_f output)
  EXPECT_EQ(softmax.name, "head_softmax");
  EXPECT_TRUE(softmax.has_forward_collective);  // sums of exponentials and target logits
  EXPECT_EQ(softmax.forward_reduce, ops::ReduceKind::sum);
  EXPECT_EQ(softmax.forward_collective_elements, 2 * 2 * small().seq_len);
  EXPECT_EQ(loss.name, "head_loss");
  EXPECT_FALSE(loss.has_forward_collective);
  EXPECT_EQ(softmax.reads_sets_of, std::vector<int>{5});
  EXPECT_EQ(loss.reads_sets_of, std::vector<int>{5});
  // The head bucket (ln_f) is final after the head's own backward, which runs after the
  // softmax's and the loss's.
  EXPECT_EQ(head.ready_bucket, 3);
  EXPECT_EQ(loss.ready_bucket, -1);
  // The head keeps this rank's logits of the sub-batch: [2 * seq, 104 / 2] of them at least.
  EXPECT_GE(head.internals_bytes, static_cast<std::size_t>(2 * small().seq_len * 52) * sizeof(float));
  for (const bool training : {true, false}) {
    schedule::ScheduleSpec spec;
    spec.kind = schedule::ScheduleKind::oases;
    spec.recompute = schedule::Recompute::fine_grained;
    spec.sub_batches = 2;
    spec.micro_batches = 2;
    spec.training = training;
    Model split(small(), [&] {
      ModelOptions o = options(tp, 4);
      o.sub_batches = 2;
      return o;
    }());
    EXPECT_NO_THROW(schedule::verify_schedule(split.program(), spec,
                                              schedule::generate(split.program(), spec)));
  }
}

ModelConfig small_llama(std::int64_t kv_heads) {
  ModelConfig c = small();
  c.arch = model::ArchitectureKind::llama;
  c.kv_heads = kv_heads;
  return c;
}

TEST(ParamLayout, LlamaFollowsHuggingFaceNamesShapesAndShards) {
  const ModelConfig c = small_llama(2);  // 4 query heads of 8, 2 key/value heads
  const ParamLayout layout = model_param_layout(c);
  EXPECT_EQ(layout.find("model.embed_tokens.weight").shape, Shape({101, 32}));
  EXPECT_EQ(layout.find("model.layers.1.input_layernorm.weight").shape, Shape({32}));
  EXPECT_EQ(layout.find("model.layers.1.self_attn.q_proj.weight").shape, Shape({32, 32}));
  EXPECT_EQ(layout.find("model.layers.1.self_attn.k_proj.weight").shape, Shape({16, 32}));
  EXPECT_EQ(layout.find("model.layers.1.self_attn.v_proj.weight").shape, Shape({16, 32}));
  EXPECT_EQ(layout.find("model.layers.1.self_attn.o_proj.weight").shape, Shape({32, 32}));
  EXPECT_EQ(layout.find("model.layers.0.mlp.gate_proj.weight").shape, Shape({64, 32}));
  EXPECT_EQ(layout.find("model.layers.0.mlp.up_proj.weight").shape, Shape({64, 32}));
  EXPECT_EQ(layout.find("model.layers.0.mlp.down_proj.weight").shape, Shape({32, 64}));
  EXPECT_EQ(layout.find("model.norm.weight").shape, Shape({32}));
  EXPECT_EQ(layout.find("lm_head.weight").shape, Shape({101, 32}));  // untied by default
  EXPECT_FALSE(layout.has("model.layers.0.self_attn.q_proj.bias"));    // no biases anywhere
  std::int64_t total = 0;
  for (const auto& p : layout.params()) total += p.numel();
  EXPECT_EQ(total, c.parameter_count());
  // Tensor parallelism: q, k, v and gate/up by output rows, o and down by input columns.
  const ParamLayout shard = model_param_layout(c, 1, 2);
  EXPECT_EQ(shard.find("model.layers.0.self_attn.q_proj.weight").shape, Shape({16, 32}));
  EXPECT_EQ(shard.find("model.layers.0.self_attn.k_proj.weight").shape, Shape({8, 32}));
  EXPECT_EQ(shard.find("model.layers.0.self_attn.o_proj.weight").shape, Shape({32, 16}));
  EXPECT_EQ(shard.find("model.layers.0.mlp.up_proj.weight").shape, Shape({32, 32}));
  EXPECT_EQ(shard.find("model.layers.0.mlp.down_proj.weight").shape, Shape({32, 32}));
  EXPECT_EQ(shard.find("lm_head.weight").shape, Shape({51, 32}));  // 101 padded to 102
  // Tied: no lm_head; the head reads the embedding.
  ModelConfig tied = c;
  tied.tie_embeddings = true;
  EXPECT_FALSE(model_param_layout(tied).has("lm_head.weight"));
}

TEST(ModelConfig, KeyValueHeadsMustSplitAcrossTheGroup) {
  const ModelConfig c = small_llama(2);
  EXPECT_NO_THROW(c.validate_tensor_parallel(2));
  try {
    c.validate_tensor_parallel(4);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp = 4 must divide model.kv_heads = 2"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("valid tp for this model: 1, 2"), std::string::npos);
  }
  ModelConfig gpt = small();
  gpt.kv_heads = 2;
  EXPECT_THROW(gpt.validate(), UserError);  // grouped-query attention is a LLaMA setting
  ModelConfig odd = small_llama(3);
  EXPECT_THROW(odd.validate(), UserError);  // 3 does not divide 4 heads
}

TEST(ParamLayout, BertFollowsHuggingFaceNamesShapesAndShards) {
  ModelConfig c = small();
  c.arch = model::ArchitectureKind::bert;
  const ParamLayout layout = model_param_layout(c);
  EXPECT_EQ(layout.find("bert.embeddings.word_embeddings.weight").shape, Shape({101, 32}));
  EXPECT_EQ(layout.find("bert.embeddings.position_embeddings.weight").shape, Shape({12, 32}));
  EXPECT_EQ(layout.find("bert.embeddings.token_type_embeddings.weight").shape, Shape({2, 32}));
  EXPECT_EQ(layout.find("bert.embeddings.LayerNorm.bias").shape, Shape({32}));
  const std::string p = "bert.encoder.layer.1.";
  EXPECT_EQ(layout.find(p + "attention.self.query.weight").shape, Shape({32, 32}));
  EXPECT_EQ(layout.find(p + "attention.self.key.bias").shape, Shape({32}));
  EXPECT_EQ(layout.find(p + "attention.output.dense.weight").shape, Shape({32, 32}));
  EXPECT_EQ(layout.find(p + "attention.output.LayerNorm.weight").shape, Shape({32}));
  EXPECT_EQ(layout.find(p + "intermediate.dense.weight").shape, Shape({64, 32}));
  EXPECT_EQ(layout.find(p + "output.dense.weight").shape, Shape({32, 64}));
  EXPECT_EQ(layout.find("cls.predictions.transform.dense.weight").shape, Shape({32, 32}));
  EXPECT_EQ(layout.find("cls.predictions.bias").shape, Shape({101}));
  EXPECT_FALSE(layout.has("cls.predictions.decoder.weight"));  // tied to the word embeddings
  std::int64_t total = 0;
  for (const auto& q : layout.params()) total += q.numel();
  EXPECT_EQ(total, c.parameter_count());
  const ParamLayout shard = model_param_layout(c, 0, 2);
  EXPECT_EQ(shard.find(p + "attention.self.value.weight").shape, Shape({16, 32}));
  EXPECT_EQ(shard.find(p + "attention.self.value.bias").shape, Shape({16}));
  EXPECT_EQ(shard.find(p + "intermediate.dense.bias").shape, Shape({32}));
  EXPECT_EQ(shard.find(p + "output.dense.weight").shape, Shape({32, 32}));
  EXPECT_EQ(shard.find("cls.predictions.bias").shape, Shape({51}));
  EXPECT_EQ(shard.find("cls.predictions.transform.dense.weight").shape, Shape({32, 32}));
  // The vocabulary bias's padding element (token 101 of 102) is not a real token.
  const ParamLayout second = model_param_layout(c, 1, 2);
  const auto& bias = second.find("cls.predictions.bias");
  EXPECT_EQ(second.global_index(bias, 49), 100);
  EXPECT_EQ(second.global_index(bias, 50), -1);
}

TEST(Model, EveryArchitectureBuildsAVerifiedProgramAtEveryDegree) {
  for (const std::string arch : {"gpt", "llama", "bert"}) {
    for (const int T : {1, 2, 4}) {
      ModelConfig c = small();
      c.arch = model::parse_architecture(arch);
      if (arch == "llama") c.kv_heads = 2;
      if (T > c.kv_head_count()) continue;
      ShapeOnlyGroup tp(T - 1, T);
      Model model(c, options(tp, 4));
      schedule::ScheduleSpec spec;
      spec.micro_batches = 2;
      EXPECT_NO_THROW(schedule::verify_schedule(model.program(), spec,
                                                schedule::generate(model.program(), spec)))
          << arch << " T=" << T;
      EXPECT_EQ(model.program().segments.size(), static_cast<std::size_t>(1 + 2 * c.layers + (T > 1 ? 3 : 1)))
          << arch;
    }
  }
}

TEST(ModelConfig, ValidationNamesTheKey) {
  ModelConfig c = small();
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
