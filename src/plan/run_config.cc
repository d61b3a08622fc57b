#include "plan/run_config.h"

#include "model/hf_config.h"

#include "core/error.h"
#include "core/named_values.h"
#include "core/regular_file.h"
#include "data/tokenizer.h"
#include "ops/moe.h"
#include "plan/settings.h"
#include "planner/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>

namespace oases::plan {
namespace {

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

std::string describe(const toml::node& node) {
  std::ostringstream out;
  if (auto s = node.as_string()) out << '"' << s->get() << '"';
  else if (node.is_table()) out << "{...}";
  else node.visit([&](auto&& v) { out << v; });
  return out.str();
}

// One field binding: how to read a key of a section into the RunConfig, and whether its value
// is text (a string or a word of a table), which a bare --set value gives as it is.
using Reader = std::function<void(const toml::node&, const std::string& key, RunConfig&)>;
struct Field {
  Reader read;
  bool takes_text = false;
};

template <class T>
Field bind(T RunConfig::*section, std::int64_t T::*field) {
  return Field{[=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<std::int64_t>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected an integer", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  }};
}
template <class T>
Field bind(T RunConfig::*section, double T::*field) {
  return Field{[=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    OASES_CHECK(node.is_number(), "config key {} = {} is {}; expected a number", key,
                describe(node), type_name(node));
    // toml++ gives no double for an integer beyond 2^53, which no double holds exactly.
    const std::optional<double> v = node.value<double>();
    OASES_CHECK(v.has_value(),
                "config key {} = {} has no exact floating-point value; write it as a "
                "floating-point number (with a decimal point or an exponent)",
                key, describe(node));
    (cfg.*section).*field = *v;
  }};
}
template <class T>
Field bind(T RunConfig::*section, bool T::*field) {
  return Field{[=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<bool>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected true or false", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  }};
}
template <class T>
Field bind(T RunConfig::*section, std::optional<bool> T::*field) {
  return Field{[=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<bool>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected true or false", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  }};
}
template <class T>
Field bind(T RunConfig::*section, std::string T::*field) {
  return Field{[=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<std::string>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected a string", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  }, true};
}
// A word of `table` (model.arch, model.moe_gate), parsed into the field's enum.
template <class T, class E, std::size_t N>
Field bind_word(T RunConfig::*section, E T::*field, const std::array<NamedValue<E>, N>& table) {
  return Field{[=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<std::string>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected a string", key,
                describe(node), type_name(node));
    (cfg.*section).*field = parse_named_value<E>(table, *v, key);
  }, true};
}

using SectionFields = std::map<std::string, Field>;

const std::map<std::string, SectionFields>& schema() {
  using M = model::ModelConfig;
  static const std::map<std::string, SectionFields> table = {
      {"model",
       {{"arch", bind_word(&RunConfig::model, &M::arch, model::kArchitectureNames)},
        {"layers", bind(&RunConfig::model, &M::layers)},
        {"hidden", bind(&RunConfig::model, &M::hidden)},
        {"heads", bind(&RunConfig::model, &M::heads)},
        {"kv_heads", bind(&RunConfig::model, &M::kv_heads)},
        {"ffn_hidden", bind(&RunConfig::model, &M::ffn_hidden)},
        {"vocab_size", bind(&RunConfig::model, &M::vocab_size)},
        {"seq_len", bind(&RunConfig::model, &M::seq_len)},
        {"dropout", bind(&RunConfig::model, &M::dropout)},
        {"attention_dropout", bind(&RunConfig::model, &M::attention_dropout)},
        {"tie_embeddings", bind(&RunConfig::model, &M::tie_embeddings)},
        {"norm_eps", bind(&RunConfig::model, &M::norm_eps)},
        // The name of norm_eps in configs written before LLaMA's RMSNorm existed.
        {"layernorm_eps", bind(&RunConfig::model, &M::norm_eps)},
        {"rope_theta", bind(&RunConfig::model, &M::rope_theta)},
        {"max_positions", bind(&RunConfig::model, &M::max_positions)},
        {"rope_scaling_factor", bind(&RunConfig::model, &M::rope_scaling_factor)},
        {"rope_low_freq_factor", bind(&RunConfig::model, &M::rope_low_freq_factor)},
        {"rope_high_freq_factor", bind(&RunConfig::model, &M::rope_high_freq_factor)},
        {"rope_original_max_positions", bind(&RunConfig::model, &M::rope_original_max_positions)},
        {"moe_every", bind(&RunConfig::model, &M::moe_every)},
        {"experts", bind(&RunConfig::model, &M::experts)},
        {"moe_gate", bind_word(&RunConfig::model, &M::moe_gate, ops::kMoeGateNames)},
        {"moe_top_k", bind(&RunConfig::model, &M::moe_top_k)},
        {"capacity_factor", bind(&RunConfig::model, &M::capacity_factor)},
        {"eval_capacity_factor", bind(&RunConfig::model, &M::eval_capacity_factor)},
        {"moe_group_size", bind(&RunConfig::model, &M::moe_group_size)},
        {"moe_aux_loss_coef", bind(&RunConfig::model, &M::moe_aux_loss_coef)},
        {"moe_z_loss_coef", bind(&RunConfig::model, &M::moe_z_loss_coef)},
        {"moe_router_noise", bind(&RunConfig::model, &M::moe_router_noise)},
        {"moe_init_scale", bind(&RunConfig::model, &M::moe_init_scale)},
        {"expert_dropout", bind(&RunConfig::model, &M::expert_dropout)},
        {"moe_ffn_hidden", bind(&RunConfig::model, &M::moe_ffn_hidden)}}},
      {"parallel",
       {{"tp", bind(&RunConfig::parallel, &ParallelConfig::tp)},
        {"dp", bind(&RunConfig::parallel, &ParallelConfig::dp)},
        {"pp", bind(&RunConfig::parallel, &ParallelConfig::pp)},
        {"ep", bind(&RunConfig::parallel, &ParallelConfig::ep)},
        {"expert_tp", bind(&RunConfig::parallel, &ParallelConfig::expert_tp)},
        {"cp", bind(&RunConfig::parallel, &ParallelConfig::cp)},
        {"cp_kind", bind(&RunConfig::parallel, &ParallelConfig::cp_kind)},
        {"pipeline", bind(&RunConfig::parallel, &ParallelConfig::pipeline)},
        {"virtual_stages", bind(&RunConfig::parallel, &ParallelConfig::virtual_stages)},
        {"pipeline_layers", bind(&RunConfig::parallel, &ParallelConfig::pipeline_layers)},
        {"schedule", bind(&RunConfig::parallel, &ParallelConfig::schedule)},
        {"recompute", bind(&RunConfig::parallel, &ParallelConfig::recompute)},
        {"recompute_every", bind(&RunConfig::parallel, &ParallelConfig::recompute_every)},
        {"activation_compression",
         bind(&RunConfig::parallel, &ParallelConfig::activation_compression)},
        {"partition_activations",
         bind(&RunConfig::parallel, &ParallelConfig::partition_activations)},
        {"sequence_parallel", bind(&RunConfig::parallel, &ParallelConfig::sequence_parallel)},
        {"bucket_bytes", bind(&RunConfig::parallel, &ParallelConfig::bucket_bytes)},
        {"sub_batches", bind(&RunConfig::parallel, &ParallelConfig::sub_batches)},
        {"plan", bind(&RunConfig::parallel, &ParallelConfig::plan)},
        {"memory_limit", bind(&RunConfig::parallel, &ParallelConfig::memory_limit)},
        {"dp_sync_every", bind(&RunConfig::parallel, &ParallelConfig::dp_sync_every)},
        {"zero", bind(&RunConfig::parallel, &ParallelConfig::zero)},
        {"zero3_reshard_after_forward",
         bind(&RunConfig::parallel, &ParallelConfig::zero3_reshard_after_forward)},
        {"offload", bind(&RunConfig::parallel, &ParallelConfig::offload)},
        {"offload_dir", bind(&RunConfig::parallel, &ParallelConfig::offload_dir)},
        {"comm_timeout_s", bind(&RunConfig::parallel, &ParallelConfig::comm_timeout_s)},
        {"startup_timeout_s", bind(&RunConfig::parallel, &ParallelConfig::startup_timeout_s)}}},
      {"train",
       {{"micro_batch", bind(&RunConfig::train, &OptimConfig::micro_batch)},
        {"global_batch", bind(&RunConfig::train, &OptimConfig::global_batch)},
        {"steps", bind(&RunConfig::train, &OptimConfig::steps)},
        {"lr", bind(&RunConfig::train, &OptimConfig::lr)},
        {"min_lr", bind(&RunConfig::train, &OptimConfig::min_lr)},
        {"warmup_steps", bind(&RunConfig::train, &OptimConfig::warmup_steps)},
        {"lr_decay_steps", bind(&RunConfig::train, &OptimConfig::lr_decay_steps)},
        {"weight_decay", bind(&RunConfig::train, &OptimConfig::weight_decay)},
        {"beta1", bind(&RunConfig::train, &OptimConfig::beta1)},
        {"beta2", bind(&RunConfig::train, &OptimConfig::beta2)},
        {"eps", bind(&RunConfig::train, &OptimConfig::eps)},
        {"grad_clip", bind(&RunConfig::train, &OptimConfig::grad_clip)},
        {"max_loss", bind(&RunConfig::train, &OptimConfig::max_loss)},
        {"optimizer", bind(&RunConfig::train, &OptimConfig::optimizer)},
        {"momentum", bind(&RunConfig::train, &OptimConfig::momentum)},
        {"nesterov", bind(&RunConfig::train, &OptimConfig::nesterov)},
        {"adafactor_beta1", bind(&RunConfig::train, &OptimConfig::adafactor_beta1)},
        {"precision", bind(&RunConfig::train, &OptimConfig::precision)},
        {"grad_reduce_dtype", bind(&RunConfig::train, &OptimConfig::grad_reduce_dtype)},
        {"gemm16_path", bind(&RunConfig::train, &OptimConfig::gemm16_path)},
        {"loss_scale", bind(&RunConfig::train, &OptimConfig::loss_scale)},
        {"initial_loss_scale", bind(&RunConfig::train, &OptimConfig::initial_loss_scale)},
        {"min_loss_scale", bind(&RunConfig::train, &OptimConfig::min_loss_scale)},
        {"loss_scale_window", bind(&RunConfig::train, &OptimConfig::loss_scale_window)},
        {"hysteresis", bind(&RunConfig::train, &OptimConfig::hysteresis)},
        {"seed", bind(&RunConfig::train, &OptimConfig::seed)},
        {"eval_every", bind(&RunConfig::train, &OptimConfig::eval_every)},
        {"eval_steps", bind(&RunConfig::train, &OptimConfig::eval_steps)},
        {"threads", bind(&RunConfig::train, &OptimConfig::threads)},
        {"save_on_signal", bind(&RunConfig::train, &OptimConfig::save_on_signal)},
        {"save_signals", bind(&RunConfig::train, &OptimConfig::save_signals)},
        {"straggler_warn_ratio", bind(&RunConfig::train, &OptimConfig::straggler_warn_ratio)}}},
      {"data",
       {{"path", bind(&RunConfig::data, &DataConfig::path)},
        {"tokenizer", bind(&RunConfig::data, &DataConfig::tokenizer)},
        {"tokenizer_model", bind(&RunConfig::data, &DataConfig::tokenizer_model)},
        {"shuffle", bind(&RunConfig::data, &DataConfig::shuffle)}}},
      {"checkpoint",
       {{"dir", bind(&RunConfig::checkpoint, &CheckpointConfig::dir)},
        {"every", bind(&RunConfig::checkpoint, &CheckpointConfig::every)},
        {"keep", bind(&RunConfig::checkpoint, &CheckpointConfig::keep)},
        {"resume", bind(&RunConfig::checkpoint, &CheckpointConfig::resume)},
        {"async", bind(&RunConfig::checkpoint, &CheckpointConfig::async)}}},
      {"log",
       {{"every", bind(&RunConfig::log, &LogConfig::every)},
        {"metrics", bind(&RunConfig::log, &LogConfig::metrics)},
        {"trace", bind(&RunConfig::log, &LogConfig::trace)},
        {"trace_steps", bind(&RunConfig::log, &LogConfig::trace_steps)},
        {"peak_tflops", bind(&RunConfig::log, &LogConfig::peak_tflops)},
        {"flight_records", bind(&RunConfig::log, &LogConfig::flight_records)},
        {"flight_dir", bind(&RunConfig::log, &LogConfig::flight_dir)}}},
  };
  return table;
}

std::string keys_of(const SectionFields& fields) {
  std::vector<std::string> names;
  for (const auto& [name, field] : fields) names.push_back(name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string section_names() {
  std::vector<std::string> names;
  for (const auto& [name, fields] : schema()) names.push_back("[" + name + "]");
  return fmt::format("{}", fmt::join(names, ", "));
}

const SectionFields& section_fields(const std::string& section, const std::string& where) {
  auto it = schema().find(section);
  OASES_CHECK(it != schema().end(), "{}: unknown config section [{}]; valid sections: {}", where,
              section, section_names());
  return it->second;
}

const Field& field_of(const std::string& section, const std::string& key,
                      const std::string& where) {
  const SectionFields& fields = section_fields(section, where);
  auto it = fields.find(key);
  OASES_CHECK(it != fields.end(), "{}: unknown config key {}.{}; valid keys in [{}]: {}", where,
              section, key, section, keys_of(fields));
  return it->second;
}

// Whether `text` is well-formed UTF-8, as a TOML document must be: no stray or missing
// continuation bytes, overlong forms, surrogates or code points above U+10FFFF.
bool is_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // The lead byte gives the number of continuation bytes and the smallest code point that
    // needs that many.
    std::size_t extra = 0;
    std::uint32_t least = 0;
    if ((lead & 0xE0) == 0xC0) {
      extra = 1;
      least = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      extra = 2;
      least = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      extra = 3;
      least = 0x10000;
    } else {
      return false;
    }
    std::uint32_t code = lead & (0x3Fu >> extra);
    if (text.size() - i - 1 < extra) return false;
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3Fu);
    }
    if (code < least || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

// The value of `--set key=text` for a key whose value is text: a valid TOML value is that
// value (a quoted string; anything else its reader rejects, naming the type it wants); what is
// not TOML is the text as typed (a bare word, a path, a list of counts such as 1,1,2,2, a word
// that starts with a digit such as 1f1b), which like any TOML text must be UTF-8 (the
// configuration is stored with checkpoints as TOML and read back from there).
toml::table text_override(const std::string& section, const std::string& key,
                          const std::string& value, const std::string& origin) {
  try {
    return toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
  }
  OASES_CHECK(is_utf8(value),
              "{} {}.{}: the value is not valid UTF-8 text; config values are TOML, which "
              "holds only UTF-8",
              origin, section, key);
  return toml::table{{"v", value}};
}

// The value of `--set key=value` for a key whose value is a number or a boolean: TOML syntax.
toml::table typed_override(const std::string& assignment, const std::string& value,
                           const std::string& origin) {
  try {
    return toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    // A bare word is read as text, which the key's reader then rejects naming the type it
    // wants; something that starts like a number but is not a valid TOML value (too large an
    // integer, a malformed float) is an error here.
    const bool numeric = !value.empty() &&
                         (std::isdigit(static_cast<unsigned char>(value[0])) || value[0] == '+' ||
                          value[0] == '-' || value[0] == '.');
    OASES_CHECK(!numeric, "{} {}: '{}' is not a valid value: {} (integers must fit in 64 bits)",
                origin, assignment, value, std::string(e.description()));
    return toml::table{{"v", value}};
  }
}

// `origin` names where the assignment comes from in messages: "--set", or a plan file.
void apply_override(toml::table& root, const std::string& assignment,
                    const std::string& origin = "--set") {
  const auto eq = assignment.find('=');
  OASES_CHECK(eq != std::string::npos && eq > 0,
              "{} {}: expected section.key=value (for example --set train.lr=3e-4)", origin,
              assignment);
  const std::string path = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const auto dot = path.find('.');
  OASES_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < path.size(),
              "{} {}: the key must be section.key (for example train.lr)", origin, assignment);
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  // The name is checked before the value.
  const toml::table parsed = field_of(section, key, origin).takes_text
                                 ? text_override(section, key, value, origin)
                                 : typed_override(assignment, value, origin);
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* target = root[section].as_table();
  OASES_CHECK(target != nullptr, "config: [{}] must be a table", section);
  target->insert_or_assign(key, *parsed["v"].node());
}

// The settings of the plan file parallel.plan names (planner::read_plan_settings), after the
// config and `overrides`, applied as `--set` assignments over the config's values; a setting
// the user also gave by --set must have the same value. Returns the plan file's path, or empty
// when parallel.plan names no plan file with settings (a keyword, degrees, a file that does not
// exist: validation names it).
std::string apply_plan_settings(toml::table& root, const std::vector<std::string>& overrides) {
  const std::optional<std::string> plan = root.at_path("parallel.plan").value_exact<std::string>();
  if (!plan || layer_plan_source(*plan) != LayerPlanSource::file) return "";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(*plan, ec)) return "";
  const std::vector<std::pair<std::string, std::string>> settings =
      planner::read_plan_settings(*plan);
  if (settings.empty()) return "";
  // The user's last assignment of each key.
  std::map<std::string, std::string> assigned;
  for (const std::string& assignment : overrides)
    assigned[assignment.substr(0, assignment.find('='))] = assignment;
  const std::string origin = fmt::format("plan file '{}'", *plan);
  for (const auto& [key, value] : settings) {
    const std::string assignment = key + "=" + value;
    if (const auto user = assigned.find(key); user != assigned.end()) {
      toml::table theirs, mine;
      apply_override(theirs, assignment, origin);
      apply_override(mine, user->second);
      OASES_CHECK(mine == theirs,
                  "--set {} differs from the plan file '{}' (parallel.plan), which sets {}; drop "
                  "--set {} or edit the plan",
                  user->second, *plan, assignment, key);
    }
    apply_override(root, assignment, origin);
  }
  return *plan;
}

toml::table model_table(const model::ModelConfig& m);

// The value a [model] key has in effect for `m` (kv_heads 0 is heads, norm_eps 0 the
// architecture's, ...), as text, for comparing a run's setting with a model folder's.
std::string effective_model_value(const model::ModelConfig& m, const std::string& key) {
  if (key == "arch") return std::string(model::name(m.arch));
  if (key == "kv_heads") return std::to_string(m.kv_head_count());
  if (key == "norm_eps") return fmt::format("{}", m.norm_epsilon());
  if (key == "tie_embeddings") return m.tied_embeddings() ? "true" : "false";
  if (key == "max_positions") return std::to_string(m.position_count());
  const toml::table table = model_table(m);
  if (const toml::node* node = table.get(key)) {
    if (const auto* v = node->as_integer()) return std::to_string(v->get());
    if (const auto* v = node->as_floating_point()) return fmt::format("{}", v->get());
    if (const auto* v = node->as_boolean()) return v->get() ? "true" : "false";
    if (const auto* v = node->as_string()) return v->get();
  }
  if (key == "rope_scaling_factor") return fmt::format("{}", m.rope_scaling_factor);
  if (key == "rope_low_freq_factor") return fmt::format("{}", m.rope_low_freq_factor);
  if (key == "rope_high_freq_factor") return fmt::format("{}", m.rope_high_freq_factor);
  if (key == "rope_original_max_positions") return std::to_string(m.rope_original_max_positions);
  OASES_FAIL("no effective value for model.{}", key);
}

// Gives [model] the settings of a model folder (see load_run_config_from_folder): a fixed
// setting the run states must have the folder's value; the others are filled in.
void apply_model_folder(toml::table& root, const model::HfConfig& folder,
                        const std::string& folder_path, const std::string& source) {
  if (!root.contains("model")) root.insert("model", toml::table{});
  toml::table* model = root["model"].as_table();
  OASES_CHECK(model != nullptr, "{}: model must be a table [model]", source);
  const toml::table folder_values = model_table(folder.model);
  RunConfig from_folder;
  from_folder.model = folder.model;
  for (const model::HfSetting& setting : model::hf_settings(folder)) {
    if (const toml::node* given = model->get(setting.key)) {
      if (!setting.fixed) continue;
      RunConfig probe = from_folder;
      field_of("model", setting.key, source).read(*given, "model." + setting.key, probe);
      const std::string stated = effective_model_value(probe.model, setting.key);
      const std::string expected = effective_model_value(folder.model, setting.key);
      OASES_CHECK(stated == expected,
                  "model.{} = {} in {} differs from the model folder '{}', whose config.json "
                  "gives {}; leave model.{} out (the folder's value is taken) or set it to {}",
                  setting.key, stated, source, folder_path, expected, setting.key, expected);
      continue;
    }
    const toml::node* value = folder_values.get(setting.key);
    if (value != nullptr) {
      model->insert(setting.key, *value);
    } else if (setting.key == "max_positions") {
      model->insert(setting.key, folder.model.position_count());
    } else if (setting.key == "rope_scaling_factor") {
      model->insert(setting.key, folder.model.rope_scaling_factor);
    }
  }
  // The folder's tokenizer, unless the run names one.
  const std::optional<data::TokenizerKind> tokenizer = data::folder_tokenizer_kind(folder_path);
  if (!root.contains("data")) root.insert("data", toml::table{});
  toml::table* data = root["data"].as_table();
  OASES_CHECK(data != nullptr, "{}: data must be a table [data]", source);
  if (tokenizer && !data->contains("tokenizer") && !data->contains("tokenizer_model")) {
    data->insert("tokenizer", std::string(data::name(*tokenizer)));
    data->insert("tokenizer_model", folder_path);
  }
}

RunConfig parse_config_root(const std::string& toml_text, const std::string& source,
                            const std::vector<std::string>& overrides,
                            const model::HfConfig* folder, const std::string& folder_path) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    OASES_FAIL("config {} is not valid TOML: {} (line {}, column {})", source, e.description(),
               e.source().begin.line, e.source().begin.column);
  }
  for (const auto& assignment : overrides) apply_override(root, assignment);
  const std::string plan_file = apply_plan_settings(root, overrides);
  if (folder != nullptr) apply_model_folder(root, *folder, folder_path, source);

  RunConfig config;
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const SectionFields& fields = section_fields(section, source);
    const toml::table* table = section_node.as_table();
    OASES_CHECK(table != nullptr, "{}: {} must be a table [{}], found {}", source, section,
                section, type_name(section_node));
    (void)fields;
    for (const auto& [key_node, value] : *table) {
      const std::string key(key_node.str());
      // TOML strings may hold NUL ("\u0000"), which the operating system reads as the end of
      // a path and C strings as the end of a message.
      if (const auto* text = value.as_string())
        check_path_has_no_nul(text->get(), section + "." + key);
      field_of(section, key, source).read(value, section + "." + key, config);
    }
  }
  if (plan_file.empty()) {
    config.validate();
    return config;
  }
  try {
    config.validate();
  } catch (const UserError& e) {
    // A setting the plan gave may be the one at fault.
    throw UserError(fmt::format("{} (parallel.plan = \"{}\" sets some of the run's settings)",
                                e.what(), plan_file),
                    e.location());
  }
  return config;
}

}  // namespace

RunConfig parse_run_config(const std::string& toml_text, const std::string& source,
                           const std::vector<std::string>& overrides) {
  return parse_config_root(toml_text, source, overrides, nullptr, "");
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_run_config(read_regular_file(path, "config file", kMaxTextFileBytes), path,
                          overrides);
}

RunConfig parse_run_config_with_folder(const std::string& toml_text, const std::string& source,
                                       const std::vector<std::string>& overrides,
                                       const std::string& folder) {
  const model::HfConfig hf = model::read_hf_config(folder);
  return parse_config_root(toml_text, source, overrides, &hf, folder);
}

RunConfig load_run_config_from_folder(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      const std::string& folder) {
  return parse_run_config_with_folder(read_regular_file(path, "config file", kMaxTextFileBytes),
                                      path, overrides, folder);
}

// The flags to_toml prints with. toml++'s defaults write a string that holds a line break as
// a multi-line literal ('''...'''), which cannot hold ''' and loses a leading line break when
// read back; single-line quoted strings with escapes hold every string.
constexpr toml::format_flags kRoundTripFormat =
    toml::toml_formatter::default_flags &
    ~(toml::format_flags::allow_literal_strings | toml::format_flags::allow_multi_line_strings);


namespace {

// The [model] section; the mixture-of-experts keys only for a model that has experts.
toml::table model_table(const model::ModelConfig& m) {
  toml::table model{{"arch", std::string(model::name(m.arch))}, {"layers", m.layers},
                                   {"hidden", m.hidden}, {"heads", m.heads},
                                   {"kv_heads", m.kv_head_count()},
                                   {"ffn_hidden", m.ffn_hidden},
                                   {"vocab_size", m.vocab_size},
                                   {"seq_len", m.seq_len}, {"dropout", m.dropout},
                                   {"attention_dropout", m.attention_dropout},
                                   {"tie_embeddings", m.tied_embeddings()},
                                   {"norm_eps", m.norm_epsilon()},
                                   {"rope_theta", m.rope_theta}};
  if (m.max_positions > 0) model.insert("max_positions", m.max_positions);
  if (m.rope_scaling_factor > 0) {
    model.insert("rope_scaling_factor", m.rope_scaling_factor);
    model.insert("rope_low_freq_factor", m.rope_low_freq_factor);
    model.insert("rope_high_freq_factor", m.rope_high_freq_factor);
    model.insert("rope_original_max_positions", m.rope_original_max_positions);
  }
  if (m.moe_every > 0) {
    model.insert("moe_every", m.moe_every);
    model.insert("experts", m.experts);
    model.insert("moe_gate", std::string(ops::moe_gate_name(m.moe_gate)));
    model.insert("moe_top_k", m.moe_gate == ops::MoeGate::expert_choice ? std::int64_t{0}
                                                                   : std::int64_t{m.moe_choices()});
    model.insert("capacity_factor", m.capacity_factor);
    model.insert("eval_capacity_factor", m.moe_eval_capacity_factor());
    model.insert("moe_group_size", m.moe_group_tokens());
    model.insert("moe_aux_loss_coef", m.moe_aux_loss_coef);
    model.insert("moe_z_loss_coef", m.moe_z_loss_coef);
    model.insert("moe_router_noise", m.moe_router_noise);
    model.insert("moe_init_scale", m.moe_init_scale);
    model.insert("expert_dropout", m.expert_dropout);
    model.insert("moe_ffn_hidden", m.expert_ffn_hidden());
  }
  return model;
}

}  // namespace

std::string to_toml(const RunConfig& c) {
  toml::table root;
  root.insert("model", model_table(c.model));
  root.insert("parallel",
              toml::table{{"tp", c.parallel.tp},
                          {"dp", c.parallel.dp},
                          {"pp", c.parallel.pp},
                          {"ep", c.parallel.ep},
                          {"expert_tp", c.parallel.expert_tp},
                          {"cp", c.parallel.cp},
                          {"cp_kind", c.parallel.cp_kind},
                          {"pipeline", c.parallel.pipeline},
                          {"virtual_stages", c.parallel.virtual_stages},
                          {"pipeline_layers", c.parallel.pipeline_layers},
                          {"schedule", c.parallel.schedule},
                          {"recompute", c.parallel.recompute},
                          {"recompute_every", c.parallel.recompute_every},
                          {"activation_compression", c.parallel.activation_compression},
                          {"partition_activations", c.parallel.partition_activations},
                          {"sequence_parallel", c.parallel.sequence_parallel},
                          {"bucket_bytes", c.parallel.bucket_bytes},
                          {"sub_batches", c.parallel.sub_batches},
                          {"plan", c.parallel.plan},
                          {"memory_limit", c.parallel.memory_limit},
                          {"dp_sync_every", c.parallel.dp_sync_every},
                          {"zero", c.parallel.zero},
                          {"zero3_reshard_after_forward", c.parallel.zero3_reshard_after_forward},
                          {"offload", c.parallel.offload},
                          {"offload_dir", c.parallel.offload_dir},
                          {"comm_timeout_s", c.parallel.comm_timeout_s},
                          {"startup_timeout_s", c.parallel.startup_timeout_s}});
  const auto& t = c.train;
  root.insert("train", toml::table{{"micro_batch", t.micro_batch}, {"global_batch", t.global_batch},
                                   {"steps", t.steps}, {"lr", t.lr}, {"min_lr", t.min_lr},
                                   {"warmup_steps", t.warmup_steps},
                                   {"lr_decay_steps", t.lr_decay_steps},
                                   {"weight_decay", t.weight_decay}, {"beta1", t.beta1},
                                   {"beta2", t.beta2}, {"eps", t.eps}, {"grad_clip", t.grad_clip},
                                   {"max_loss", t.max_loss},
                                   {"optimizer", t.optimizer}, {"momentum", t.momentum},
                                   {"nesterov", t.nesterov},
                                   {"adafactor_beta1", t.adafactor_beta1},
                                   {"precision", t.precision},
                                   {"grad_reduce_dtype", t.grad_reduce_dtype},
                                   {"gemm16_path", t.gemm16_path}, {"loss_scale", t.loss_scale},
                                   {"initial_loss_scale", t.initial_loss_scale},
                                   {"min_loss_scale", t.min_loss_scale},
                                   {"loss_scale_window", t.loss_scale_window},
                                   {"hysteresis", t.hysteresis}, {"seed", t.seed},
                                   {"eval_every", t.eval_every},
                                   {"eval_steps", t.eval_steps}, {"threads", t.threads},
                                   {"save_on_signal", t.save_on_signal},
                                   {"save_signals", t.save_signals},
                                   {"straggler_warn_ratio", t.straggler_warn_ratio}});
  root.insert("data", toml::table{{"path", c.data.path}, {"tokenizer", c.data.tokenizer},
                                  {"tokenizer_model", c.data.tokenizer_model},
                                  {"shuffle", c.data.shuffle}});
  root.insert("checkpoint", toml::table{{"dir", c.checkpoint.dir}, {"every", c.checkpoint.every},
                                        {"keep", c.checkpoint.keep},
                                        {"resume", c.checkpoint.resume},
                                        {"async", c.checkpoint.async}});
  root.insert("log", toml::table{{"every", c.log.every}, {"metrics", c.log.metrics},
                                 {"trace", c.log.trace}, {"trace_steps", c.log.trace_steps},
                                 {"peak_tflops", c.log.peak_tflops},
                                 {"flight_records", c.log.flight_records},
                                 {"flight_dir", c.log.flight_dir}});
  std::ostringstream out;
  out << toml::toml_formatter(root, kRoundTripFormat);
  return out.str();
}

namespace {

// Whether data.tokenizer names a tokenizer only its files describe, which have no default.
bool needs_model_file(const RunConfig& config) {
  const auto kind = data::tokenizer_kind(config.data.tokenizer);
  return kind == data::TokenizerKind::sentencepiece || kind == data::TokenizerKind::wordpiece;
}

// Whether the tokenizer's name says all training needs of it (byte; gpt2 from its files).
bool named_fully(const RunConfig& config) {
  return data::known_vocab_size(config.data.tokenizer).has_value();
}

}  // namespace

std::string tokenizer_model_path(const RunConfig& config) {
  if (!config.data.tokenizer_model.empty()) return config.data.tokenizer_model;
  if (config.data.path.empty()) return "";
  std::error_code ec;
  const std::string folder = data::tokenizer_folder_beside_shards(config.data.path);
  if (!named_fully(config) && std::filesystem::is_directory(folder, ec)) return folder;
  if (data::tokenizer_kind(config.data.tokenizer) != data::TokenizerKind::sentencepiece) return "";
  const std::string beside = data::tokenizer_model_beside_shards(config.data.path);
  return std::filesystem::exists(beside, ec) ? beside : "";
}

std::unique_ptr<data::Tokenizer> load_run_tokenizer(const RunConfig& config) {
  const std::string path = tokenizer_model_path(config);
  if (path.empty() && named_fully(config)) return nullptr;
  const std::string prefix = config.data.path.empty() ? std::string("PREFIX") : config.data.path;
  const bool sentencepiece =
      data::tokenizer_kind(config.data.tokenizer) == data::TokenizerKind::sentencepiece;
  OASES_CHECK(!path.empty() || !needs_model_file(config),
              "data.tokenizer = \"{}\" needs its model file: set data.tokenizer_model to the "
              "{} (or its Hugging Face model folder), or run `oases prepare-data --tokenizer {} "
              "--tokenizer-model {} --output {}`, which copies it to '{}' where training looks "
              "by default",
              config.data.tokenizer,
              sentencepiece ? ".model file (made by `oases train-tokenizer`)" : "vocab.txt",
              config.data.tokenizer, sentencepiece ? "P.model" : "DIR", prefix,
              sentencepiece ? data::tokenizer_model_beside_shards(prefix)
                            : data::tokenizer_folder_beside_shards(prefix));
  std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(config.data.tokenizer, path);
  OASES_CHECK(config.model.vocab_size >= tokenizer->vocab_size(),
              "model.vocab_size = {} is smaller than the vocabulary of the {} tokenizer '{}' ({} "
              "tokens); set model.vocab_size to at least {}",
              config.model.vocab_size, tokenizer->name(), path, tokenizer->vocab_size(),
              tokenizer->vocab_size());
  return tokenizer;
}


std::vector<std::string> config_key_names() {
  std::vector<std::string> names;
  for (const auto& [section, fields] : schema())
    for (const auto& [key, field] : fields) names.push_back(section + "." + key);
  return names;
}

}  // namespace oases::plan
