#include "model/gpt/gpt.h"

#include <cmath>
#include <string>

namespace oases::model {
namespace {

std::string prefix(std::int64_t layer) { return "h." + std::to_string(layer) + "."; }

class Gpt final : public Architecture {
 public:
  explicit Gpt(const ModelConfig& config) : c_(config) {}

  void add_embedding_parameters(ParamLayout& layout) const override {
    add_word_embedding(layout);
    layout.add("wpe.weight", {c_.position_count(), c_.hidden}, ParamInit::normal);
  }
  void add_layer_parameters(ParamLayout& layout, std::int64_t layer, int k) const override {
    const std::int64_t C = c_.hidden, F = c_.ffn_hidden;
    const std::string p = prefix(layer);
    layout.add(p + "ln_1.weight", {C}, ParamInit::ones);
    layout.add(p + "ln_1.bias", {C}, ParamInit::zeros);
    layout.add(p + "attn.c_attn.weight", {C, 3 * C}, ParamInit::normal, Sharding::qkv_columns, 0, k);
    layout.add(p + "attn.c_attn.bias", {3 * C}, ParamInit::zeros, Sharding::qkv_columns, 0, k);
    layout.add(p + "attn.c_proj.weight", {C, C}, ParamInit::normal_residual, Sharding::rows, 0, k);
    layout.add(p + "attn.c_proj.bias", {C}, ParamInit::zeros);
    layout.add(p + "ln_2.weight", {C}, ParamInit::ones);
    layout.add(p + "ln_2.bias", {C}, ParamInit::zeros);
    if (c_.is_moe_layer(layer)) return add_moe_parameters(layout, layer, p, k);
    layout.add(p + "mlp.c_fc.weight", {C, F}, ParamInit::normal, Sharding::columns, 0, k);
    layout.add(p + "mlp.c_fc.bias", {F}, ParamInit::zeros, Sharding::columns, 0, k);
    layout.add(p + "mlp.c_proj.weight", {F, C}, ParamInit::normal_residual, Sharding::rows, 0, k);
    layout.add(p + "mlp.c_proj.bias", {C}, ParamInit::zeros);
  }
  void add_head_parameters(ParamLayout& layout, bool with_embedding) const override {
    layout.add("ln_f.weight", {c_.hidden}, ParamInit::ones);
    layout.add("ln_f.bias", {c_.hidden}, ParamInit::zeros);
    if (!with_embedding) add_word_embedding(layout);
  }

  ops::EmbeddingSpec embedding(const ParamResolver& params, kernels::VocabRange vocab) const override {
    return {params("wte.weight"), params("wpe.weight"), {}, vocab};
  }
  ops::ResidualEpilogue::Spec epilogue_into_layer(std::int64_t layer, int previous,
                                                  const ParamResolver& params) const override {
    ops::ResidualEpilogue::Spec spec;
    if (layer == 0) {  // r_0 = dropout(E)
      spec.site = {static_cast<std::uint32_t>(c_.layers), ops::kDropoutSiteEmbedding};
      return spec;
    }
    // An MoE layer's experts add their own biases before the combine.
    if (!c_.is_moe_layer(layer - 1)) spec.bias = params(prefix(layer - 1) + "mlp.c_proj.bias");
    spec.site = {static_cast<std::uint32_t>(layer - 1), ops::kDropoutSiteMlp};
    spec.residual_segment = previous;
    return spec;
  }
  ops::ResidualEpilogue::Spec epilogue_into_mlp(std::int64_t layer, int attention,
                                                const ParamResolver& params) const override {
    ops::ResidualEpilogue::Spec spec;
    spec.bias = params(prefix(layer) + "attn.c_proj.bias");
    spec.site = {static_cast<std::uint32_t>(layer), ops::kDropoutSiteAttention};
    spec.residual_segment = attention;
    return spec;
  }
  ops::AttentionSpec attention(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer);
    const std::int64_t heads = c_.heads / b.at.degree;
    ops::AttentionSpec spec;
    spec.pre_norm = ops::Norm(ops::NormKind::layer, params(p + "ln_1.weight"),
                              params(p + "ln_1.bias"), c_.norm_epsilon());
    const ops::ParamRef bias = params(p + "attn.c_attn.bias");
    spec.qkv = {ops::ColumnParallelLinear(params(p + "attn.c_attn.weight"), bias,
                                          ops::WeightLayout::in_out)};
    spec.attention = ops::CoreAttention({b.at.rows, c_.seq_len, heads, heads, c_.head_dim(), true},
                                        {}, {});
    spec.out_proj = ops::RowParallelLinear(params(p + "attn.c_proj.weight"), ops::WeightLayout::in_out);
    const std::int64_t local = heads * c_.head_dim();
    // [q_r | k_r | v_r]; no gradient where the parameters are only read (inference).
    if (!bias.grad.empty()) spec.key_bias_grad = bias.grad.view(local, {local});
    return spec;
  }
  ops::MlpSpec mlp(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer);
    ops::MlpSpec spec;
    spec.pre_norm = ops::Norm(ops::NormKind::layer, params(p + "ln_2.weight"),
                              params(p + "ln_2.bias"), c_.norm_epsilon());
    spec.up = {ops::ColumnParallelLinear(params(p + "mlp.c_fc.weight"), params(p + "mlp.c_fc.bias"),
                                         ops::WeightLayout::in_out)};
    spec.activation = ops::MlpActivation(ops::Activation::gelu_tanh, c_.ffn_hidden / b.at.degree);
    spec.down = ops::RowParallelLinear(params(p + "mlp.c_proj.weight"), ops::WeightLayout::in_out);
    return spec;
  }
  ops::MoeSpec moe(const BlockContext& b) const override {
    const ParamResolver& params = *b.params;
    const std::string p = prefix(b.layer);
    ops::MoeSpec spec;
    spec.pre_norm = ops::Norm(ops::NormKind::layer, params(p + "ln_2.weight"),
                              params(p + "ln_2.bias"), c_.norm_epsilon());
    spec.router_linear = ops::ColumnParallelLinear(params(p + "mlp.router.weight"), {},
                                                   ops::WeightLayout::in_out);
    if (params.has(p + "mlp.router.noise_weight"))
      spec.noise_linear = ops::ColumnParallelLinear(params(p + "mlp.router.noise_weight"), {},
                                                    ops::WeightLayout::in_out);
    for (std::int64_t j = 0; j < c_.experts; ++j) {  // this rank's experts
      const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
      if (!params.has(e + (c_.arch == ArchitectureKind::llama ? "down_proj.weight" : "c_proj.weight"))) continue;
      ops::ExpertSpec expert;
      expert.up = {ops::ColumnParallelLinear(params(e + "c_fc.weight"), params(e + "c_fc.bias"),
                                             ops::WeightLayout::in_out)};
      expert.down = ops::ColumnParallelLinear(params(e + "c_proj.weight"), params(e + "c_proj.bias"),
                                              ops::WeightLayout::in_out);
      spec.experts.push_back(std::move(expert));
    }
    spec.activation = ops::MlpActivation(ops::Activation::gelu_tanh, c_.expert_ffn_hidden() / b.at.degree);
    return spec;
  }
  ops::HeadSpec head(const ParamResolver& params) const override {
    ops::HeadSpec spec;
    spec.final_norm = ops::Norm(ops::NormKind::layer, params("ln_f.weight"), params("ln_f.bias"),
                                c_.norm_epsilon());
    spec.vocab_weight = params("wte.weight");
    return spec;
  }
  std::string word_embedding_name() const override { return "wte.weight"; }

 private:
  // Router (and noise weights: Shazeer et al. start them at zero) and every expert's FFN, laid
  // out as GPT-2's MLP. Normal initialisations scaled by sqrt(model.moe_init_scale).
  void add_moe_parameters(ParamLayout& layout, std::int64_t layer, const std::string& p,
                          int k) const {
    const std::int64_t C = c_.hidden, F = c_.expert_ffn_hidden(), E = c_.experts;
    const double scale = std::sqrt(c_.moe_init_scale);
    layout.add(p + "mlp.router.weight", {C, E}, ParamInit::normal);
    layout.scale_last_init(scale);
    if (c_.moe_gate == ops::MoeGate::noisy_top_k && c_.moe_router_noise > 0)
      layout.add(p + "mlp.router.noise_weight", {C, E}, ParamInit::zeros);
    // This rank's experts, in a group of their own.
    layout.begin_group(expert_group_of(c_.layers, layer));
    const std::int64_t local = E / layout.ep_size();
    for (std::int64_t j = layout.ep_rank() * local; j < (layout.ep_rank() + 1) * local; ++j) {
      const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
      layout.add(e + "c_fc.weight", {C, F}, ParamInit::normal, Sharding::columns, 0, k);
      layout.scale_last_init(scale);
      layout.add(e + "c_fc.bias", {F}, ParamInit::zeros, Sharding::columns, 0, k);
      layout.add(e + "c_proj.weight", {F, C}, ParamInit::normal_residual, Sharding::rows, 0, k);
      layout.scale_last_init(scale);
      layout.add(e + "c_proj.bias", {C}, ParamInit::zeros);
    }
  }
  void add_word_embedding(ParamLayout& layout) const {
    layout.add("wte.weight", {c_.vocab_size, c_.hidden}, ParamInit::normal, Sharding::rows,
               c_.padded_vocab(layout.tp_size()));
  }

  ModelConfig c_;
};

}  // namespace

std::unique_ptr<Architecture> make_gpt(const ModelConfig& config) {
  return std::make_unique<Gpt>(config);
}

}  // namespace oases::model
