// `oases report`: one self-contained HTML page about a training run, built from the files the
// run left in its folder:
//
//   metrics.jsonl  required: one JSON object per step (train/trainer.cc writes it on rank 0;
//                  docs/metrics-and-reports.md, "Metrics"); a fresh run may start with a
//                  step-0 record holding only step, tokens, time and val_loss
//   run.json       optional: the resolved config (TOML text), layer degrees, layout, host,
//                  cpu, start time, parameter count and memory breakdown of the run
//   a trace        optional: the Chrome trace of log.trace (runtime/trace.h), one process per
//                  rank and one thread per lane
//   checkpoints    optional: without run.json, the config comes from the newest checkpoint's
//                  model.safetensors metadata "oases_config" (train/checkpoint.h)
//
// The page embeds everything it shows as JSON and draws it with its own script into inline
// SVG: it opens offline, from a file, with nothing fetched. Charts are <svg> elements with
// stable ids (chart-loss, chart-lr, chart-grad-norm, chart-tokens-per-s, chart-mfu,
// chart-exposed-comm, chart-memory, chart-loss-scale, chart-skipped-steps) whose
// data-points attribute reads "series:count,series:count" (the points each series has, however
// many are drawn); the timeline is <svg id="timeline"> with one <g class="rank" data-rank="r"
// data-events="n"> per rank holding that rank's <rect class="ev"> elements, one per event (over
// 20,000 events in all, neighbours within a pixel are drawn as one; data-rects counts them).
// <body> carries data-ready="true" once the page has drawn and data-errors = the number of
// script errors it caught (each also shown in a visible box). The address can choose the
// charts' toggles: report.html#x=tokens&log=1.
//
// Which files are read:
//   metrics: --metrics; else RUN_DIR/metrics.jsonl; else the file named like run.json's
//            log.metrics in RUN_DIR. Missing, empty or malformed (line number named): UserError.
//   trace:   --trace (unreadable: UserError); else the config's log.trace when that file exists
//            (by its name in RUN_DIR, else as written); else RUN_DIR/trace.json. A trace found
//            this way that cannot be read is a warning, and the page shows no timeline and says
//            why.
//   run.json and checkpoints: read when present; unreadable ones are warnings, shown in the page.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::report {

struct ReportOptions {
  std::string run_dir;
  std::string output;   // empty: <run_dir>/report.html
  std::string metrics;  // empty: found in run_dir (above)
  std::string trace;    // empty: found (above); given: must be readable
};

// Hears what the report had to leave out (an unreadable trace or run.json), as it happens; the
// page says the same in its notes.
using ReportWarning = std::function<void(const std::string&)>;

// The metrics file as columns: {"count": records, "columns": {"step": [...], "loss": [...],
// ...}}. Records are ordered by step; a step recorded twice keeps its later record (a run
// resumed by an older trainer appended again) and "repeated" counts the records dropped so.
// A column exists when some record has the field; records without it hold null, as does a
// field written as null (the JSON of a NaN). Fields other than the known ones are ignored.
// UserError naming the file and line for a line that is not a JSON object, a record without an
// integer "step" >= 0, or a known field that is neither a number nor null; and for a file
// that cannot be read or holds no record.
nlohmann::json read_metrics_columns(const std::string& path);

// The metrics fields a report knows, in the order of the columns.
const std::vector<std::string>& report_metric_fields();

// What an instruction of the trace was, from its event name (runtime/trace.h lists them):
// "F" forward, "R" recompute, "B<k>" backward, "AR"/"AR-max" all-reduce, "AG" all-gather,
// "ReduceGrads" reduce-grads, "OptimizerStep" optimizer; anything else (frees, pipeline sends
// and receives) other.
enum class TraceEventKind {
  forward,
  recompute,
  backward,
  all_reduce,
  all_gather,
  reduce_grads,
  optimizer,
  other
};
inline constexpr int kTraceEventKinds = 8;
TraceEventKind trace_event_kind(std::string_view event_name);
std::string_view trace_event_kind_name(TraceEventKind kind);  // "forward", "all-reduce", ...

// The complete ("ph": "X") events of a Chrome trace, per rank (process id) in rank order:
// {"span_us": last end - first start, "kinds": [kind names, indexed by "kind" below],
//  "ranks": [{"rank": r, "lanes": {"<tid>": "<thread name>", ...},
//             "lane": [...], "start_us": [...], "dur_us": [...], "kind": [...],
//             "name": [...]}]} with start_us measured from the trace's first event and events
// ordered by start. UserError naming the file when it cannot be read, is not a trace (an
// object with a traceEvents array, or a bare array of events), or an "X" event lacks a
// numeric ts, dur, pid or tid.
nlohmann::json read_trace_timeline(const std::string& path);

// Everything the page shows, as JSON (its "facts", "notes", "metrics", "trace", "config",
// "plan", "memory" and "sources" members). Reads the files above; `warn` hears the problems
// that leave something out.
nlohmann::json collect_report_data(const ReportOptions& options, const ReportWarning& warn);

// `value` as JSON text that can sit inside an HTML <script> element: every '<' is written as
// the JSON escape \u003c, so no "</script>" or "<!--" in a string can end or alter the element.
std::string json_for_script(const nlohmann::json& value);

// The HTML page for collect_report_data's result.
std::string report_page(const nlohmann::json& data);

// Collects the data, writes the page to options.output (default <run_dir>/report.html)
// atomically, creating its folder, and returns the path written.
std::string write_report(const ReportOptions& options, const ReportWarning& warn);

}  // namespace oases::report
