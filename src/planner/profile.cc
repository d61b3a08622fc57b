#include "planner/profile.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/named_values.h"
#include "core/regular_file.h"
#include "io/untrusted_json.h"
#include "ops/program.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace oases::planner {

using nlohmann::json;

const DegreeProfile* Profile::at_degree(int degree) const {
  for (const DegreeProfile& d : degrees)
    if (d.degree == degree) return &d;
  return nullptr;
}

std::string segment_kind(const std::string& name) {
  return name.substr(0, name.find('.'));
}

std::string ProfiledLayout::describe() const {
  std::string out = sequence_parallel ? "sequence parallelism" : "";
  if (cp > 1)
    out +=
        fmt::format("{}parallel.cp = {} ({})", out.empty() ? "" : ", ", cp,
                    value_name<ops::ContextParallelKind>(ops::kContextParallelKindNames, cp_kind));
  return out.empty() ? "no sequence or context parallelism" : out;
}

std::string Profile::memory_settings() const {
  if (precision.empty()) return "";
  return fmt::format("zero {}{}, offload {}, precision {}", zero,
                     data_parallel > 1 ? fmt::format(" over dp {}", data_parallel) : "", offload,
                     precision);
}

Profile with_zero_share(Profile profile, int zero, int dp) {
  OASES_CHECK(zero >= 0 && zero <= 3 && dp >= 1,
              "parallel.zero = {} over parallel.dp = {}: valid stages 0-3 over dp >= 1", zero, dp);
  const double share = 1.0 / static_cast<double>(dp);
  if (zero >= 1) profile.optimizer_bytes_ratio *= share;
  if (zero >= 2) profile.grad_bytes_ratio *= share;
  if (zero >= 3) profile.param_bytes_ratio *= share;
  profile.zero = zero;
  profile.data_parallel = dp;
  return profile;
}

std::string Profile::reshard_key(int a, int b) {
  return std::to_string(std::min(a, b)) + "-" + std::to_string(std::max(a, b));
}

double Profile::reshard_seconds(int a, int b) const {
  if (a == b) return 0;
  const auto it = reshards.find(reshard_key(a, b));
  OASES_CHECK(it != reshards.end(),
              "the profile has no reshard time between degrees {} and {}; re-run `oases profile`",
              std::min(a, b), std::max(a, b));
  return it->second;
}

namespace {

// A measured figure of the profile: finite and at least 0 (or above 0 where `positive`).
// UserError naming the source, the field and the value.
void check_measured(double value, const std::string& field, const std::string& source,
                    bool positive = false) {
  OASES_CHECK(std::isfinite(value) && (positive ? value > 0 : value >= 0),
              "{}: malformed profile (\"{}\" = {}: a measured time, size or slowdown is finite "
              "and {}); re-run `oases profile`",
              source, field, value, positive ? "> 0" : ">= 0");
}

// `value` (the profile's `key`) as T; UserError naming `source` and the key when it is not an
// integer T holds.
template <class T>
T integer_value(const json& value, const std::string& key, const std::string& source) {
  const std::optional<T> v = io::json_integer<T>(value);
  OASES_CHECK(v.has_value(), "{}: malformed profile (\"{}\" = {} is not an integer in [{}, {}])",
              source, key, value.dump(), std::numeric_limits<T>::min(),
              std::numeric_limits<T>::max());
  return *v;
}

// object[key] as T, as integer_value; a missing key throws json::out_of_range, as json::at.
template <class T>
T integer_at(const json& object, const std::string& key, const std::string& source) {
  return integer_value<T>(object.at(key), key, source);
}

// The per-kind memory ratios and the settings they were measured under. A profile written
// before them has only optimizer_state_ratio: one copy of the parameters, one of the gradients
// and the rest as the optimizer's, the same total. Where both are present they must agree.
void read_memory_ratios(const json& j, Profile& p, const std::string& source) {
  const bool by_kind = j.contains("param_bytes_ratio") || j.contains("grad_bytes_ratio") ||
                       j.contains("optimizer_bytes_ratio");
  if (by_kind) {
    p.param_bytes_ratio = j.at("param_bytes_ratio");
    p.grad_bytes_ratio = j.at("grad_bytes_ratio");
    p.optimizer_bytes_ratio = j.at("optimizer_bytes_ratio");
    // Only here: a profile with the single optimizer_state_ratio may hold a negative one (the
    // total less 2), which stands for the optimizer's share.
    check_measured(p.optimizer_bytes_ratio, "optimizer_bytes_ratio", source);
    if (j.contains("optimizer_state_ratio")) {
      const double whole = j.at("optimizer_state_ratio");
      OASES_CHECK(std::abs(whole - p.optimizer_state_ratio()) <=
                      1e-9 * std::max(1.0, std::abs(whole)),
                  "{}: malformed profile (\"optimizer_state_ratio\" = {} but the parameter, "
                  "gradient and optimizer ratios {}, {} and {} give {}: it must be their sum "
                  "less 2)",
                  source, whole, p.param_bytes_ratio, p.grad_bytes_ratio,
                  p.optimizer_bytes_ratio, p.optimizer_state_ratio());
    }
  } else {
    p.param_bytes_ratio = 1;
    p.grad_bytes_ratio = 1;
    p.optimizer_bytes_ratio = j.at("optimizer_state_ratio");
  }
  // Finite each, their sum may still overflow: it would print as null.
  OASES_CHECK(std::isfinite(p.optimizer_state_ratio()),
              "{}: malformed profile (the memory ratios {}, {} and {} are out of range)", source,
              p.param_bytes_ratio, p.grad_bytes_ratio, p.optimizer_bytes_ratio);
  if (j.contains("precision")) {
    p.precision = j.at("precision");
    p.zero = j.contains("zero") ? integer_at<int>(j, "zero", source) : 0;
    p.offload = j.value("offload", std::string("none"));
  }
}

// The model keys a profile depends on. The MoE keys appear only for models with MoE layers, so
// that a dense model's keys are those of the profiles written before them.
json model_json(const model::ModelConfig& m) {
  json out{{"arch", std::string(model::name(m.arch))},           {"layers", m.layers},         {"hidden", m.hidden},
           {"heads", m.heads},         {"kv_heads", m.kv_head_count()},
           {"ffn_hidden", m.ffn_hidden}, {"vocab_size", m.vocab_size}, {"seq_len", m.seq_len}};
  if (m.has_moe()) {
    out["moe_every"] = m.moe_every;
    out["experts"] = m.experts;
    out["moe_gate"] = ops::moe_gate_name(m.moe_gate);
    out["moe_top_k"] = m.moe_top_k;
    out["capacity_factor"] = m.capacity_factor;
    out["eval_capacity_factor"] = m.eval_capacity_factor;
    out["moe_group_size"] = m.moe_group_size;
    out["moe_ffn_hidden"] = m.moe_ffn_hidden;
  }
  return out;
}

void read_moe_model(const json& m, model::ModelConfig& model, const std::string& source) {
  if (!m.contains("moe_every")) return;  // dense
  model.moe_every = integer_at<std::int64_t>(m, "moe_every", source);
  model.experts = integer_at<std::int64_t>(m, "experts", source);
  model.moe_gate = ops::parse_moe_gate(m.at("moe_gate").get<std::string>());
  model.moe_top_k = integer_at<std::int64_t>(m, "moe_top_k", source);
  model.capacity_factor = m.at("capacity_factor");
  model.eval_capacity_factor = m.at("eval_capacity_factor");
  model.moe_group_size = integer_at<std::int64_t>(m, "moe_group_size", source);
  model.moe_ffn_hidden = integer_at<std::int64_t>(m, "moe_ffn_hidden", source);
  OASES_CHECK(model.moe_every >= 1 && model.experts >= 2,
              "{}: malformed profile (model.moe_every = {} and model.experts = {}: an MoE model "
              "has moe_every >= 1 and at least 2 experts)",
              source, model.moe_every, model.experts);
}

// Every time, byte count, slowdown and ratio a profile holds, checked once on load so that the
// planner prices plans with measurements only (a negative time would pass for a free one).
void check_profile_figures(const Profile& p, const std::string& source) {
  check_measured(static_cast<double>(p.tp), "tp", source, true);
  check_measured(static_cast<double>(p.micro_batch), "micro_batch", source, true);
  check_measured(static_cast<double>(p.sub_batches), "sub_batches", source, true);
  check_measured(static_cast<double>(p.element_bytes), "element_bytes", source, true);
  check_measured(p.param_bytes_ratio, "param_bytes_ratio", source);
  check_measured(p.grad_bytes_ratio, "grad_bytes_ratio", source);
  for (const DegreeProfile& d : p.degrees) {
    const std::string at = fmt::format("degrees[degree {}].", d.degree);
    check_measured(static_cast<double>(d.degree), at + "degree", source, true);
    check_measured(static_cast<double>(d.rows), at + "rows", source, true);
    for (const auto& [kind, t] : d.segments) {
      const std::string segment = at + "segments." + kind + ".";
      check_measured(t.forward_s, segment + "forward_s", source);
      check_measured(t.recompute_s, segment + "recompute_s", source);
      check_measured(t.backward0_s, segment + "backward0_s", source);
      check_measured(t.backward1_s, segment + "backward1_s", source);
    }
    for (const auto& [key, seconds] : d.collectives)
      check_measured(seconds, at + "collectives." + key, source);
    check_measured(d.optimizer_s, at + "optimizer_s", source);
    check_measured(static_cast<double>(d.parameter_bytes), at + "parameter_bytes", source);
    check_measured(static_cast<double>(d.parameter_bytes_per_layer),
                   at + "parameter_bytes_per_layer", source);
    check_measured(d.replica_reduce_per_layer_s, at + "replica_reduce_per_layer_s", source);
    check_measured(d.overlap_slowdown, at + "overlap_slowdown", source);
    check_measured(d.collective_slowdown, at + "collective_slowdown", source);
    for (const auto& [kind, sets] : d.activation_bytes)
      for (const auto& [set, bytes] : sets)
        check_measured(static_cast<double>(bytes), at + "activation_bytes." + kind + "." + set,
                       source);
    check_measured(static_cast<double>(d.static_activation_bytes),
                   at + "static_activation_bytes", source);
    for (const auto& [key, elements] : d.collective_elements)
      check_measured(static_cast<double>(elements), at + "collective_elements." + key, source);
  }
  for (const auto& [key, seconds] : p.reshards) check_measured(seconds, "reshards." + key, source);
}

}  // namespace

std::string to_json(const Profile& p) {
  json degrees = json::array();
  for (const DegreeProfile& d : p.degrees) {
    json segments = json::object();
    for (const auto& [kind, t] : d.segments)
      segments[kind] = {{"forward_s", t.forward_s},
                        {"recompute_s", t.recompute_s},
                        {"backward0_s", t.backward0_s},
                        {"backward1_s", t.backward1_s}};
    degrees.push_back({{"degree", d.degree},
                       {"rows", d.rows},
                       {"segments", segments},
                       {"collectives", d.collectives},
                       {"optimizer_s", d.optimizer_s},
                       {"parameter_bytes", d.parameter_bytes},
                       {"replica_reduce_per_layer_s", d.replica_reduce_per_layer_s},
                       {"overlap_slowdown", d.overlap_slowdown},
                       {"collective_slowdown", d.collective_slowdown},
                       {"parameter_bytes_per_layer", d.parameter_bytes_per_layer},
                       {"activation_bytes", d.activation_bytes},
                       {"static_activation_bytes", d.static_activation_bytes}});
    if (!d.collective_elements.empty())
      degrees.back()["collective_elements"] = d.collective_elements;
  }
  json out{{"format", "oases-profile"},
           {"version", Profile::kVersion},
           {"model", model_json(p.model)},
           {"tp", p.tp},
           {"micro_batch", p.micro_batch},
           {"sub_batches", p.sub_batches},
           {"element_bytes", p.element_bytes},
           {"optimizer_state_ratio", p.optimizer_state_ratio()},
           {"param_bytes_ratio", p.param_bytes_ratio},
           {"grad_bytes_ratio", p.grad_bytes_ratio},
           {"optimizer_bytes_ratio", p.optimizer_bytes_ratio},
           {"degrees", degrees},
           {"reshards", p.reshards}};
  if (!p.precision.empty()) {
    out["precision"] = p.precision;
    out["zero"] = p.zero;
    out["offload"] = p.offload;
  }
  if (p.replica_link.ranks > 0)
    out["replica_link"] = {{"bytes", p.replica_link.bytes},
                           {"ranks", p.replica_link.ranks},
                           {"seconds", p.replica_link.seconds}};
  if (!p.activation_codec.empty()) {
    json codec = json::object();
    for (const auto& [word, c] : p.activation_codec)
      codec[word] = {{"encode_s_per_element", c.encode_s_per_element},
                     {"decode_s_per_element", c.decode_s_per_element}};
    out["activation_codec"] = codec;
  }
  if (p.layout.sequence_parallel) out["sequence_parallel"] = true;
  if (p.layout.cp > 1) {
    out["cp"] = p.layout.cp;
    out["cp_kind"] = std::string(
        value_name<ops::ContextParallelKind>(ops::kContextParallelKindNames, p.layout.cp_kind));
  }
  if (p.ep > 1) {
    out["ep"] = p.ep;
    out["expert_link"] = {{"bytes_per_second", p.expert_link.bytes_per_second},
                          {"latency_s", p.expert_link.latency_s}};
    if (!p.expert_load_imbalance.empty()) {
      json imbalance = json::object();
      for (const auto& [layer, ratio] : p.expert_load_imbalance) imbalance[std::to_string(layer)] = ratio;
      out["expert_load_imbalance"] = imbalance;
    }
  }
  return out.dump(2);
}

Profile profile_from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = io::parse_untrusted_json(text, source);
  } catch (const json::exception& e) {
    OASES_FAIL("{} is not a profile: not valid JSON ({})", source, e.what());
  }
  // Compared as JSON values, which never throws whatever the types in the file.
  OASES_CHECK(j.is_object() && j.value("format", json()) == "oases-profile",
              "{} is not a profile written by `oases profile` (no \"format\": \"oases-profile\")",
              source);
  const json version = j.value("version", json(0));
  OASES_CHECK(version.is_number_integer() && version.get<int>() >= Profile::kOldestVersion &&
                  version.get<int>() <= Profile::kVersion,
              "{} is a profile of format version {}; this build reads versions {} to {}: re-run "
              "`oases profile`",
              source, version.dump(), Profile::kOldestVersion, Profile::kVersion);
  try {
    Profile p;
    const json& m = j.at("model");
    p.model.arch = model::parse_architecture(m.at("arch").get<std::string>());
    p.model.kv_heads = integer_at<std::int64_t>(m, "kv_heads", source);
    p.model.layers = integer_at<std::int64_t>(m, "layers", source);
    p.model.hidden = integer_at<std::int64_t>(m, "hidden", source);
    p.model.heads = integer_at<std::int64_t>(m, "heads", source);
    p.model.ffn_hidden = integer_at<std::int64_t>(m, "ffn_hidden", source);
    p.model.vocab_size = integer_at<std::int64_t>(m, "vocab_size", source);
    p.model.seq_len = integer_at<std::int64_t>(m, "seq_len", source);
    read_moe_model(m, p.model, source);
    p.tp = integer_at<int>(j, "tp", source);
    p.micro_batch = integer_at<std::int64_t>(j, "micro_batch", source);
    p.sub_batches = integer_at<int>(j, "sub_batches", source);
    p.element_bytes = integer_at<std::int64_t>(j, "element_bytes", source);
    read_memory_ratios(j, p, source);
    for (const json& d : j.at("degrees")) {
      DegreeProfile degree;
      degree.degree = integer_at<int>(d, "degree", source);
      degree.rows = integer_at<std::int64_t>(d, "rows", source);
      for (const auto& [kind, t] : d.at("segments").items())
        degree.segments[kind] = {t.at("forward_s"), t.at("recompute_s"), t.at("backward0_s"),
                                 t.at("backward1_s")};
      degree.collectives = d.at("collectives").get<std::map<std::string, double>>();
      degree.optimizer_s = d.at("optimizer_s");
      degree.parameter_bytes = integer_at<std::int64_t>(d, "parameter_bytes", source);
      degree.replica_reduce_per_layer_s = d.at("replica_reduce_per_layer_s");
      degree.overlap_slowdown = d.at("overlap_slowdown");
      degree.collective_slowdown = d.at("collective_slowdown");
      degree.parameter_bytes_per_layer =
          integer_at<std::int64_t>(d, "parameter_bytes_per_layer", source);
      for (const auto& [kind, sets] :
           d.at("activation_bytes").get<std::map<std::string, std::map<std::string, json>>>())
        for (const auto& [set, value] : sets)
          degree.activation_bytes[kind][set] = integer_value<std::int64_t>(value, set, source);
      degree.static_activation_bytes =
          integer_at<std::int64_t>(d, "static_activation_bytes", source);
      if (d.contains("collective_elements"))
        for (const auto& [key, value] : d.at("collective_elements").items())
          degree.collective_elements[key] = integer_value<std::int64_t>(value, key, source);
      p.degrees.push_back(std::move(degree));
    }
    p.reshards = j.at("reshards").get<std::map<std::string, double>>();
    if (j.contains("replica_link")) {
      const json& link = j.at("replica_link");
      p.replica_link = {integer_at<std::int64_t>(link, "bytes", source),
                        integer_at<int>(link, "ranks", source), link.at("seconds").get<double>()};
      OASES_CHECK(p.replica_link.bytes > 0 && p.replica_link.ranks >= 2 &&
                      std::isfinite(p.replica_link.seconds) && p.replica_link.seconds > 0,
                  "{}: malformed profile (replica_link: {} bytes over {} ranks in {} s: bytes "
                  "must be > 0, ranks >= 2 and seconds finite and > 0)",
                  source, p.replica_link.bytes, p.replica_link.ranks, p.replica_link.seconds);
    }
    if (j.contains("activation_codec"))
      for (const auto& item : j.at("activation_codec").items()) {
        const std::string word = item.key();
        const json& c = item.value();
        OASES_CHECK(std::ranges::any_of(ops::kActivationEncodingNames,
                                        [&](const auto& named) { return named.name == word; }),
                    "{}: malformed profile (activation_codec \"{}\": valid: \"bf16\", \"fp8\")",
                    source, word);
        const ActivationCodec codec{c.at("encode_s_per_element").get<double>(),
                                    c.at("decode_s_per_element").get<double>()};
        OASES_CHECK(std::isfinite(codec.encode_s_per_element) && codec.encode_s_per_element >= 0 &&
                        std::isfinite(codec.decode_s_per_element) &&
                        codec.decode_s_per_element >= 0,
                    "{}: malformed profile (activation_codec \"{}\": encode {} s and decode {} s "
                    "per element; each must be finite and >= 0)",
                    source, word, codec.encode_s_per_element, codec.decode_s_per_element);
        p.activation_codec[word] = codec;
      }
    if (j.contains("ep")) {
      p.ep = integer_at<int>(j, "ep", source);
      const json& link = j.at("expert_link");
      p.expert_link = {link.at("bytes_per_second"), link.at("latency_s")};
      OASES_CHECK(p.ep >= 1 && std::isfinite(p.expert_link.bytes_per_second) &&
                      p.expert_link.bytes_per_second >= 0 &&
                      std::isfinite(p.expert_link.latency_s) && p.expert_link.latency_s >= 0,
                  "{}: malformed profile (\"ep\" = {}, expert link {} B/s and {} s latency: ep "
                  "must be >= 1 and the link's figures finite and >= 0)",
                  source, p.ep, p.expert_link.bytes_per_second, p.expert_link.latency_s);
      if (j.contains("expert_load_imbalance"))
        for (const auto& [key, value] : j.at("expert_load_imbalance").items()) {
          const double ratio = value.get<double>();
          OASES_CHECK(std::isfinite(ratio) && ratio >= 1.0,
                      "{}: malformed profile (expert_load_imbalance of layer {} = {}: the busiest "
                      "rank's load over the mean is a finite ratio >= 1)",
                      source, key, ratio);
          int layer = -1;
          const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), layer);
          OASES_CHECK(error == std::errc() && end == key.data() + key.size() && layer >= 0,
                      "{}: malformed profile (expert_load_imbalance key \"{}\": a layer index)",
                      source, key);
          p.expert_load_imbalance[layer] = ratio;
        }
    }
    if (j.contains("sequence_parallel")) {
      OASES_CHECK(j.at("sequence_parallel").is_boolean(),
                  "{}: malformed profile (\"sequence_parallel\" = {}: true or false)", source,
                  j.at("sequence_parallel").dump());
      p.layout.sequence_parallel = j.at("sequence_parallel").get<bool>();
    }
    if (j.contains("cp")) {
      p.layout.cp = integer_at<int>(j, "cp", source);
      OASES_CHECK(p.layout.cp >= 1, "{}: malformed profile (\"cp\" = {}: at least 1)", source,
                  p.layout.cp);
      OASES_CHECK(j.contains("cp_kind") && j.at("cp_kind").is_string(),
                  "{}: malformed profile (\"cp\" without a \"cp_kind\" string)", source);
      p.layout.cp_kind = parse_named_value<ops::ContextParallelKind>(
          ops::kContextParallelKindNames, j.at("cp_kind").get<std::string>(), source + ": cp_kind");
    }
    check_profile_figures(p, source);
    return p;
  } catch (const json::exception& e) {
    OASES_FAIL("{}: malformed profile ({})", source, e.what());
  }
}

double expert_load_imbalance(const std::vector<double>& tokens_per_expert, int ep) {
  const auto experts = static_cast<int>(tokens_per_expert.size());
  OASES_CHECK(ep >= 1 && experts % ep == 0,
              "parallel.ep = {} does not divide the {} experts of a layer: each expert-parallel "
              "rank holds experts / ep of them",
              ep, experts);
  const int local = experts / ep;
  double busiest = 0, total = 0;
  for (int rank = 0; rank < ep; ++rank) {
    double load = 0;
    for (int e = rank * local; e < (rank + 1) * local; ++e) load += tokens_per_expert[static_cast<std::size_t>(e)];
    busiest = std::max(busiest, load);
    total += load;
  }
  return total > 0 ? busiest * ep / total : 1.0;
}

void write_profile(const Profile& profile, const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomically(path, to_json(profile) + "\n");
}

Profile read_profile(const std::string& path) {
  return profile_from_json(read_regular_file(path, "profile", kMaxJsonFileBytes), path);
}

void check_profile_matches(const Profile& p, const model::ModelConfig& m, std::int64_t micro_batch,
                           int sub_batches, const std::vector<int>& degrees,
                           const std::string& source, int ep) {
  const json measured = model_json(p.model), wanted = model_json(m);
  OASES_CHECK(m.has_moe() == p.model.has_moe(),
              "{} was measured for a {} model; this config's model {}: re-run `oases profile` "
              "with this config",
              source, p.model.has_moe() ? "mixture-of-experts" : "dense",
              m.has_moe() ? "has MoE layers (model.moe_every > 0)" : "is dense");
  for (const auto& [key, value] : wanted.items())
    OASES_CHECK(measured.at(key) == value,
                "{} was measured for another model: model.{} = {} there, {} in this config; "
                "re-run `oases profile` with this config",
                source, key, measured.at(key).dump(), value.dump());
  OASES_CHECK(p.micro_batch == micro_batch && p.sub_batches == sub_batches,
              "{} was measured at train.micro_batch = {} in {} sub-batch(es); this config runs {} "
              "in {}: re-run `oases profile` with this config",
              source, p.micro_batch, p.sub_batches, micro_batch, sub_batches);
  for (int degree : degrees) {
    if (p.at_degree(degree)) continue;
    std::string have;
    for (const DegreeProfile& d : p.degrees)
      have += (have.empty() ? "" : ", ") + std::to_string(d.degree);
    OASES_FAIL(
        "{} has no measurements at tensor-parallel degree {} (it has {}); re-run `oases "
        "profile` under mpirun with parallel.tp = {}",
        source, degree, have.empty() ? "none" : have, degrees.back());
  }
  for (int a : degrees)
    for (int b : degrees)
      if (a < b)
        OASES_CHECK(p.reshards.contains(Profile::reshard_key(a, b)),
                    "{} has no reshard time between degrees {} and {}; re-run `oases profile` "
                    "under mpirun with parallel.tp = {}",
                    source, a, b, degrees.back());
  if (ep > 1 && m.has_moe())
    OASES_CHECK(p.ep == ep && p.expert_link.bytes_per_second > 0,
                "{} has no expert-parallel link measured over {} ranks (it was profiled at "
                "parallel.ep = {}); this config splits the experts over parallel.ep = {}: re-run "
                "`oases profile` under mpirun with parallel.ep = parallel.dp = {} ({} ranks)",
                source, ep, p.ep, ep, ep, ep * degrees.back());
}

void check_profile_layout(const Profile& p, const ProfiledLayout& layout,
                          const std::string& source) {
  const auto cp_kind = [](const ProfiledLayout& l) {
    return value_name<ops::ContextParallelKind>(ops::kContextParallelKindNames, l.cp_kind);
  };
  OASES_CHECK(p.layout.sequence_parallel == layout.sequence_parallel,
              "{} was measured with parallel.sequence_parallel = {}; this config sets {}: the "
              "layers' segments differ, re-run `oases profile` with this config",
              source, p.layout.sequence_parallel, layout.sequence_parallel);
  OASES_CHECK(p.layout.cp == layout.cp && (layout.cp == 1 || p.layout.cp_kind == layout.cp_kind),
              "{} was measured at parallel.cp = {}{}; this config runs parallel.cp = {}{}: the "
              "attention's segments and transfers differ, re-run `oases profile` with this "
              "config (under mpirun with parallel.tp x parallel.cp ranks)",
              source, p.layout.cp,
              p.layout.cp > 1 ? fmt::format(" (cp_kind \"{}\")", cp_kind(p.layout)) : "", layout.cp,
              layout.cp > 1 ? fmt::format(" (cp_kind \"{}\")", cp_kind(layout)) : "");
}

}  // namespace oases::planner
