// Architecture hyper-parameters of a model ([model] section of the config). One struct serves
// every architecture; settings an architecture does not use must keep their defaults.
//
//   arch    "gpt"    GPT-2: learned positions, pre-LN, GeLU (tanh), biases, LM head tied to wte
//           "llama"  LLaMA: rotary positions, pre-RMSNorm, SwiGLU, no biases, untied LM head,
//                    grouped-query attention with kv_heads
//           "bert"   BERT: learned positions and token types, post-LN, GeLU (erf), masked-LM
//                    head (dense + GeLU + LayerNorm + decoder tied to the word embeddings)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::model {

struct ModelConfig {
  std::string arch = "gpt";
  std::int64_t layers = 4;
  std::int64_t hidden = 256;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 0;       // key/value heads (grouped-query attention); 0: = heads
  std::int64_t ffn_hidden = 1024;  // 4 * hidden in GPT-2 and BERT
  std::int64_t vocab_size = 256;
  std::int64_t seq_len = 128;      // also the number of learned positions
  double dropout = 0.0;            // after the embedding and on both residual branches
  // Whether the LM head shares the word embedding; unset: the architecture's (gpt, bert: yes;
  // llama: no).
  std::optional<bool> tie_embeddings;
  double norm_eps = 0;             // 0: the architecture's (gpt, llama: 1e-5; bert: 1e-12)
  double rope_theta = 10000;       // llama's rotary base

  std::int64_t head_dim() const { return hidden / heads; }
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

  // Parameters of the model (a tied embedding counted once).
  std::int64_t parameter_count() const;

  // Training FLOPs per token: 6 per parameter that multiplies an activation (forward 2,
  // backward 4 per multiply-add; lookup tables such as positions and an untied input
  // embedding excluded; a tied embedding counts once, as the LM head), plus attention scores
  // and their weighted sum: 12 * layers * hidden * seq_len (the PaLM convention, causal mask
  // not discounted).
  double training_flops_per_token() const;
};

// The architecture names, for messages.
std::vector<std::string> architecture_names();

}  // namespace oases::model
