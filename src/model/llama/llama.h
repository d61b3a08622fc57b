// LLaMA (Hugging Face LlamaForCausalLM): token embedding without positions, pre-norm RMSNorm
// (eps model.norm_eps, weight, no bias), rotary position embedding on q and k (base
// model.rope_theta, rotate-half pairing), grouped-query attention with model.kv_heads
// key/value heads, SwiGLU MLP down(silu(gate(x)) * up(x)) of width model.ffn_hidden, no biases
// anywhere, causal attention, final RMSNorm and an untied LM head (tied with
// model.tie_embeddings = true). Linear weights are [out, in]. Names:
//   model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
//   model.layers.{i}.post_attention_layernorm.weight,
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight
// Tensor parallelism shards q, k and v by heads and gate/up by columns (column-parallel),
// o_proj and down_proj by their input columns (row-parallel).
#pragma once

#include "model/architecture.h"

#include <memory>

namespace oases::model {

std::unique_ptr<Architecture> make_llama(const ModelConfig& config);

}  // namespace oases::model
