// `oases report` on a real run, drawn by a real browser: a 2-rank tensor-parallel run of a tiny
// GPT with validation and a trace, its report, and Debian's chromium in headless mode, which
// runs the page's script and dumps the resulting DOM (and a screenshot, kept under the build
// tree for people to look at). The page must draw without a script error, every chart must
// hold as many points as the metrics file has values of its series, and the timeline one
// rectangle per event of each rank of the trace. Expected counts are read from the run's files
// here, independently of the report's own reading.
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The value of attribute `name` in the start tag that begins with `tag_start` (e.g.
// `<svg id="chart-loss"`), or nullopt when there is no such tag or attribute.
std::optional<std::string> attribute(const std::string& dom, const std::string& tag_start,
                                     const std::string& name) {
  const std::size_t at = dom.find(tag_start);
  if (at == std::string::npos) return std::nullopt;
  const std::string tag = dom.substr(at, dom.find('>', at) - at);
  std::smatch m;
  if (!std::regex_search(tag, m, std::regex(" " + name + "=\"([^\"]*)\""))) return std::nullopt;
  return m[1].str();
}

// The DOM without the text of its <script> elements, whose source spells the markup it builds.
std::string without_scripts(const std::string& dom) {
  std::string out;
  std::size_t at = 0;
  for (std::size_t open = dom.find("<script"); open != std::string::npos;
       open = dom.find("<script", at)) {
    out += dom.substr(at, open - at);
    const std::size_t close = dom.find("</script>", open);
    if (close == std::string::npos) return out;
    at = close + std::string("</script>").size();
  }
  return out + dom.substr(at);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The number of records of the metrics file whose `field` is a number.
int count_numbers(const std::vector<json>& records, const std::string& field) {
  int n = 0;
  for (const json& r : records) n += r.contains(field) && r[field].is_number();
  return n;
}

// The records where both times are numbers and the step took time: the points of the
// exposed-communication share.
int count_exposed_share(const std::vector<json>& records) {
  int n = 0;
  for (const json& r : records)
    n += r.contains("exposed_comm_s") && r["exposed_comm_s"].is_number() &&
         r.contains("step_time_s") && r["step_time_s"].is_number() &&
         r["step_time_s"].get<double>() > 0;
  return n;
}

// Chromium's console messages in its log (--enable-logging=stderr): lines such as
// `[...:INFO:CONSOLE(12)] "Uncaught TypeError: ...", source: file:///... (12)`.
std::vector<std::string> console_errors(const std::string& log) {
  std::vector<std::string> found;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);)
    if (line.find("CONSOLE") != std::string::npos &&
        (line.find("ERROR") != std::string::npos || line.find("Error") != std::string::npos ||
         line.find("Uncaught") != std::string::npos))
      found.push_back(line);
  return found;
}

TEST(ReportBrowser, TwoRankRunDrawsEveryChartAndBothRanksTimeline) {
  const auto which = oases::testing::run_command("command -v chromium");
  ASSERT_EQ(which.exit_code, 0)
      << "chromium is not installed; run scripts/install-deps.sh --test, which installs it";

  const fs::path dir = oases::testing::fresh_test_folder("report_browser");
  const fs::path run = dir / "run";
  const auto prepared = oases::testing::prepare_fortunes_data(OASES_BINARY, dir);
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  std::ofstream(dir / "tiny.toml") << R"([model]
layers = 2
hidden = 64
heads = 4
ffn_hidden = 128
vocab_size = 257
seq_len = 24
[train]
micro_batch = 2
global_batch = 4
steps = 4
eval_every = 2
eval_steps = 1
threads = 1
[parallel]
tp = 2
[data]
path = ")" + (dir / "data").string() + R"("
[checkpoint]
dir = ")" + (run / "ckpt").string() + R"("
[log]
metrics = ")" + (run / "metrics.jsonl").string() +
                                          R"("
trace = ")" + (run / "trace.json").string() +
                                          R"("
trace_steps = 2
peak_tflops = 1.0
)";
  const auto trained =
      oases::testing::run_command(oases::testing::mpirun_prefix(2) + OASES_BINARY +
                                  " train --quiet --config " + (dir / "tiny.toml").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;

  const fs::path page = run / "report.html";
  const auto reported = oases::testing::run_command(std::string(OASES_BINARY) + " report " +
                                                    run.string() + " --output " + page.string());
  ASSERT_EQ(reported.exit_code, 0) << reported.output;
  EXPECT_NE(reported.output.find(page.string()), std::string::npos) << reported.output;

  // What the page must show, from the run's own files.
  std::vector<json> records;
  {
    std::ifstream in(run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) records.push_back(json::parse(line));
  }
  ASSERT_EQ(count_numbers(records, "loss"), 4);      // train.steps
  ASSERT_EQ(count_numbers(records, "val_loss"), 3);  // steps 0 (the initial model), 2 and 4
  ASSERT_EQ(records.front()["step"], 0);
  // The run's facts, written by rank 0 beside the metrics.
  const json facts = json::parse(read_text(run / "run.json"));
  ASSERT_TRUE(facts["host"].is_string()) << facts.dump();
  std::map<int, int> events_per_rank;
  const json trace = json::parse(read_text(run / "trace.json"));
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X") ++events_per_rank[e["pid"].get<int>()];
  ASSERT_EQ(events_per_rank.size(), 2u);

  const fs::path profile = dir / "chromium-profile";
  const std::string browser =
      "timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-background-networking "
      "--no-first-run --user-data-dir=" +
      profile.string() + " --enable-logging=stderr --v=0 ";
  const std::string url = "file://" + fs::absolute(page).string();
  const auto dumped = oases::testing::run_command(
      browser + "--virtual-time-budget=5000 --dump-dom " + url + " > " +
      (dir / "dom.html").string() + " 2> " + (dir / "chromium.log").string());
  const std::string dom = without_scripts(read_text(dir / "dom.html"));
  const std::string log = read_text(dir / "chromium.log");
  ASSERT_EQ(dumped.exit_code, 0) << dumped.output << log;
  EXPECT_TRUE(console_errors(log).empty()) << log;
  EXPECT_EQ(attribute(dom, "<body", "data-ready"), "true") << "the page's script did not finish";
  EXPECT_EQ(attribute(dom, "<body", "data-errors"), "0") << dom.substr(0, 4000);

  const std::map<std::string, std::string> expected_points{
      {"chart-loss", "loss:" + std::to_string(count_numbers(records, "loss")) +
                         ",val_loss:" + std::to_string(count_numbers(records, "val_loss"))},
      {"chart-lr", "lr:" + std::to_string(count_numbers(records, "lr"))},
      {"chart-grad-norm", "grad_norm:" + std::to_string(count_numbers(records, "grad_norm"))},
      {"chart-tokens-per-s",
       "tokens_per_s:" + std::to_string(count_numbers(records, "tokens_per_s"))},
      {"chart-mfu", "mfu:" + std::to_string(count_numbers(records, "mfu"))},
      {"chart-exposed-comm", "exposed_comm_share:" + std::to_string(count_exposed_share(records))},
      {"chart-memory",
       "peak_mem_bytes:" + std::to_string(count_numbers(records, "peak_mem_bytes")) +
           ",peak_activation_bytes:" +
           std::to_string(count_numbers(records, "peak_activation_bytes"))}};
  for (const auto& [id, points] : expected_points)
    EXPECT_EQ(attribute(dom, "<svg id=\"" + id + "\"", "data-points"), points) << id;

  ASSERT_NE(dom.find("<svg id=\"timeline\""), std::string::npos);
  for (const auto& [rank, events] : events_per_rank) {
    const std::string group = "<g class=\"rank\" data-rank=\"" + std::to_string(rank) + "\"";
    const std::size_t begin = dom.find(group);
    ASSERT_NE(begin, std::string::npos) << "no timeline group of rank " << rank;
    const std::string body = dom.substr(begin, dom.find("</g>", begin) - begin);
    int rects = 0;
    for (std::size_t at = body.find("<rect class=\"ev\""); at != std::string::npos;
         at = body.find("<rect class=\"ev\"", at + 1))
      ++rects;
    EXPECT_EQ(rects, events) << "rank " << rank;
    EXPECT_EQ(attribute(dom, group, "data-events"), std::to_string(events)) << "rank " << rank;
  }
  // The facts and the memory breakdown of run.json are on the page.
  EXPECT_NE(dom.find("<dd>" + facts["host"].get<std::string>() + "</dd>"), std::string::npos)
      << "no host in the run facts";
  EXPECT_NE(dom.find("<table class=\"small\" id=\"memory-table\""), std::string::npos)
      << "no memory breakdown";
  // Every event names its instruction on hover.
  EXPECT_NE(dom.find("<title>OptimizerStep — "), std::string::npos);

  // The other drawing of the charts: against tokens, on a logarithmic y axis.
  const auto toggled = oases::testing::run_command(
      browser + "--virtual-time-budget=5000 --dump-dom '" + url + "#x=tokens&log=1' > " +
      (dir / "dom_toggled.html").string() + " 2> " + (dir / "chromium_toggled.log").string());
  const std::string toggled_dom = without_scripts(read_text(dir / "dom_toggled.html"));
  const std::string toggled_log = read_text(dir / "chromium_toggled.log");
  ASSERT_EQ(toggled.exit_code, 0) << toggled.output << toggled_log;
  EXPECT_TRUE(console_errors(toggled_log).empty()) << toggled_log;
  EXPECT_EQ(attribute(toggled_dom, "<body", "data-ready"), "true");
  EXPECT_EQ(attribute(toggled_dom, "<body", "data-errors"), "0");
  EXPECT_EQ(attribute(toggled_dom, "<svg id=\"chart-loss\"", "data-log"), "true");
  EXPECT_EQ(attribute(toggled_dom, "<svg id=\"chart-loss\"", "data-points"),
            expected_points.at("chart-loss"));  // losses are positive: none dropped
  EXPECT_NE(toggled_dom.find(">tokens</text>"), std::string::npos) << "x axis not in tokens";

  // A picture of the page for people, under the build tree.
  const fs::path artifacts = fs::current_path() / "test-artifacts";
  fs::create_directories(artifacts);
  const fs::path screenshot = artifacts / "report.png";
  fs::remove(screenshot);
  const auto shot = oases::testing::run_command(
      browser +
      "--virtual-time-budget=5000 --hide-scrollbars --window-size=1280,4000 --screenshot=" +
      screenshot.string() + " " + url + " 2> " + (dir / "screenshot.log").string());
  ASSERT_EQ(shot.exit_code, 0) << shot.output << read_text(dir / "screenshot.log");
  const std::string png = read_text(screenshot);
  ASSERT_GT(png.size(), 1000u) << screenshot;
  EXPECT_EQ(png.substr(1, 3), "PNG");
  fs::copy_file(page, artifacts / "report.html", fs::copy_options::overwrite_existing);
  std::cout << "screenshot of the report: " << screenshot.string() << "\n";
}

}  // namespace
