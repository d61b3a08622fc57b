// `oases report` on hand-made run folders: what it reads from metrics, run.json, traces and
// checkpoints, what it says is missing, how the page embeds its data (no "</script>" from the
// data can end the element) and the errors for bad input. The page drawn in a browser is
// tests/browser/report_browser_test.cc.
#include "report/report.h"

#include "core/error.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "support/files.h"
#include "plan/run_config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
using oases::testing::expect_user_error;
using oases::testing::leftover_temporaries;
using oases::testing::read_bytes;
using oases::testing::TempDir;
using oases::testing::write_bytes;
using oases::report::ReportOptions;

constexpr const char* kDataElement = R"(<script type="application/json" id="report-data">)";

std::string config_toml(const std::string& extra = "") {
  return "[model]\nlayers = 3\nhidden = 32\nheads = 4\nffn_hidden = 64\nvocab_size = 50\n"
         "seq_len = 16\n[train]\nmicro_batch = 2\nglobal_batch = 4\n[parallel]\ntp = 2\n" +
         extra;
}

// A metrics line as the trainer writes it, at `step`, with the extra members `more`.
std::string metrics_line(int step, const json& more = json::object()) {
  json line = {{"step", step},
               {"loss", 5.0 - 0.5 * step},
               {"lr", 1e-3},
               {"grad_norm", 1.5},
               {"step_time_s", 0.25},
               {"tokens_per_s", 256.0},
               {"model_tflops", 0.01},
               {"mfu", 0.1},
               {"compute_s", 0.2},
               {"exposed_comm_s", 0.05},
               {"comm_s", 0.08},
               {"peak_activation_bytes", 1000 * step},
               {"peak_mem_bytes", 1 << 20}};
  line.update(more);
  return line.dump() + "\n";
}

// The JSON the page embeds, parsed back out of the page's text.
json embedded_data(const std::string& html) {
  const std::size_t begin = html.find(kDataElement);
  EXPECT_NE(begin, std::string::npos);
  const std::size_t start = begin + std::string(kDataElement).size();
  const std::size_t end = html.find("</script>", start);
  EXPECT_NE(end, std::string::npos);
  return json::parse(html.substr(start, end - start));
}

std::string fact(const json& data, const std::string& label) {
  for (const json& f : data["facts"])
    if (f["label"] == label) return f["value"].get<std::string>();
  return "(no fact '" + label + "')";
}

bool any_note_contains(const json& data, const std::string& text) {
  for (const json& note : data["notes"])
    if (note.get<std::string>().find(text) != std::string::npos) return true;
  return false;
}

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// A Chrome trace as runtime/trace.cc writes it: lane names, then complete events, per rank.
json two_rank_trace() {
  json events = json::array();
  const char* names[] = {"compute", "communication", "optimizer"};
  for (int rank = 0; rank < 2; ++rank) {
    for (int lane = 0; lane < 3; ++lane)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", rank},
                        {"tid", lane},
                        {"args", {{"name", names[lane]}}}});
    const auto add = [&](const std::string& name, int lane, double ts, double dur) {
      events.push_back(
          {{"name", name}, {"ph", "X"}, {"pid", rank}, {"tid", lane}, {"ts", ts}, {"dur", dur}});
    };
    const double offset = 1000.0 + rank;  // the clock of the job, not zero
    add("F attention.0 mb0 sb0", 0, offset + 10, 5);
    add("AR fwd attention.0 mb0 sb0", 1, offset + 15, 4);
    add("B1 attention.0 mb0 sb0", 0, offset + 20, 8);
    if (rank == 1) add("R mlp.0 mb0 sb0 [internals]", 0, offset + 30, 2);
    add("ReduceGrads bucket0", 2, offset + 33, 1);
    add("OptimizerStep", 2, offset + 40, 6);
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

// A folder as a run of the current trainer leaves it: run.json, a step-0 record and the time
// and tokens of every record, a trace.
class ReportOfCompleteRun : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = config_toml("[log]\ntrace_steps = 1\n# a comment </script><!-- -->\n");
    json run = {
        {"format", 1},
        {"config", config_},
        {"layer_degrees", {2, 1, 2}},
        {"world_size", 2},
        {"tp", 2},
        {"dp", 1},
        {"pp", 1},
        {"threads", 3},
        {"started", "2024-05-01T10:00:00Z"},
        {"host", "node</script>7"},
        {"cpu", "Test CPU 9000"},
        {"parameters", 123456},
        {"start_step", 0},
        {"memory_bytes",
         {{"parameters", 4096}, {"gradients", 4096}, {"optimizer", 8192}, {"activations", 1000}}}};
    write_bytes(dir_.file("run.json"), run.dump());
    std::string metrics =
        json{{"step", 0}, {"tokens", 0}, {"time", 100.0}, {"val_loss", 6.0}}.dump() + "\n";
    for (int step = 1; step <= 4; ++step) {
      json more = {{"time", 100.0 + step}, {"tokens", step * 64}, {"loss_scale", 1024.0}};
      if (step % 2 == 0) more["val_loss"] = 6.0 - step;
      metrics += metrics_line(step, more);
    }
    write_bytes(dir_.file("metrics.jsonl"), metrics);
    write_bytes(dir_.file("trace.json"), two_rank_trace().dump());
  }

  TempDir dir_{"report_complete"};
  std::string config_;
};

TEST_F(ReportOfCompleteRun, CollectsEveryFileItFinds) {
  std::vector<std::string> warnings;
  const json data = oases::report::collect_report_data(
      {dir_.path().string(), "", "", ""}, [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_TRUE(warnings.empty());
  const json& m = data["metrics"];
  EXPECT_EQ(m["count"], 5);
  EXPECT_EQ(m["columns"]["step"], json({0, 1, 2, 3, 4}));
  EXPECT_EQ(m["columns"]["tokens"], json({0, 64, 128, 192, 256}));  // as recorded, not derived
  EXPECT_FALSE(m.contains("tokens_derived"));
  EXPECT_EQ(m["columns"]["loss"], json({nullptr, 4.5, 4.0, 3.5, 3.0}));  // step 0 has no loss
  EXPECT_EQ(m["columns"]["val_loss"], json({6.0, nullptr, 4.0, nullptr, 2.0}));
  EXPECT_EQ(m["columns"]["loss_scale"][1], 1024.0);
  EXPECT_FALSE(m["columns"].contains("skipped_steps"));

  EXPECT_EQ(data["config"], config_);
  EXPECT_EQ(data["plan"]["layer_degrees"], json({2, 1, 2}));
  EXPECT_EQ(data["plan"]["source"], "run.json");
  ASSERT_EQ(data["memory"].size(), 4u);
  EXPECT_EQ(data["memory"][2]["name"], "optimizer");
  EXPECT_EQ(data["memory"][2]["bytes"], 8192);

  EXPECT_EQ(fact(data, "host"), "node</script>7");
  EXPECT_EQ(fact(data, "cpu"), "Test CPU 9000");
  EXPECT_EQ(fact(data, "started"), "2024-05-01T10:00:00Z");
  EXPECT_NE(fact(data, "model").find("123.5k parameters"), std::string::npos)
      << fact(data, "model");
  EXPECT_NE(fact(data, "layout").find("2 rank(s): tp 2 x dp 1 x pp 1"), std::string::npos);
  EXPECT_NE(fact(data, "layout").find("3 thread(s) per rank"), std::string::npos);
  EXPECT_EQ(fact(data, "steps"), "0 to 4 (5 records)");
  EXPECT_EQ(fact(data, "final training loss"), "3.0000 at step 4");
  EXPECT_EQ(fact(data, "final validation loss"), "2.0000 at step 4 (first 6.0000)");
  EXPECT_EQ(fact(data, "total time"),
            "1.00 s in steps, 4.00 s wall clock from first to last record");

  const json& trace = data["trace"];
  ASSERT_TRUE(trace.is_object());
  EXPECT_EQ(trace["path"], dir_.file("trace.json"));
  EXPECT_EQ(trace["steps"], 1);
  ASSERT_EQ(trace["ranks"].size(), 2u);
  EXPECT_EQ(trace["ranks"][0]["name"].size(), 5u);
  EXPECT_EQ(trace["ranks"][1]["name"].size(), 6u);
  EXPECT_EQ(trace["ranks"][1]["lanes"]["1"], "communication");
  // Times from the first event of the trace (rank 0's forward at 1010 us); the last event ends
  // at 1001 + 46 us.
  EXPECT_EQ(trace["ranks"][0]["start_us"][0], 0.0);
  EXPECT_EQ(trace["ranks"][1]["start_us"][0], 1.0);
  EXPECT_EQ(trace["span_us"], 1047.0 - 1010.0);
}

TEST_F(ReportOfCompleteRun, PageEmbedsTheDataWithoutEndingItsScript) {
  const std::string output = dir_.file("out/page.html");
  const std::string written =
      oases::report::write_report({dir_.path().string(), output, "", ""}, nullptr);
  EXPECT_EQ(written, output);
  const std::string html = read_bytes(output);
  const json data = embedded_data(html);
  EXPECT_EQ(data["config"], config_);  // "</script><!--" inside survives, escaped
  EXPECT_EQ(fact(data, "host"), "node</script>7");
  // Only the page's own three script elements end: the data holds no "</" at all.
  EXPECT_EQ(count_of(html, "</script>"), 3u);
  EXPECT_EQ(count_of(html, "<!-- -->"), 0u);
  // Nothing fetched at view time.
  for (const char* fetch : {"src=\"http", "href=\"http", "src='http", "@import", "url(http"})
    EXPECT_EQ(count_of(html, fetch), 0u) << fetch;
  for (const char* id :
       {"id=\"charts\"", "id=\"timeline-box\"", "id=\"errors\"", "data-errors=\"0\""})
    EXPECT_NE(html.find(id), std::string::npos) << id;
  // The atomic write leaves no temporary file behind.
  EXPECT_TRUE(leftover_temporaries(std::filesystem::path(output).parent_path()).empty());
}

TEST_F(ReportOfCompleteRun, DefaultOutputIsInTheRunFolder) {
  const std::string written =
      oases::report::write_report({dir_.path().string(), "", "", ""}, nullptr);
  EXPECT_EQ(written, dir_.file("report.html"));
  EXPECT_EQ(embedded_data(read_bytes(written))["metrics"]["count"], 5);
}

TEST_F(ReportOfCompleteRun, NamedTraceThatCannotBeReadIsAnError) {
  expect_user_error(
      [&] {
        oases::report::collect_report_data({dir_.path().string(), "", "", dir_.file("gone.json")},
                                          nullptr);
      },
      {"trace", "gone.json", "does not exist"});
  write_bytes(dir_.file("bad.json"), "{\"traceEvents\": [");
  expect_user_error(
      [&] {
        oases::report::collect_report_data({dir_.path().string(), "", "", dir_.file("bad.json")},
                                          nullptr);
      },
      {"trace", "bad.json", "is not JSON"});
}

TEST_F(ReportOfCompleteRun, FoundTraceThatCannotBeReadIsLeftOutWithAWarning) {
  write_bytes(dir_.file("trace.json"),
              R"({"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "ts": "soon"}]})");
  std::vector<std::string> warnings;
  const json data = oases::report::collect_report_data(
      {dir_.path().string(), "", "", ""}, [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_TRUE(data["trace"].is_null());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("timeline left out"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("numeric ts"), std::string::npos) << warnings[0];
  EXPECT_TRUE(any_note_contains(data, "timeline left out"));
}

TEST_F(ReportOfCompleteRun, TraceNamedByTheConfigIsTakenFromTheRunFolder) {
  // The run wrote its trace elsewhere and the folder was moved: the file of that name beside
  // the metrics is the run's, and it wins over trace.json.
  json run = json::parse(read_bytes(dir_.file("run.json")));
  run["config"] = config_toml("[log]\ntrace = \"/gone/elsewhere/steps.trace\"\n");
  write_bytes(dir_.file("run.json"), run.dump());
  json one_rank = two_rank_trace();
  json& events = one_rank["traceEvents"];
  events.erase(
      std::remove_if(events.begin(), events.end(), [](const json& e) { return e["pid"] == 1; }),
      events.end());
  write_bytes(dir_.file("steps.trace"), one_rank.dump());
  const json data = oases::report::collect_report_data({dir_.path().string(), "", "", ""}, nullptr);
  EXPECT_EQ(data["trace"]["path"], dir_.file("steps.trace"));
  EXPECT_EQ(data["trace"]["ranks"].size(), 1u);
}

TEST_F(ReportOfCompleteRun, CorruptRunJsonIsLeftOutWithAWarning) {
  write_bytes(dir_.file("run.json"), "{\"format\": 1, ");
  std::vector<std::string> warnings;
  const json data = oases::report::collect_report_data(
      {dir_.path().string(), "", "", ""}, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("run.json left out"), std::string::npos) << warnings[0];
  EXPECT_EQ(fact(data, "host"), "not recorded");
  EXPECT_TRUE(data["config"].is_null());
  EXPECT_EQ(data["metrics"]["count"], 5);
}

// A folder as an older trainer leaves it: no run.json, no time or tokens, the config only in
// the checkpoint, no trace.
// The training fact names the optimizer, mixed precision with its product path and fp16's last
// loss scale and skipped steps, and compressed kept sets; the layout fact names sqrt's groups.
TEST(Report, TrainingFactNamesOptimizerPrecisionAndCompression) {
  TempDir dir("report_training");
  const std::string config =
      "[model]\nlayers = 3\nhidden = 32\nheads = 4\nffn_hidden = 64\nvocab_size = 50\n"
      "seq_len = 16\n[train]\nmicro_batch = 2\nglobal_batch = 4\nprecision = \"fp16\"\n"
      "optimizer = \"sm3\"\n[parallel]\nactivation_compression = \"fp8\"\n"
      "recompute = \"sqrt\"\n";
  const json run = {{"format", 1},
                    {"config", config},
                    {"schedule", {{"recompute", "sqrt"}, {"recompute_every", 2}}},
                    {"gemm16_path", "f16 GEMM: convert+sgemm (test)"},
                    {"memory_bytes", {{"parameters", 8}, {"working_copy", 4}}}};
  write_bytes(dir.file("run.json"), run.dump());
  std::string metrics;
  for (int step = 1; step <= 3; ++step)
    metrics += metrics_line(step, {{"loss_scale", 4096.0 * step}, {"skipped_steps", step - 1}});
  write_bytes(dir.file("metrics.jsonl"), metrics);
  const json data = oases::report::collect_report_data({dir.path().string(), "", "", ""}, {});
  EXPECT_EQ(fact(data, "training"),
            "sm3 optimizer; fp16 mixed precision over fp32 master weights, 16-bit products by "
            "f16 GEMM: convert+sgemm (test); loss scale 12288 at step 3, 2 step(s) skipped for "
            "overflow; kept activations held in fp8 between the passes");
  EXPECT_NE(fact(data, "layout").find("recompute sqrt (groups of 2 layers)"), std::string::npos)
      << fact(data, "layout");
  ASSERT_EQ(data["memory"].size(), 2u);
  EXPECT_EQ(data["memory"][1]["name"], "working_copy");
}

TEST(Report, OlderRunTakesTheConfigFromTheNewestCheckpoint) {
  TempDir dir("report_older");
  std::string metrics;
  for (int step = 1; step <= 3; ++step)
    metrics += metrics_line(step, step == 3 ? json{{"val_loss", 3.25}} : json::object());
  write_bytes(dir.file("metrics.jsonl"), metrics);
  const float value = 1.0f;
  for (int step : {2, 3}) {
    oases::io::SafetensorsWriter model, optimizer;
    model.add("w", oases::DType::f32, {1}, &value);
    model.set_metadata("oases_config", config_toml(step == 3 ? "[log]\ntrace_steps = 2\n" : ""));
    optimizer.add("s", oases::DType::f32, {1}, &value);
    oases::io::write_checkpoint(dir.file("ckpt"), step, model, optimizer, 0);
  }
  const json data = oases::report::collect_report_data({dir.path().string(), "", "", ""}, nullptr);
  EXPECT_EQ(data["config"], config_toml("[log]\ntrace_steps = 2\n"));
  EXPECT_EQ(data["config_source"], dir.file("ckpt/step_3/model.safetensors"));
  // Tokens by the contract's definition: step x global_batch x seq_len = step x 4 x 16.
  EXPECT_EQ(data["metrics"]["columns"]["tokens"], json({64.0, 128.0, 192.0}));
  EXPECT_EQ(data["metrics"]["tokens_derived"], true);
  EXPECT_FALSE(data["metrics"]["columns"].contains("time"));
  // Every layer at parallel.tp under the uniform plan.
  EXPECT_EQ(data["plan"]["layer_degrees"], json({2, 2, 2}));
  EXPECT_TRUE(data["memory"].is_null());
  EXPECT_TRUE(data["trace"].is_null());
  EXPECT_EQ(fact(data, "host"), "not recorded");
  EXPECT_NE(fact(data, "checkpoints").find("step_3"), std::string::npos);
  const oases::plan::RunConfig config = oases::plan::parse_run_config(config_toml(), "test");
  const std::string expected_model =
      fmt::format("gpt, 3 layers, hidden 32, 4 heads, seq 16, vocab 50: {:.1f}k parameters, fp32",
                  static_cast<double>(config.model.parameter_count()) / 1e3);
  EXPECT_EQ(fact(data, "model"), expected_model);
  EXPECT_TRUE(any_note_contains(data, "run.json is absent"));
  EXPECT_TRUE(any_note_contains(data, "no trace"));
}

TEST(Report, SingleRecordWithoutConfigOrTrace) {
  TempDir dir("report_single");
  write_bytes(dir.file("metrics.jsonl"), metrics_line(1));
  const std::string page = oases::report::write_report({dir.path().string(), "", "", ""}, nullptr);
  const json data = embedded_data(read_bytes(page));
  EXPECT_EQ(data["metrics"]["count"], 1);
  EXPECT_EQ(data["metrics"]["columns"]["loss"], json({4.5}));
  EXPECT_EQ(fact(data, "steps"), "1 (1 record)");
  EXPECT_FALSE(data["metrics"]["columns"].contains("tokens"));
  EXPECT_TRUE(data["config"].is_null());
  EXPECT_TRUE(data["plan"].is_null());
  EXPECT_TRUE(any_note_contains(data, "no config"));
  EXPECT_TRUE(any_note_contains(data, "charts against tokens are not available"));
}

TEST(Report, MetricsFileOptionAndRunJsonLogMetricsName) {
  TempDir dir("report_named_metrics");
  write_bytes(dir.file("steps.jsonl"), metrics_line(1) + metrics_line(2));
  expect_user_error(
      [&] {
        oases::report::collect_report_data({dir.path().string(), "", "", ""}, nullptr);
      },
      {"no metrics file", dir.path().string(), "steps.jsonl", "--metrics"});
  EXPECT_EQ(
      oases::report::collect_report_data({dir.path().string(), "", dir.file("steps.jsonl"), ""},
                                        nullptr)["metrics"]["count"],
      2);
  // run.json lives beside the metrics file; its config names that file.
  write_bytes(
      dir.file("run.json"),
      json{{"config", config_toml("[log]\nmetrics = \"/elsewhere/steps.jsonl\"\n")}}.dump());
  EXPECT_EQ(oases::report::collect_report_data({dir.path().string(), "", "", ""},
                                              nullptr)["metrics"]["count"],
            2);
}

TEST(Report, RepeatedStepsKeepTheLaterRecordAndNullIsAMissingValue) {
  TempDir dir("report_repeated");
  write_bytes(dir.file("metrics.jsonl"), metrics_line(1) + metrics_line(2) + "\n" +
                                             metrics_line(2, {{"loss", nullptr}}) +
                                             metrics_line(3));
  const json metrics = oases::report::read_metrics_columns(dir.file("metrics.jsonl"));
  EXPECT_EQ(metrics["count"], 3);
  EXPECT_EQ(metrics["repeated"], 1);
  EXPECT_EQ(metrics["columns"]["loss"], json({4.5, nullptr, 3.5}));
}

TEST(Report, BadMetricsAreErrorsNamingFileAndLine) {
  TempDir dir("report_bad_metrics");
  const std::string path = dir.file("metrics.jsonl");
  expect_user_error([&] { oases::report::read_metrics_columns(path); },
                    {"metrics file", path, "does not exist"});
  write_bytes(path, "");
  expect_user_error([&] { oases::report::read_metrics_columns(path); }, {path, "holds no records"});
  write_bytes(path, "\n  \n");
  expect_user_error([&] { oases::report::read_metrics_columns(path); }, {"holds no records"});
  write_bytes(path, metrics_line(1) + metrics_line(2) + "{\"step\": 3, \"loss\": 2.\n");
  expect_user_error([&] { oases::report::read_metrics_columns(path); },
                    {path, "line 3", "not JSON"});
  write_bytes(path, metrics_line(1) + "[1, 2]\n");
  expect_user_error([&] { oases::report::read_metrics_columns(path); }, {"line 2", "a JSON object"});
  write_bytes(path, R"({"loss": 1.0})"
                    "\n");
  expect_user_error([&] { oases::report::read_metrics_columns(path); },
                    {"line 1", "\"step\"", "no step"});
  write_bytes(path, R"({"step": -1, "loss": 1.0})"
                    "\n");
  expect_user_error([&] { oases::report::read_metrics_columns(path); }, {"line 1", ">= 0", "-1"});
  write_bytes(path, metrics_line(1) + metrics_line(2, {{"grad_norm", "big"}}));
  expect_user_error([&] { oases::report::read_metrics_columns(path); },
                    {"line 2", "\"grad_norm\"", "\"big\"", "a number"});
}

TEST(Report, RunFolderMustExistAndHoldMetrics) {
  TempDir dir("report_folder");
  expect_user_error(
      [&] {
        oases::report::collect_report_data({dir.file("nope"), "", "", ""}, nullptr);
      },
      {"nope", "is not a directory"});
  write_bytes(dir.file("notes.txt"), "x");
  std::filesystem::create_directories(dir.path() / "ckpt");
  expect_user_error(
      [&] {
        oases::report::collect_report_data({dir.path().string(), "", "", ""}, nullptr);
      },
      {"no metrics file", "metrics.jsonl", "ckpt/, notes.txt"});
}

TEST(Report, TraceEventKindsFollowTheRecorderNames) {
  using K = oases::report::TraceEventKind;
  const std::vector<std::pair<std::string, K>> cases{
      {"F attention.3 mb0 sb1", K::forward},
      {"R mlp.0 mb0 sb0 [internals]", K::recompute},
      {"B1 head mb0 sb0", K::backward},
      {"B12 head mb0 sb0", K::backward},
      {"AR fwd head_softmax mb0 sb0", K::all_reduce},
      {"AR-max fwd head mb0 sb0", K::all_reduce},
      {"AR bwd replay attention.1 mb0 sb0", K::all_reduce},
      {"AG bwd reshard.2 mb0 sb0", K::all_gather},
      {"ReduceGrads bucket3", K::reduce_grads},
      {"OptimizerStep", K::optimizer},
      {"Free attention.0 mb0 sb0 [inputs]", K::other},
      {"Bx head", K::other},
      {"", K::other}};
  for (const auto& [name, kind] : cases)
    EXPECT_EQ(oases::report::trace_event_kind(name), kind) << name;
  EXPECT_EQ(oases::report::trace_event_kind_name(K::all_reduce), "all-reduce");
  EXPECT_EQ(oases::report::trace_event_kind_name(K::reduce_grads), "reduce-grads");
}

TEST(Report, TraceMayBeABareArrayAndMustBeATrace) {
  TempDir dir("report_trace");
  write_bytes(dir.file("array.json"),
              R"([{"name": "F a mb0 sb0", "ph": "X", "pid": 3, "tid": 0, "ts": 5, "dur": 2},
                  {"name": "ignored", "ph": "i", "pid": 3, "tid": 0, "ts": 1}])");
  const json timeline = oases::report::read_trace_timeline(dir.file("array.json"));
  ASSERT_EQ(timeline["ranks"].size(), 1u);
  EXPECT_EQ(timeline["ranks"][0]["rank"], 3);
  EXPECT_EQ(timeline["ranks"][0]["kind"], json({0}));
  EXPECT_EQ(timeline["span_us"], 2.0);
  write_bytes(dir.file("object.json"), R"({"events": []})");
  expect_user_error([&] { oases::report::read_trace_timeline(dir.file("object.json")); },
                    {"object.json", "traceEvents"});
  write_bytes(dir.file("no_pid.json"),
              R"([{"name": "F", "ph": "X", "tid": 0, "ts": 5, "dur": 2}])");
  expect_user_error([&] { oases::report::read_trace_timeline(dir.file("no_pid.json")); },
                    {"no_pid.json", "event 0", "pid"});
}

TEST(Report, ScriptJsonEscapesEveryLessThanSign) {
  const json value = {{"text", "a</script><!--b<c"}, {"n", 1.5}};
  const std::string text = oases::report::json_for_script(value);
  EXPECT_EQ(text.find('<'), std::string::npos) << text;
  EXPECT_EQ(json::parse(text), value);
  // Bytes that are not UTF-8 (a damaged config) do not stop the page.
  const std::string damaged = oases::report::json_for_script(json{{"text", std::string("a\xff"
                                                                                      "b")}});
  EXPECT_EQ(json::parse(damaged)["text"],
            "a\xEF\xBF\xBD"
            "b")
      << damaged;  // U+FFFD
}

}  // namespace
