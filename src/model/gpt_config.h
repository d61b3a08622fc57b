// Architecture hyper-parameters of a GPT-2 style model ([model] section of the config).
#pragma once

#include <cstdint>
#include <string>

namespace oases::model {

struct GptConfig {
  std::string arch = "gpt";
  std::int64_t layers = 4;
  std::int64_t hidden = 256;
  std::int64_t heads = 4;
  std::int64_t ffn_hidden = 1024;  // 4 * hidden in GPT-2
  std::int64_t vocab_size = 256;
  std::int64_t seq_len = 128;      // also the number of learned positions
  double dropout = 0.0;            // after the embedding and on both residual branches
  bool tie_embeddings = true;      // LM head shares wte, as GPT-2
  double layernorm_eps = 1e-5;

  std::int64_t head_dim() const { return hidden / heads; }

  // Vocabulary rounded up to a multiple of the tensor-parallel degree, so wte splits into
  // equal row blocks. The padding rows are zero and never enter the loss.
  std::int64_t padded_vocab(std::int64_t tp) const { return (vocab_size + tp - 1) / tp * tp; }

  // Throws UserError when `tp` ranks cannot split the model (heads and ffn_hidden).
  void validate_tensor_parallel(std::int64_t tp) const;

  // Throws UserError naming the offending `model.*` key, its value and what is valid.
  void validate() const;

  // Parameters of the model (wte counted once; wpe included).
  std::int64_t parameter_count() const;

  // Training FLOPs per token: 6 * (parameters - wpe) for the matrix products (forward 2, backward
  // 4 per multiply-add; the tied wte counts once, as the LM head), plus attention scores and
  // their weighted sum: 12 * layers * hidden * seq_len (the PaLM convention, causal mask not
  // discounted).
  double training_flops_per_token() const;
};

}  // namespace oases::model
