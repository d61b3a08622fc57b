#include "sim/cluster.h"

#include "core/error.h"
#include "core/regular_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace oases::sim {
namespace {

std::string type_of(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// Reads the keys of one table, each once, and rejects the ones nobody asked for.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string where, std::string source)
      : table_(table), where_(std::move(where)), source_(std::move(source)) {}

  bool has(const std::string& key) const { return table_.contains(key); }

  std::string string(const std::string& key, bool required) {
    const toml::node* node = take(key, required);
    if (!node) return "";
    const auto value = node->value<std::string>();
    OASES_CHECK(value.has_value(), "{}: {} is {}; expected a string", source_, path(key),
                type_of(*node));
    return *value;
  }

  std::int64_t integer(const std::string& key, std::int64_t minimum) {
    const toml::node* node = take(key, true);
    OASES_CHECK(node->is_integer(), "{}: {} is {}; expected an integer >= {}", source_, path(key),
                type_of(*node), minimum);
    const std::int64_t value = *node->value<std::int64_t>();
    OASES_CHECK(value >= minimum, "{}: {} = {}; it must be >= {}", source_, path(key), value,
                minimum);
    return value;
  }

  // A number; `positive`: > 0, else >= 0. Absent: `fallback` unless required.
  double number(const std::string& key, bool required, bool positive, double fallback = 0) {
    const toml::node* node = take(key, required);
    if (!node) return fallback;
    OASES_CHECK(node->is_number(), "{}: {} is {}; expected a number {}", source_, path(key),
                type_of(*node), positive ? "> 0" : ">= 0");
    const double value = *node->value<double>();
    OASES_CHECK(std::isfinite(value) && (positive ? value > 0 : value >= 0),
                "{}: {} = {}; it must be a finite number {}", source_, path(key), value,
                positive ? "> 0" : ">= 0");
    return value;
  }

  std::vector<double> numbers(const std::string& key) {
    const toml::node* node = take(key, true);
    const toml::array* array = node->as_array();
    OASES_CHECK(array != nullptr && !array->empty(), "{}: {} is {}; expected a non-empty array of numbers",
                source_, path(key), array ? "an empty array" : type_of(*node));
    std::vector<double> out;
    for (const toml::node& element : *array) {
      OASES_CHECK(element.is_number(), "{}: {} holds {}; expected numbers only", source_, path(key),
                  type_of(element));
      out.push_back(*element.value<double>());
    }
    return out;
  }

  const toml::table& table(const std::string& key, bool required) {
    static const toml::table empty;
    const toml::node* node = take(key, required);
    if (!node) return empty;
    OASES_CHECK(node->is_table(), "{}: {} is {}; expected a table ([{}])", source_, path(key),
                type_of(*node), path(key));
    return *node->as_table();
  }

  const toml::array& array_of_tables(const std::string& key) {
    const toml::node* node = take(key, true);
    const toml::array* array = node->as_array();
    OASES_CHECK(array != nullptr && array->is_array_of_tables() && !array->empty(),
                "{}: {} must be one or more [[{}]] tables", source_, path(key), path(key));
    return *array;
  }

  // Every key of the table was read.
  void finish() const {
    for (const auto& [key, node] : table_) {
      const std::string name(key.str());
      OASES_CHECK(read_.contains(name), "{}: unknown key {}; valid keys here: {}", source_,
                  path(name), fmt::join(read_, ", "));
    }
  }

  std::string path(const std::string& key) const { return where_.empty() ? key : where_ + "." + key; }

 private:
  const toml::node* take(const std::string& key, bool required) {
    read_.insert(key);
    const toml::node* node = table_.get(key);
    OASES_CHECK(node != nullptr || !required, "{}: {} is missing", source_, path(key));
    return node;
  }

  const toml::table& table_;
  std::string where_, source_;
  std::set<std::string> read_;
};

// The curve of table `key` of `parent`; with `by_dtype`, also the sub-tables named after
// element types, each a curve of its own.
EfficiencyCurve read_curve(TableReader& parent, const std::string& key, const std::string& x_key,
                           const std::string& source,
                           std::map<std::string, EfficiencyCurve>* by_dtype = nullptr) {
  TableReader r(parent.table(key, true), parent.path(key), source);
  EfficiencyCurve curve;
  curve.x = r.numbers(x_key);
  curve.fraction = r.numbers("fraction");
  if (by_dtype)
    for (const char* dtype : {"fp32", "bf16", "fp16", "fp64"})
      if (r.has(dtype)) (*by_dtype)[dtype] = read_curve(r, dtype, x_key, source);
  r.finish();
  const std::string where = parent.path(key);
  OASES_CHECK(curve.x.size() == curve.fraction.size(),
              "{}: {}.{} has {} points and {}.fraction {}; give one fraction per point", source,
              where, x_key, curve.x.size(), where, curve.fraction.size());
  for (std::size_t i = 0; i < curve.x.size(); ++i) {
    OASES_CHECK(curve.x[i] > 0 && (i == 0 || curve.x[i] > curve.x[i - 1]),
                "{}: {}.{} must be positive and ascending; point {} is {}", source, where, x_key, i,
                curve.x[i]);
    OASES_CHECK(curve.fraction[i] > 0 && curve.fraction[i] <= 1,
                "{}: {}.fraction[{}] = {}; a fraction of the peak is in (0, 1]", source, where, i,
                curve.fraction[i]);
  }
  return curve;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

DeviceSpec read_device(TableReader& root, const std::string& source) {
  TableReader r(root.table("device", true), "device", source);
  DeviceSpec d;
  d.name = r.string("name", true);
  d.memory_bytes = r.number("memory_gib", true, true) * kGiB;
  d.memory_bytes_per_second = r.number("memory_bandwidth_gbs", true, true) * 1e9;
  d.kernel_launch_seconds = r.number("kernel_launch_us", false, false) * 1e-6;
  d.overlap_slowdown = r.number("overlap_slowdown", false, false);
  d.collective_slowdown = r.number("collective_slowdown", false, false);
  const std::string compute = r.has("compute") ? r.string("compute", true) : "roofline";
  OASES_CHECK(compute == "roofline" || compute == "profile",
              "{}: device.compute = \"{}\"; valid: \"roofline\" (peak_tflops and efficiency "
              "curves) or \"profile\" (this machine: times from `oases profile`)",
              source, compute);
  if (compute == "profile") {
    r.finish();
    return d;
  }
  TableReader peaks(r.table("peak_tflops", true), "device.peak_tflops", source);
  for (const char* dtype : {"fp32", "bf16", "fp16", "fp64"})
    if (peaks.has(dtype)) d.peak_flops[dtype] = peaks.number(dtype, true, true) * 1e12;
  peaks.finish();
  OASES_CHECK(d.peak_flops.contains("fp32"), "{}: device.peak_tflops.fp32 is missing", source);
  if (r.has("step_efficiency")) {
    d.step_efficiency = r.number("step_efficiency", true, true);
    OASES_CHECK(d.step_efficiency <= 1,
                "{}: device.step_efficiency = {}; a fraction of the kernels' figures is in (0, 1]",
                source, d.step_efficiency);
  }
  d.gemm_efficiency = read_curve(r, "gemm_efficiency", "flops", source, &d.gemm_efficiency_of);
  d.memory_efficiency = read_curve(r, "memory_efficiency", "bytes", source);
  r.finish();
  return d;
}

}  // namespace

double EfficiencyCurve::at(double value) const {
  OASES_ASSERT(!x.empty() && x.size() == fraction.size(), "an empty efficiency curve");
  if (value <= x.front()) return fraction.front();
  if (value >= x.back()) return fraction.back();
  const auto upper = static_cast<std::size_t>(std::upper_bound(x.begin(), x.end(), value) - x.begin());
  const std::size_t lower = upper - 1;
  const double t = (std::log10(value) - std::log10(x[lower])) /
                   (std::log10(x[upper]) - std::log10(x[lower]));
  return fraction[lower] + t * (fraction[upper] - fraction[lower]);
}

int ClusterSpec::domain_of(int tier, int device_index) const {
  return device_index / tiers[static_cast<std::size_t>(tier)].span;
}

int ClusterSpec::tier_between(int a, int b) const {
  if (a == b) return -1;
  for (std::size_t t = 0; t < tiers.size(); ++t)
    if (a / tiers[t].span == b / tiers[t].span) return static_cast<int>(t);
  OASES_ASSERT(false, "devices {} and {} share no tier of {}", a, b, name);
  return -1;
}

int ClusterSpec::tier_of(const std::vector<int>& group) const {
  int tier = -1;
  for (std::size_t i = 1; i < group.size(); ++i)
    tier = std::max(tier, tier_between(group[0], group[i]));
  return tier;
}

std::string_view precision_key(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::f64: return "fp64";
    default: return "fp32";
  }
}

ClusterSpec parse_cluster(const std::string& toml_text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    OASES_FAIL("cluster description {} is not valid TOML: {} (line {}, column {})", source,
               e.description(), e.source().begin.line, e.source().begin.column);
  }
  TableReader r(root, "", source);
  ClusterSpec c;
  c.name = r.string("name", true);
  c.description = r.string("description", false);
  {
    TableReader topology(r.table("topology", true), "topology", source);
    c.nodes = static_cast<int>(topology.integer("nodes", 1));
    c.devices_per_node = static_cast<int>(topology.integer("devices_per_node", 1));
    topology.finish();
  }
  c.device = read_device(r, source);
  int previous = 1;
  for (const toml::node& node : r.array_of_tables("tier")) {
    const std::string where = fmt::format("tier[{}]", c.tiers.size());
    TableReader t(*node.as_table(), where, source);
    LinkTier tier;
    tier.name = t.string("name", true);
    tier.span = static_cast<int>(t.integer("span", 2));
    tier.link_bytes_per_second = t.number("link_gbs", true, true) * 1e9;
    tier.uplink_bytes_per_second = t.number("uplink_gbs", false, false) * 1e9;
    tier.latency_seconds = t.number("latency_us", true, false) * 1e-6;
    const std::string sharing = t.has("sharing") ? t.string("sharing", true) : "fair";
    OASES_CHECK(sharing == "fair" || sharing == "issue-order",
                "{}: {}.sharing = \"{}\" (\"{}\"); valid: \"fair\" (concurrent transfers split "
                "the bandwidth) or \"issue-order\" (they move one at a time, in issue order)",
                source, where, sharing, tier.name);
    tier.in_issue_order = sharing == "issue-order";
    if (t.has("efficiency")) tier.efficiency = read_curve(t, "efficiency", "bytes", source);
    t.finish();
    OASES_CHECK(tier.span > previous && tier.span % previous == 0,
                "{}: {}.span = {} (\"{}\"); each tier's span must be a multiple of the one "
                "before it ({}) and larger",
                source, where, tier.span, tier.name, previous);
    for (const LinkTier& other : c.tiers)
      OASES_CHECK(other.name != tier.name, "{}: two tiers are named \"{}\"", source, tier.name);
    previous = tier.span;
    c.tiers.push_back(tier);
  }
  r.finish();
  OASES_CHECK(c.tiers.back().span == c.devices(),
              "{}: the last tier (\"{}\") spans {} devices; it must span every device: "
              "topology.nodes x topology.devices_per_node = {}",
              source, c.tiers.back().name, c.tiers.back().span, c.devices());
  const bool node_is_a_span =
      c.devices_per_node == 1 ||
      std::any_of(c.tiers.begin(), c.tiers.end(),
                  [&](const LinkTier& t) { return t.span == c.devices_per_node; });
  std::vector<int> spans;
  for (const LinkTier& t : c.tiers) spans.push_back(t.span);
  OASES_CHECK(node_is_a_span,
              "{}: topology.devices_per_node = {} is not the span of any tier ({}); one tier "
              "must link exactly the devices of a node",
              source, c.devices_per_node, fmt::join(spans, ", "));
  return c;
}

ClusterSpec load_cluster(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string text =
      read_regular_file(path, "cluster description", kMaxTextFileBytes);
  if (overrides.empty()) return parse_cluster(text, path);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    OASES_FAIL("cluster description {} is not valid TOML: {} (line {}, column {})", path,
               e.description(), e.source().begin.line, e.source().begin.column);
  }
  for (const std::string& assignment : overrides) {
    const auto equals = assignment.find('=');
    OASES_CHECK(equals != std::string::npos && equals > 0,
                "cluster override '{}' must read key=value (e.g. tier.network.link_gbs=12.5)",
                assignment);
    const std::string key = assignment.substr(0, equals), value = assignment.substr(equals + 1);
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      parsed = toml::table{{"v", value}};
    }
    std::vector<std::string> parts;
    for (std::size_t at = 0; at <= key.size();) {
      const auto dot = std::min(key.find('.', at), key.size());
      parts.push_back(key.substr(at, dot - at));
      at = dot + 1;
    }
    toml::table* table = &root;
    if (parts.size() == 3 && parts[0] == "tier") {
      toml::array* tiers = root["tier"].as_array();
      table = nullptr;
      if (tiers)
        for (toml::node& tier : *tiers)
          if (tier.is_table() && (*tier.as_table())["name"].value<std::string>() == parts[1])
            table = tier.as_table();
      OASES_CHECK(table != nullptr, "cluster override {}: {} has no tier named \"{}\"", assignment,
                  path, parts[1]);
      parts.erase(parts.begin(), parts.begin() + 2);
    } else {
      OASES_CHECK(parts.size() <= 3 && !parts.back().empty(),
                  "cluster override {}: the key must be name, section.key, section.table.key or "
                  "tier.NAME.key",
                  assignment);
      for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
        toml::table* next = (*table)[parts[i]].as_table();
        OASES_CHECK(next != nullptr, "cluster override {}: {} has no [{}] table", assignment, path,
                    parts[i]);
        table = next;
      }
      parts.erase(parts.begin(), parts.end() - 1);
    }
    parsed.get("v")->visit([&](const auto& v) { table->insert_or_assign(parts.back(), v); });
  }
  std::stringstream edited;
  edited << root;
  return parse_cluster(edited.str(), path);
}

void check_cluster_holds(const ClusterSpec& cluster, std::int64_t ranks, const std::string& source) {
  OASES_CHECK(ranks <= cluster.devices(),
              "the config runs {} ranks (tp x dp x pp) but the cluster {} ({}) has {} devices "
              "({} nodes x {}); choose a smaller layout or a larger cluster (topology.nodes)",
              ranks, source, cluster.name, cluster.devices(), cluster.nodes,
              cluster.devices_per_node);
}

}  // namespace oases::sim
