#include "report/report.h"

#include "core/regular_file.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "io/untrusted_json.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <numeric>
#include <optional>
#include <sstream>

namespace oases::report {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#include "report/report_page.inc"

// ---------------------------------------------------------------------------------------------
// Formatting for the run facts.

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::abs(bytes) >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[unit]);
}

std::string format_count(double n) {
  if (std::abs(n) >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (std::abs(n) >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (std::abs(n) >= 1e4) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string format_seconds(double s) {
  if (s < 120) return fmt::format("{:.2f} s", s);
  const auto total = static_cast<std::int64_t>(std::llround(s));
  if (total < 3600) return fmt::format("{} min {:02} s", total / 60, total % 60);
  return fmt::format("{} h {:02} min", total / 3600, (total % 3600) / 60);
}

// The start of `line` for a message, so a huge corrupt line does not flood the terminal.
std::string excerpt(std::string_view line) {
  constexpr std::size_t kMax = 80;
  return line.size() <= kMax ? std::string(line) : std::string(line.substr(0, kMax)) + "...";
}

// ---------------------------------------------------------------------------------------------
// What the report knows about the run besides its metrics.

struct RunFiles {
  fs::path dir;
  std::optional<json> run_json;     // run.json, when present and readable
  std::string config_text;          // the resolved config as TOML; empty: unknown
  std::string config_source;        // where config_text came from
  std::optional<plan::RunConfig> config;  // config_text parsed, when it parses
  std::vector<std::pair<std::int64_t, std::string>> checkpoints;  // (step, folder), by step
  std::vector<std::string> notes;  // what the page says was missing or unreadable
};

void warn_and_note(RunFiles& run, const ReportWarning& warn, const std::string& message) {
  run.notes.push_back(message);
  if (warn) warn(message);
}

// run.json's member `key` when it has JSON type `type`; null otherwise.
json run_json_member(const RunFiles& run, const char* key, json::value_t type) {
  if (!run.run_json || !run.run_json->contains(key)) return nullptr;
  const json& value = run.run_json->at(key);
  if (value.type() == type ||
      (type == json::value_t::number_integer && value.is_number_unsigned()) ||
      (type == json::value_t::number_float && value.is_number()))
    return value;
  return nullptr;
}

void read_run_json(RunFiles& run, const ReportWarning& warn) {
  const fs::path path = run.dir / "run.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    run.notes.push_back(fmt::format(
        "{} is absent: host, cpu, start time, threads and the memory breakdown were not "
        "recorded; the config comes from a checkpoint when there is one",
        path.string()));
    return;
  }
  try {
    json parsed = io::parse_untrusted_json(read_regular_file(path.string(), "run file", kMaxJsonFileBytes),
                                           "run file '" + path.string() + "'");
    OASES_CHECK(parsed.is_object(), "run file '{}' is not a JSON object", path.string());
    run.run_json = std::move(parsed);
  } catch (const std::exception& e) {
    warn_and_note(run, warn, fmt::format("run.json left out: {}", e.what()));
  }
}

void find_checkpoints(RunFiles& run) {
  std::vector<fs::path> folders{run.dir};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run.dir, ec))
    if (entry.is_directory(ec)) folders.push_back(entry.path());
  for (const fs::path& folder : folders)
    for (auto& found : io::complete_checkpoints(folder.string()))
      run.checkpoints.push_back(std::move(found));
  std::sort(run.checkpoints.begin(), run.checkpoints.end());
}

// The resolved config: run.json's, else the one stored with the newest checkpoint.
void find_config(RunFiles& run, const ReportWarning& warn) {
  const json text = run_json_member(run, "config", json::value_t::string);
  if (!text.is_null()) {
    run.config_text = text.get<std::string>();
    run.config_source = (run.dir / "run.json").string();
  } else if (!run.checkpoints.empty()) {
    const fs::path model_file = fs::path(run.checkpoints.back().second) / io::kModelFile;
    try {
      const auto file = io::SafetensorsFile::open(model_file.string());
      run.config_text = io::metadata_value(file, "oases_config");
      run.config_source = model_file.string();
    } catch (const std::exception& e) {
      warn_and_note(run, warn,
                    fmt::format("the config of {} left out: {}", model_file.string(), e.what()));
    }
  }
  if (run.config_text.empty()) {
    run.notes.push_back(
        fmt::format("no config: neither run.json nor a complete checkpoint in {} "
                    "or its subfolders holds one",
                    run.dir.string()));
    return;
  }
  try {
    run.config = plan::parse_run_config(run.config_text, run.config_source);
  } catch (const std::exception& e) {
    warn_and_note(run, warn,
                  fmt::format("the config text does not parse, so figures derived from it "
                              "(parameters, layout, tokens) are left out: {}",
                              e.what()));
  }
}

std::string find_metrics(const ReportOptions& options, const RunFiles& run) {
  if (!options.metrics.empty()) return options.metrics;
  const fs::path default_path = run.dir / "metrics.jsonl";
  std::error_code ec;
  if (fs::exists(default_path, ec)) return default_path.string();
  if (run.config && !run.config->log.metrics.empty()) {
    const fs::path named = run.dir / fs::path(run.config->log.metrics).filename();
    if (fs::exists(named, ec)) return named.string();
  }
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(run.dir, ec))
    entries.push_back(entry.path().filename().string() + (entry.is_directory(ec) ? "/" : ""));
  std::sort(entries.begin(), entries.end());
  std::string listing;
  for (const std::string& name : entries) listing += (listing.empty() ? "" : ", ") + name;
  OASES_FAIL(
      "no metrics file in run folder '{}': expected metrics.jsonl (the run's log.metrics "
      "written there); the folder holds {}; name another file with --metrics PATH",
      run.dir.string(), listing.empty() ? std::string("nothing") : listing);
}

// The trace to show (empty: none) and whether the user named it.
std::pair<std::string, bool> find_trace(const ReportOptions& options, const RunFiles& run) {
  if (!options.trace.empty()) return {options.trace, true};
  std::error_code ec;
  if (run.config && !run.config->log.trace.empty()) {
    // By its name in the run folder first: a folder copied or moved elsewhere keeps its own
    // trace, while the path as written may by now hold another run's.
    const fs::path named = run.config->log.trace;
    const fs::path beside = run.dir / named.filename();
    if (fs::is_regular_file(beside, ec)) return {beside.string(), false};
    if (fs::is_regular_file(named, ec)) return {named.string(), false};
  }
  const fs::path default_path = run.dir / "trace.json";
  if (fs::is_regular_file(default_path, ec)) return {default_path.string(), false};
  return {std::string(), false};
}

// ---------------------------------------------------------------------------------------------
// The sections of the page.

// The numbers of one metrics column that are not null, in order.
std::vector<double> column_values(const json& metrics, const char* field) {
  std::vector<double> values;
  const json& columns = metrics["columns"];
  if (!columns.contains(field)) return values;
  for (const json& v : columns[field])
    if (v.is_number()) values.push_back(v.get<double>());
  return values;
}

// The step of the last record whose `field` is a number, with that number.
std::optional<std::pair<std::int64_t, double>> last_value(const json& metrics, const char* field) {
  const json& columns = metrics["columns"];
  if (!columns.contains(field)) return std::nullopt;
  const json& values = columns[field];
  for (std::size_t i = values.size(); i-- > 0;)
    if (values[i].is_number())
      return std::make_pair(columns["step"][i].get<std::int64_t>(), values[i].get<double>());
  return std::nullopt;
}

std::vector<int> plan_degrees(const RunFiles& run, std::string& source) {
  std::vector<int> degrees;
  const json recorded = run_json_member(run, "layer_degrees", json::value_t::array);
  if (!recorded.is_null()) {
    for (const json& d : recorded)
      if (auto degree = io::json_integer<int>(d)) degrees.push_back(*degree);
    if (degrees.size() == recorded.size()) {
      source = "run.json";
      return degrees;
    }
    degrees.clear();
  }
  if (!run.config) return degrees;
  try {
    degrees = plan::make_run_plan(*run.config).layer_degrees;
  } catch (const std::exception&) {
    return {};  // a plan file that is gone, or "auto": the degrees are not known here
  }
  if (degrees.empty())
    degrees.assign(static_cast<std::size_t>(run.config->model.layers),
                   static_cast<int>(run.config->parallel.tp));
  source = "parallel.plan = \"" + run.config->parallel.plan + "\" in the config";
  return degrees;
}

json plan_section(const RunFiles& run) {
  std::string source;
  const std::vector<int> degrees = plan_degrees(run, source);
  if (degrees.empty()) return nullptr;
  return {{"layer_degrees", degrees}, {"source", source}};
}

json memory_section(const RunFiles& run) {
  const json recorded = run_json_member(run, "memory_bytes", json::value_t::object);
  if (recorded.is_null()) return nullptr;
  json parts = json::array();
  for (const char* key : {"parameters", "working_copy", "gradients", "optimizer", "activations"})
    if (recorded.contains(key) && recorded[key].is_number())
      parts.push_back({{"name", key}, {"bytes", recorded[key]}});
  return parts.empty() ? json(nullptr) : parts;
}

// The tokens of each record: recorded by the run, else step x global_batch x seq_len from the
// config (the same definition), else none.
void fill_tokens(json& metrics, RunFiles& run) {
  json& columns = metrics["columns"];
  if (columns.contains("tokens")) return;
  if (!run.config) {
    run.notes.push_back(
        "the metrics hold no token counts and no config says the batch size: "
        "charts against tokens are not available");
    return;
  }
  const double per_step = static_cast<double>(run.config->train.global_batch) *
                          static_cast<double>(run.config->model.seq_len);
  json tokens = json::array();
  for (const json& step : columns["step"]) tokens.push_back(step.get<double>() * per_step);
  columns["tokens"] = std::move(tokens);
  metrics["tokens_derived"] = true;
}

json facts_section(const RunFiles& run, const json& metrics, const std::string& metrics_path) {
  json facts = json::array();
  const auto add = [&](const std::string& label, const std::string& value) {
    facts.push_back({{"label", label}, {"value", value}});
  };
  const auto recorded_text = [&](const char* key) {
    const json v = run_json_member(run, key, json::value_t::string);
    return v.is_null() ? std::string("not recorded") : v.get<std::string>();
  };
  const json parameters = run_json_member(run, "parameters", json::value_t::number_integer);
  if (run.config) {
    const auto& m = run.config->model;
    const double count =
        parameters.is_null() ? static_cast<double>(m.parameter_count()) : parameters.get<double>();
    add("model", fmt::format("{}, {} layers, hidden {}, {} heads, seq {}, vocab {}: {} "
                             "parameters, {}",
                             model::name(m.arch), m.layers, m.hidden, m.heads, m.seq_len, m.vocab_size,
                             format_count(count), run.config->train.precision));
  } else {
    add("model", parameters.is_null() ? std::string("not recorded")
                                      : format_count(parameters.get<double>()) + " parameters");
  }
  json world = run_json_member(run, "world_size", json::value_t::number_integer);
  if (run.config || !world.is_null()) {
    const auto number = [&](const char* key, std::int64_t from_config) {
      const json v = run_json_member(run, key, json::value_t::number_integer);
      return v.is_null() ? from_config : v.get<std::int64_t>();
    };
    const plan::ParallelConfig p = run.config ? run.config->parallel : plan::ParallelConfig{};
    const std::int64_t tp = number("tp", p.tp), cp = number("cp", p.cp), dp = number("dp", p.dp),
                       pp = number("pp", p.pp);
    const std::int64_t ranks = world.is_null() ? tp * cp * dp * pp : world.get<std::int64_t>();
    std::string layout = cp > 1
                             ? fmt::format("{} rank(s): tp {} x cp {} x dp {} x pp {} ({})", ranks,
                                           tp, cp, dp, pp, p.cp_kind)
                             : fmt::format("{} rank(s): tp {} x dp {} x pp {}", ranks, tp, dp, pp);
    if (run.config) {
      layout += fmt::format(", schedule {}, recompute {}", p.schedule, p.recompute);
      const json schedule = run_json_member(run, "schedule", json::value_t::object);
      if (!schedule.is_null() && schedule.contains("recompute_every") &&
          schedule["recompute_every"].is_number_integer())
        layout += fmt::format(" (groups of {} layers)",
                              schedule["recompute_every"].get<std::int64_t>());
    }
    const json threads = run_json_member(run, "threads", json::value_t::number_integer);
    if (!threads.is_null())
      layout += fmt::format(", {} thread(s) per rank", threads.get<std::int64_t>());
    add("layout", layout);
  }
  if (run.config) {
    // How the run trains: the optimizer, the precision and what it keeps compressed.
    const plan::OptimConfig& t = run.config->train;
    const plan::Settings settings = plan::parse_settings(*run.config);
    std::string training = fmt::format("{} optimizer", t.optimizer);
    if (settings.precision == plan::Precision::bf16 || settings.precision == plan::Precision::fp16) {
      training += fmt::format("; {} mixed precision over fp32 master weights", t.precision);
      const json path = run_json_member(run, "gemm16_path", json::value_t::string);
      if (!path.is_null()) training += ", 16-bit products by " + path.get<std::string>();
      const auto scale = last_value(metrics, "loss_scale");
      const auto skipped = last_value(metrics, "skipped_steps");
      if (scale)
        training += fmt::format("; loss scale {:g} at step {}, {} step(s) skipped for overflow",
                                scale->second, scale->first, skipped ? skipped->second : 0.0);
    }
    if (settings.activation_compression.any())
      training += fmt::format("; kept activations held in {} between the passes",
                              settings.activation_compression.describe());
    add("training", training);
  }
  add("host", recorded_text("host"));
  add("cpu", recorded_text("cpu"));
  add("started", recorded_text("started"));

  const json& steps = metrics["columns"]["step"];
  const std::int64_t first_step = steps.front().get<std::int64_t>();
  const std::int64_t last_step = steps.back().get<std::int64_t>();
  const std::int64_t records = metrics["count"].get<std::int64_t>();
  std::string steps_text =
      records == 1 ? fmt::format("{} (1 record)", first_step)
                   : fmt::format("{} to {} ({} records)", first_step, last_step, records);
  const json start_step = run_json_member(run, "start_step", json::value_t::number_integer);
  if (!start_step.is_null() && start_step.get<std::int64_t>() > 0)
    steps_text +=
        fmt::format("; the last start resumed at step {}", start_step.get<std::int64_t>());
  add("steps", steps_text);
  if (const auto loss = last_value(metrics, "loss"))
    add("final training loss", fmt::format("{:.4f} at step {}", loss->second, loss->first));
  if (const auto val = last_value(metrics, "val_loss")) {
    const std::vector<double> vals = column_values(metrics, "val_loss");
    add("final validation loss",
        fmt::format("{:.4f} at step {} (first {:.4f})", val->second, val->first, vals.front()));
  }
  if (const auto tokens = last_value(metrics, "tokens"))
    add("tokens",
        format_count(tokens->second) +
            (metrics.contains("tokens_derived") ? " (step x global batch x seq_len)" : ""));
  const std::vector<double> step_times = column_values(metrics, "step_time_s");
  if (!step_times.empty()) {
    std::string time =
        format_seconds(std::accumulate(step_times.begin(), step_times.end(), 0.0)) + " in steps";
    const std::vector<double> clock = column_values(metrics, "time");
    if (clock.size() >= 2)
      time += fmt::format(", {} wall clock from first to last record",
                          format_seconds(*std::max_element(clock.begin(), clock.end()) -
                                         *std::min_element(clock.begin(), clock.end())));
    add("total time", time);
  }
  const std::vector<double> rates = column_values(metrics, "tokens_per_s");
  if (!rates.empty())
    add("mean throughput", format_count(std::accumulate(rates.begin(), rates.end(), 0.0) /
                                        static_cast<double>(rates.size())) +
                               " tokens/s");
  const std::vector<double> mfus = column_values(metrics, "mfu");
  if (!mfus.empty()) {
    std::string mfu = fmt::format("{:.1f}% mean over {} step(s)",
                                  100 * std::accumulate(mfus.begin(), mfus.end(), 0.0) /
                                      static_cast<double>(mfus.size()),
                                  mfus.size());
    // What it divides by: the peak of the precision the products ran in (train/peaks.h).
    const json peak = run_json_member(run, "peak", json::value_t::object);
    if (!peak.is_null() && peak.contains("flops_per_s") && peak["flops_per_s"].is_number()) {
      mfu += fmt::format(", against {:.1f} GFLOP/s per rank", peak["flops_per_s"].get<double>() / 1e9);
      if (peak.contains("precision") && peak["precision"].is_string())
        mfu += fmt::format(" of {} products by {}, measured {}",
                           peak["precision"].get<std::string>(), peak.value("path", std::string("?")),
                           peak.value("measured_at", std::string("?")));
      else
        mfu += " (log.peak_tflops)";
    }
    add("MFU", mfu);
  }
  const std::vector<double> peaks = column_values(metrics, "peak_mem_bytes");
  if (!peaks.empty()) {
    std::string memory =
        format_bytes(*std::max_element(peaks.begin(), peaks.end())) + " resident (rank 0 process)";
    const std::vector<double> activations = column_values(metrics, "peak_activation_bytes");
    if (!activations.empty())
      memory += ", " + format_bytes(*std::max_element(activations.begin(), activations.end())) +
                " of activations";
    add("peak memory", memory);
  }
  if (!run.checkpoints.empty()) {
    std::string list;
    for (const auto& [step, folder] : run.checkpoints) list += (list.empty() ? "" : ", ") + folder;
    add("checkpoints", list);
  }
  add("metrics file", metrics_path);
  return facts;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

const std::vector<std::string>& report_metric_fields() {
  static const std::vector<std::string> fields{
      "step",           "time",        "tokens",
      "loss",           "val_loss",    "lr",
      "grad_norm",      "step_time_s", "tokens_per_s",
      "model_tflops",   "mfu",         "compute_s",
      "exposed_comm_s", "comm_s",      "peak_activation_bytes",
      "peak_mem_bytes", "loss_scale",  "skipped_steps",
      "bubble_s",       "slowest_rank", "straggler_ratio"};
  return fields;
}

json read_metrics_columns(const std::string& path) {
  check_regular_file(path, "metrics file");
  std::ifstream in(path);
  OASES_CHECK(in.good(), "cannot read metrics file '{}': {}", path, std::strerror(errno));
  std::map<std::int64_t, json> by_step;
  std::int64_t repeated = 0, line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json record;
    try {
      record = io::parse_untrusted_json(
          line, fmt::format("metrics file '{}' line {}", path, line_number));
    } catch (const json::exception& e) {
      OASES_FAIL("metrics file '{}' line {}: not JSON ({}): {}", path, line_number, e.what(),
                 excerpt(line));
    }
    OASES_CHECK(record.is_object(),
                "metrics file '{}' line {}: expected a JSON object per line, "
                "found: {}",
                path, line_number, excerpt(line));
    const auto step =
        record.contains("step") ? io::json_integer<std::int64_t>(record["step"]) : std::nullopt;
    OASES_CHECK(step && *step >= 0,
                "metrics file '{}' line {}: \"step\" must be an integer >= 0, "
                "found {}",
                path, line_number,
                record.contains("step") ? record["step"].dump() : std::string("no step"));
    json kept = json::object();
    for (const std::string& field : report_metric_fields()) {
      if (!record.contains(field)) continue;
      const json& value = record[field];
      OASES_CHECK(value.is_number() || value.is_null(),
                  "metrics file '{}' line {}: \"{}\" must be "
                  "a number (or null for NaN), found {}",
                  path, line_number, field, excerpt(value.dump()));
      kept[field] = value;
    }
    // Per-rank figures ("rank_compute_s": [r0, r1, ...]) become a column per rank.
    for (const char* field : {"rank_compute_s", "rank_exposed_comm_s"}) {
      if (!record.contains(field)) continue;
      const json& values = record[field];
      OASES_CHECK(values.is_array() && values.size() <= 1u << 16,
                  "metrics file '{}' line {}: \"{}\" must be a list of numbers, one per rank, "
                  "found {}",
                  path, line_number, field, excerpt(values.dump()));
      for (std::size_t r = 0; r < values.size(); ++r) {
        OASES_CHECK(values[r].is_number(),
                    "metrics file '{}' line {}: \"{}\"[{}] must be a number, found {}", path,
                    line_number, field, r, excerpt(values[r].dump()));
        kept[fmt::format("{}.{}", field, r)] = values[r];
      }
    }
    if (by_step.contains(*step)) ++repeated;
    by_step[*step] = std::move(kept);
  }
  OASES_CHECK(!in.bad(), "cannot read metrics file '{}': {}", path, std::strerror(errno));
  OASES_CHECK(!by_step.empty(),
              "metrics file '{}' holds no records (a run writes one JSON object "
              "per line, one line per step); did the run reach its first step?",
              path);

  json columns = json::object();
  std::vector<std::string> fields = report_metric_fields();
  std::set<std::string> per_rank;  // "rank_compute_s.3", ... in the records that have them
  for (const auto& [step, record] : by_step)
    for (const auto& [key, value] : record.items())
      if (key.rfind("rank_", 0) == 0) per_rank.insert(key);
  fields.insert(fields.end(), per_rank.begin(), per_rank.end());
  for (const std::string& field : fields) {
    const bool present = std::any_of(by_step.begin(), by_step.end(), [&](const auto& entry) {
      return entry.second.contains(field);
    });
    if (!present) continue;
    json column = json::array();
    for (const auto& [step, record] : by_step)
      column.push_back(record.contains(field) ? record[field] : json(nullptr));
    columns[field] = std::move(column);
  }
  return {{"count", by_step.size()}, {"repeated", repeated}, {"columns", std::move(columns)}};
}

TraceEventKind trace_event_kind(std::string_view name) {
  const auto word = name.substr(0, name.find(' '));
  if (word == "F") return TraceEventKind::forward;
  if (word == "R") return TraceEventKind::recompute;
  if (word.size() >= 2 && word[0] == 'B' &&
      std::all_of(word.begin() + 1, word.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return TraceEventKind::backward;
  if (word == "AR" || word.starts_with("AR-")) return TraceEventKind::all_reduce;
  if (word == "AG") return TraceEventKind::all_gather;
  if (word == "ReduceGrads") return TraceEventKind::reduce_grads;
  if (word == "OptimizerStep") return TraceEventKind::optimizer;
  return TraceEventKind::other;
}

std::string_view trace_event_kind_name(TraceEventKind kind) {
  switch (kind) {
    case TraceEventKind::forward:
      return "forward";
    case TraceEventKind::recompute:
      return "recompute";
    case TraceEventKind::backward:
      return "backward";
    case TraceEventKind::all_reduce:
      return "all-reduce";
    case TraceEventKind::all_gather:
      return "all-gather";
    case TraceEventKind::reduce_grads:
      return "reduce-grads";
    case TraceEventKind::optimizer:
      return "optimizer";
    case TraceEventKind::other:
      return "other";
  }
  return "other";
}

json read_trace_timeline(const std::string& path) {
  const std::string text = read_regular_file(path, "trace");
  json trace;
  try {
    trace = io::parse_untrusted_json(text, "trace '" + path + "'");
  } catch (const json::exception& e) {
    OASES_FAIL("trace '{}' is not JSON: {}", path, e.what());
  }
  const json* events = &trace;
  if (trace.is_object() && trace.contains("traceEvents")) events = &trace["traceEvents"];
  OASES_CHECK(events->is_array(),
              "trace '{}' is not a Chrome trace: expected an object with a "
              "\"traceEvents\" array or an array of events",
              path);

  struct Event {
    int rank, lane;
    double start_us, dur_us;
    std::string name;
  };
  std::vector<Event> complete;
  std::map<int, json> lane_names;  // by rank
  for (std::size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string()) continue;
    // Ranks and lanes are never negative: -1 stands for a missing or malformed id.
    const auto id = [&](const char* key) {
      return e.contains(key) ? io::json_integer<int>(e[key]).value_or(-1) : -1;
    };
    const int pid = id("pid"), tid = id("tid");
    const std::string ph = e["ph"].get<std::string>();
    if (ph == "M" && pid >= 0 && tid >= 0 && e.contains("name") && e["name"] == "thread_name" &&
        e.contains("args") && e["args"].is_object() && e["args"].contains("name") &&
        e["args"]["name"].is_string())
      lane_names[pid][std::to_string(tid)] = e["args"]["name"];
    if (ph != "X") continue;
    OASES_CHECK(pid >= 0 && tid >= 0 && e.contains("ts") && e["ts"].is_number() &&
                    e.contains("dur") && e["dur"].is_number(),
                "trace '{}': event {} (\"ph\": \"X\") needs integer pid and tid >= 0 and "
                "numeric ts and dur, found {}",
                path, i, excerpt(e.dump()));
    complete.push_back({pid, tid, e["ts"].get<double>(), e["dur"].get<double>(),
                        e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>()
                                                                    : std::string()});
  }
  std::stable_sort(complete.begin(), complete.end(), [](const Event& a, const Event& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.start_us < b.start_us;
  });
  double first = 0, last = 0;
  if (!complete.empty()) {
    first = complete.front().start_us;
    last = complete.front().start_us;
    for (const Event& e : complete) {
      first = std::min(first, e.start_us);
      last = std::max(last, e.start_us + std::max(0.0, e.dur_us));
    }
  }
  // Nanoseconds are the clock's resolution; rounding to them keeps the embedded JSON short.
  const auto ns = [](double us) { return std::round(us * 1000.0) / 1000.0; };
  json ranks = json::array();
  for (std::size_t i = 0; i < complete.size();) {
    const int rank = complete[i].rank;
    json r = {{"rank", rank},
              {"lanes", lane_names.contains(rank) ? lane_names[rank] : json::object()},
              {"lane", json::array()},
              {"start_us", json::array()},
              {"dur_us", json::array()},
              {"kind", json::array()},
              {"name", json::array()}};
    for (; i < complete.size() && complete[i].rank == rank; ++i) {
      const Event& e = complete[i];
      r["lane"].push_back(e.lane);
      r["start_us"].push_back(ns(e.start_us - first));
      r["dur_us"].push_back(ns(std::max(0.0, e.dur_us)));
      r["kind"].push_back(static_cast<int>(trace_event_kind(e.name)));
      r["name"].push_back(e.name);
    }
    ranks.push_back(std::move(r));
  }
  json kinds = json::array();
  for (int k = 0; k < kTraceEventKinds; ++k)
    kinds.push_back(trace_event_kind_name(static_cast<TraceEventKind>(k)));
  return {{"span_us", ns(last - first)}, {"kinds", kinds}, {"ranks", ranks}};
}

json collect_report_data(const ReportOptions& options, const ReportWarning& warn) {
  RunFiles run;
  run.dir = options.run_dir;
  std::error_code ec;
  OASES_CHECK(fs::is_directory(run.dir, ec),
              "run folder '{}' is not a directory; pass the folder "
              "holding the run's metrics.jsonl (its log.metrics)",
              options.run_dir);
  read_run_json(run, warn);
  find_checkpoints(run);
  find_config(run, warn);

  const std::string metrics_path = find_metrics(options, run);
  json metrics = read_metrics_columns(metrics_path);
  if (metrics["repeated"].get<std::int64_t>() > 0)
    run.notes.push_back(
        fmt::format("{} metrics record(s) repeated an earlier step; the later "
                    "record of each step is shown",
                    metrics["repeated"].get<std::int64_t>()));
  fill_tokens(metrics, run);

  json trace = nullptr;
  const auto [trace_path, trace_named] = find_trace(options, run);
  if (trace_path.empty()) {
    run.notes.push_back(
        fmt::format("no trace: the config names no log.trace file that exists and "
                    "{} is absent (set log.trace to record one)",
                    (run.dir / "trace.json").string()));
  } else if (trace_named) {
    trace = read_trace_timeline(trace_path);
  } else {
    try {
      trace = read_trace_timeline(trace_path);
    } catch (const std::exception& e) {
      warn_and_note(run, warn, fmt::format("timeline left out: {}", e.what()));
    }
  }
  if (trace.is_object()) {
    trace["path"] = trace_path;
    if (run.config) trace["steps"] = run.config->log.trace_steps;
  }

  json data = {{"format", 1},
               {"run_name", fs::absolute(run.dir).lexically_normal().filename().string()},
               {"facts", facts_section(run, metrics, metrics_path)},
               {"metrics", std::move(metrics)},
               {"trace", std::move(trace)},
               {"plan", plan_section(run)},
               {"memory", memory_section(run)},
               {"config", run.config_text.empty() ? json(nullptr) : json(run.config_text)},
               {"config_source", run.config_source}};
  if (data["run_name"].get<std::string>().empty()) data["run_name"] = run.dir.string();
  data["notes"] = run.notes;
  return data;
}

std::string json_for_script(const json& value) {
  // Invalid UTF-8 (a corrupt config text) is replaced rather than failing the whole report.
  const std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size() + text.size() / 16);
  for (char c : text) {
    // '<' only occurs inside JSON strings, where \u003c denotes the same character.
    if (c == '<')
      out += "\\u003c";
    else
      out += c;
  }
  return out;
}

std::string report_page(const json& data) {
  const std::string embedded = json_for_script(data);
  std::string html;
  html.reserve(kReportPageHead.size() + embedded.size() + kReportPageTail.size());
  html.append(kReportPageHead);
  html.append(embedded);
  html.append(kReportPageTail);
  return html;
}

std::string write_report(const ReportOptions& options, const ReportWarning& warn) {
  const std::string output = options.output.empty()
                                 ? (fs::path(options.run_dir) / "report.html").string()
                                 : options.output;
  const std::string html = report_page(collect_report_data(options, warn));
  const fs::path parent = fs::path(output).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  OASES_CHECK(!ec, "--output: cannot create the folder '{}': {}", parent.string(), ec.message());
  write_file_atomically(output, html);
  return output;
}

}  // namespace oases::report
