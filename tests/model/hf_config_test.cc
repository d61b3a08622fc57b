#include "model/hf_config.h"

#include "core/error.h"
#include "support/files.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <numbers>
#include <string>

namespace oases::model {
namespace {

using nlohmann::json;
using oases::testing::expect_user_error;

// config.json of GPT-2 (124M) as transformers writes it for GPT2LMHeadModel.
json gpt2_config() {
  return json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": null, "n_layer": 12,
    "n_positions": 1024, "reorder_and_upcast_attn": false, "resid_pdrop": 0.1,
    "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true,
    "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
    "summary_type": "cls_index", "summary_use_proj": true,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "torch_dtype": "float32", "transformers_version": "4.44.0", "use_cache": true,
    "vocab_size": 50257})");
}

// Llama 3.2 1B's config.json.
json llama32_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

// bert-base-uncased's config.json.
json bert_config() {
  return json::parse(R"({
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "gradient_checkpointing": false, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
    "position_embedding_type": "absolute", "transformers_version": "4.6.0.dev0",
    "type_vocab_size": 2, "use_cache": true, "vocab_size": 30522})");
}

TEST(HfConfig, MapsGpt2) {
  const HfConfig c = parse_hf_config(gpt2_config(), "gpt2/config.json");
  EXPECT_EQ(c.architecture, "GPT2LMHeadModel");
  EXPECT_EQ(c.model.arch, ArchitectureKind::gpt);
  EXPECT_EQ(c.model.layers, 12);
  EXPECT_EQ(c.model.hidden, 768);
  EXPECT_EQ(c.model.heads, 12);
  EXPECT_EQ(c.model.ffn_hidden, 3072);  // n_inner null: 4 * n_embd
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.model.position_count(), 1024);
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.1);
  EXPECT_DOUBLE_EQ(c.model.attention_dropout, 0.1);
  EXPECT_DOUBLE_EQ(c.model.norm_epsilon(), 1e-5);
  EXPECT_EQ(c.model.parameter_count(), 124'439'808);  // GPT-2 small, as published
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_EQ(c.eos_token_id, 50256);
}

TEST(HfConfig, MapsLlamaWithGroupedQueryAttentionAndLlama3RopeScaling) {
  const HfConfig c = parse_hf_config(llama32_config(), "llama/config.json");
  EXPECT_EQ(c.model.arch, ArchitectureKind::llama);
  EXPECT_EQ(c.model.kv_head_count(), 8);
  EXPECT_EQ(c.model.head_dim(), 64);
  EXPECT_TRUE(c.model.tied_embeddings());
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.model.rope_scaling_factor, 32.0);
  EXPECT_EQ(c.model.rope_original_max_positions, 8192);
  EXPECT_EQ(c.model.position_count(), 131072);
  EXPECT_EQ(c.model.parameter_count(), 1'235'814'400);  // Llama 3.2 1B
  EXPECT_EQ(c.eos_token_id, json({128001, 128008, 128009}));
}

TEST(HfConfig, MapsBert) {
  const HfConfig c = parse_hf_config(bert_config(), "bert/config.json");
  EXPECT_EQ(c.model.arch, ArchitectureKind::bert);
  EXPECT_EQ(c.model.position_count(), 512);
  EXPECT_DOUBLE_EQ(c.model.norm_epsilon(), 1e-12);
  EXPECT_EQ(c.pad_token_id, 0);
}

// LLaMA 3's frequency scaling, against the rule written out per frequency band.
TEST(HfConfig, Llama3RopeScalingFollowsItsThreeBands) {
  ModelConfig m = parse_hf_config(llama32_config(), "llama/config.json").model;
  const std::vector<double> scaled = m.rope_inverse_frequencies();
  m.rope_scaling_factor = 0;
  const std::vector<double> plain = m.rope_inverse_frequencies();
  ASSERT_EQ(scaled.size(), 32u);
  int low = 0, high = 0, between = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_DOUBLE_EQ(plain[i], std::pow(500000.0, -2.0 * static_cast<double>(i) / 64));
    const double wavelength = 2 * std::numbers::pi / plain[i];
    if (wavelength < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]);
      ++high;
    } else if (wavelength > 8192.0 / 1) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 32);
      ++low;
    } else {
      const double s = (8192 / wavelength - 1) / (4 - 1);
      EXPECT_NEAR(scaled[i], (1 - s) * plain[i] / 32 + s * plain[i], 1e-15 * plain[i]);
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 32);
      ++between;
    }
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(between, 0);
}

TEST(HfConfig, WrittenConfigsReadBackAsTheSameModel) {
  for (const json& original : {gpt2_config(), llama32_config(), bert_config()}) {
    const HfConfig first = parse_hf_config(original, "config.json");
    const json written = hf_config_json(first.model, first.torch_dtype, first.bos_token_id,
                                        first.eos_token_id, first.pad_token_id);
    const HfConfig again = parse_hf_config(written, "exported config.json");
    EXPECT_EQ(again.architecture, first.architecture);
    EXPECT_EQ(again.model.parameter_count(), first.model.parameter_count());
    EXPECT_EQ(again.model.position_count(), first.model.position_count());
    EXPECT_EQ(again.model.kv_head_count(), first.model.kv_head_count());
    EXPECT_EQ(again.model.tied_embeddings(), first.model.tied_embeddings());
    EXPECT_EQ(again.model.norm_epsilon(), first.model.norm_epsilon());
    EXPECT_EQ(again.model.rope_theta, first.model.rope_theta);
    EXPECT_EQ(again.model.rope_inverse_frequencies(), first.model.rope_inverse_frequencies());
    EXPECT_EQ(again.model.dropout, first.model.dropout);
    EXPECT_EQ(again.torch_dtype, first.torch_dtype);
    EXPECT_EQ(again.eos_token_id, first.eos_token_id);
    // Written twice, the same file.
    EXPECT_EQ(hf_config_json(again.model, again.torch_dtype, again.bos_token_id, again.eos_token_id,
                             again.pad_token_id),
              written);
    for (const char* key : original["architectures"][0] == "GPT2LMHeadModel"
                               ? std::vector<const char*>{"n_embd", "n_layer", "n_positions"}
                               : std::vector<const char*>{"hidden_size", "num_hidden_layers",
                                                          "max_position_embeddings"})
      EXPECT_EQ(written[key], original[key]) << key;
  }
}

TEST(HfConfig, SettingsItCannotHonourAreErrorsNamingKeyAndValue) {
  const auto refused = [](json config, const char* key, json value,
                          std::vector<std::string> parts) {
    if (value.is_null())
      config.erase(key);
    else
      config[key] = value;
    parts.push_back("config.json");
    expect_user_error([&] { (void)parse_hf_config(config, "m/config.json"); }, parts);
  };
  refused(gpt2_config(), "architectures", {"GPT2DoubleHeadsModel"},
          {"\"GPT2DoubleHeadsModel\"", "LlamaForCausalLM"});
  refused(gpt2_config(), "activation_function", "relu", {"\"activation_function\"", "\"relu\""});
  refused(gpt2_config(), "scale_attn_by_inverse_layer_idx", true,
          {"scale_attn_by_inverse_layer_idx", "true"});
  refused(gpt2_config(), "embd_pdrop", 0.2, {"resid_pdrop", "embd_pdrop", "0.2"});
  refused(gpt2_config(), "n_layer", json(), {"\"n_layer\" is missing"});
  refused(gpt2_config(), "n_head", 7, {"model.heads = 7", "768"});
  refused(llama32_config(), "hidden_act", "gelu", {"\"hidden_act\"", "\"gelu\"", "silu"});
  refused(llama32_config(), "attention_bias", true, {"\"attention_bias\" = true"});
  refused(llama32_config(), "mlp_bias", true, {"\"mlp_bias\" = true"});
  refused(llama32_config(), "head_dim", 128, {"\"head_dim\" = 128"});
  refused(llama32_config(), "rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}},
          {"rope_scaling", "\"yarn\"", "llama3"});
  refused(llama32_config(), "rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}},
          {"rope_scaling", "low_freq_factor"});
  refused(llama32_config(), "sliding_window", 4096,
          {"\"sliding_window\" = 4096", "not one oases knows"});
  refused(llama32_config(), "pretraining_tp", 2, {"\"pretraining_tp\" = 2"});
  refused(bert_config(), "hidden_act", "gelu_new", {"\"hidden_act\"", "\"gelu_new\""});
  refused(bert_config(), "position_embedding_type", "relative_key",
          {"position_embedding_type", "relative_key"});
  refused(bert_config(), "type_vocab_size", 3, {"type_vocab_size", "3"});
  refused(bert_config(), "is_decoder", true, {"\"is_decoder\" = true"});
  refused(bert_config(), "model_type", "roberta", {"model_type", "roberta"});
}

TEST(HfConfig, TensorNamesFollowTheClass) {
  const ModelConfig gpt = parse_hf_config(gpt2_config(), "c").model;
  EXPECT_EQ(hf_tensor_name(gpt, "h.0.attn.c_attn.weight"), "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(hf_tensor_name_candidates(gpt, "wte.weight"),
            (std::vector<std::string>{"transformer.wte.weight", "wte.weight"}));
  EXPECT_TRUE(hf_unused_tensor(gpt, "h.3.attn.bias"));
  EXPECT_TRUE(hf_unused_tensor(gpt, "transformer.h.3.attn.masked_bias"));
  EXPECT_FALSE(hf_unused_tensor(gpt, "h.3.attn.c_proj.bias"));
  const ModelConfig llama = parse_hf_config(llama32_config(), "c").model;
  EXPECT_EQ(hf_tensor_name(llama, "model.norm.weight"), "model.norm.weight");
  EXPECT_TRUE(hf_unused_tensor(llama, "lm_head.weight"));  // tied in Llama 3.2 1B
  const ModelConfig bert = parse_hf_config(bert_config(), "c").model;
  EXPECT_EQ(hf_tensor_name_candidates(bert, "bert.embeddings.LayerNorm.weight"),
            (std::vector<std::string>{"bert.embeddings.LayerNorm.weight",
                                      "bert.embeddings.LayerNorm.gamma"}));
  EXPECT_EQ(hf_tensor_name_candidates(bert, "bert.encoder.layer.0.output.LayerNorm.bias"),
            (std::vector<std::string>{"bert.encoder.layer.0.output.LayerNorm.bias",
                                      "bert.encoder.layer.0.output.LayerNorm.beta"}));
  EXPECT_EQ(hf_tensor_name_candidates(bert, "bert.encoder.layer.0.output.dense.bias"),
            (std::vector<std::string>{"bert.encoder.layer.0.output.dense.bias"}));
  EXPECT_TRUE(hf_unused_tensor(bert, "bert.pooler.dense.weight"));
  EXPECT_TRUE(hf_unused_tensor(bert, "cls.seq_relationship.bias"));
  EXPECT_FALSE(hf_unused_tensor(bert, "cls.predictions.bias"));
}

TEST(HfConfig, MixtureOfExpertsModelsAreNotWritten) {
  ModelConfig m = parse_hf_config(gpt2_config(), "c").model;
  m.moe_every = 2;
  m.experts = 4;
  expect_user_error([&] { (void)hf_config_json(m, "float32", json(), json(), json()); },
                    {"model.moe_every = 2", "no Hugging Face class"});
}

}  // namespace
}  // namespace oases::model
