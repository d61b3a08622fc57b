#include "plan/run_config.h"

#include "core/error.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "planner/planner.h"
#include "planner/stage_partition.h"
#include "schedule/pipeline.h"

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

// One field binding: how to read a key of a section into the RunConfig.
using Reader = std::function<void(const toml::node&, const std::string& key, RunConfig&)>;

template <class T>
Reader bind(T RunConfig::*section, std::int64_t T::*field) {
  return [=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<std::int64_t>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected an integer", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  };
}
template <class T>
Reader bind(T RunConfig::*section, double T::*field) {
  return [=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    OASES_CHECK(node.is_number(), "config key {} = {} is {}; expected a number", key,
                describe(node), type_name(node));
    // toml++ gives no double for an integer beyond 2^53, which no double holds exactly.
    const std::optional<double> v = node.value<double>();
    OASES_CHECK(v.has_value(),
                "config key {} = {} has no exact floating-point value; write it as a "
                "floating-point number (with a decimal point or an exponent)",
                key, describe(node));
    (cfg.*section).*field = *v;
  };
}
template <class T>
Reader bind(T RunConfig::*section, bool T::*field) {
  return [=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<bool>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected true or false", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  };
}
template <class T>
Reader bind(T RunConfig::*section, std::optional<bool> T::*field) {
  return [=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<bool>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected true or false", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  };
}
template <class T>
Reader bind(T RunConfig::*section, std::string T::*field) {
  return [=](const toml::node& node, const std::string& key, RunConfig& cfg) {
    auto v = node.value_exact<std::string>();
    OASES_CHECK(v.has_value(), "config key {} = {} is {}; expected a string", key,
                describe(node), type_name(node));
    (cfg.*section).*field = *v;
  };
}

using SectionFields = std::map<std::string, Reader>;

const std::map<std::string, SectionFields>& schema() {
  using M = model::ModelConfig;
  static const std::map<std::string, SectionFields> table = {
      {"model",
       {{"arch", bind(&RunConfig::model, &M::arch)},
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
        {"moe_every", bind(&RunConfig::model, &M::moe_every)},
        {"experts", bind(&RunConfig::model, &M::experts)},
        {"moe_gate", bind(&RunConfig::model, &M::moe_gate)},
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
        {"threads", bind(&RunConfig::train, &OptimConfig::threads)}}},
      {"data",
       {{"path", bind(&RunConfig::data, &DataConfig::path)},
        {"tokenizer", bind(&RunConfig::data, &DataConfig::tokenizer)},
        {"tokenizer_model", bind(&RunConfig::data, &DataConfig::tokenizer_model)},
        {"shuffle", bind(&RunConfig::data, &DataConfig::shuffle)}}},
      {"checkpoint",
       {{"dir", bind(&RunConfig::checkpoint, &CheckpointConfig::dir)},
        {"every", bind(&RunConfig::checkpoint, &CheckpointConfig::every)},
        {"keep", bind(&RunConfig::checkpoint, &CheckpointConfig::keep)},
        {"resume", bind(&RunConfig::checkpoint, &CheckpointConfig::resume)}}},
      {"log",
       {{"every", bind(&RunConfig::log, &LogConfig::every)},
        {"metrics", bind(&RunConfig::log, &LogConfig::metrics)},
        {"trace", bind(&RunConfig::log, &LogConfig::trace)},
        {"trace_steps", bind(&RunConfig::log, &LogConfig::trace_steps)},
        {"peak_tflops", bind(&RunConfig::log, &LogConfig::peak_tflops)}}},
  };
  return table;
}

std::string keys_of(const SectionFields& fields) {
  std::vector<std::string> names;
  for (const auto& [name, reader] : fields) names.push_back(name);
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

const Reader& field_reader(const std::string& section, const std::string& key,
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

// "2,4" or "1, 1, 2, 2": non-negative integers separated by commas (two or more).
bool is_count_list(std::string_view text) {
  bool digit_before = false, saw_comma = false;
  for (const char c : text) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digit_before = true;
    } else if (c == ',') {
      if (!digit_before) return false;
      digit_before = false;
      saw_comma = true;
    } else if (c != ' ') {
      return false;
    }
  }
  return saw_comma && digit_before;
}

void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  OASES_CHECK(eq != std::string::npos && eq > 0,
              "--set {}: expected section.key=value (for example --set train.lr=3e-4)",
              assignment);
  const std::string path = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const auto dot = path.find('.');
  OASES_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < path.size(),
              "--set {}: the key must be section.key (for example train.lr)", assignment);
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  field_reader(section, key, "--set");  // validates the name before the value
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    // A bare word or path is a string; something that starts like a number but is not a
    // valid TOML value (too large an integer, a malformed float) is an error.
    // A list of counts such as 1,1,2,2 (parallel.plan, parallel.pipeline_layers) is a string
    // too: TOML reads it as nothing else.
    const bool numeric = !value.empty() && !is_count_list(value) &&
                         (std::isdigit(static_cast<unsigned char>(value[0])) || value[0] == '+' ||
                          value[0] == '-' || value[0] == '.');
    OASES_CHECK(!numeric, "--set {}: '{}' is not a valid value: {} (integers must fit in 64 bits)",
                assignment, value, std::string(e.description()));
    // A bare word: a string, which like any TOML text must be UTF-8 (the configuration is
    // stored with checkpoints as TOML and read back from there).
    OASES_CHECK(is_utf8(value),
                "--set {}.{}: the value is not valid UTF-8 text; config values are TOML, which "
                "holds only UTF-8",
                section, key);
    parsed = toml::table{{"v", value}};
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* target = root[section].as_table();
  OASES_CHECK(target != nullptr, "config: [{}] must be a table", section);
  target->insert_or_assign(key, *parsed["v"].node());
}

// The divisors of n, for messages that list the valid values ("1, 2, 4"). Only those up to
// 4096 are tried, so that an absurd setting cannot stall the message; larger ones are
// elided (", ...").
std::string divisors_of(std::int64_t n) {
  constexpr std::int64_t kMaxListed = 4096;
  std::string out;
  for (std::int64_t d = 1; d <= std::min(n, kMaxListed); ++d)
    if (n % d == 0) out += fmt::format("{}{}", out.empty() ? "" : ", ", d);
  if (n > kMaxListed) out += ", ...";
  return out;
}

// "1,1,2,2": digits, commas and spaces only.
bool looks_like_degree_list(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789, ") == std::string::npos;
}

std::vector<int> parse_degree_list(const std::string& text, std::int64_t layers, std::int64_t tp) {
  std::vector<int> degrees;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto first = item.find_first_not_of(' ');
    const auto last = item.find_last_not_of(' ');
    // The example shows at most 8 layers: model.layers may be anything here.
    OASES_CHECK(first != std::string::npos,
                "parallel.plan = \"{}\": an empty entry; write one degree per layer, e.g. \"{}{}\"",
                text,
                fmt::join(std::vector<std::int64_t>(
                              static_cast<std::size_t>(std::clamp<std::int64_t>(layers, 1, 8)), tp),
                          ","),
                layers > 8 ? ",..." : "");
    const std::string digits = item.substr(first, last - first + 1);
    OASES_CHECK(digits.find(' ') == std::string::npos && digits.size() <= 6,
                "parallel.plan = \"{}\": \"{}\" is not a degree", text, digits);
    degrees.push_back(std::stoi(digits));
  }
  OASES_CHECK(static_cast<std::int64_t>(degrees.size()) == layers,
              "parallel.plan = \"{}\" gives {} layer degrees; the model has model.layers = {}",
              text, degrees.size(), layers);
  for (std::size_t l = 0; l < degrees.size(); ++l)
    OASES_CHECK(degrees[l] >= 1 && tp % degrees[l] == 0,
                "parallel.plan = \"{}\": layer {} has degree {}; valid degrees divide "
                "parallel.tp = {}",
                text, l, degrees[l], tp);
  return degrees;
}

}  // namespace

RunConfig parse_run_config(const std::string& toml_text, const std::string& source,
                           const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    OASES_FAIL("config {} is not valid TOML: {} (line {}, column {})", source, e.description(),
               e.source().begin.line, e.source().begin.column);
  }
  for (const auto& assignment : overrides) apply_override(root, assignment);

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
      field_reader(section, key, source)(value, section + "." + key, config);
    }
  }
  config.validate();
  return config;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  OASES_CHECK(in.good(), "cannot read config file '{}': no such file or not readable", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), path, overrides);
}

namespace {

// parallel.recompute_every resolved for `policy`: sqrt's layers per group (0: the default,
// round(sqrt(model.layers))); 0 under the other policies, which group no layers.
int resolved_recompute_every(const RunConfig& config, schedule::Recompute policy) {
  const std::int64_t k = config.parallel.recompute_every;
  const std::int64_t layers = config.model.layers;
  if (policy != schedule::Recompute::sqrt) {
    OASES_CHECK(k == 0,
                "parallel.recompute_every = {} is set, but parallel.recompute resolves to \"{}\", "
                "which recomputes no groups of layers; valid: parallel.recompute = \"sqrt\", or "
                "recompute_every = 0 (unset)",
                k, schedule::name(policy));
    return 0;
  }
  OASES_CHECK(k >= 0 && k <= layers,
              "parallel.recompute_every = {} is out of range for model.layers = {}; valid: 1 to "
              "{} layers per recomputation group, or 0 for round(sqrt(model.layers)) = {}",
              k, layers, layers, schedule::default_recompute_every(layers));
  return k == 0 ? schedule::default_recompute_every(layers) : static_cast<int>(k);
}

}  // namespace

std::optional<ops::ActivationEncoding> activation_encoding(const RunConfig& config) {
  const std::string& name = config.parallel.activation_compression;
  if (name == "none") return std::nullopt;
  if (name == "bf16") return ops::ActivationEncoding::bf16;
  if (name == "fp8") return ops::ActivationEncoding::fp8_e4m3;
  OASES_FAIL("parallel.activation_compression = \"{}\" is not known; valid: \"none\", \"bf16\", "
             "\"fp8\" (e4m3)",
             name);
}

schedule::ScheduleSpec schedule_spec(const RunConfig& config) {
  const ParallelConfig& p = config.parallel;
  schedule::ScheduleSpec spec;
  spec.kind = p.schedule == "auto"
                  ? (p.tp > 1 ? schedule::ScheduleKind::oases : schedule::ScheduleKind::megatron)
                  : schedule::parse_schedule_kind(p.schedule, "parallel.schedule");
  if (p.recompute == "auto") {
    switch (spec.kind) {
      case schedule::ScheduleKind::megatron: spec.recompute = schedule::Recompute::none; break;
      case schedule::ScheduleKind::cross_pass: spec.recompute = schedule::Recompute::full; break;
      case schedule::ScheduleKind::fine_grained:
      case schedule::ScheduleKind::oases:
      case schedule::ScheduleKind::oases_interleaved:
      case schedule::ScheduleKind::oases_deferred:
        spec.recompute = schedule::Recompute::fine_grained;
        break;
    }
  } else {
    spec.recompute = schedule::parse_recompute(p.recompute, "parallel.recompute");
  }
  spec.recompute_every = resolved_recompute_every(config, spec.recompute);
  spec.partitioned_checkpoints = p.partition_activations;
  const bool overlapped = spec.kind == schedule::ScheduleKind::cross_pass ||
                          spec.kind == schedule::ScheduleKind::oases ||
                          spec.kind == schedule::ScheduleKind::oases_interleaved ||
                          spec.kind == schedule::ScheduleKind::oases_deferred;
  const std::int64_t micro = config.train.micro_batch;
  OASES_CHECK(p.sub_batches >= 0, "parallel.sub_batches = {} must be >= 1 (or 0: automatic)",
              p.sub_batches);
  if (p.sub_batches == 0) {
    spec.sub_batches = overlapped && micro % 2 == 0 ? 2 : 1;
  } else {
    if (micro % p.sub_batches != 0)
      OASES_FAIL(
          "parallel.sub_batches = {} must divide train.micro_batch = {} (sub-batches "
          "split each micro-batch along the batch dimension); valid: {}",
          p.sub_batches, micro, divisors_of(micro));
    OASES_CHECK(p.sub_batches <= std::numeric_limits<int>::max(),
                "parallel.sub_batches = {} is too many; at most {}", p.sub_batches,
                std::numeric_limits<int>::max());
    spec.sub_batches = static_cast<int>(p.sub_batches);
  }
  std::int64_t dp_micro = 0;
  const bool divides = !__builtin_mul_overflow(micro, p.dp, &dp_micro) && dp_micro > 0 &&
                       config.train.global_batch % dp_micro == 0;
  const std::int64_t micro_batches = divides ? config.train.global_batch / dp_micro : 1;
  OASES_CHECK(micro_batches <= std::numeric_limits<int>::max(),
              "train.global_batch = {} makes {} micro-batches (of train.micro_batch x "
              "parallel.dp = {} x {} sequences) per step; at most {}",
              config.train.global_batch, micro_batches, micro, p.dp,
              std::numeric_limits<int>::max());
  spec.micro_batches = static_cast<int>(micro_batches);
  schedule::check_spec(spec);
  return spec;
}

std::vector<int> stage_layer_counts(const RunConfig& config) {
  const std::string& text = config.parallel.pipeline_layers;
  OASES_CHECK(config.model.layers <= std::numeric_limits<int>::max(),
              "model.layers = {} is too many to split into pipeline stages; at most {}",
              config.model.layers, std::numeric_limits<int>::max());
  const auto layers = static_cast<int>(config.model.layers);
  const auto chunks = static_cast<int>(config.parallel.pp * config.parallel.virtual_stages);
  // "auto" is measured and balanced at start-up (train/pipeline_split.h), which needs the
  // run's ranks; one chunk has nothing to balance.
  if (text == "auto" && chunks == 1) return {layers};
  OASES_CHECK(text != "auto",
              "parallel.pipeline_layers = \"auto\" is resolved by `oases train` and `oases "
              "plan` (from measured layer costs); here it needs explicit counts: \"uniform\" or "
              "one layer count per chunk, parallel.pp x parallel.virtual_stages = {} of them "
              "(e.g. \"{}\")",
              chunks,
              planner::format_pipeline_layers(planner::uniform_pipeline_layers(layers, chunks)));
  if (text == "uniform") return planner::uniform_pipeline_layers(layers, chunks);
  return planner::parse_pipeline_layers(text, layers, chunks);
}

std::pair<std::int64_t, std::int64_t> stage_layer_range(const RunConfig& config, int stage) {
  if (config.parallel.pp == 1) return {0, -1};
  OASES_ASSERT(config.parallel.virtual_stages == 1,
               "stage {} holds {} chunks: its layers are no single range", stage,
               config.parallel.virtual_stages);
  const std::vector<int> counts = stage_layer_counts(config);
  OASES_ASSERT(stage >= 0 && stage < static_cast<int>(counts.size()), "stage {} of {}", stage,
               counts.size());
  std::int64_t first = 0;
  for (int s = 0; s < stage; ++s) first += counts[static_cast<std::size_t>(s)];
  return {first, first + counts[static_cast<std::size_t>(stage)]};
}

std::vector<std::pair<std::int64_t, std::int64_t>> stage_layer_ranges(const RunConfig& config,
                                                                      int stage) {
  if (config.parallel.pp == 1) return {{0, config.model.layers}};
  const std::vector<int> counts = stage_layer_counts(config);
  const auto stages = static_cast<int>(config.parallel.pp);
  OASES_ASSERT(stage >= 0 && stage < stages, "stage {} of {}", stage, stages);
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::int64_t first = 0;
  for (int chunk = 0; chunk < static_cast<int>(counts.size()); ++chunk) {
    const int count = counts[static_cast<std::size_t>(chunk)];
    if (chunk % stages == stage) out.emplace_back(first, first + count);
    first += count;
  }
  return out;
}

namespace {

// Pipeline settings beyond the names: virtual stages, the number of chunks, and the
// micro-batches an interleaved pipeline needs.
void check_pipeline_settings(const RunConfig& config, schedule::PipelineKind kind) {
  const ParallelConfig& p = config.parallel;
  const std::int64_t v = p.virtual_stages;
  const bool interleaved = kind == schedule::PipelineKind::interleaved;
  OASES_CHECK(v >= 1, "parallel.virtual_stages = {} must be at least 1", v);
  OASES_CHECK(v == 1 || interleaved,
              "parallel.virtual_stages = {} needs parallel.pipeline = \"interleaved\" (found "
              "\"{}\"); valid: virtual_stages = 1, or pipeline = \"interleaved\"",
              v, p.pipeline);
  if (p.pp == 1) {
    OASES_CHECK(v == 1,
                "parallel.virtual_stages = {} needs a pipeline to interleave; valid: "
                "virtual_stages = 1 with parallel.pp = 1, or parallel.pp of 2 or more",
                v);
    return;
  }
  OASES_CHECK(!interleaved || v >= 2,
              "parallel.pipeline = \"interleaved\" needs parallel.virtual_stages of 2 or more "
              "model chunks per rank (found {}); valid: virtual_stages = 2, 3, ..., or pipeline = "
              "\"1f1b\" for one chunk per rank",
              v);
  std::int64_t chunks = 0;
  OASES_CHECK(!__builtin_mul_overflow(p.pp, v, &chunks) && chunks <= config.model.layers,
              "parallel.pp x parallel.virtual_stages = {} x {} chunks is more than model.layers "
              "= {}: each chunk needs at least one layer; valid: virtual_stages up to {}",
              p.pp, v, config.model.layers, std::max<std::int64_t>(1, config.model.layers / p.pp));
  if (!interleaved) return;
  const OptimConfig& t = config.train;
  std::int64_t micro_dp = 0;
  if (t.global_batch < 1 || __builtin_mul_overflow(t.micro_batch, p.dp, &micro_dp) ||
      micro_dp <= 0 || t.global_batch % micro_dp != 0)
    return;  // the batch arithmetic's own error comes later
  const std::int64_t micro_batches = t.global_batch / micro_dp;
  if (micro_batches % p.pp == 0) return;
  // Interleaved runs micro-batches through each chunk in groups of pp.
  const std::int64_t group = micro_dp * p.pp;
  const std::int64_t below = t.global_batch / group * group, above = below + group;
  OASES_FAIL(
      "parallel.pipeline = \"interleaved\" needs the micro-batches per step, "
      "train.global_batch / (train.micro_batch x parallel.dp) = {} / ({} x {}) = {}, to "
      "be a multiple of parallel.pp = {}; valid: train.global_batch = {}{} (multiples of "
      "{} x {} x {} = {})",
      t.global_batch, t.micro_batch, p.dp, micro_batches, p.pp,
      below > 0 ? fmt::format("{} or ", below) : std::string(), above, t.micro_batch, p.dp, p.pp,
      group);
}

}  // namespace

void RunConfig::validate() const {
  model.validate();
  const auto& p = parallel;
  OASES_CHECK(p.tp >= 1 && p.dp >= 1 && p.pp >= 1,
              "parallel.tp, dp, pp must be at least 1 (found tp={}, dp={}, pp={})", p.tp, p.dp,
              p.pp);
  const schedule::PipelineKind pipeline_kind =
      schedule::parse_pipeline_kind(p.pipeline, "parallel.pipeline");
  OASES_CHECK(p.pp <= model.layers,
              "parallel.pp = {} is more than model.layers = {}: each pipeline stage needs at "
              "least one layer; valid: 1 to {}",
              p.pp, model.layers, model.layers);
  check_pipeline_settings(*this, pipeline_kind);
  model.validate_tensor_parallel(p.tp);
  if (p.plan != "uniform" && p.plan != "auto") {
    // Degrees listed inline are checked here; a plan file when it is read (layer_degrees).
    // The error_code form: a name the system cannot look up (too long, say) is no plan file.
    std::error_code ec;
    if (looks_like_degree_list(p.plan)) parse_degree_list(p.plan, model.layers, p.tp);
    else
      OASES_CHECK(std::filesystem::exists(p.plan, ec),
                  "parallel.plan = \"{}\" is neither \"uniform\", \"auto\", degrees per layer "
                  "like \"1,2,2,1\", nor an existing plan file",
                  p.plan);
  }
  if ((p.pp > 1 || p.pipeline_layers != "uniform") && p.pipeline_layers != "auto")
    stage_layer_counts(*this);
  // The planner profiles and solves one whole model on tp x dp ranks; it has no notion of
  // stages yet. Explicit degrees (a list or a plan file) do run under a pipeline.
  OASES_CHECK(p.pp == 1 || p.plan != "auto",
              "parallel.plan = \"auto\" with parallel.pp = {}: the planner does not plan "
              "pipeline stages yet; valid: parallel.plan = \"uniform\", explicit degrees per "
              "layer (e.g. \"{}{}\") or a plan file, or parallel.pp = 1 with \"auto\"",
              p.pp,
              fmt::join(std::vector<std::int64_t>(
                            static_cast<std::size_t>(std::clamp<std::int64_t>(model.layers, 1, 8)),
                            p.tp),
                        ","),
              model.layers > 8 ? ",..." : "");
  OASES_CHECK(p.ep >= 1, "parallel.ep = {} must be at least 1", p.ep);
  if (p.ep > 1) {
    OASES_CHECK(model.has_moe(),
                "parallel.ep = {} splits the experts of mixture-of-experts layers, but the model "
                "has none (model.moe_every = 0); set parallel.ep = 1 or model.moe_every > 0",
                p.ep);
    OASES_CHECK(p.dp % p.ep == 0,
                "parallel.ep = {} must divide parallel.dp = {}: the expert-parallel group is made "
                "of data-parallel ranks; valid: a divisor of {}",
                p.ep, p.dp, p.dp);
    OASES_CHECK(p.dp_sync_every == 1,
                "parallel.dp_sync_every = {} with parallel.ep = {}: local SGD averages the "
                "data-parallel replicas, which hold different experts under expert parallelism; "
                "use parallel.dp_sync_every = 1 or parallel.ep = 1",
                p.dp_sync_every, p.ep);
    OASES_CHECK(model.experts % p.ep == 0,
                "model.experts = {} is not divisible by parallel.ep = {}: each expert-parallel "
                "rank holds model.experts / parallel.ep whole experts; use an ep that divides {}",
                model.experts, p.ep, model.experts);
  }
  // Checked on dense models too: a setting the run cannot take is an error wherever it appears.
  OASES_CHECK(p.expert_tp == 0 || p.expert_tp == 1 || p.expert_tp == p.tp,
              "parallel.expert_tp = {} with parallel.tp = {}: experts are either whole on each "
              "rank (1) or split over the layer's tensor-parallel ranks ({}; 0, the default, "
              "means the same)",
              p.expert_tp, p.tp, p.tp);
  if (model.has_moe()) {
    if (p.expert_tp == 1 && p.tp > 1 && looks_like_degree_list(p.plan)) {
      const std::vector<int> degrees = parse_degree_list(p.plan, model.layers, p.tp);
      for (std::int64_t l = 0; l < model.layers; ++l)
        OASES_CHECK(!model.is_moe_layer(l) || degrees[static_cast<std::size_t>(l)] == 1,
                    "parallel.plan = \"{}\" gives layer {} (a mixture-of-experts layer) degree {}, "
                    "but parallel.expert_tp = 1 keeps its experts whole, which runs the layer at "
                    "degree 1; give MoE layers 1 in the plan, or set parallel.expert_tp = {} to "
                    "split the experts",
                    p.plan, l, degrees[static_cast<std::size_t>(l)], p.tp);
    }
    OASES_CHECK(p.activation_compression == "none",
                "parallel.activation_compression = \"{}\" with mixture-of-experts layers "
                "(model.moe_every = {}): the MoE segments keep token indices beside their rows, "
                "which an encoding would round; use \"none\"",
                p.activation_compression, model.moe_every);
  }
  OASES_CHECK(p.memory_limit >= 0, "parallel.memory_limit = {} must be >= 0 bytes", p.memory_limit);
  OASES_CHECK(p.bucket_bytes == 0 || p.bucket_bytes >= 1024,
              "parallel.bucket_bytes = {} is too small to carry a collective; valid: 0 (no "
              "bound) or at least 1024 bytes (e.g. 50000000, about what DeepSpeed's buckets "
              "hold)",
              p.bucket_bytes);
  OASES_CHECK(p.comm_timeout_s >= 0, "parallel.comm_timeout_s = {} must be >= 0 seconds (0: no timeout)",
              p.comm_timeout_s);
  OASES_CHECK(p.startup_timeout_s >= 0,
              "parallel.startup_timeout_s = {} must be >= 0 seconds (0: no timeout)",
              p.startup_timeout_s);

  const auto& t = train;
  OASES_CHECK(t.micro_batch >= 1, "train.micro_batch = {} must be at least 1", t.micro_batch);
  OASES_CHECK(t.global_batch >= 1, "train.global_batch = {} must be at least 1", t.global_batch);
  std::int64_t micro_dp = 0;
  OASES_CHECK(!__builtin_mul_overflow(t.micro_batch, p.dp, &micro_dp),
              "train.micro_batch x parallel.dp = {} x {} is too large", t.micro_batch, p.dp);
  if (t.global_batch % micro_dp != 0) {
    OASES_FAIL(
        "train.global_batch = {} must be a multiple of train.micro_batch x parallel.dp = "
        "{} x {} = {} (global batch = micro_batch x accumulation steps x dp); try "
        "global_batch = {}{}",
        t.global_batch, t.micro_batch, p.dp, micro_dp,
        std::max<std::int64_t>(1, t.global_batch / micro_dp) * micro_dp,
        t.global_batch % t.micro_batch != 0
            ? std::string()
            : fmt::format(", or dp in {{{}}}", divisors_of(t.global_batch / t.micro_batch)));
  }
  if (pipeline_kind == schedule::PipelineKind::two_bw) {
    // A 2bw step's micro-batches must outnumber the stages: a batch's last backwards then
    // overlap the next batch's first forwards without two of them sharing a micro-batch slot.
    const std::int64_t micro_batches = t.global_batch / micro_dp;
    OASES_CHECK(micro_batches > p.pp,
                "parallel.pipeline = \"2bw\" needs more micro-batches per step than pipeline "
                "stages, but train.global_batch = {} / (train.micro_batch x parallel.dp = {} x "
                "{}) = {} micro-batches with parallel.pp = {}; valid: train.global_batch = {}, "
                "{}, ... (a multiple of {} above {}), or parallel.pp below {}",
                t.global_batch, t.micro_batch, p.dp, micro_batches, p.pp,
                (p.pp + 1) * micro_dp, (p.pp + 2) * micro_dp, micro_dp, p.pp * micro_dp,
                micro_batches);
  }
  OASES_CHECK(t.steps >= 0, "train.steps = {} must be >= 0", t.steps);
  // train.lr = 0 is Adafactor's relative step size, which is its own schedule: min_lr is not
  // used, and there is no rate to warm up to.
  const bool relative_step = t.optimizer == "adafactor" && t.lr == 0;
  OASES_CHECK(t.lr > 0 || relative_step,
              "train.lr = {} must be positive (0 only with train.optimizer = \"adafactor\", "
              "for its relative step size)",
              t.lr);
  OASES_CHECK(relative_step || (t.min_lr >= 0 && t.min_lr <= t.lr),
              "train.min_lr = {} must be in [0, train.lr = {}]", t.min_lr, t.lr);
  OASES_CHECK(!relative_step || t.warmup_steps == 0,
              "train.warmup_steps = {} has no rate to warm up to: train.lr = 0 gives Adafactor's "
              "relative step size min(1e-2, 1/sqrt(step)); set train.warmup_steps = 0, or "
              "train.lr > 0",
              t.warmup_steps);
  OASES_CHECK(t.warmup_steps >= 0, "train.warmup_steps = {} must be >= 0", t.warmup_steps);
  OASES_CHECK(t.lr_decay_steps >= 0, "train.lr_decay_steps = {} must be >= 0", t.lr_decay_steps);
  OASES_CHECK(t.weight_decay >= 0, "train.weight_decay = {} must be >= 0", t.weight_decay);
  OASES_CHECK(t.beta1 >= 0 && t.beta1 < 1, "train.beta1 = {} must be in [0, 1)", t.beta1);
  OASES_CHECK(t.beta2 >= 0 && t.beta2 < 1, "train.beta2 = {} must be in [0, 1)", t.beta2);
  OASES_CHECK(t.eps > 0, "train.eps = {} must be positive", t.eps);
  OASES_CHECK(t.grad_clip >= 0, "train.grad_clip = {} must be >= 0 (0 disables clipping)",
              t.grad_clip);
  OASES_CHECK(t.max_loss >= 0, "train.max_loss = {} must be >= 0 (0: no limit)", t.max_loss);
  optim::validate_optimizer_config(optimizer_config(t));
  OASES_CHECK(t.precision == "fp32" || t.precision == "fp64" || t.precision == "bf16" ||
                  t.precision == "fp16",
              "train.precision = \"{}\" is not known; valid: \"fp32\", \"bf16\", \"fp16\" "
              "(mixed precision over fp32 master weights), \"fp64\" (the verification precision)",
              t.precision);
  OASES_CHECK(t.grad_reduce_dtype == "fp32" || t.grad_reduce_dtype == "bf16",
              "train.grad_reduce_dtype = \"{}\" is not known; valid: \"fp32\", \"bf16\"",
              t.grad_reduce_dtype);
  OASES_CHECK(t.grad_reduce_dtype == "fp32" || t.precision == "bf16" || t.precision == "fp16",
              "train.grad_reduce_dtype = \"{}\" needs mixed precision (train.precision = "
              "\"bf16\" or \"fp16\"); train.precision is \"{}\", whose gradients are reduced "
              "in their own type",
              t.grad_reduce_dtype, t.precision);
  OASES_CHECK(t.gemm16_path == "auto" || kernels::gemm16_path_from_name(t.gemm16_path),
              "train.gemm16_path = \"{}\" is not known; valid: \"auto\" (measured at start-up), "
              "\"convert+sgemm\", \"oneDNN\"",
              t.gemm16_path);
  // Scales below 1 would shrink fp16 gradients towards underflow, the opposite of their use.
  OASES_CHECK(t.loss_scale == 0 || t.loss_scale >= 1,
              "train.loss_scale = {} must be 0 (dynamic scaling) or at least 1 (a constant scale)",
              t.loss_scale);
  OASES_CHECK(t.min_loss_scale >= 1, "train.min_loss_scale = {} must be at least 1",
              t.min_loss_scale);
  OASES_CHECK(t.initial_loss_scale >= t.min_loss_scale,
              "train.initial_loss_scale = {} must be at least train.min_loss_scale = {}",
              t.initial_loss_scale, t.min_loss_scale);
  OASES_CHECK(t.loss_scale_window >= 1, "train.loss_scale_window = {} must be at least 1",
              t.loss_scale_window);
  OASES_CHECK(t.hysteresis >= 1, "train.hysteresis = {} must be at least 1", t.hysteresis);
  OASES_CHECK(t.seed >= 0, "train.seed = {} must be >= 0", t.seed);
  OASES_CHECK(t.eval_every >= 0, "train.eval_every = {} must be >= 0 (0: never)", t.eval_every);
  OASES_CHECK(t.eval_steps >= 1, "train.eval_steps = {} must be at least 1", t.eval_steps);
  OASES_CHECK(t.threads >= 0, "train.threads = {} must be >= 0 (0: automatic, the host's cores shared among its ranks)", t.threads);

  const std::vector<std::string> tokenizers = data::tokenizer_names();
  OASES_CHECK(std::find(tokenizers.begin(), tokenizers.end(), data.tokenizer) != tokenizers.end(),
              "data.tokenizer = \"{}\" is not known; valid: \"{}\"", data.tokenizer,
              fmt::join(tokenizers, "\", \""));
  OASES_CHECK(data.tokenizer_model.empty() || data.tokenizer != "byte",
              "data.tokenizer_model = \"{}\" is set, but data.tokenizer = \"{}\" reads no model "
              "file; unset it, or set data.tokenizer to the tokenizer the file belongs to "
              "(\"gpt2\" or \"sentencepiece\")",
              data.tokenizer_model, data.tokenizer);
  OASES_CHECK(checkpoint.every >= 0, "checkpoint.every = {} must be >= 0", checkpoint.every);
  OASES_CHECK(checkpoint.keep >= 0, "checkpoint.keep = {} must be >= 0 (0 keeps all)",
              checkpoint.keep);
  OASES_CHECK(!checkpoint.resume || !checkpoint.dir.empty(),
              "checkpoint.resume = true needs checkpoint.dir to name the run's checkpoint folder");
  OASES_CHECK(log.every >= 1, "log.every = {} must be at least 1", log.every);
  OASES_CHECK(log.trace_steps >= 1, "log.trace_steps = {} must be at least 1", log.trace_steps);
  OASES_CHECK(log.peak_tflops >= 0, "log.peak_tflops = {} must be >= 0 (0: measure)",
              log.peak_tflops);
  schedule_spec(*this);
  activation_encoding(*this);
  OASES_CHECK(!activation_encoding(*this) ||
                  schedule::parse_pipeline_kind(p.pipeline, "parallel.pipeline") !=
                      schedule::PipelineKind::two_bw,
              "parallel.activation_compression = \"{}\" does not run with parallel.pipeline = "
              "\"2bw\" yet (its runs carry kept sets from one step to the next); valid: "
              "parallel.activation_compression = \"none\", or another parallel.pipeline",
              p.activation_compression);
  OASES_CHECK(!p.partition_activations || p.activation_compression == "none",
              "parallel.partition_activations = true with parallel.activation_compression = "
              "\"{}\" is not supported yet (a checkpoint's slice is not held encoded); valid: "
              "one of the two, i.e. parallel.activation_compression = \"none\" or "
              "parallel.partition_activations = false",
              p.activation_compression);
  OASES_CHECK(!(t.precision == "bf16" && p.activation_compression == "bf16"),
              "parallel.activation_compression = \"bf16\" with train.precision = \"bf16\" "
              "would change nothing (the kept activations are bf16 already); valid: "
              "parallel.activation_compression = \"fp8\" (a quarter of fp32, half of bf16) or "
              "\"none\"");
  OASES_CHECK(t.precision != "fp16" ||
                  schedule::parse_pipeline_kind(p.pipeline, "parallel.pipeline") !=
                      schedule::PipelineKind::two_bw,
              "train.precision = \"fp16\" does not run with parallel.pipeline = \"2bw\" (a step "
              "skipped for an overflow would break its stream of weight versions); valid: "
              "train.precision = \"bf16\" (no loss scaling), or another parallel.pipeline");
  OASES_CHECK(p.dp_sync_every >= 1,
              "parallel.dp_sync_every = {} must be at least 1 (1: gradients summed over the "
              "data-parallel group every step; x > 1: replicas average every x steps)",
              p.dp_sync_every);
  OASES_CHECK(p.dp_sync_every == 1 || p.plan == "uniform",
              "parallel.dp_sync_every = {} needs parallel.plan = \"uniform\" (a layer below the "
              "tensor-parallel degree sums its gradient over tensor- and data-parallel replicas "
              "at once); parallel.plan is \"{}\"",
              p.dp_sync_every, p.plan);
  OASES_CHECK(p.dp_sync_every == 1 ||
                  schedule::parse_pipeline_kind(p.pipeline, "parallel.pipeline") !=
                      schedule::PipelineKind::two_bw,
              "parallel.dp_sync_every = {} does not run with parallel.pipeline = \"2bw\" "
              "(its steps carry a batch into the next); valid: parallel.dp_sync_every = 1, or "
              "another parallel.pipeline",
              p.dp_sync_every);
  OASES_CHECK(p.zero >= 0 && p.zero <= 3,
              "parallel.zero = {} is not a ZeRO stage; valid: 0 (none), 1 (optimizer state "
              "partitioned), 2 (and gradients), 3 (and parameters)",
              p.zero);
  OASES_CHECK(p.zero == 0 || p.dp_sync_every == 1,
              "parallel.zero = {} with parallel.dp_sync_every = {}: local SGD keeps a whole "
              "optimizer state on each replica and sums no gradients; valid: parallel.zero = 0, "
              "or parallel.dp_sync_every = 1",
              p.zero, p.dp_sync_every);
  OASES_CHECK(p.offload == "none" || p.offload == "optimizer" || p.offload == "optimizer+params",
              "parallel.offload = \"{}\" is not known; valid: \"none\", \"optimizer\", "
              "\"optimizer+params\"",
              p.offload);
  OASES_CHECK(p.offload == "none" || !p.offload_dir.empty(),
              "parallel.offload = \"{}\" needs parallel.offload_dir: a folder on local disk for "
              "the scratch file that holds the offloaded state",
              p.offload);
  OASES_CHECK(p.offload != "optimizer+params" || t.precision == "bf16" || t.precision == "fp16",
              "parallel.offload = \"optimizer+params\" needs train.precision = \"bf16\" or "
              "\"fp16\" (forward and backward then read the 16-bit copy; at \"{}\" they read the "
              "master weights themselves); valid: parallel.offload = \"optimizer\"",
              t.precision);
  // Last: each setting's own error above is the more useful one.
  {
    // Batch b of the run reads token positions up to about b x global_batch x (seq_len + 1);
    // those indices are 64-bit, so the whole run must fit well inside that range.
    const long double positions = static_cast<long double>(t.steps) *
                                  static_cast<long double>(t.global_batch) *
                                  static_cast<long double>(model.seq_len + 1);
    const std::int64_t limit = std::int64_t{1} << 62;
    OASES_CHECK(positions <= static_cast<long double>(limit),
                "train.steps = {} is too large: steps x train.global_batch x (model.seq_len + 1) "
                "must stay below 2^62 token positions; valid: at most {} steps",
                t.steps,
                static_cast<std::int64_t>(static_cast<long double>(limit) /
                                          (static_cast<long double>(t.global_batch) *
                                           static_cast<long double>(model.seq_len + 1))));
  }
}

// The flags to_toml prints with. toml++'s defaults write a string that holds a line break as
// a multi-line literal ('''...'''), which cannot hold ''' and loses a leading line break when
// read back; single-line quoted strings with escapes hold every string.
constexpr toml::format_flags kRoundTripFormat =
    toml::toml_formatter::default_flags &
    ~(toml::format_flags::allow_literal_strings | toml::format_flags::allow_multi_line_strings);

optim::OptimizerConfig optimizer_config(const OptimConfig& t) {
  optim::OptimizerConfig o;
  o.name = t.optimizer;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  o.weight_decay = t.weight_decay;
  o.momentum = t.momentum;
  o.nesterov = t.nesterov;
  o.adafactor_beta1 = t.adafactor_beta1;
  o.relative_step = t.optimizer == "adafactor" && t.lr == 0;
  return o;
}

std::string to_toml(const RunConfig& c) {
  toml::table root;
  root.insert("model", toml::table{{"arch", c.model.arch}, {"layers", c.model.layers},
                                   {"hidden", c.model.hidden}, {"heads", c.model.heads},
                                   {"kv_heads", c.model.kv_head_count()},
                                   {"ffn_hidden", c.model.ffn_hidden},
                                   {"vocab_size", c.model.vocab_size},
                                   {"seq_len", c.model.seq_len}, {"dropout", c.model.dropout},
                                   {"attention_dropout", c.model.attention_dropout},
                                   {"tie_embeddings", c.model.tied_embeddings()},
                                   {"norm_eps", c.model.norm_epsilon()},
                                   {"rope_theta", c.model.rope_theta}});
  if (c.model.moe_every > 0) {
    toml::table& model = *root["model"].as_table();
    model.insert("moe_every", c.model.moe_every);
    model.insert("experts", c.model.experts);
    model.insert("moe_gate", c.model.moe_gate);
    model.insert("moe_top_k", c.model.moe_gate == "expert-choice" ? std::int64_t{0}
                                                                   : std::int64_t{c.model.moe_choices()});
    model.insert("capacity_factor", c.model.capacity_factor);
    model.insert("eval_capacity_factor", c.model.moe_eval_capacity_factor());
    model.insert("moe_group_size", c.model.moe_group_tokens());
    model.insert("moe_aux_loss_coef", c.model.moe_aux_loss_coef);
    model.insert("moe_z_loss_coef", c.model.moe_z_loss_coef);
    model.insert("moe_router_noise", c.model.moe_router_noise);
    model.insert("moe_init_scale", c.model.moe_init_scale);
    model.insert("expert_dropout", c.model.expert_dropout);
    model.insert("moe_ffn_hidden", c.model.expert_ffn_hidden());
  }
  root.insert("parallel", toml::table{{"tp", c.parallel.tp},
                                      {"dp", c.parallel.dp},
                                      {"pp", c.parallel.pp},
                                      {"ep", c.parallel.ep},
                                      {"expert_tp", c.parallel.expert_tp},
                                      {"pipeline", c.parallel.pipeline},
                                      {"virtual_stages", c.parallel.virtual_stages},
                                      {"pipeline_layers", c.parallel.pipeline_layers},
                                      {"schedule", c.parallel.schedule},
                                      {"recompute", c.parallel.recompute},
                                      {"recompute_every", c.parallel.recompute_every},
                                      {"activation_compression",
                                       c.parallel.activation_compression},
                                      {"partition_activations",
                                       c.parallel.partition_activations},
                                      {"bucket_bytes", c.parallel.bucket_bytes},
                                      {"sub_batches", c.parallel.sub_batches},
                                      {"plan", c.parallel.plan},
                                      {"memory_limit", c.parallel.memory_limit},
                                      {"dp_sync_every", c.parallel.dp_sync_every},
                                      {"zero", c.parallel.zero},
                                      {"zero3_reshard_after_forward",
                                       c.parallel.zero3_reshard_after_forward},
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
                                   {"eval_steps", t.eval_steps}, {"threads", t.threads}});
  root.insert("data", toml::table{{"path", c.data.path}, {"tokenizer", c.data.tokenizer},
                                  {"tokenizer_model", c.data.tokenizer_model},
                                  {"shuffle", c.data.shuffle}});
  root.insert("checkpoint", toml::table{{"dir", c.checkpoint.dir}, {"every", c.checkpoint.every},
                                        {"keep", c.checkpoint.keep},
                                        {"resume", c.checkpoint.resume}});
  root.insert("log", toml::table{{"every", c.log.every}, {"metrics", c.log.metrics},
                                 {"trace", c.log.trace}, {"trace_steps", c.log.trace_steps},
                                 {"peak_tflops", c.log.peak_tflops}});
  std::ostringstream out;
  out << toml::toml_formatter(root, kRoundTripFormat);
  return out.str();
}

std::string tokenizer_model_path(const RunConfig& config) {
  if (!config.data.tokenizer_model.empty()) return config.data.tokenizer_model;
  if (config.data.tokenizer != "sentencepiece" || config.data.path.empty()) return "";
  const std::string beside = data::tokenizer_model_beside_shards(config.data.path);
  std::error_code ec;
  return std::filesystem::exists(beside, ec) ? beside : "";
}

std::unique_ptr<data::Tokenizer> load_run_tokenizer(const RunConfig& config) {
  const std::string path = tokenizer_model_path(config);
  if (path.empty() && config.data.tokenizer != "sentencepiece") return nullptr;
  OASES_CHECK(!path.empty(),
              "data.tokenizer = \"sentencepiece\" needs its model file: set data.tokenizer_model "
              "to the .model file (made by `oases train-tokenizer`), or run `oases prepare-data "
              "--tokenizer sentencepiece --tokenizer-model P.model --output {}`, which copies it "
              "to '{}' where training looks by default",
              config.data.path.empty() ? std::string("PREFIX") : config.data.path,
              data::tokenizer_model_beside_shards(
                  config.data.path.empty() ? std::string("PREFIX") : config.data.path));
  std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(config.data.tokenizer, path);
  OASES_CHECK(config.model.vocab_size >= tokenizer->vocab_size(),
              "model.vocab_size = {} is smaller than the vocabulary of the {} tokenizer '{}' ({} "
              "tokens); set model.vocab_size to at least {}",
              config.model.vocab_size, tokenizer->name(), path, tokenizer->vocab_size(),
              tokenizer->vocab_size());
  return tokenizer;
}

std::vector<int> layer_degrees(const RunConfig& config) {
  const auto& p = config.parallel;
  OASES_ASSERT(p.plan != "auto", "parallel.plan = \"auto\" must be resolved to a plan first");
  const model::ModelConfig& model = config.model;
  std::vector<int> degrees;
  if (p.plan == "uniform") {
    // Whole experts (parallel.expert_tp = 1) run their layers at degree 1.
    if (p.tp == 1 || p.expert_tp != 1 || !model.has_moe()) return {};
    for (std::int64_t l = 0; l < model.layers; ++l)
      degrees.push_back(model.is_moe_layer(l) ? 1 : static_cast<int>(p.tp));
    return degrees;
  }
  if (looks_like_degree_list(p.plan)) return parse_degree_list(p.plan, model.layers, p.tp);
  degrees = planner::read_plan(p.plan, static_cast<int>(p.tp), model.layers).degrees;
  degrees = parse_degree_list(fmt::format("{}", fmt::join(degrees, ",")), model.layers, p.tp);
  for (std::int64_t l = 0; l < model.layers && p.expert_tp == 1; ++l)
    OASES_CHECK(!model.is_moe_layer(l) || degrees[static_cast<std::size_t>(l)] == 1,
                "the plan {} gives layer {} (a mixture-of-experts layer) degree {}, but "
                "parallel.expert_tp = 1 runs MoE layers at degree 1; plan with expert_tp = 1, or "
                "set parallel.expert_tp = {}",
                p.plan, l, degrees[static_cast<std::size_t>(l)], p.tp);
  return degrees;
}

std::vector<std::string> config_key_names() {
  std::vector<std::string> names;
  for (const auto& [section, fields] : schema())
    for (const auto& [key, reader] : fields) names.push_back(section + "." + key);
  return names;
}

}  // namespace oases::plan
