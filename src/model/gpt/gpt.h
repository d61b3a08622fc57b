// GPT-2 (docs/models.md, "Reference semantics"): learned positions wpe [seq_len, hidden], pre-LN
// blocks (LayerNorm eps model.norm_eps), fused QKV c_attn [C, 3C] and every linear weight in
// Conv1D [in, out] layout with biases, GeLU in its tanh form, causal attention, final ln_f and
// an LM head tied to wte. Names as Hugging Face GPT2LMHeadModel's checkpoints:
//   wte.weight, wpe.weight, h.{i}.ln_1.{weight,bias}, h.{i}.attn.c_attn.{weight,bias},
//   h.{i}.attn.c_proj.{weight,bias}, h.{i}.ln_2.{weight,bias}, h.{i}.mlp.c_fc.{weight,bias},
//   h.{i}.mlp.c_proj.{weight,bias}, ln_f.{weight,bias}
#pragma once

#include "model/architecture.h"

#include <memory>

namespace oases::model {

std::unique_ptr<Architecture> make_gpt(const ModelConfig& config);

}  // namespace oases::model
