// Helpers for the end-to-end pipeline tests: a tiny fp64 model config whose runs are compared
// with the single process, the `oases train` command over tp x pp x dp ranks, and the
// comparison of two runs (losses, validation losses, parameters, optimizer state).
#pragma once

#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace oases::testing {

// The TOML of a tiny model trained in fp64 with dropout and attention dropout 0.1 for `steps` steps on the token
// shards at `data` (prepare_fortunes_data): `layers` layers of `arch` ("gpt", "llama": two kv
// heads), hidden 32, 4 heads, sequences of 16, and 4 micro-batches of 2 per step.
// `train_extra` lines go to the [train] section.
inline std::string tiny_fp64_config(const std::string& arch, int layers,
                                    const std::filesystem::path& data,
                                    const std::string& train_extra = "", int steps = 3) {
  return R"([model]
arch = ")" + arch + R"("
layers = )" + std::to_string(layers) + R"(
hidden = 32
heads = 4
)" + (arch == "llama" ? "kv_heads = 2\n" : "") + R"(ffn_hidden = 48
vocab_size = 257
seq_len = 16
dropout = 0.1
attention_dropout = 0.1
[train]
precision = "fp64"
micro_batch = 2
global_batch = 8
steps = )" + std::to_string(steps) + R"(
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
threads = 1
)" + train_extra + R"([data]
path = ")" + data.string() + R"("
[log]
peak_tflops = 1.0
)";
}

// Where a run starts and how it is laid out.
struct RunLayout {
  int tp = 1, pp = 1, dp = 1;
};

// Runs `oases train --quiet` (`binary`) on `config` from the weights in `init` over
// tp x pp x dp ranks (one process, without mpirun, when all are 1), writing metrics.jsonl and
// ckpt/ under `out`, with `extra` settings appended to --set. Expects success; returns `out`.
inline std::filesystem::path train_run(const std::string& binary,
                                       const std::filesystem::path& config,
                                       const std::filesystem::path& init, RunLayout layout,
                                       const std::filesystem::path& out,
                                       const std::string& extra = "") {
  const int ranks = layout.tp * layout.pp * layout.dp;
  const std::string command =
      (ranks > 1 ? mpirun_prefix(ranks) : std::string()) + binary + " train --quiet --config " +
      config.string() + " --init-from " + init.string() +
      " --set parallel.tp=" + std::to_string(layout.tp) +
      " parallel.pp=" + std::to_string(layout.pp) + " parallel.dp=" + std::to_string(layout.dp) +
      " log.metrics=" + quoted((out / "metrics.jsonl").string()) +
      " checkpoint.dir=" + quoted((out / "ckpt").string()) + " " + extra;
  const CommandResult r = run_command(command);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return out;
}

// The values of `key` in the training steps' records of a metrics file that have it
// (val_loss: the evaluation steps).
inline std::vector<double> recorded_values(const std::filesystem::path& metrics,
                                           const std::string& key) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.at("step").get<std::int64_t>() > 0 && record.contains(key))
      out.push_back(record.at(key).get<double>());
  }
  return out;
}

// The run in `got` equals the one in `want` to kFp64Tolerance: its losses, its validation
// losses when `got` has any (a run may skip validation to save time), and the model and
// optimizer state of the checkpoint at `step`.
inline void expect_same_run(const std::filesystem::path& got, const std::filesystem::path& want,
                            const std::string& what, int step = 3) {
  expect_same_losses(metric_values(got / "metrics.jsonl", "loss"),
                     metric_values(want / "metrics.jsonl", "loss"), what);
  const std::vector<double> validation = recorded_values(got / "metrics.jsonl", "val_loss");
  if (!validation.empty())
    expect_same_losses(validation, recorded_values(want / "metrics.jsonl", "val_loss"),
                       what + " validation");
  const std::string folder = "ckpt/step_" + std::to_string(step);
  expect_same_tensors(got / folder / "model.safetensors", want / folder / "model.safetensors",
                      what);
  expect_same_tensors(got / folder / "optimizer.safetensors",
                      want / folder / "optimizer.safetensors", what + " optimizer");
}

}  // namespace oases::testing
