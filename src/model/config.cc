#include "model/config.h"

#include "core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace oases::model {

std::string_view name(ArchitectureKind arch) { return value_name<ArchitectureKind>(kArchitectureNames, arch); }

ArchitectureKind parse_architecture(std::string_view text) {
  return parse_named_value<ArchitectureKind>(kArchitectureNames, text, "model.arch");
}

bool ModelConfig::tied_embeddings() const {
  return tie_embeddings.value_or(arch != ArchitectureKind::llama);
}

double ModelConfig::norm_epsilon() const {
  if (norm_eps > 0) return norm_eps;
  return arch == ArchitectureKind::bert ? 1e-12 : 1e-5;
}

std::vector<double> ModelConfig::rope_inverse_frequencies() const {
  const std::int64_t half = head_dim() / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  const double pi = std::acos(-1.0);
  const double old_context = static_cast<double>(rope_original_max_positions);
  const double low_wavelength = old_context / rope_low_freq_factor;
  const double high_wavelength = old_context / rope_high_freq_factor;
  for (std::int64_t i = 0; i < half; ++i) {
    double f =
        std::pow(rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim()));
    if (rope_scaling_factor > 0) {
      const double wavelength = 2 * pi / f;
      if (wavelength > low_wavelength) {
        f /= rope_scaling_factor;
      } else if (wavelength >= high_wavelength) {
        const double s = (old_context / wavelength - rope_low_freq_factor) /
                         (rope_high_freq_factor - rope_low_freq_factor);
        f = (1 - s) * f / rope_scaling_factor + s * f;
      }
    }
    inv_freq[static_cast<std::size_t>(i)] = f;
  }
  return inv_freq;
}

void ModelConfig::validate() const {
  OASES_CHECK(layers >= 1, "model.layers = {} must be at least 1", layers);
  OASES_CHECK(hidden >= 1, "model.hidden = {} must be at least 1", hidden);
  OASES_CHECK(heads >= 1, "model.heads = {} must be at least 1", heads);
  OASES_CHECK(hidden % heads == 0,
              "model.heads = {} must divide model.hidden = {} (each head gets hidden/heads "
              "features); valid head counts for this hidden size are its divisors",
              heads, hidden);
  OASES_CHECK(kv_heads >= 0, "model.kv_heads = {} must be >= 0 (0: as many as model.heads)",
              kv_heads);
  if (kv_heads > 0) {
    OASES_CHECK(arch == ArchitectureKind::llama || kv_heads == heads,
                "model.kv_heads = {} differs from model.heads = {}: grouped-query attention is "
                "a model.arch = \"llama\" setting; for \"{}\" leave kv_heads at 0 (or = heads)",
                kv_heads, heads, name(arch));
    OASES_CHECK(heads % kv_heads == 0,
                "model.kv_heads = {} must divide model.heads = {} (each key/value head serves "
                "heads / kv_heads query heads)",
                kv_heads, heads);
  }
  OASES_CHECK(ffn_hidden >= 1, "model.ffn_hidden = {} must be at least 1", ffn_hidden);
  OASES_CHECK(vocab_size >= 2 && vocab_size <= (std::int64_t{1} << 31) - 1,
              "model.vocab_size = {} must be in [2, 2^31)", vocab_size);
  OASES_CHECK(seq_len >= 1, "model.seq_len = {} must be at least 1", seq_len);
  OASES_CHECK(dropout >= 0.0 && dropout < 1.0, "model.dropout = {} must be in [0, 1)", dropout);
  OASES_CHECK(attention_dropout >= 0.0 && attention_dropout < 1.0,
              "model.attention_dropout = {} must be in [0, 1)", attention_dropout);
  OASES_CHECK(norm_eps >= 0, "model.norm_eps = {} must be positive (0: the architecture's default)",
              norm_eps);
  OASES_CHECK(rope_theta > 0, "model.rope_theta = {} must be positive", rope_theta);
  OASES_CHECK(
      max_positions == 0 || max_positions >= seq_len,
      "model.max_positions = {} is below model.seq_len = {}: the model takes sequences of "
      "at most max_positions tokens; shorten seq_len or leave max_positions at 0 (= seq_len)",
      max_positions, seq_len);
  OASES_CHECK(rope_scaling_factor >= 0,
              "model.rope_scaling_factor = {} must be >= 0 (0: no scaling of the rotary "
              "frequencies; LLaMA 3.1 uses 8)",
              rope_scaling_factor);
  if (rope_scaling_factor > 0) {
    OASES_CHECK(arch == ArchitectureKind::llama,
                "model.rope_scaling_factor = {} scales rotary frequencies, which only "
                "model.arch = \"llama\" has; leave it at 0 for \"{}\"",
                rope_scaling_factor, name(arch));
    OASES_CHECK(rope_low_freq_factor > 0 && rope_high_freq_factor > rope_low_freq_factor,
                "model.rope_low_freq_factor = {} and model.rope_high_freq_factor = {} must "
                "satisfy 0 < low < high (LLaMA 3.1: 1 and 4)",
                rope_low_freq_factor, rope_high_freq_factor);
    OASES_CHECK(rope_original_max_positions >= 1,
                "model.rope_original_max_positions = {} must be at least 1 (LLaMA 3.1: 8192)",
                rope_original_max_positions);
  }
  if (arch == ArchitectureKind::llama) {
    OASES_CHECK(head_dim() % 2 == 0,
                "model.hidden / model.heads = {} must be even for rotary position embedding "
                "(model.arch = \"llama\")",
                head_dim());
  }
  if (arch == ArchitectureKind::gpt || arch == ArchitectureKind::bert) {
    OASES_CHECK(tied_embeddings(),
                "model.tie_embeddings = false is not supported for model.arch = \"{}\", whose LM "
                "head shares the word embedding; set it to true (or leave it out)",
                name(arch));
  }
  validate_moe();
  if (arch == ArchitectureKind::bert) {
    OASES_CHECK(seq_len >= 3,
                "model.seq_len = {} is too short for BERT, whose sequences hold [CLS], at least "
                "one token and [SEP]; use at least 3",
                seq_len);
  }
}

void ModelConfig::validate_moe() const {
  OASES_CHECK(moe_every >= 0, "model.moe_every = {} must be >= 0 (0: no MoE layers; k: every k-th "
              "layer's feed-forward block is a mixture of experts)", moe_every);
  if (moe_every == 0) return;
  OASES_CHECK(moe_every <= layers,
              "model.moe_every = {} is more than model.layers = {}: no layer would be an MoE layer; "
              "use 1 to {} (or 0 for a dense model)", moe_every, layers, layers);
  OASES_CHECK(arch == ArchitectureKind::gpt || arch == ArchitectureKind::llama,
              "model.moe_every = {}: mixture-of-experts layers exist for model.arch = \"gpt\" and "
              "\"llama\", not \"{}\"; set model.moe_every = 0", moe_every, name(arch));
  OASES_CHECK(experts >= 2, "model.experts = {} must be at least 2 with model.moe_every = {}",
              experts, moe_every);
  OASES_CHECK(moe_top_k >= 0, "model.moe_top_k = {} must be >= 0 (0: the gate's default)", moe_top_k);
  OASES_CHECK(moe_top_k <= experts,
              "model.moe_top_k = {} is more than model.experts = {}: a token cannot go to more "
              "experts than there are; use 1 to {}", moe_top_k, experts, experts);
  if (moe_gate == ops::MoeGate::switch_top1)
    OASES_CHECK(moe_top_k <= 1, "model.moe_top_k = {}: the switch gate routes each token to one "
                "expert; use 1 (or 0), or model.moe_gate = \"noisy-topk\" for top-k", moe_top_k);
  if (moe_gate == ops::MoeGate::gshard)
    OASES_CHECK(moe_top_k == 0 || moe_top_k == 2, "model.moe_top_k = {}: the gshard gate routes "
                "each token to its top 2 experts; use 2 (or 0), or model.moe_gate = "
                "\"noisy-topk\" for top-k", moe_top_k);
  if (moe_gate == ops::MoeGate::expert_choice)
    OASES_CHECK(moe_top_k == 0, "model.moe_top_k = {}: with expert-choice routing each expert "
                "chooses its tokens (model.capacity_factor sets how many); leave moe_top_k at 0",
                moe_top_k);
  OASES_CHECK(capacity_factor > 0 && std::isfinite(capacity_factor),
              "model.capacity_factor = {} must be positive (tokens an expert takes per group: "
              "capacity_factor x top_k x group tokens / experts)", capacity_factor);
  OASES_CHECK(eval_capacity_factor >= 0 && std::isfinite(eval_capacity_factor),
              "model.eval_capacity_factor = {} must be positive (0: model.capacity_factor)",
              eval_capacity_factor);
  OASES_CHECK(moe_group_size >= 0, "model.moe_group_size = {} must be >= 0 (0: model.seq_len "
              "tokens per dispatch group)", moe_group_size);
  const std::int64_t group = moe_group_tokens();
  OASES_CHECK(seq_len % group == 0 || group % seq_len == 0,
              "model.moe_group_size = {} must divide model.seq_len = {} or be a multiple of it "
              "(groups are consecutive tokens and may not straddle a sequence's end)", group, seq_len);
  OASES_CHECK(moe_aux_loss_coef >= 0, "model.moe_aux_loss_coef = {} must be >= 0", moe_aux_loss_coef);
  OASES_CHECK(moe_z_loss_coef >= 0, "model.moe_z_loss_coef = {} must be >= 0", moe_z_loss_coef);
  OASES_CHECK(moe_router_noise >= 0, "model.moe_router_noise = {} must be >= 0", moe_router_noise);
  OASES_CHECK(moe_init_scale > 0, "model.moe_init_scale = {} must be positive", moe_init_scale);
  OASES_CHECK(expert_dropout >= 0 && expert_dropout < 1, "model.expert_dropout = {} must be in [0, 1)",
              expert_dropout);
  OASES_CHECK(moe_ffn_hidden >= 0, "model.moe_ffn_hidden = {} must be >= 0 (0: model.ffn_hidden)",
              moe_ffn_hidden);
}

void ModelConfig::validate_tensor_parallel(std::int64_t tp) const {
  OASES_CHECK(tp >= 1, "parallel.tp = {} must be at least 1", tp);
  const std::int64_t kv = kv_head_count();
  if (heads % tp == 0 && kv % tp == 0 && ffn_hidden % tp == 0) return;
  // Valid degrees divide the head counts and the MLP width. Only those up to 4096 are listed,
  // so that absurd sizes cannot stall the message.
  constexpr std::int64_t kMaxListed = 4096;
  std::vector<std::string> valid;
  for (std::int64_t d = 1; d <= std::min(heads, kMaxListed); ++d)
    if (heads % d == 0 && kv % d == 0 && ffn_hidden % d == 0) valid.push_back(std::to_string(d));
  if (heads > kMaxListed) valid.push_back("...");
  OASES_CHECK(heads % tp == 0,
              "parallel.tp = {} must divide model.heads = {} (each rank computes whole heads); "
              "valid tp for this model: {}",
              tp, heads, fmt::join(valid, ", "));
  OASES_CHECK(kv % tp == 0,
              "parallel.tp = {} must divide model.kv_heads = {} (each rank holds whole key/value "
              "heads); valid tp for this model: {}",
              tp, kv, fmt::join(valid, ", "));
  OASES_FAIL("parallel.tp = {} must divide model.ffn_hidden = {} (column-parallel MLP); valid tp "
             "for this model: {}",
             tp, ffn_hidden, fmt::join(valid, ", "));
}

int ModelConfig::moe_choices() const {
  if (moe_top_k > 0) return static_cast<int>(moe_top_k);
  return ops::default_top_k(moe_gate);
}

namespace {

// Parameters of one dense feed-forward block of width F (GPT and BERT with biases).
std::int64_t feed_forward_params(const ModelConfig& c, std::int64_t F) {
  const std::int64_t C = c.hidden;
  return c.arch == ArchitectureKind::llama ? 3 * C * F : (C * F + F) + (F * C + C);
}

std::int64_t router_params(const ModelConfig& c) {
  const bool noise = c.moe_gate == ops::MoeGate::noisy_top_k && c.moe_router_noise > 0;
  return c.hidden * c.experts * (noise ? 2 : 1);
}

}  // namespace

std::int64_t ModelConfig::parameter_count() const {
  const std::int64_t C = hidden, V = vocab_size, S = position_count();
  const std::int64_t A = heads * head_dim(), KV = kv_head_count() * head_dim();
  const std::int64_t moe_layers = moe_layer_count();
  // Every layer's feed-forward parameters: dense blocks and MoE layers' routers and experts.
  const std::int64_t feed_forward =
      (layers - moe_layers) * feed_forward_params(*this, ffn_hidden) +
      moe_layers * (router_params(*this) + experts * feed_forward_params(*this, expert_ffn_hidden()));
  if (arch == ArchitectureKind::llama) {
    const std::int64_t per_layer = 2 * C + C * (A + 2 * KV) + A * C;
    return V * C * (tied_embeddings() ? 1 : 2) + layers * per_layer + feed_forward + C;
  }
  if (arch == ArchitectureKind::bert) {
    const std::int64_t per_layer = 4 * (C * C + C) + 2 * C + 2 * C;
    return V * C + S * C + 2 * C + 2 * C + layers * per_layer + feed_forward + (C * C + C) +
           2 * C + V;
  }
  const std::int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C;
  return V * C + S * C + layers * per_layer + feed_forward + 2 * C;
}

double ModelConfig::training_flops_per_token() const {
  std::int64_t lookups = 0;  // parameters read by index, not multiplied
  if (arch == ArchitectureKind::gpt)
    lookups = position_count() * hidden;
  else if (arch == ArchitectureKind::bert)
    lookups = position_count() * hidden + 2 * hidden;
  else if (!tied_embeddings()) lookups = vocab_size * hidden;
  // A token passes through moe_top_k experts of an MoE layer (expert-choice: capacity_factor
  // on average), not through all of them.
  const double experts_per_token =
      moe_gate == ops::MoeGate::expert_choice ? capacity_factor : static_cast<double>(moe_choices());
  const double idle_expert_params =
      static_cast<double>(moe_layer_count()) *
      (static_cast<double>(experts) - experts_per_token) *
      static_cast<double>(feed_forward_params(*this, expert_ffn_hidden()));
  return 6.0 * (static_cast<double>(parameter_count() - lookups) - idle_expert_params) +
         12.0 * static_cast<double>(layers) * static_cast<double>(hidden) *
             static_cast<double>(seq_len);
}

}  // namespace oases::model
