#include "model/incremental_decoder.h"

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/architecture.h"

#include <string>

namespace oases::model {
namespace {
// The decoder computes in its parameters' f32 or f64: no 16-bit products to route.
const kernels::Gemm16Paths kF32Paths{};
}  // namespace

namespace {

// Parameter values only: the decoder never runs a backward pass, so every ParamRef it builds
// has an empty gradient.
class ValueResolver final : public ParamResolver {
 public:
  ValueResolver(const ParamLayout& layout, const Tensor& params) : layout_(layout), params_(params) {}
  ops::ParamRef operator()(const std::string& name) const override {
    return {layout_.view(params_, layout_.find(name)), Tensor()};
  }
  bool has(const std::string& name) const override { return layout_.has(name); }

 private:
  const ParamLayout& layout_;
  const Tensor& params_;
};

// What the decoder computes is residual + (output projection + bias) after each block and
// nothing else: the epilogues of pre-norm architectures without dropout.
Tensor plain_residual_bias(const ops::ResidualEpilogue::Spec& spec, const std::string& where) {
  OASES_ASSERT(!spec.post_norm.present() && !spec.dropout_after_norm && !spec.copies_input,
               "incremental decoding supports pre-norm residual epilogues only ({})", where);
  return spec.bias.value;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const ModelConfig& config, const ParamLayout& layout,
                                       const Tensor& params)
    : config_(config), dtype_(params.dtype()), arena_(std::size_t{1} << 20) {
  OASES_CHECK(config.arch == ArchitectureKind::gpt || config.arch == ArchitectureKind::llama,
              "model.arch = \"{}\": cached incremental decoding needs a causal language model "
              "(\"gpt\" or \"llama\")",
              name(config.arch));
  OASES_CHECK(dtype_ == DType::f32 || dtype_ == DType::f64,
              "incremental decoding computes in fp32 or fp64, not {}", dtype_name(dtype_));
  const auto architecture = make_architecture(config);
  OASES_ASSERT(layout.tp_size() == 1 && layout.has(architecture->word_embedding_name()) &&
                   layout.groups().contains(static_cast<int>(config.layers)) &&
                   layout.groups().contains(static_cast<int>(config.layers + 1)),
               "the decoder needs a whole model's parameters on one rank");
  const ValueResolver resolver(layout, params);
  const std::int64_t C = config.hidden, seq = config.seq_len, hd = config.head_dim();
  const std::int64_t kv_heads = config.kv_head_count();

  embedding_ = architecture->embedding(resolver, {0, config.vocab_size});
  OASES_ASSERT(!embedding_.token_types.present(), "token types in a causal language model");
  OASES_ASSERT(
      plain_residual_bias(architecture->epilogue_into_layer(0, -1, resolver), "embedding").empty(),
      "a bias after the embedding");
  if (architecture->rotary()) {
    rope_cos_ = arena_.allocate(dtype_, {seq, hd / 2});
    rope_sin_ = arena_.allocate(dtype_, {seq, hd / 2});
    kernels::rotary_tables(seq, config.rope_inverse_frequencies(), rope_cos_, rope_sin_);
  }
  OASES_CHECK(!config.has_moe() || config.moe_gate != ops::MoeGate::expert_choice,
              "model.moe_gate = \"expert-choice\" cannot generate: each expert chooses its "
              "tokens among the whole group (model.moe_group_size tokens), so a token's routing "
              "depends on the tokens after it, which do not exist yet when it is generated; "
              "generation needs a token-choice gate (\"switch\", \"gshard\", \"noisy-topk\")");
  ops::Placement whole;  // degree 1: this rank holds every head and column
  whole.rows = 1;
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const BlockContext block{l, whole, nullptr, &resolver, rope_cos_, rope_sin_};
    Layer layer;
    layer.attention = architecture->attention(block);
    if (config.is_moe_layer(l)) {
      layer.moe = architecture->moe(block);
      moe_spec_settings(config, *layer.moe);
      layer.mlp.pre_norm = layer.moe->pre_norm;
      layer.mlp.activation = layer.moe->activation;
    } else {
      layer.mlp = architecture->mlp(block);
    }
    OASES_ASSERT(layer.attention.pre_norm.present() && layer.mlp.pre_norm.present(),
                 "incremental decoding supports pre-norm blocks only");
    layer.attention_bias = plain_residual_bias(
        architecture->epilogue_into_mlp(l, -1, resolver), "after attention " + std::to_string(l));
    layer.mlp_bias = plain_residual_bias(architecture->epilogue_into_layer(l + 1, -1, resolver),
                                         "after MLP " + std::to_string(l));
    layer.keys = arena_.allocate(dtype_, {kv_heads, seq, hd});
    layer.values = arena_.allocate(dtype_, {kv_heads, seq, hd});
    layers_.push_back(std::move(layer));
  }
  head_ = architecture->head(resolver);
  OASES_ASSERT(!head_.has_transform && head_.final_norm.present(),
               "incremental decoding supports a final norm and the vocabulary projection only");

  const ops::CoreAttention& attention = layers_.front().attention.attention;
  ops::MlpActivation activation = layers_.front().mlp.activation;
  for (const Layer& layer : layers_)
    if (!layer.moe) activation = layer.mlp.activation;
  residual_ = arena_.allocate(dtype_, {seq, C});
  normed_ = arena_.allocate(dtype_, {seq, C});
  stats_ = arena_.allocate(dtype_, {2 * seq});
  qkv_ = arena_.allocate(dtype_, {seq, attention.qkv_width()});
  attended_ = arena_.allocate(dtype_, {seq, attention.out_width()});
  projected_ = arena_.allocate(dtype_, {seq, C});
  mlp_in_ = arena_.allocate(dtype_, {seq, activation.input_width()});
  mlp_act_ = arena_.allocate(dtype_, {seq, activation.width()});
  if (config.has_moe()) {
    const ops::MlpActivation& expert = ops::MlpActivation(
        config.arch == ArchitectureKind::llama ? ops::Activation::swiglu : ops::Activation::gelu_tanh,
        config.expert_ffn_hidden());
    router_logits_ = arena_.allocate(dtype_, {1, config.experts});
    expert_in_ = arena_.allocate(dtype_, {1, expert.input_width()});
    expert_act_ = arena_.allocate(dtype_, {1, expert.width()});
    expert_out_ = arena_.allocate(dtype_, {1, C});
  }
}

void IncrementalDecoder::append(std::span<const std::int32_t> tokens, const Tensor& logits) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  OASES_ASSERT(n >= 1 && length_ + n <= capacity(), "appending {} positions to {} of {}", n,
               length_, capacity());
  OASES_ASSERT(logits.ndim() == 2 && logits.dim(0) >= 1 && logits.dim(0) <= n &&
                   logits.dim(1) == config_.vocab_size && logits.dtype() == dtype_,
               "logits {} of {} for {} appended positions", logits.shape().str(),
               dtype_name(logits.dtype()), n);
  for (const std::int32_t token : tokens)
    OASES_ASSERT(token >= 0 && token < config_.vocab_size, "token {} of vocabulary {}", token,
                 config_.vocab_size);
  const Tensor x = residual_.rows(0, n);
  // Learned positions (GPT): the rows of this window's absolute positions.
  const Tensor positions = embedding_.positions.present()
                               ? embedding_.positions.value.rows(length_, length_ + n)
                               : Tensor();
  kernels::embedding_forward(tokens.data(), embedding_.word.value, positions, x, 1, n,
                             embedding_.vocab);
  for (Layer& layer : layers_) {
    run_attention(layer, n);
    if (!layer.moe) run_mlp(layer, n);
    else if (dtype_ == DType::f64) run_moe<double>(layer, n);
    else run_moe<float>(layer, n);
  }
  const std::int64_t k = logits.dim(0);
  const Tensor features = normed_.rows(0, k);
  head_.final_norm.forward(x.rows(n - k, n), features, stats_.view(0, {2 * k}));
  kernels::linear_forward(features, head_.vocab_weight.value, kernels::WeightLayout::out_in,
                          head_.vocab_bias.value, logits);
  length_ += n;
}

void IncrementalDecoder::run_attention(Layer& layer, std::int64_t n) {
  const ops::AttentionSpec& spec = layer.attention;
  const ops::CoreAttention& core = spec.attention;
  const Tensor x = residual_.rows(0, n), normed = normed_.rows(0, n);
  spec.pre_norm.forward(x, normed, stats_.view(0, {2 * n}));
  const Tensor qkv = qkv_.rows(0, n);
  std::int64_t column = 0;
  for (const ops::ColumnParallelLinear& projection : spec.qkv) {
    projection.forward(normed, qkv.columns(column, column + projection.local_out()), kF32Paths);
    column += projection.local_out();
  }
  const kernels::AttentionShape& shape = core.shape();
  if (core.rotary())
    kernels::rotary_apply(qkv, 1, n, shape.heads + shape.kv_heads, shape.head_dim,
                          rope_cos_.rows(length_, length_ + n),
                          rope_sin_.rows(length_, length_ + n), false);
  const Tensor attended = attended_.rows(0, n), projected = projected_.rows(0, n);
  kernels::cached_attention_forward(qkv, layer.keys, layer.values, attended, length_);
  spec.out_proj.forward(attended, projected, kF32Paths);
  kernels::bias_dropout_add_forward(projected, layer.attention_bias, x, x, 1, n, 0.0, {}, {});
}

void IncrementalDecoder::run_mlp(const Layer& layer, std::int64_t n) {
  const ops::MlpSpec& spec = layer.mlp;
  const ops::MlpActivation& activation = spec.activation;
  const std::int64_t F = activation.width();
  const Tensor x = residual_.rows(0, n), normed = normed_.rows(0, n);
  spec.pre_norm.forward(x, normed, stats_.view(0, {2 * n}));
  const Tensor in = mlp_in_.rows(0, n), act = mlp_act_.rows(0, n);
  if (spec.up.size() == 1) {
    spec.up[0].forward(normed, in, kF32Paths);
  } else {
    spec.up[0].forward(normed, in.columns(0, F), kF32Paths);
    spec.up[1].forward(normed, in.columns(F, 2 * F), kF32Paths);
  }
  activation.forward(in, act);
  const Tensor projected = projected_.rows(0, n);
  spec.down.forward(act, projected, kF32Paths);
  kernels::bias_dropout_add_forward(projected, layer.mlp_bias, x, x, 1, n, 0.0, {}, {});
}

template <class T>
void IncrementalDecoder::run_moe(const Layer& layer, std::int64_t n) {
  const ops::MoeSpec& spec = *layer.moe;
  const ops::MlpActivation& activation = spec.activation;
  const std::int64_t F = activation.width(), C = config_.hidden;
  const Tensor x = residual_.rows(0, n), normed = normed_.rows(0, n);
  spec.pre_norm.forward(x, normed, stats_.view(0, {2 * n}));
  const Tensor projected = projected_.rows(0, n);
  kernels::zero(projected);
  const int experts = spec.router.experts;
  std::vector<int> slot_token(static_cast<std::size_t>(experts));
  std::vector<T> slot_weight(static_cast<std::size_t>(experts));
  ops::MoeRandom evaluation;
  evaluation.training = false;
  for (std::int64_t t = 0; t < n; ++t) {
    const Tensor row = normed.rows(t, t + 1);
    spec.router_linear.forward(row, router_logits_, kF32Paths);
    // A group of one token: capacity 1 holds each of its (distinct) experts.
    ops::moe_route<T>(spec.router, evaluation, 1, router_logits_.data<T>(), nullptr, 1,
                      slot_token.data(), slot_weight.data());
    T* out = projected.data<T>() + t * C;
    for (int e = 0; e < experts; ++e) {
      if (slot_token[static_cast<std::size_t>(e)] < 0) continue;
      const ops::ExpertSpec& expert = spec.experts[static_cast<std::size_t>(e)];
      if (expert.up.size() == 1) {
        expert.up[0].forward(row, expert_in_, kF32Paths);
      } else {
        expert.up[0].forward(row, expert_in_.columns(0, F), kF32Paths);
        expert.up[1].forward(row, expert_in_.columns(F, 2 * F), kF32Paths);
      }
      activation.forward(expert_in_, expert_act_);
      expert.down.forward(expert_act_, expert_out_, kF32Paths);
      const T w = slot_weight[static_cast<std::size_t>(e)];
      const T* y = expert_out_.data<T>();
      for (std::int64_t c = 0; c < C; ++c) out[c] += w * y[c];
    }
  }
  kernels::bias_dropout_add_forward(projected, Tensor(), x, x, 1, n, 0.0, {}, {});
}

}  // namespace oases::model
