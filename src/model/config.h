// Architecture hyper-parameters of a model ([model] section of the config). One struct serves
// every architecture; settings an architecture does not use must keep their defaults.
//
//   arch    "gpt"    GPT-2: learned positions, pre-LN, GeLU (tanh), biases, LM head tied to wte
//           "llama"  LLaMA: rotary positions, pre-RMSNorm, SwiGLU, no biases, untied LM head,
//                    grouped-query attention with kv_heads
//           "bert"   BERT: learned positions and token types, post-LN, GeLU (erf), masked-LM
//                    head (dense + GeLU + LayerNorm + decoder tied to the word embeddings)
#pragma once

#include "core/named_values.h"
#include "ops/moe.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::model {

enum class ArchitectureKind : std::uint8_t { gpt, llama, bert };
// model.arch's words.
inline constexpr std::array<NamedValue<ArchitectureKind>, 3> kArchitectureNames{{
    {ArchitectureKind::gpt, "gpt"}, {ArchitectureKind::llama, "llama"}, {ArchitectureKind::bert, "bert"}}};
std::string_view name(ArchitectureKind arch);
// The kind kArchitectureNames names; UserError naming model.arch and the valid names.
ArchitectureKind parse_architecture(std::string_view text);

struct ModelConfig {
  ArchitectureKind arch = ArchitectureKind::gpt;
  std::int64_t layers = 4;
  std::int64_t hidden = 256;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 0;       // key/value heads (grouped-query attention); 0: = heads
  std::int64_t ffn_hidden = 1024;  // 4 * hidden in GPT-2 and BERT
  std::int64_t vocab_size = 256;
  std::int64_t seq_len = 128;      // also the number of learned positions
  double dropout = 0.0;            // after the embedding and on both residual branches
  // On the attention probabilities, after the softmax (Megatron-LM's attention_dropout,
  // GPT-2's attn_pdrop).
  double attention_dropout = 0.0;
  // Whether the LM head shares the word embedding; unset: the architecture's (gpt, bert: yes;
  // llama: no).
  std::optional<bool> tie_embeddings;
  double norm_eps = 0;             // 0: the architecture's (gpt, llama: 1e-5; bert: 1e-12)
  double rope_theta = 10000;       // llama's rotary base
  // The longest sequence the model takes: the rows of the learned position tables (gpt, bert),
  // and the context a Hugging Face config states (llama). 0: seq_len. A model trained on
  // longer sequences (GPT-2's 1024 positions) fine-tunes at any seq_len up to it.
  std::int64_t max_positions = 0;
  // LLaMA 3's scaling of the rotary frequencies (Hugging Face rope_scaling of rope_type
  // "llama3"; off while rope_scaling_factor is 0): with L = rope_original_max_positions,
  // wavelength w_i = 2 pi / inv_freq_i, low = L / rope_low_freq_factor and
  // high = L / rope_high_freq_factor, a frequency with w_i > low is divided by the factor, one
  // with w_i < high is kept, and one between is interpolated:
  //   s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor),
  //   inv_freq_i <- (1 - s) inv_freq_i / factor + s inv_freq_i.
  double rope_scaling_factor = 0;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  std::int64_t rope_original_max_positions = 8192;

  // Mixture of experts (ops/moe.h has the routing semantics). Layer l's feed-forward block is
  // an MoE layer when moe_every > 0 and (l + 1) % moe_every == 0 (2: every other layer, as in
  // GShard); 0: every layer is dense.
  std::int64_t moe_every = 0;
  std::int64_t experts = 0;             // experts per MoE layer (>= 2 with moe_every > 0)
  ops::MoeGate moe_gate = ops::MoeGate::switch_top1;  // ops::kMoeGateNames
  std::int64_t moe_top_k = 0;           // experts per token; 0: the gate's (2, 2, 1, -)
  double capacity_factor = 1.0;         // expert capacity factor in training
  double eval_capacity_factor = 0;      // in evaluation and generation; 0: capacity_factor
  std::int64_t moe_group_size = 0;      // tokens per dispatch group; 0: seq_len
  double moe_aux_loss_coef = 0.01;      // load-balancing loss weight
  double moe_z_loss_coef = 0;           // router z-loss weight
  double moe_router_noise = 1.0;        // noisy-topk: scale of the learned noise; 0: none
  double moe_init_scale = 1.0;          // variance scale of expert and router weights (0.1: Switch)
  double expert_dropout = 0;            // dropout on the experts' hidden activations
  std::int64_t moe_ffn_hidden = 0;      // each expert's hidden width; 0: ffn_hidden

  bool is_moe_layer(std::int64_t layer) const {
    return moe_every > 0 && (layer + 1) % moe_every == 0;
  }
  bool has_moe() const { return moe_every > 0 && moe_every <= layers; }
  std::int64_t moe_layer_count() const { return moe_every > 0 ? layers / moe_every : 0; }
  std::int64_t expert_ffn_hidden() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_hidden; }
  int moe_choices() const;                    // moe_top_k or the gate's default
  double moe_eval_capacity_factor() const {
    return eval_capacity_factor > 0 ? eval_capacity_factor : capacity_factor;
  }
  std::int64_t moe_group_tokens() const { return moe_group_size > 0 ? moe_group_size : seq_len; }

  // BERT's masked-language-model objective: only the masked positions are targets, and the
  // attention is bidirectional; GPT and LLaMA are causal language models.
  bool masked_lm() const { return arch == ArchitectureKind::bert; }

  std::int64_t head_dim() const { return hidden / heads; }
  std::int64_t position_count() const { return max_positions > 0 ? max_positions : seq_len; }
  // inv_freq_i = rope_theta^(-2i / head_dim), i in [0, head_dim / 2), then scaled as
  // rope_scaling_factor says (llama).
  std::vector<double> rope_inverse_frequencies() const;
  std::int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  bool tied_embeddings() const;
  double norm_epsilon() const;

  // Vocabulary rounded up to a multiple of the tensor-parallel degree, so the word embedding
  // splits into equal row blocks. The padding rows are zero and never enter the loss.
  std::int64_t padded_vocab(std::int64_t tp) const { return (vocab_size + tp - 1) / tp * tp; }

  // Throws UserError when `tp` ranks cannot split the model (heads, kv_heads, ffn_hidden).
  void validate_tensor_parallel(std::int64_t tp) const;

  // Throws UserError naming the offending `model.*` key, its value and what is valid.
  void validate() const;
  void validate_moe() const;

  // Parameters of the model (a tied embedding counted once).
  std::int64_t parameter_count() const;

  // Training FLOPs per token: 6 per parameter that multiplies an activation (forward 2,
  // backward 4 per multiply-add; lookup tables such as positions and an untied input
  // embedding excluded; a tied embedding counts once, as the LM head), plus attention scores
  // and their weighted sum: 12 * layers * hidden * seq_len (the PaLM convention, causal mask
  // not discounted).
  double training_flops_per_token() const;
};


}  // namespace oases::model
