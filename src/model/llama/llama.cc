#include "model/llama/llama.h"

#include <cmath>
#include <string>

namespace oases::model {
namespace {

std::string prefix(std::int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

class Llama final : public Architecture {
 public:
  explicit Llama(const ModelConfig& config) : c_(config) {}

  void add_embedding_parameters(ParamLayout& layout) const override {
    layout.add("model.embed_tokens.weight", {c_.vocab_size, c_.hidden}, ParamInit::normal,
               Sharding::rows, c_.padded_vocab(layout.tp_size()));
  }
  void add_layer_parameters(ParamLayout& layout, std::int64_t layer, int k) const override {
    const std::int64_t C = c_.hidden, F = c_.ffn_hidden;
    const std::int64_t A = c_.heads * c_.head_dim(), KV = c_.kv_head_count() * c_.head_dim();
    const std::string p = prefix(layer);
    layout.add(p + "input_layernorm.weight", {C}, ParamInit::ones);
    layout.add(p + "self_attn.q_proj.weight", {A, C}, ParamInit::normal, Sharding::rows, 0, k);
    layout.add(p + "self_attn.k_proj.weight", {KV, C}, ParamInit::normal, Sharding::rows, 0, k);
    layout.add(p + "self_attn.v_proj.weight", {KV, C}, ParamInit::normal, Sharding::rows, 0, k);
    layout.add(p + "self_attn.o_proj.weight", {C, A}, ParamInit::normal, Sharding::columns, 0, k);
    layout.add(p + "post_attention_layernorm.weight", {C}, ParamInit::ones);
    if (c_.is_moe_layer(layer)) return add_moe_parameters(layout, layer, p, k);
    layout.add(p + "mlp.gate_proj.weight", {F, C}, ParamInit::normal, Sharding::rows, 0, k);
    layout.add(p + "mlp.up_proj.weight", {F, C}, ParamInit::normal, Sharding::rows, 0, k);
    layout.add(p + "mlp.down_proj.weight", {C, F}, ParamInit::normal, Sharding::columns, 0, k);
  }
  void add_head_parameters(ParamLayout& layout, bool with_embedding) const override {
    layout.add("model.norm.weight", {c_.hidden}, ParamInit::ones);
    if (!c_.tied_embeddings())
      layout.add("lm_head.weight", {c_.vocab_size, c_.hidden}, ParamInit::normal, Sharding::rows,
                 c_.padded_vocab(layout.tp_size()));
    else if (!with_embedding)
      add_embedding_parameters(layout);
  }
  bool rotary() const override { return true; }

  ops::EmbeddingSpec embedding(const ParamResolver& params, kernels::VocabRange vocab) const override {
    return {params("model.embed_tokens.weight"), {}, {}, vocab};
  }
  ops::ResidualEpilogue::Spec epilogue_into_layer(std::int64_t layer, int previous,
                                                  const ParamResolver&) const override {
    ops::ResidualEpilogue::Spec spec;
    if (layer == 0) {
      spec.site = {static_cast<std::uint32_t>(c_.layers), ops::kDropoutSiteEmbedding};
      return spec;
    }
    spec.site = {static_cast<std::uint32_t>(layer - 1), ops::kDropoutSiteMlp};
    spec.residual_segment = previous;
    return spec;
  }
  ops::ResidualEpilogue::Spec epilogue_into_mlp(std::int64_t layer, int attention,
                                                const ParamResolver&) const override {
    ops::ResidualEpilogue::Spec spec;
    spec.site = {static_cast<std::uint32_t>(layer), ops::kDropoutSiteAttention};
    spec.residual_segment = attention;
    return spec;
  }
  ops::AttentionSpec attention(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer) + "self_attn.";
    ops::AttentionSpec spec;
    spec.pre_norm = ops::Norm(ops::NormKind::rms, params(prefix(b.layer) + "input_layernorm.weight"),
                              {}, c_.norm_epsilon());
    for (const char* name : {"q_proj", "k_proj", "v_proj"})
      spec.qkv.emplace_back(params(p + name + ".weight"), ops::ParamRef{}, ops::WeightLayout::out_in);
    spec.attention = ops::CoreAttention({b.at.rows, c_.seq_len, c_.heads / b.at.degree,
                                         c_.kv_head_count() / b.at.degree, c_.head_dim(), true},
                                        b.rope_cos, b.rope_sin);
    spec.out_proj = ops::RowParallelLinear(params(p + "o_proj.weight"), ops::WeightLayout::out_in);
    return spec;
  }
  ops::MlpSpec mlp(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer);
    ops::MlpSpec spec;
    spec.pre_norm = ops::Norm(ops::NormKind::rms, params(p + "post_attention_layernorm.weight"), {},
                              c_.norm_epsilon());
    for (const char* name : {"mlp.gate_proj.weight", "mlp.up_proj.weight"})
      spec.up.emplace_back(params(p + name), ops::ParamRef{}, ops::WeightLayout::out_in);
    spec.activation = ops::MlpActivation(ops::Activation::swiglu, c_.ffn_hidden / b.at.degree);
    spec.down = ops::RowParallelLinear(params(p + "mlp.down_proj.weight"), ops::WeightLayout::out_in);
    return spec;
  }
  ops::MoeSpec moe(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer);
    ops::MoeSpec spec;
    spec.pre_norm = ops::Norm(ops::NormKind::rms, params(p + "post_attention_layernorm.weight"), {},
                              c_.norm_epsilon());
    spec.router_linear = ops::ColumnParallelLinear(params(p + "mlp.router.weight"), {},
                                                   ops::WeightLayout::out_in);
    if (params.has(p + "mlp.router.noise_weight"))
      spec.noise_linear = ops::ColumnParallelLinear(params(p + "mlp.router.noise_weight"), {},
                                                    ops::WeightLayout::out_in);
    for (std::int64_t j = 0; j < c_.experts; ++j) {  // this rank's experts
      const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
      if (!params.has(e + (c_.arch == ArchitectureKind::llama ? "down_proj.weight" : "c_proj.weight"))) continue;
      ops::ExpertSpec expert;
      for (const char* name : {"gate_proj.weight", "up_proj.weight"})
        expert.up.emplace_back(params(e + name), ops::ParamRef{}, ops::WeightLayout::out_in);
      expert.down = ops::ColumnParallelLinear(params(e + "down_proj.weight"), {},
                                              ops::WeightLayout::out_in);
      spec.experts.push_back(std::move(expert));
    }
    spec.activation = ops::MlpActivation(ops::Activation::swiglu, c_.expert_ffn_hidden() / b.at.degree);
    return spec;
  }
  ops::HeadSpec head(const ParamResolver& params) const override {
    ops::HeadSpec spec;
    spec.final_norm = ops::Norm(ops::NormKind::rms, params("model.norm.weight"), {}, c_.norm_epsilon());
    spec.vocab_weight =
        params(c_.tied_embeddings() ? "model.embed_tokens.weight" : "lm_head.weight");
    return spec;
  }
  std::string word_embedding_name() const override { return "model.embed_tokens.weight"; }

 private:
  // Router (noise weights start at zero, as Shazeer et al.'s) and every expert's SwiGLU FFN.
  // Normal initialisations scaled by sqrt(model.moe_init_scale).
  void add_moe_parameters(ParamLayout& layout, std::int64_t layer, const std::string& p,
                          int k) const {
    const std::int64_t C = c_.hidden, F = c_.expert_ffn_hidden(), E = c_.experts;
    const double scale = std::sqrt(c_.moe_init_scale);
    layout.add(p + "mlp.router.weight", {E, C}, ParamInit::normal);
    layout.scale_last_init(scale);
    if (c_.moe_gate == ops::MoeGate::noisy_top_k && c_.moe_router_noise > 0)
      layout.add(p + "mlp.router.noise_weight", {E, C}, ParamInit::zeros);
    // This rank's experts, in a group of their own.
    layout.begin_group(expert_group_of(c_.layers, layer));
    const std::int64_t local = E / layout.ep_size();
    for (std::int64_t j = layout.ep_rank() * local; j < (layout.ep_rank() + 1) * local; ++j) {
      const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
      for (const char* name : {"gate_proj.weight", "up_proj.weight"}) {
        layout.add(e + name, {F, C}, ParamInit::normal, Sharding::rows, 0, k);
        layout.scale_last_init(scale);
      }
      layout.add(e + "down_proj.weight", {C, F}, ParamInit::normal, Sharding::columns, 0, k);
      layout.scale_last_init(scale);
    }
  }

  ModelConfig c_;
};

}  // namespace

std::unique_ptr<Architecture> make_llama(const ModelConfig& config) {
  return std::make_unique<Llama>(config);
}

}  // namespace oases::model
