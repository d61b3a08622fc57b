#include "model/hf_config.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

namespace oases::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::uint64_t kMaxConfigBytes = 16u << 20;

struct ArchitectureNames {
  ArchitectureKind arch;
  const char* hf_class;
  const char* model_type;
};
constexpr ArchitectureNames kArchitectures[] = {
    {ArchitectureKind::gpt, "GPT2LMHeadModel", "gpt2"},
    {ArchitectureKind::llama, "LlamaForCausalLM", "llama"},
    {ArchitectureKind::bert, "BertForMaskedLM", "bert"},
};

const ArchitectureNames& names_of(ArchitectureKind arch) {
  for (const ArchitectureNames& a : kArchitectures)
    if (a.arch == arch) return a;
  OASES_FAIL("no Hugging Face class for model.arch = \"{}\"", name(arch));
}

// Keys that do not change what the model computes in training: initialisation (the weights
// come from the folder), inference caches, bookkeeping, token ids (kept for export), and the
// heads of other classes of the same model type.
const std::set<std::string, std::less<>> kNeutralKeys = {"_name_or_path",
                                                         "architectures",
                                                         "model_type",
                                                         "torch_dtype",
                                                         "dtype",
                                                         "transformers_version",
                                                         "initializer_range",
                                                         "use_cache",
                                                         "bos_token_id",
                                                         "eos_token_id",
                                                         "pad_token_id",
                                                         "sep_token_id",
                                                         "cls_token_id",
                                                         "mask_token_id",
                                                         "unk_token_id",
                                                         "decoder_start_token_id",
                                                         "output_attentions",
                                                         "output_hidden_states",
                                                         "return_dict",
                                                         "gradient_checkpointing",
                                                         "tokenizer_class",
                                                         "prefix",
                                                         "task_specific_params",
                                                         "id2label",
                                                         "label2id",
                                                         "num_labels",
                                                         "problem_type",
                                                         "finetuning_task",
                                                         "torchscript",
                                                         "pruned_heads",
                                                         "chunk_size_feed_forward",
                                                         "tie_encoder_decoder",
                                                         "max_length",
                                                         "min_length",
                                                         "do_sample",
                                                         "early_stopping",
                                                         "num_beams",
                                                         "temperature",
                                                         "top_k",
                                                         "top_p",
                                                         "repetition_penalty",
                                                         "length_penalty",
                                                         "no_repeat_ngram_size",
                                                         "bad_words_ids",
                                                         "num_return_sequences",
                                                         "output_scores",
                                                         "return_dict_in_generate",
                                                         "forced_bos_token_id",
                                                         "forced_eos_token_id",
                                                         "remove_invalid_values",
                                                         "exponential_decay_length_penalty",
                                                         "suppress_tokens",
                                                         "begin_suppress_tokens",
                                                         "typical_p",
                                                         "diversity_penalty",
                                                         "num_beam_groups",
                                                         "encoder_no_repeat_ngram_size",
                                                         "tf_legacy_loss",
                                                         "use_bfloat16",
                                                         "cross_attention_hidden_size",
                                                         "is_encoder_decoder",
                                                         "add_cross_attention",
                                                         "is_decoder",
                                                         "classifier_dropout",
                                                         "pretraining_tp",
                                                         "summary_type",
                                                         "summary_use_proj",
                                                         "summary_activation",
                                                         "summary_proj_to_labels",
                                                         "summary_first_dropout",
                                                         "reorder_and_upcast_attn",
                                                         "n_ctx"};
// Neutral only at a stated value: anything else changes the model.
const std::map<std::string, json, std::less<>> kNeutralAt = {{"is_decoder", false},
                                                             {"add_cross_attention", false},
                                                             {"is_encoder_decoder", false},
                                                             {"tie_encoder_decoder", false},
                                                             {"pruned_heads", json::object()},
                                                             {"chunk_size_feed_forward", 0},
                                                             {"pretraining_tp", 1}};

std::string shown(const json& value) {
  return value.dump();
}

// The keys one architecture maps; each handler reads its value into the config.
class ConfigReader {
 public:
  ConfigReader(const json& config, std::string source)
      : config_(config), source_(std::move(source)) {}

  bool has(const char* key) const { return config_.contains(key) && !config_[key].is_null(); }
  const json& at(const char* key) const { return config_[key]; }
  const std::string& source() const { return source_; }

  std::int64_t integer(const char* key, std::int64_t minimum = 1) {
    used_.insert(key);
    OASES_CHECK(has(key), "{}: key \"{}\" is missing; a {} model needs it", source_, key,
                architecture_);
    const auto v = io::json_integer<std::int64_t>(at(key));
    OASES_CHECK(v && *v >= minimum, "{}: \"{}\" = {} must be an integer >= {}", source_, key,
                shown(at(key)), minimum);
    return *v;
  }
  std::optional<std::int64_t> optional_integer(const char* key, std::int64_t minimum = 1) {
    used_.insert(key);
    if (!has(key)) return std::nullopt;
    return integer(key, minimum);
  }
  double number(const char* key, double fallback) {
    used_.insert(key);
    if (!has(key)) return fallback;
    OASES_CHECK(at(key).is_number(), "{}: \"{}\" = {} must be a number", source_, key,
                shown(at(key)));
    return at(key).get<double>();
  }
  bool boolean(const char* key, bool fallback) {
    used_.insert(key);
    if (!has(key)) return fallback;
    OASES_CHECK(at(key).is_boolean(), "{}: \"{}\" = {} must be true or false", source_, key,
                shown(at(key)));
    return at(key).get<bool>();
  }
  // The key, when present, must hold one of `accepted`; `why` says what oases computes.
  void require(const char* key, std::initializer_list<json> accepted, const char* why) {
    used_.insert(key);
    if (!has(key)) return;
    for (const json& a : accepted)
      if (at(key) == a) return;
    std::string valid;
    for (const json& a : accepted) valid += (valid.empty() ? "" : " or ") + a.dump();
    OASES_FAIL("{}: \"{}\" = {} cannot be honoured: {} ({} here)", source_, key, shown(at(key)),
               why, valid);
  }
  void mark(const char* key) { used_.insert(key); }
  void set_architecture(std::string name) { architecture_ = std::move(name); }

  // Every key is mapped, neutral, or an error naming it.
  void check_all_used() const {
    for (const auto& [key, value] : config_.items()) {
      if (used_.count(key)) continue;
      if (const auto at = kNeutralAt.find(key); at != kNeutralAt.end()) {
        OASES_CHECK(value.is_null() || value == at->second,
                    "{}: \"{}\" = {} changes the model, which oases cannot honour (it computes "
                    "the model as with {})",
                    source_, key, shown(value), at->second.dump());
        continue;
      }
      OASES_CHECK(kNeutralKeys.count(key),
                  "{}: key \"{}\" = {} is not one oases knows for a {} model; it may change "
                  "what the model computes, so it is not dropped silently (remove it from the "
                  "file if it does not apply)",
                  source_, key, shown(value), architecture_);
    }
  }

 private:
  const json& config_;
  std::string source_;
  std::string architecture_;
  std::set<std::string, std::less<>> used_;
};

void read_gpt2(ConfigReader& r, HfConfig& out) {
  ModelConfig& m = out.model;
  m.arch = ArchitectureKind::gpt;
  m.vocab_size = r.integer("vocab_size", 2);
  m.hidden = r.integer("n_embd");
  m.layers = r.integer("n_layer");
  m.heads = r.integer("n_head");
  m.ffn_hidden = r.optional_integer("n_inner").value_or(4 * m.hidden);
  m.max_positions = r.integer("n_positions");
  m.seq_len = m.max_positions;
  m.norm_eps = r.number("layer_norm_epsilon", 1e-5);
  // One dropout rate serves the embedding and both residual branches.
  const double resid = r.number("resid_pdrop", 0.1), embd = r.number("embd_pdrop", 0.1);
  OASES_CHECK(resid == embd,
              "{}: \"resid_pdrop\" = {} and \"embd_pdrop\" = {} differ; oases applies one rate "
              "(model.dropout) after the embedding and on both residual branches",
              r.source(), resid, embd);
  m.dropout = resid;
  m.attention_dropout = r.number("attn_pdrop", 0.1);
  r.require("activation_function", {"gelu_new", "gelu_pytorch_tanh"},
            "GPT-2 blocks compute GeLU's tanh approximation");
  r.require("scale_attn_weights", {true}, "attention scores are scaled by 1/sqrt(head_dim)");
  r.require("scale_attn_by_inverse_layer_idx", {false}, "attention scores are not scaled by layer");
  r.require("tie_word_embeddings", {true}, "the GPT-2 LM head is the word embedding");
  r.require("add_cross_attention", {false}, "GPT-2 blocks have no cross-attention");
  out.fixed_keys = {"arch",       "layers",        "hidden",   "heads",         "ffn_hidden",
                    "vocab_size", "max_positions", "norm_eps", "tie_embeddings"};
}

void read_llama(ConfigReader& r, HfConfig& out) {
  ModelConfig& m = out.model;
  m.arch = ArchitectureKind::llama;
  m.vocab_size = r.integer("vocab_size", 2);
  m.hidden = r.integer("hidden_size");
  m.layers = r.integer("num_hidden_layers");
  m.heads = r.integer("num_attention_heads");
  m.kv_heads = r.optional_integer("num_key_value_heads").value_or(m.heads);
  m.ffn_hidden = r.integer("intermediate_size");
  m.max_positions = r.optional_integer("max_position_embeddings").value_or(2048);
  m.seq_len = m.max_positions;
  m.norm_eps = r.number("rms_norm_eps", 1e-6);
  m.rope_theta = r.number("rope_theta", 10000);
  m.attention_dropout = r.number("attention_dropout", 0);
  m.tie_embeddings = r.boolean("tie_word_embeddings", false);
  r.require("hidden_act", {"silu"}, "LLaMA's MLP is SwiGLU, silu(gate) * up");
  r.require("attention_bias", {false}, "LLaMA's attention projections have no bias");
  r.require("mlp_bias", {false}, "LLaMA's MLP projections have no bias");
  if (const auto head_dim = r.optional_integer("head_dim"))
    OASES_CHECK(*head_dim * m.heads == m.hidden,
                "{}: \"head_dim\" = {} differs from hidden_size / num_attention_heads = {}; "
                "oases splits the hidden size evenly over the heads",
                r.source(), *head_dim, m.hidden / m.heads);
  r.mark("rope_scaling");
  if (r.has("rope_scaling")) {
    const json& s = r.at("rope_scaling");
    OASES_CHECK(s.is_object(), "{}: \"rope_scaling\" = {} must be an object or null", r.source(),
                shown(s));
    const json kind = s.contains("rope_type") ? s["rope_type"] : s.value("type", json());
    if (kind != "default") {
      OASES_CHECK(kind == "llama3",
                  "{}: \"rope_scaling\" has type {}; oases scales rotary frequencies as LLaMA 3 "
                  "does (\"rope_type\": \"llama3\") or not at all (null), and no other way",
                  r.source(), shown(kind));
      for (const auto& [key, value] : s.items()) {
        OASES_CHECK(key == "rope_type" || key == "type" || key == "factor" ||
                        key == "low_freq_factor" || key == "high_freq_factor" ||
                        key == "original_max_position_embeddings",
                    "{}: \"rope_scaling\".\"{}\" = {} is not a key of llama3 rope scaling "
                    "(factor, low_freq_factor, high_freq_factor, "
                    "original_max_position_embeddings)",
                    r.source(), key, shown(value));
        if (key != "rope_type" && key != "type")
          OASES_CHECK(value.is_number() && value.get<double>() > 0,
                      "{}: \"rope_scaling\".\"{}\" = {} must be a positive number", r.source(), key,
                      shown(value));
      }
      for (const char* key :
           {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        OASES_CHECK(s.contains(key), "{}: \"rope_scaling\" of type llama3 needs \"{}\"", r.source(),
                    key);
      m.rope_scaling_factor = s["factor"].get<double>();
      m.rope_low_freq_factor = s["low_freq_factor"].get<double>();
      m.rope_high_freq_factor = s["high_freq_factor"].get<double>();
      const auto original = io::json_integer<std::int64_t>(s["original_max_position_embeddings"]);
      OASES_CHECK(original && *original >= 1,
                  "{}: \"rope_scaling\".\"original_max_position_embeddings\" = {} must be a "
                  "positive integer",
                  r.source(), shown(s["original_max_position_embeddings"]));
      m.rope_original_max_positions = *original;
    }
  }
  out.fixed_keys = {"arch",     "layers",     "hidden",         "heads",
                    "kv_heads", "ffn_hidden", "vocab_size",     "max_positions",
                    "norm_eps", "rope_theta", "tie_embeddings", "rope_scaling_factor"};
  if (m.rope_scaling_factor > 0)
    for (const char* key :
         {"rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_positions"})
      out.fixed_keys.push_back(key);
}

void read_bert(ConfigReader& r, HfConfig& out) {
  ModelConfig& m = out.model;
  m.arch = ArchitectureKind::bert;
  m.vocab_size = r.integer("vocab_size", 2);
  m.hidden = r.integer("hidden_size");
  m.layers = r.integer("num_hidden_layers");
  m.heads = r.integer("num_attention_heads");
  m.ffn_hidden = r.integer("intermediate_size");
  m.max_positions = r.optional_integer("max_position_embeddings").value_or(512);
  m.seq_len = m.max_positions;
  m.norm_eps = r.number("layer_norm_eps", 1e-12);
  m.dropout = r.number("hidden_dropout_prob", 0.1);
  m.attention_dropout = r.number("attention_probs_dropout_prob", 0.1);
  r.require("hidden_act", {"gelu"}, "BERT's blocks compute the exact (erf) GeLU");
  r.require("type_vocab_size", {2}, "BERT's token-type table has two rows");
  r.require("position_embedding_type", {"absolute"}, "positions are learned absolute embeddings");
  r.require("tie_word_embeddings", {true}, "the masked-LM decoder is the word embedding");
  out.fixed_keys = {"arch",       "layers",        "hidden",   "heads",         "ffn_hidden",
                    "vocab_size", "max_positions", "norm_eps", "tie_embeddings"};
}

}  // namespace

HfConfig parse_hf_config(const json& config, const std::string& source) {
  OASES_CHECK(config.is_object(), "{} must hold a JSON object", source);
  HfConfig out;
  const std::string model_type = config.value("model_type", std::string());
  std::string architecture;
  if (config.contains("architectures")) {
    const json& list = config["architectures"];
    OASES_CHECK(list.is_array() && list.size() == 1 && list[0].is_string(),
                "{}: \"architectures\" = {} must name one class", source, shown(list));
    architecture = list[0].get<std::string>();
  }
  const ArchitectureNames* found = nullptr;
  for (const ArchitectureNames& a : kArchitectures)
    if (architecture == a.hf_class || (architecture.empty() && model_type == a.model_type))
      found = &a;
  std::string known;
  for (const ArchitectureNames& a : kArchitectures)
    known += fmt::format("{}{} (model_type \"{}\")", known.empty() ? "" : ", ", a.hf_class,
                         a.model_type);
  OASES_CHECK(found != nullptr,
              "{}: architecture \"{}\" (model_type \"{}\") is not one oases computes; it reads "
              "{}",
              source, architecture.empty() ? "(none)" : architecture, model_type, known);
  OASES_CHECK(model_type.empty() || model_type == found->model_type,
              "{}: \"model_type\" = \"{}\" does not fit \"architectures\" = [\"{}\"] (expected "
              "\"{}\")",
              source, model_type, found->hf_class, found->model_type);
  out.architecture = found->hf_class;
  ConfigReader reader(config, source);
  reader.set_architecture(found->hf_class);
  switch (found->arch) {
    case ArchitectureKind::gpt:
      read_gpt2(reader, out);
      break;
    case ArchitectureKind::llama:
      read_llama(reader, out);
      break;
    case ArchitectureKind::bert:
      read_bert(reader, out);
      break;
  }
  reader.check_all_used();
  const char* dtype_key = config.contains("torch_dtype") ? "torch_dtype" : "dtype";
  if (config.contains(dtype_key) && config[dtype_key].is_string())
    out.torch_dtype = config[dtype_key].get<std::string>();
  out.bos_token_id = config.value("bos_token_id", json());
  out.eos_token_id = config.value("eos_token_id", json());
  out.pad_token_id = config.value("pad_token_id", json());
  try {
    out.model.validate();
  } catch (const UserError& e) {
    OASES_FAIL("{}: the model it describes is not one oases can build: {}", source, e.what());
  }
  return out;
}

bool is_hf_model_folder(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(fs::path(dir) / kHfConfigFile, ec);
}

HfConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kHfConfigFile).string();
  std::error_code ec;
  OASES_CHECK(fs::is_regular_file(path, ec),
              "'{}' holds no {}: a Hugging Face model folder has one (with the weights in "
              "model.safetensors or shards named by model.safetensors.index.json)",
              dir, kHfConfigFile);
  const std::string text = read_regular_file(path, "model config", kMaxConfigBytes);
  json config;
  try {
    config = io::parse_untrusted_json(text, path);
  } catch (const json::exception& e) {
    OASES_FAIL("{} is not valid JSON: {}", path, e.what());
  }
  return parse_hf_config(config, path);
}

std::vector<HfSetting> hf_settings(const HfConfig& config) {
  std::vector<HfSetting> out;
  for (const std::string& key : config.fixed_keys) out.push_back({key, true});
  for (const char* key : {"seq_len", "dropout", "attention_dropout"}) out.push_back({key, false});
  return out;
}

json hf_config_json(const ModelConfig& m, std::string_view torch_dtype, const json& bos_token_id,
                    const json& eos_token_id, const json& pad_token_id) {
  OASES_CHECK(!m.has_moe(),
              "model.moe_every = {}: a mixture-of-experts model has no Hugging Face class among "
              "those oases writes (GPT2LMHeadModel, LlamaForCausalLM, BertForMaskedLM); it "
              "cannot be exported as a model folder",
              m.moe_every);
  const ArchitectureNames& names = names_of(m.arch);
  json c = json::object();
  c["architectures"] = json::array({names.hf_class});
  c["model_type"] = names.model_type;
  switch (m.arch) {
    case ArchitectureKind::gpt:
      c["activation_function"] = "gelu_new";
      c["attn_pdrop"] = m.attention_dropout;
      c["embd_pdrop"] = m.dropout;
      c["resid_pdrop"] = m.dropout;
      c["initializer_range"] = 0.02;
      c["layer_norm_epsilon"] = m.norm_epsilon();
      c["n_embd"] = m.hidden;
      c["n_head"] = m.heads;
      c["n_inner"] = m.ffn_hidden == 4 * m.hidden ? json() : json(m.ffn_hidden);
      c["n_layer"] = m.layers;
      c["n_positions"] = m.position_count();
      c["n_ctx"] = m.position_count();
      c["scale_attn_by_inverse_layer_idx"] = false;
      c["scale_attn_weights"] = true;
      c["reorder_and_upcast_attn"] = false;
      c["tie_word_embeddings"] = true;
      break;
    case ArchitectureKind::llama:
      c["attention_bias"] = false;
      c["attention_dropout"] = m.attention_dropout;
      c["head_dim"] = m.head_dim();
      c["hidden_act"] = "silu";
      c["hidden_size"] = m.hidden;
      c["initializer_range"] = 0.02;
      c["intermediate_size"] = m.ffn_hidden;
      c["max_position_embeddings"] = m.position_count();
      c["mlp_bias"] = false;
      c["num_attention_heads"] = m.heads;
      c["num_hidden_layers"] = m.layers;
      c["num_key_value_heads"] = m.kv_head_count();
      c["pretraining_tp"] = 1;
      c["rms_norm_eps"] = m.norm_epsilon();
      c["rope_theta"] = m.rope_theta;
      c["rope_scaling"] =
          m.rope_scaling_factor > 0
              ? json{{"rope_type", "llama3"},
                     {"factor", m.rope_scaling_factor},
                     {"low_freq_factor", m.rope_low_freq_factor},
                     {"high_freq_factor", m.rope_high_freq_factor},
                     {"original_max_position_embeddings", m.rope_original_max_positions}}
              : json();
      c["tie_word_embeddings"] = m.tied_embeddings();
      break;
    case ArchitectureKind::bert:
      c["attention_probs_dropout_prob"] = m.attention_dropout;
      c["hidden_act"] = "gelu";
      c["hidden_dropout_prob"] = m.dropout;
      c["hidden_size"] = m.hidden;
      c["initializer_range"] = 0.02;
      c["intermediate_size"] = m.ffn_hidden;
      c["layer_norm_eps"] = m.norm_epsilon();
      c["max_position_embeddings"] = m.position_count();
      c["num_attention_heads"] = m.heads;
      c["num_hidden_layers"] = m.layers;
      c["position_embedding_type"] = "absolute";
      c["type_vocab_size"] = 2;
      break;
  }
  c["vocab_size"] = m.vocab_size;
  c["use_cache"] = m.arch != ArchitectureKind::bert;
  if (!torch_dtype.empty()) c["torch_dtype"] = std::string(torch_dtype);
  if (!bos_token_id.is_null()) c["bos_token_id"] = bos_token_id;
  if (!eos_token_id.is_null()) c["eos_token_id"] = eos_token_id;
  if (!pad_token_id.is_null()) c["pad_token_id"] = pad_token_id;
  return c;
}

std::string hf_tensor_name(const ModelConfig& model, const std::string& name) {
  return model.arch == ArchitectureKind::gpt ? "transformer." + name : name;
}

std::vector<std::string> hf_tensor_name_candidates(const ModelConfig& model,
                                                   const std::string& name) {
  std::vector<std::string> names = {name};
  if (model.arch == ArchitectureKind::gpt) names = {"transformer." + name, name};
  // Checkpoints written by old releases of BERT's code name LayerNorm's parameters gamma and
  // beta (bert-base-uncased's own file does); transformers renames them on loading.
  if (name.find("LayerNorm.") != std::string::npos) {
    const std::size_t count = names.size();
    for (std::size_t i = 0; i < count; ++i) {
      if (names[i].ends_with(".weight"))
        names.push_back(names[i].substr(0, names[i].size() - 7) + ".gamma");
      else if (names[i].ends_with(".bias"))
        names.push_back(names[i].substr(0, names[i].size() - 5) + ".beta");
    }
  }
  return names;
}

bool hf_unused_tensor(const ModelConfig& model, const std::string& name) {
  const auto ends = [&](std::string_view suffix) { return name.ends_with(suffix); };
  switch (model.arch) {
    case ArchitectureKind::gpt:
      return ends(".attn.bias") || ends(".attn.masked_bias") || name == "lm_head.weight";
    case ArchitectureKind::llama:
      return ends(".rotary_emb.inv_freq") || (model.tied_embeddings() && name == "lm_head.weight");
    case ArchitectureKind::bert:
      return name == "bert.embeddings.position_ids" || name.starts_with("bert.pooler.") ||
             name.starts_with("cls.seq_relationship.") ||
             name == "cls.predictions.decoder.weight" || name == "cls.predictions.decoder.bias";
  }
  return false;
}

}  // namespace oases::model
