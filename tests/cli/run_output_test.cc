// What a user sees of a training run and of `oases eval`, end to end through the binary:
// metrics with timestamps and token counts, run.json, the settings a plan file gave the run,
// the progress line (redrawn in place on a terminal, plain lines otherwise), only rank 0's
// summaries under mpirun, resuming with a changed learning-rate schedule, errors without source
// positions, the warning for a host with more ranks than cores, and eval's numbers on one rank
// and on two.
#include "plan/run_config.h"
#include "planner/planner.h"
#include "support/command.h"
#include "support/runs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using oases::testing::CommandResult;
using oases::testing::quoted;

CommandResult oases_command(const std::string& args) {
  return oases::testing::run_command(std::string(OASES_BINARY) + " " + args);
}

// Runs `command` with its stdout and stderr on a pseudo-terminal of 200 columns; returns what
// the terminal received.
CommandResult run_on_terminal(const std::string& command) {
  winsize size{};
  size.ws_row = 50;
  size.ws_col = 200;
  int master = -1;
  const pid_t child = forkpty(&master, nullptr, nullptr, &size);
  if (child < 0) return {-1, "forkpty failed"};
  if (child == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string output;
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(master, chunk, sizeof(chunk));
    if (n <= 0) break;  // EIO once the child side is closed
    output.append(chunk, static_cast<std::size_t>(n));
  }
  close(master);
  int status = 0;
  waitpid(child, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::vector<nlohmann::json> read_records(const fs::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t count = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// The learning rate of 0-based step s: linear warmup over w steps to lr, then cosine decay to
// min_lr ending at step decay_end (docs/models.md, "Reference semantics", written out here as
// the reference).
double scheduled_lr(std::int64_t s, double lr, double min_lr, std::int64_t w,
                    std::int64_t decay_end) {
  if (s < w) return lr * static_cast<double>(s + 1) / static_cast<double>(w);
  const double progress =
      std::min(1.0, static_cast<double>(s - w) / static_cast<double>(decay_end - w));
  return min_lr + 0.5 * (1 + std::cos(M_PI * progress)) * (lr - min_lr);
}

class RunOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("run_output_runs");
    const CommandResult data = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(data.exit_code, 0) << data.output;
    std::ofstream(dir_ / "tiny.toml") << R"(
[model]
layers = 2
hidden = 32
heads = 2
ffn_hidden = 64
vocab_size = 256
seq_len = 16
dropout = 0.0
[train]
micro_batch = 2
global_batch = 4
steps = 6
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
eval_every = 3
eval_steps = 2
threads = 1
precision = "fp64"
[data]
path = ")" + (dir_ / "data").string() + R"("
[log]
peak_tflops = 1.0
)";
  }

  // `oases train` (`flags` before --set) with `settings`.
  std::string train(const std::string& flags, const std::string& settings) const {
    return std::string(OASES_BINARY) + " train " + flags + " --config " +
           (dir_ / "tiny.toml").string() + " --set " + settings;
  }
  std::string in_dir(const std::string& key, const std::string& name) const {
    return key + "=" + quoted((dir_ / name).string()) + " ";
  }

  fs::path dir_;
};

TEST_F(RunOutput, MetricsCarryTimeAndTokensFromAStepZeroRecordAndRunJsonDescribesTheRun) {
  const std::string settings = in_dir("log.metrics", "run/metrics.jsonl") +
                               in_dir("checkpoint.dir", "run/ckpt") + "checkpoint.every=3";
  fs::create_directories(dir_ / "run");
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const CommandResult r = oases::testing::run_command(train("--quiet", settings));
  const double after =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto records = read_records(dir_ / "run/metrics.jsonl");
  ASSERT_EQ(records.size(), 7u);
  EXPECT_EQ(records[0]["step"], 0);
  EXPECT_EQ(records[0]["tokens"], 0);
  EXPECT_TRUE(records[0].contains("val_loss"));
  EXPECT_FALSE(records[0].contains("loss"));
  double previous_time = before;
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i]["step"].get<std::int64_t>(), static_cast<std::int64_t>(i));
    EXPECT_EQ(records[i]["tokens"].get<std::int64_t>(), static_cast<std::int64_t>(i) * 4 * 16);
    const double time = records[i]["time"].get<double>();
    EXPECT_GE(time, previous_time) << "step " << i;
    EXPECT_LE(time, after) << "step " << i;
    previous_time = time;
  }

  const auto run = nlohmann::json::parse(std::ifstream(dir_ / "run/run.json"));
  const auto config = oases::plan::load_run_config(
      (dir_ / "tiny.toml").string(),
      {"log.metrics=\"" + (dir_ / "run/metrics.jsonl").string() + "\"",
       "checkpoint.dir=\"" + (dir_ / "run/ckpt").string() + "\"", "checkpoint.every=3"});
  EXPECT_EQ(run["format"], 1);
  EXPECT_EQ(run["config"].get<std::string>(), oases::plan::to_toml(config));
  EXPECT_EQ(run["layer_degrees"], nlohmann::json({1, 1}));
  for (const char* key : {"world_size", "tp", "dp", "pp", "threads"}) EXPECT_EQ(run[key], 1) << key;
  EXPECT_EQ(run["parameters"].get<std::int64_t>(), config.model.parameter_count());
  EXPECT_EQ(run["start_step"], 0);
  EXPECT_EQ(run["memory_bytes"]["parameters"].get<std::int64_t>(),
            config.model.parameter_count() * 8);  // fp64
  EXPECT_EQ(run["memory_bytes"]["gradients"], run["memory_bytes"]["parameters"]);
  // AdamW: two moments per parameter.
  EXPECT_EQ(run["memory_bytes"]["optimizer"].get<std::int64_t>(),
            2 * config.model.parameter_count() * 8);
  EXPECT_GT(run["memory_bytes"]["activations"].get<std::int64_t>(), 0);
  EXPECT_TRUE(std::regex_match(run["started"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << run["started"];
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(run["host"], std::string(host));
  EXPECT_FALSE(run["cpu"].get<std::string>().empty());

  // Resumed at step 3: run.json says so, and the metrics hold each step once.
  fs::remove_all(dir_ / "run/ckpt/step_6");
  const CommandResult resumed =
      oases::testing::run_command(train("--quiet", settings + " checkpoint.resume=true"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir_ / "run/run.json"))["start_step"], 3);
  const auto again = read_records(dir_ / "run/metrics.jsonl");
  ASSERT_EQ(again.size(), 7u);
  for (std::size_t i = 0; i < again.size(); ++i)
    EXPECT_EQ(again[i]["step"].get<std::int64_t>(), static_cast<std::int64_t>(i));
}

// A plan file that carries settings (a joint plan's) names itself and what it set in a start-up
// line and in run.json's "plan"; a plan file of degrees alone adds neither.
TEST_F(RunOutput, SettingsFromAPlanFileAreNamedAtStartUpAndInRunJson) {
  oases::planner::Plan plan;
  plan.degrees = {1, 1};
  plan.predicted_step_seconds = 0.25;
  plan.settings = {{"parallel.schedule", "megatron"},
                   {"parallel.recompute", "full,none"},
                   {"train.micro_batch", "1"}};
  const std::string joint = (dir_ / "joint.json").string();
  oases::planner::write_plan(plan, 1, joint);
  const std::string settings = in_dir("log.metrics", "joint/metrics.jsonl") +
                               "checkpoint.dir=" + quoted("") + " train.steps=1 train.eval_every=0";
  const CommandResult r =
      oases::testing::run_command(train("", settings + " parallel.plan=" + quoted(joint)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // In the file's order (its keys sorted).
  EXPECT_NE(r.output.find("plan " + joint +
                          ": parallel.recompute=full,none, parallel.schedule=megatron, "
                          "train.micro_batch=1 (predicted step 0.25 s)\n"),
            std::string::npos)
      << r.output;
  const auto run = nlohmann::json::parse(std::ifstream(dir_ / "joint/run.json"));
  EXPECT_EQ(run["plan"], nlohmann::json({{"file", joint},
                                         {"settings",
                                          {{"parallel.schedule", "megatron"},
                                           {"parallel.recompute", "full,none"},
                                           {"train.micro_batch", "1"}}},
                                         {"predicted_step_s", 0.25}}));
  // The run took them: four micro-batches of one sequence, the first layer recomputed.
  EXPECT_EQ(run["schedule"]["kind"], "megatron");
  EXPECT_EQ(run["schedule"]["micro_batches"], 4);
  EXPECT_EQ(run["schedule"]["recompute"], "full,none");

  plan.settings.clear();
  const std::string degrees = (dir_ / "degrees.json").string();
  oases::planner::write_plan(plan, 1, degrees);
  const CommandResult plain = oases::testing::run_command(
      train("", in_dir("log.metrics", "degrees/metrics.jsonl") + "checkpoint.dir=" + quoted("") +
                    " train.steps=1 train.eval_every=0 parallel.plan=" + quoted(degrees)));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("plan " + degrees + ":"), std::string::npos) << plain.output;
  EXPECT_FALSE(nlohmann::json::parse(std::ifstream(dir_ / "degrees/run.json")).contains("plan"));
}

TEST_F(RunOutput, ProgressRedrawsInPlaceOnATerminalAndIsPlainLinesOtherwise) {
  const CommandResult tty = run_on_terminal(train("", "log.every=1"));
  ASSERT_EQ(tty.exit_code, 0) << tty.output;
  // Step 1 is redrawn by step 2 (no newline between them), step 3 (validation) stays, step 4
  // starts a fresh redraw, the last step stays.
  EXPECT_NE(tty.output.find("\x1b[K\rstep     2/6 |"), std::string::npos) << tty.output;
  EXPECT_EQ(tty.output.find("\rstep     1/6 |"), tty.output.find("step     1/6 |") - 1);
  const std::size_t step3 = tty.output.find("\rstep     3/6 |");
  ASSERT_NE(step3, std::string::npos) << tty.output;
  EXPECT_NE(tty.output.find("val_loss", step3), std::string::npos);
  // A line that stays ends with clear-to-end and a newline (the terminal shows \r\n).
  EXPECT_LT(tty.output.find("\x1b[K\r\n", step3), tty.output.find("step     4/6", step3));
  const std::size_t step6 = tty.output.find("\rstep     6/6 |");
  ASSERT_NE(step6, std::string::npos) << tty.output;
  EXPECT_NE(tty.output.find("\x1b[K\r\n", step6), std::string::npos);
  EXPECT_NE(tty.output.find("\r\nvalidation loss "), std::string::npos) << tty.output;

  const CommandResult plain = oases::testing::run_command(train("", "log.every=1"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find('\r'), std::string::npos) << plain.output;
  EXPECT_EQ(plain.output.find("\x1b["), std::string::npos) << plain.output;
  for (int step = 1; step <= 6; ++step)
    EXPECT_NE(plain.output.find(fmt::format("\nstep {:>5}/6 |", step)), std::string::npos)
        << "step " << step << ":\n"
        << plain.output;
}

TEST_F(RunOutput, ResumeWithAChangedScheduleIsExplainedAndFollowsTheChosenOne) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string base =
      in_dir("checkpoint.dir", "ckpt") + "checkpoint.every=2 checkpoint.keep=0";
  ASSERT_EQ(oases::testing::run_command(train("--quiet", base + " train.steps=4")).exit_code, 0);
  fs::remove_all(dir_ / "ckpt/step_4");
  fs::copy(dir_ / "ckpt", dir_ / "ckpt_copy", fs::copy_options::recursive);

  // Refused by default, with the numbers: steps 1 and 2 are warmup, step 3 starts the decay at
  // lr under both schedules, step 4 is the first whose rate differs.
  const std::string longer = base + " train.steps=8 checkpoint.resume=true ";
  const CommandResult refused = oases::testing::run_command(train("--quiet", longer));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  const auto lr_now = [](std::int64_t s) { return scheduled_lr(s, 3e-3, 3e-4, 2, 8); };
  const auto lr_was = [](std::int64_t s) { return scheduled_lr(s, 3e-3, 3e-4, 2, 4); };
  for (const std::string& part :
       {std::string("train.steps changed from 4 to 8"), std::string("at step 2"),
        fmt::format("the lr at step 3 stays {:.6g}", lr_now(2)),
        fmt::format("at step 4 it becomes {:.6g} (it would have been {:.6g})", lr_now(3),
                    lr_was(3)),
        std::string("--lr-schedule config"), std::string("--lr-schedule checkpoint")})
    EXPECT_NE(refused.output.find(part), std::string::npos) << part << "\n" << refused.output;

  // --lr-schedule config: the schedule recomputed for 8 steps.
  const CommandResult recomputed = oases::testing::run_command(
      train("--quiet --lr-schedule config", longer + in_dir("log.metrics", "config.jsonl")));
  ASSERT_EQ(recomputed.exit_code, 0) << recomputed.output;
  EXPECT_NE(recomputed.output.find("warning: train.steps changed from 4 to 8"), std::string::npos)
      << recomputed.output;
  auto lrs = oases::testing::metric_values(dir_ / "config.jsonl", "lr");
  ASSERT_EQ(lrs.size(), 6u);
  for (std::int64_t s = 2; s < 8; ++s)
    EXPECT_NEAR(lrs[static_cast<std::size_t>(s - 2)], lr_now(s), 1e-15) << "step " << s + 1;

  // --lr-schedule checkpoint: the checkpoint's decay ends at step 4; min_lr after it.
  fs::remove_all(dir_ / "ckpt");
  fs::rename(dir_ / "ckpt_copy", dir_ / "ckpt");
  const CommandResult kept = oases::testing::run_command(
      train("--quiet --lr-schedule checkpoint", longer + in_dir("log.metrics", "kept.jsonl")));
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  lrs = oases::testing::metric_values(dir_ / "kept.jsonl", "lr");
  ASSERT_EQ(lrs.size(), 6u);
  for (std::int64_t s = 2; s < 8; ++s)
    EXPECT_NEAR(lrs[static_cast<std::size_t>(s - 2)], lr_was(s), 1e-15) << "step " << s + 1;
  EXPECT_EQ(lrs.back(), 3e-4);
  // Resuming again from its checkpoint with the same config: nothing changed any more.
  const CommandResult again =
      oases::testing::run_command(train("--quiet", base + " train.steps=8 checkpoint.resume=true"));
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

TEST_F(RunOutput, UserErrorsShowNoSourcePositionUnlessDebugging) {
  const CommandResult r = oases::testing::run_command(train("--quiet", "model.heads=3"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("model.heads = 3"), std::string::npos) << r.output;
  EXPECT_FALSE(std::regex_search(r.output, std::regex(R"(\.(cc|h):\d+)"))) << r.output;
  const CommandResult debug =
      oases::testing::run_command("OASES_LOG_LEVEL=debug " + train("--quiet", "model.heads=3"));
  EXPECT_EQ(debug.exit_code, 2);
  EXPECT_TRUE(std::regex_search(debug.output, std::regex(R"(debug: raised at \w+\.cc:\d+)")))
      << debug.output;
}

TEST_F(RunOutput, UnderMpirunOnlyRankZeroPrintsSummariesAndEvalAgreesWithOneRank) {
  const std::string mpirun = oases::testing::mpirun_prefix(2);
  const CommandResult trained = oases::testing::run_command(
      mpirun + train("", "parallel.dp=2 " + in_dir("checkpoint.dir", "ckpt")));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_EQ(count_of(trained.output, "validation loss "), 1u) << trained.output;
  EXPECT_EQ(count_of(trained.output, "saved checkpoint"), 1u) << trained.output;

  const std::string eval = " eval --checkpoint " + (dir_ / "ckpt").string() + " --data " +
                           (dir_ / "data").string() + " --batches 3 --batch-size 4";
  const CommandResult one = oases_command(eval);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CommandResult two = oases::testing::run_command(mpirun + OASES_BINARY + eval);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(count_of(two.output, "nats/token"), 1u) << two.output;
  const CommandResult tp2 = oases::testing::run_command(mpirun + OASES_BINARY + eval + " --tp 2");
  ASSERT_EQ(tp2.exit_code, 0) << tp2.output;
  const std::regex loss_line(
      R"(loss (\S+) nats/token \| perplexity (\S+) \| (\S+) bits/byte \| (\d+) tokens \((\d+) bytes\))");
  std::smatch a, b, c;
  ASSERT_TRUE(std::regex_search(one.output, a, loss_line)) << one.output;
  ASSERT_TRUE(std::regex_search(two.output, b, loss_line)) << two.output;
  ASSERT_TRUE(std::regex_search(tp2.output, c, loss_line)) << tp2.output;
  const double loss = std::stod(a[1]);
  EXPECT_NEAR(std::stod(b[1]), loss, 1e-6 * loss);  // as printed: 6 decimals
  EXPECT_NEAR(std::stod(c[1]), loss, 1e-6 * loss);
  EXPECT_EQ(a[4], std::to_string(3 * 4 * 16));
  EXPECT_EQ(a[4], a[5]);  // the byte tokenizer: one byte per token
  EXPECT_NEAR(std::stod(a[3]), loss / std::log(2.0), 2e-6);  // both printed to 6 decimals

  // A verb that does not use MPI runs once.
  const CommandResult prepared = oases::testing::run_command(
      mpirun + OASES_BINARY + " prepare-data --input /usr/share/games/fortunes/fortunes --output " +
      (dir_ / "again").string());
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  EXPECT_EQ(count_of(prepared.output, "prepared "), 1u) << prepared.output;
}

TEST_F(RunOutput, AHostWithMoreRanksThanCoresIsWarnedAboutOnceAndGivesTheSameLosses) {
  // Both ranks confined to one core.
  const std::string settings = "parallel.dp=2 train.threads=0 train.steps=3 ";
  const CommandResult crowded = oases::testing::run_command(
      "taskset -c 0 " + oases::testing::mpirun_prefix(2) + "--bind-to none " +
      train("--quiet", settings + in_dir("log.metrics", "crowded.jsonl")));
  ASSERT_EQ(crowded.exit_code, 0) << crowded.output;
  EXPECT_EQ(count_of(crowded.output, "warning: 2 ranks run on host"), 1u) << crowded.output;
  EXPECT_NE(crowded.output.find("gives them 1 core"), std::string::npos) << crowded.output;
  EXPECT_NE(crowded.output.find("at most 1 rank per host"), std::string::npos) << crowded.output;

  const CommandResult roomy = oases::testing::run_command(
      oases::testing::mpirun_prefix(2) +
      train("--quiet", settings + "train.threads=2 " + in_dir("log.metrics", "roomy.jsonl")));
  ASSERT_EQ(roomy.exit_code, 0) << roomy.output;
  EXPECT_EQ(oases::testing::metric_values(dir_ / "crowded.jsonl", "loss"),
            oases::testing::metric_values(dir_ / "roomy.jsonl", "loss"));
}

TEST_F(RunOutput, EvalHasHelpAndRejectsBadOptions) {
  const CommandResult help = oases_command("eval --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--batches"), std::string::npos) << help.output;
  ASSERT_EQ(oases::testing::run_command(
                train("--quiet", in_dir("checkpoint.dir", "ckpt") + "train.steps=1"))
                .exit_code,
            0);
  const std::string eval =
      "eval --checkpoint " + (dir_ / "ckpt").string() + " --data " + (dir_ / "data").string();
  const CommandResult batches = oases_command(eval + " --batches some");
  EXPECT_EQ(batches.exit_code, 2);
  EXPECT_NE(batches.output.find("--batches = \"some\""), std::string::npos) << batches.output;
  const CommandResult tp = oases_command(eval + " --tp 2");
  EXPECT_EQ(tp.exit_code, 2);
  EXPECT_NE(tp.output.find("mpirun -np 2"), std::string::npos) << tp.output;
}

}  // namespace
