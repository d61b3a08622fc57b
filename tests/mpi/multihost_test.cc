// One job over several hosts, launched as on real machines: `mpirun --hostfile` on host a
// starts Open MPI's daemon on each other host through an rsh agent, and the ranks of different
// hosts talk over TCP. The hosts are network and UTS namespaces of this machine
// (support/hosts.h), so each has its own address and host name; the tests skip without root.
//
// Across two hosts, tp 2 x dp 2, pp 2 (alone and with tp 2 on each host) and the oases
// schedule with its tensor-parallel pair split over the hosts give the losses, parameters and
// optimizer state of the single process in fp64 to 1e-10 (see tests/mpi/layouts_test.cc), and
// the start-up line says which ranks run where; a checkpoint written by a two-host run resumes
// on one host with the uninterrupted run's losses; and ranks of a host that never reach MPI
// start-up end the job at parallel.startup_timeout_s with a message naming that host (of two
// hosts, and of three, two of them absent). A rank stopped on host b is named with its host by
// `oases flight`, from the records of the ranks that waited for it.
#include "support/background.h"
#include "support/command.h"
#include "support/files.h"
#include "support/hosts.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace oases::testing {
namespace {

namespace fs = std::filesystem;

class SeveralHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_test_folder("multihost_runs");
    const CommandResult r = prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(dir_ / "gpt.toml") << tiny_fp64_config("gpt", 3, dir_ / "data");
    write_random_init(dir_ / "gpt.toml", dir_ / "init.safetensors", 53);
  }

  // `oases train` of the tiny GPT under `layout` with `extra` settings, writing metrics.jsonl
  // and ckpt/ under dir_/`name`, launched by `launcher` (an mpirun prefix). Expects success;
  // returns what it printed.
  static std::string train_across(const std::string& launcher, RunLayout layout,
                                  const std::string& name, const std::string& extra = "") {
    const fs::path out = dir_ / name;
    const std::string command =
        launcher + OASES_BINARY + " train --config " + (dir_ / "gpt.toml").string() +
        " --init-from " + (dir_ / "init.safetensors").string() +
        " --set parallel.tp=" + std::to_string(layout.tp) +
        " parallel.pp=" + std::to_string(layout.pp) + " parallel.dp=" + std::to_string(layout.dp) +
        " log.metrics=" + quoted((out / "metrics.jsonl").string()) +
        " checkpoint.dir=" + quoted((out / "ckpt").string()) + " " + extra;
    const CommandResult r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    return r.output;
  }

  // The single-process run every layout is compared with.
  static fs::path reference(const std::string& extra = "") {
    return train_run(OASES_BINARY, dir_ / "gpt.toml", dir_ / "init.safetensors", {}, dir_ / "one_process",
                     extra);
  }

  // The start-up line of a run whose ranks fill `hosts` in order, `per_host` each.
  static std::string hosts_line(const NamespaceHosts& hosts, int per_host) {
    std::string line = "hosts: " + std::to_string(per_host * static_cast<int>(hosts.names().size())) +
                       " ranks on " + std::to_string(hosts.names().size()) + " hosts:";
    int rank = 0;
    for (std::size_t h = 0; h < hosts.names().size(); ++h) {
      line += (h ? ", " : " ") + hosts.names()[h] + (per_host == 1 ? " (rank " : " (ranks ");
      for (int k = 0; k < per_host; ++k, ++rank) line += (k ? ", " : "") + std::to_string(rank);
      line += ")";
    }
    return line;
  }

  static inline fs::path dir_;
};

#define SKIP_UNLESS_UP(hosts) \
  if (!(hosts).unavailable().empty()) GTEST_SKIP() << (hosts).unavailable()

TEST_F(SeveralHosts, TensorTimesDataParallelOverTwoHostsMatchesOneProcess) {
  NamespaceHosts hosts(dir_, 2, 2);
  SKIP_UNLESS_UP(hosts);
  const fs::path want = reference();
  train_across(hosts.mpirun_prefix(4), {2, 1, 2}, "tp2_dp2_one_step", "train.steps=1");
  const std::int64_t sent_by_one_step = hosts.bytes_sent("b");
  const std::string output = train_across(hosts.mpirun_prefix(4), {2, 1, 2}, "tp2_dp2");
  EXPECT_NE(output.find(hosts_line(hosts, 2)), std::string::npos) << output;
  expect_same_run(dir_ / "tp2_dp2", want, "tp 2 x dp 2 over two hosts");

  // Each tensor-parallel pair sits on one host and the data-parallel pairs span both, so host
  // b's link carried its ranks' share of every step's gradient reduction: of two parties to an
  // all-reduce, each sends half of the buffer or more. The run of one step, which starts,
  // saves and ends the same way, takes out what is not steps.
  const std::vector<double> gradient_bytes = metric_values(dir_ / "tp2_dp2/metrics.jsonl", "grad_bytes");
  ASSERT_EQ(gradient_bytes.size(), 3u);
  const double least = 2 * (gradient_bytes[1] / 2) + 2 * (gradient_bytes[2] / 2);
  EXPECT_GT(least, 0);
  EXPECT_GE(static_cast<double>(hosts.bytes_sent("b") - 2 * sent_by_one_step), least);
}

TEST_F(SeveralHosts, PipelineOverTwoHostsMatchesOneProcess) {
  const fs::path want = reference();
  {
    NamespaceHosts hosts(dir_, 2, 1);
    SKIP_UNLESS_UP(hosts);
    const std::string output = train_across(hosts.mpirun_prefix(2), {1, 2, 1}, "pp2");
    EXPECT_NE(output.find(hosts_line(hosts, 1)), std::string::npos) << output;
    expect_same_run(dir_ / "pp2", want, "pp 2 over two hosts");
  }
  // Each stage a tensor-parallel pair on a host of its own.
  NamespaceHosts hosts(dir_, 2, 2);
  SKIP_UNLESS_UP(hosts);
  const std::string output = train_across(hosts.mpirun_prefix(4), {2, 2, 1}, "tp2_pp2");
  EXPECT_NE(output.find(hosts_line(hosts, 2)), std::string::npos) << output;
  expect_same_run(dir_ / "tp2_pp2", want, "tp 2 x pp 2 over two hosts");
}

TEST_F(SeveralHosts, OasesScheduleWithItsTensorParallelPairSplitOverTwoHosts) {
  NamespaceHosts hosts(dir_, 2, 1);
  SKIP_UNLESS_UP(hosts);
  const fs::path want = reference();
  const std::string output = train_across(hosts.mpirun_prefix(2), {2, 1, 1}, "oases_tp2",
                                          "parallel.schedule=" + quoted("oases") +
                                              " parallel.sub_batches=2");
  EXPECT_NE(output.find(hosts_line(hosts, 1)), std::string::npos) << output;
  EXPECT_NE(output.find("schedule: oases"), std::string::npos) << output;
  expect_same_run(dir_ / "oases_tp2", want, "oases at tp 2 over two hosts");
}

TEST_F(SeveralHosts, CheckpointWrittenOverTwoHostsResumesOnOne) {
  NamespaceHosts hosts(dir_, 2, 2);
  SKIP_UNLESS_UP(hosts);
  const std::string six_steps = "train.steps=6 checkpoint.every=3 checkpoint.keep=0";
  train_across(hosts.mpirun_prefix(4), {2, 1, 2}, "two_hosts", six_steps);
  const std::vector<double> uninterrupted = metric_values(dir_ / "two_hosts/metrics.jsonl", "loss");
  ASSERT_EQ(uninterrupted.size(), 6u);

  // Steps 4 to 6 again, on this machine's own host name and network, at tp 2 alone.
  const fs::path resumed = dir_ / "one_host";
  fs::create_directories(resumed / "ckpt");
  fs::copy(dir_ / "two_hosts/ckpt/step_3", resumed / "ckpt/step_3", fs::copy_options::recursive);
  char this_host[256] = {};
  gethostname(this_host, sizeof(this_host) - 1);
  const std::string output =
      train_across(mpirun_prefix(2), {2, 1, 1}, "one_host", six_steps + " checkpoint.resume=true");
  EXPECT_NE(output.find(std::string("hosts: 2 ranks on 1 host: ") + this_host), std::string::npos)
      << output;
  expect_same_losses(metric_values(resumed / "metrics.jsonl", "loss"),
                     {uninterrupted.begin() + 3, uninterrupted.end()}, "resumed on one host");
  expect_same_tensors(resumed / "ckpt/step_6/model.safetensors",
                      dir_ / "two_hosts/ckpt/step_6/model.safetensors", "resumed on one host");
}

// Runs `oases train` on every rank of `hosts` but those on the hosts `absent` (whose ranks
// never reach MPI_Init) with a start-up timeout of 5 s; expects the job to fail within 40 s
// and returns what it printed.
std::string run_with_absent_hosts(const NamespaceHosts& hosts, int ranks, const std::string& absent,
                                  const fs::path& config, const std::string& layout) {
  const std::string command =
      hosts.mpirun_prefix(ranks) + "sh -c 'case \"$(hostname)\" in " + absent +
      ") sleep 120;; esac; exec " + OASES_BINARY + " train --quiet --config " + config.string() +
      " --set checkpoint.dir=\\\"\\\" " + layout + " parallel.startup_timeout_s=5'";
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = run_command("timeout -s KILL 90 " + command);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 40) << "the job did not end at the start-up timeout:\n" << r.output;
  EXPECT_NE(r.output.find("parallel.startup_timeout_s = 5"), std::string::npos) << r.output;
  return r.output;
}

TEST_F(SeveralHosts, HostWhoseRanksNeverStartIsNamedAtTheStartupTimeout) {
  NamespaceHosts hosts(dir_, 2, 2);
  SKIP_UNLESS_UP(hosts);
  const fs::path flight = dir_ / "absent_b" / "flight";
  const std::string output = run_with_absent_hosts(
      hosts, 4, "b", dir_ / "gpt.toml",
      "parallel.tp=2 parallel.dp=2 log.flight_dir=" + flight.string());
  EXPECT_NE(output.find("ranks 2, 3 did not start (on host b;"), std::string::npos) << output;
  // The ranks that came left their flight records; `oases flight` tells the same story.
  const CommandResult read = run_command(std::string(OASES_BINARY) + " flight " + flight.string());
  EXPECT_EQ(read.exit_code, 0) << read.output;
  EXPECT_NE(read.output.find("none from ranks 2, 3"), std::string::npos) << read.output;
  EXPECT_NE(read.output.find("- the job did not start; "), std::string::npos) << read.output;
  EXPECT_NE(read.output.find("ranks 2, 3 did not start (on host b;"), std::string::npos)
      << read.output;
}

TEST_F(SeveralHosts, EveryHostWhoseRanksNeverStartIsNamed) {
  NamespaceHosts hosts(dir_, 3, 1);
  SKIP_UNLESS_UP(hosts);
  const std::string output = run_with_absent_hosts(hosts, 3, "b|c", dir_ / "gpt.toml",
                                                   "parallel.dp=3 train.global_batch=6");
  EXPECT_NE(output.find("ranks 1, 2 did not start (on hosts b (rank 1) and c (rank 2);"),
            std::string::npos)
      << output;
}

TEST_F(SeveralHosts, ARankStoppedOnTheOtherHostIsNamedWithItsHost) {
  NamespaceHosts hosts(dir_, 2, 1);
  SKIP_UNLESS_UP(hosts);
  const fs::path run = dir_ / "stopped_on_b";
  fs::create_directories(run);
  Background job(run, hosts.mpirun_prefix(2) +
                          "sh -c 'echo $$ > " + run.string() +
                          "/rank_$OMPI_COMM_WORLD_RANK.pid; exec \"$0\" \"$@\"' " + OASES_BINARY +
                          " train --quiet --config " + (dir_ / "gpt.toml").string() +
                          " --set parallel.tp=2 train.steps=100000 parallel.comm_timeout_s=3"
                          " checkpoint.dir=\\\"\\\" log.metrics=" +
                          quoted((run / "metrics.jsonl").string()) + " > output.txt 2>&1");
  ASSERT_TRUE(wait_until(job, [&] {
    return fs::exists(run / "rank_1.pid") && line_count(run / "metrics.jsonl") >= 3;
  })) << read_bytes((run / "output.txt").string());
  const pid_t on_b = static_cast<pid_t>(std::stol(read_bytes((run / "rank_1.pid").string())));
  ASSERT_EQ(kill(on_b, SIGSTOP), 0);
  EXPECT_NE(job.wait(), 0);
  kill(on_b, SIGKILL);
  const CommandResult read = run_command(std::string(OASES_BINARY) + " flight " + run.string());
  ASSERT_EQ(read.exit_code, 0) << read.output;
  std::string first;
  std::istringstream lines(read.output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("- ", 0) == 0) {
      first = line;
      break;
    }
  EXPECT_EQ(first.rfind("- rank 1 (host b) ", 0), 0u) << read.output;
  // Stopped inside a step (tp group) or at its end (the world group's stop agreement).
  EXPECT_TRUE(first.find("of tp group [0,1]") != std::string::npos ||
              first.find("of world group [0,1]") != std::string::npos)
      << read.output;
  EXPECT_NE(first.find("rank 0 (host a) wait"), std::string::npos) << read.output;
}

}  // namespace
}  // namespace oases::testing
