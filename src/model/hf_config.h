// Hugging Face model folders: config.json read as a ModelConfig and written from one, and the
// names tensors have there.
//
// Architectures (config.json's "architectures" and "model_type"):
//   GPT2LMHeadModel   "gpt2"   -> model.arch = "gpt"
//   LlamaForCausalLM  "llama"  -> model.arch = "llama"
//   BertForMaskedLM   "bert"   -> model.arch = "bert"
// Every key of config.json is either mapped onto a [model] setting, checked to hold the one
// value oases computes (GPT-2's activation_function "gelu_new", LLaMA's attention_bias false),
// or known not to change what the model computes in training (initializer_range, use_cache,
// token ids, torch_dtype, transformers_version, ...). Anything else, and any value oases cannot
// honour, is a UserError naming the file, the key and the value: a setting is never dropped
// silently. The mapping of each key is in docs/fine-tuning.md.
//
// Tensor names: oases names parameters as the Hugging Face models do (docs/checkpoints.md),
// except that GPT2LMHeadModel's are under "transformer." (oases: "wte.weight", the folder:
// "transformer.wte.weight"; GPT-2's own published file has no prefix, and both are read).
// LayerNorm parameters are also read under their old names, gamma and beta (as BERT's
// published file has them).
// Buffers and heads a folder may carry that the model does not use are skipped on reading:
// GPT-2's attention masks (h.N.attn.bias, h.N.attn.masked_bias), BERT's position_ids, pooler
// and next-sentence head (BertForPreTraining's), LLaMA's rotary_emb.inv_freq, and an LM head
// stored beside the embedding it is tied to (checked to equal it).
#pragma once

#include "model/config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::model {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfGenerationConfigFile = "generation_config.json";

// What a folder's config.json says.
struct HfConfig {
  ModelConfig model;
  // The [model] keys the folder fixes: a run's config may leave them out (the folder's value
  // is taken) or give the same value; any other value is an error. The other keys the folder
  // gives (seq_len, dropout, attention_dropout) are defaults a run may change.
  std::vector<std::string> fixed_keys;
  std::string architecture;  // "GPT2LMHeadModel", ...
  std::string torch_dtype;   // "float32", "bfloat16", ...; empty when not stated
  // Token ids the config states (generation and padding use them); null when absent.
  nlohmann::json bos_token_id, eos_token_id, pad_token_id;
};

// Maps a parsed config.json; `source` names it in messages.
HfConfig parse_hf_config(const nlohmann::json& config, const std::string& source);
// Reads `<dir>/config.json`. UserError when the folder has none.
HfConfig read_hf_config(const std::string& dir);
// Whether `dir` is a folder holding config.json (a Hugging Face model folder).
bool is_hf_model_folder(const std::string& dir);

// The [model] settings of `config` that a folder fixes and its defaults, as (key, value) in
// TOML terms: what parse_hf_config's fixed_keys name plus seq_len, dropout and
// attention_dropout.
struct HfSetting {
  std::string key;  // "hidden", ...
  bool fixed = false;
};
std::vector<HfSetting> hf_settings(const HfConfig& config);

// config.json for `model` as transformers writes it for the architecture's class (its keys and
// defaults), with torch_dtype and the given token ids (null: left out). UserError for a model
// no Hugging Face class holds (a GPT MoE model; LLaMA MoE models that are not Mixtral's: see
// hf_moe_layout).
nlohmann::json hf_config_json(const ModelConfig& model, std::string_view torch_dtype,
                              const nlohmann::json& bos_token_id,
                              const nlohmann::json& eos_token_id,
                              const nlohmann::json& pad_token_id);

// The name of parameter `name` in a folder written for `model` (export).
std::string hf_tensor_name(const ModelConfig& model, const std::string& name);
// The names parameter `name` may have in a folder, in order of preference (reading).
std::vector<std::string> hf_tensor_name_candidates(const ModelConfig& model,
                                                   const std::string& name);
// Whether a folder tensor of this name is one the model has no use for (see above), given the
// names it does use.
bool hf_unused_tensor(const ModelConfig& model, const std::string& name);

}  // namespace oases::model
