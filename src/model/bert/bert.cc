#include "model/bert/bert.h"

#include <string>

namespace oases::model {
namespace {

constexpr std::int64_t kTokenTypes = 2;

std::string prefix(std::int64_t layer) {
  return "bert.encoder.layer." + std::to_string(layer) + ".";
}

class Bert final : public Architecture {
 public:
  explicit Bert(const ModelConfig& config) : c_(config) {}

  void add_embedding_parameters(ParamLayout& layout) const override {
    const std::int64_t C = c_.hidden;
    add_word_embedding(layout);
    layout.add("bert.embeddings.position_embeddings.weight", {c_.position_count(), C},
               ParamInit::normal);
    layout.add("bert.embeddings.token_type_embeddings.weight", {kTokenTypes, C}, ParamInit::normal);
    layout.add("bert.embeddings.LayerNorm.weight", {C}, ParamInit::ones);
    layout.add("bert.embeddings.LayerNorm.bias", {C}, ParamInit::zeros);
  }
  void add_layer_parameters(ParamLayout& layout, std::int64_t layer, int k) const override {
    const std::int64_t C = c_.hidden, F = c_.ffn_hidden;
    const std::string p = prefix(layer);
    for (const char* name : {"query", "key", "value"}) {
      const std::string q = p + "attention.self." + name;
      layout.add(q + ".weight", {C, C}, ParamInit::normal, Sharding::rows, 0, k);
      layout.add(q + ".bias", {C}, ParamInit::zeros, Sharding::rows, 0, k);
    }
    layout.add(p + "attention.output.dense.weight", {C, C}, ParamInit::normal, Sharding::columns, 0, k);
    layout.add(p + "attention.output.dense.bias", {C}, ParamInit::zeros);
    layout.add(p + "attention.output.LayerNorm.weight", {C}, ParamInit::ones);
    layout.add(p + "attention.output.LayerNorm.bias", {C}, ParamInit::zeros);
    layout.add(p + "intermediate.dense.weight", {F, C}, ParamInit::normal, Sharding::rows, 0, k);
    layout.add(p + "intermediate.dense.bias", {F}, ParamInit::zeros, Sharding::rows, 0, k);
    layout.add(p + "output.dense.weight", {C, F}, ParamInit::normal, Sharding::columns, 0, k);
    layout.add(p + "output.dense.bias", {C}, ParamInit::zeros);
    layout.add(p + "output.LayerNorm.weight", {C}, ParamInit::ones);
    layout.add(p + "output.LayerNorm.bias", {C}, ParamInit::zeros);
  }
  void add_head_parameters(ParamLayout& layout, bool with_embedding) const override {
    const std::int64_t C = c_.hidden;
    layout.add("cls.predictions.transform.dense.weight", {C, C}, ParamInit::normal);
    layout.add("cls.predictions.transform.dense.bias", {C}, ParamInit::zeros);
    layout.add("cls.predictions.transform.LayerNorm.weight", {C}, ParamInit::ones);
    layout.add("cls.predictions.transform.LayerNorm.bias", {C}, ParamInit::zeros);
    layout.add("cls.predictions.bias", {c_.vocab_size}, ParamInit::zeros, Sharding::rows,
               c_.padded_vocab(layout.tp_size()));
    if (!with_embedding) add_word_embedding(layout);
  }

  ops::EmbeddingSpec embedding(const ParamResolver& params, kernels::VocabRange vocab) const override {
    return {params("bert.embeddings.word_embeddings.weight"),
            params("bert.embeddings.position_embeddings.weight"),
            params("bert.embeddings.token_type_embeddings.weight"), vocab};
  }
  ops::ResidualEpilogue::Spec epilogue_into_layer(std::int64_t layer, int previous,
                                                  const ParamResolver& params) const override {
    ops::ResidualEpilogue::Spec spec;
    if (layer == 0) {  // LayerNorm(embeddings), then dropout
      spec.dropout = false;
      spec.post_norm = layer_norm(params, "bert.embeddings.LayerNorm");
      spec.dropout_after_norm = true;
      spec.site = {static_cast<std::uint32_t>(c_.layers), ops::kDropoutSiteEmbedding};
      return spec;
    }
    const std::string p = prefix(layer - 1);
    spec.bias = params(p + "output.dense.bias");
    spec.site = {static_cast<std::uint32_t>(layer - 1), ops::kDropoutSiteMlp};
    spec.residual_segment = previous;
    spec.post_norm = layer_norm(params, p + "output.LayerNorm");
    return spec;
  }
  ops::ResidualEpilogue::Spec epilogue_into_mlp(std::int64_t layer, int attention,
                                                const ParamResolver& params) const override {
    const std::string p = prefix(layer) + "attention.output.";
    ops::ResidualEpilogue::Spec spec;
    spec.bias = params(p + "dense.bias");
    spec.site = {static_cast<std::uint32_t>(layer), ops::kDropoutSiteAttention};
    spec.residual_segment = attention;
    spec.post_norm = layer_norm(params, p + "LayerNorm");
    return spec;
  }
  ops::AttentionSpec attention(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer) + "attention.";
    const std::int64_t heads = c_.heads / b.at.degree;
    ops::AttentionSpec spec;
    for (const char* name : {"query", "key", "value"}) {
      const std::string q = p + "self." + name;
      spec.qkv.emplace_back(params(q + ".weight"), params(q + ".bias"), ops::WeightLayout::out_in);
    }
    spec.attention = ops::CoreAttention({b.at.rows, c_.seq_len, heads, heads, c_.head_dim(), false},
                                        {}, {});
    spec.out_proj = ops::RowParallelLinear(params(p + "output.dense.weight"), ops::WeightLayout::out_in);
    spec.key_bias_grad = params(p + "self.key.bias").grad;
    return spec;
  }
  ops::MlpSpec mlp(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer);
    ops::MlpSpec spec;
    spec.up = {ops::ColumnParallelLinear(params(p + "intermediate.dense.weight"),
                                         params(p + "intermediate.dense.bias"),
                                         ops::WeightLayout::out_in)};
    spec.activation = ops::MlpActivation(ops::Activation::gelu_erf, c_.ffn_hidden / b.at.degree);
    spec.down = ops::RowParallelLinear(params(p + "output.dense.weight"), ops::WeightLayout::out_in);
    return spec;
  }
  ops::HeadSpec head(const ParamResolver& params) const override {
    const std::string p = "cls.predictions.";
    ops::HeadSpec spec;
    spec.transform = ops::ColumnParallelLinear(params(p + "transform.dense.weight"),
                                               params(p + "transform.dense.bias"),
                                               ops::WeightLayout::out_in);
    spec.has_transform = true;
    spec.transform_norm = layer_norm(params, p + "transform.LayerNorm");
    spec.vocab_weight = params("bert.embeddings.word_embeddings.weight");
    spec.vocab_bias = params(p + "bias");
    return spec;
  }
  std::string word_embedding_name() const override {
    return "bert.embeddings.word_embeddings.weight";
  }

 private:
  void add_word_embedding(ParamLayout& layout) const {
    layout.add("bert.embeddings.word_embeddings.weight", {c_.vocab_size, c_.hidden},
               ParamInit::normal, Sharding::rows, c_.padded_vocab(layout.tp_size()));
  }
  ops::Norm layer_norm(const ParamResolver& params, const std::string& name) const {
    return ops::Norm(ops::NormKind::layer, params(name + ".weight"), params(name + ".bias"),
                     c_.norm_epsilon());
  }

  ModelConfig c_;
};

}  // namespace

std::unique_ptr<Architecture> make_bert(const ModelConfig& config) {
  return std::make_unique<Bert>(config);
}

}  // namespace oases::model
