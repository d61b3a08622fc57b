// PipeDream-2BW end to end: `mpirun -np N oases train` with parallel.pipeline = "2bw" follows
// the update rule W(t + 1) = W(t) - update(gradient of batch t at W(t - 1)), checked against
// that rule written out step by step in this process over the plain engine (which keeps
// W(t - 1), computes the gradient there and has the optimizer apply it to W(t)): losses,
// every parameter, the optimizer state and the stashed older weights agree to relative 1e-10
// in fp64 with dropout, for GPT and LLaMA, over two and three stages and with tensor
// parallelism, whether or not the
// pipeline drains between steps. The delay is real: the losses leave 1F1B's after the first
// step. A checkpoint written mid-run resumes with the same later losses and weights. Too few
// micro-batches per step is an error naming the settings and the valid values.
#include "support/command.h"
#include "support/pipeline_runs.h"
#include "support/runs.h"

#include "comm/communicator.h"
#include "core/buffer.h"
#include "data/loader.h"
#include "data/token_shard.h"
#include "kernels/kernels.h"
#include "optim/clip.h"
#include "train/batches.h"
#include "train/checkpoint.h"
#include "plan/run_config.h"
#include "train/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;
using oases::testing::expect_same_losses;
using oases::testing::expect_same_tensors;
using oases::testing::quoted;
using oases::testing::run_command;

std::vector<double> losses(const fs::path& run) {
  return oases::testing::metric_values(run / "metrics.jsonl", "loss");
}

// The 2bw update rule in one process, over `steps` steps of the config at `config_path` from
// the weights at `init`: batch t's gradient at W(t - 1) (W(-1) = W(0)), clipped by its global
// norm, applied by the optimizer to W(t). Writes the final weights, optimizer state and W(steps
// - 1) as a checkpoint under `out`/ckpt; returns the losses.
std::vector<double> two_bw_reference(const fs::path& config_path, const fs::path& init,
                                     std::int64_t steps, const fs::path& out) {
  using namespace oases;
  plan::RunConfig config = plan::load_run_config(config_path.string());
  config.train.steps = steps;
  train::TrainingEngine engine(config);  // pp = 1 and the default pipeline: plain gradients
  model::Model& model = engine.model();
  const Tensor params = model.params();
  train::load_model_weights(init.string(), model.layout(), params);
  const data::TokenShard shard = data::load_token_shard(config.data.path + "_train.bin");
  const data::DataLoader loader(shard, config.model.seq_len, config.train.global_batch,
                                config.data.shuffle, static_cast<std::uint64_t>(config.train.seed));
  const train::BatchMaker batches(config, loader, shard.vocab_size);

  Buffer older_storage(params.nbytes()), newest_storage(params.nbytes());
  const Tensor older = older_storage.tensor(params.dtype(), params.shape());
  const Tensor newest = newest_storage.tensor(params.dtype(), params.shape());
  kernels::copy(params, older);  // W(-1) = W(0)
  std::vector<double> step_losses;
  for (std::int64_t t = 0; t < steps; ++t) {
    train::Batch batch;
    batches.training(t, 0, config.train.global_batch, batch);
    kernels::copy(params, newest);  // W(t)
    kernels::copy(older, params);   // the gradient of batch t at W(t - 1)
    step_losses.push_back(engine.compute_gradients(t, batch.inputs.data(), batch.targets.data(),
                                           config.train.global_batch));
    kernels::copy(newest, params);
    const Tensor grads = model.grads();
    const double norm = std::sqrt(optim::sum_of_squares(grads, 0, grads.numel()));
    if (config.train.grad_clip > 0)
      optim::scale(grads, optim::clip_coefficient(norm, config.train.grad_clip));
    engine.optimizer().step(params, grads, {engine.learning_rate(t), t + 1});
    kernels::copy(newest, older);  // W(t) is what batch t + 1 computes on
  }
  train::TrainingState state;
  state.step = steps;
  state.data_position = steps;
  state.seed = static_cast<std::uint64_t>(config.train.seed);
  state.data_tokens = shard.size();
  comm::SelfCommunicator tp("tp"), pp("pp");
  train::save_checkpoint((out / "ckpt").string(), engine.plan(), model, engine.optimizer(), state,
                         {}, 0, tp, pp, true, {}, &older);
  return step_losses;
}

class TwoBwTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("pipeline_2bw_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const std::string arch : {"gpt", "llama"}) {
      // Three layers over two stages; 8 / 2 = 4 micro-batches per step, more than 2 stages.
      std::ofstream(dir_ / (arch + ".toml"))
          << oases::testing::tiny_fp64_config(arch, 3, dir_ / "data", "", 4);
      oases::testing::write_random_init(dir_ / (arch + ".toml"), dir_ / (arch + "_init.safetensors"), 91);
    }
  }

  static fs::path config_of(const std::string& arch) { return dir_ / (arch + ".toml"); }
  static fs::path init_of(const std::string& arch) { return dir_ / (arch + "_init.safetensors"); }

  // Runs `arch` over tp x pp x dp ranks with `extra` settings; returns the run's folder.
  static fs::path train(const std::string& arch, int tp, int pp, const std::string& name,
                        const std::string& extra, int dp = 1) {
    const fs::path out = dir_ / name;
    const int ranks = tp * pp * dp;
    const std::string command =
        (ranks > 1 ? oases::testing::mpirun_prefix(ranks) : std::string()) + OASES_BINARY +
        " train --quiet --config " + config_of(arch).string() + " --init-from " +
        init_of(arch).string() + " --set parallel.tp=" + std::to_string(tp) +
        " parallel.pp=" + std::to_string(pp) + " parallel.dp=" + std::to_string(dp) +
        " log.metrics=" +
        quoted((out / "metrics.jsonl").string()) + " checkpoint.dir=" +
        quoted((out / "ckpt").string()) + " " + extra;
    const Result r = run_command(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    return out;
  }

  static void expect_same_run(const fs::path& got, const fs::path& want, int step,
                              const std::string& what) {
    const std::string folder = "ckpt/step_" + std::to_string(step);
    expect_same_tensors(got / folder / "model.safetensors", want / folder / "model.safetensors",
                        what);
    // AdamW's moments and the stashed W(step - 1).
    expect_same_tensors(got / folder / "optimizer.safetensors",
                        want / folder / "optimizer.safetensors", what + " optimizer");
  }

  static inline fs::path dir_;
};

const std::string k2bw = "parallel.pipeline=" + quoted("2bw");

TEST_F(TwoBwTraining, PipelineRunsFollowTheUpdateRuleOfTheSingleProcessReference) {
  for (const std::string arch : {"gpt", "llama"}) {
    const fs::path reference = dir_ / (arch + "_reference");
    const std::vector<double> want = two_bw_reference(config_of(arch), init_of(arch), 4, reference);
    const fs::path run = train(arch, 1, 2, arch + "_pp2", k2bw);
    expect_same_losses(losses(run), want, arch + " pp=2");
    expect_same_run(run, reference, 4, arch + " pp=2");
  }
  const fs::path reference = dir_ / "gpt_reference";
  // Three stages: the middle one's step waits on both neighbours' messages.
  const fs::path three = train("gpt", 1, 3, "gpt_pp3", k2bw);
  expect_same_losses(losses(three), losses(dir_ / "gpt_pp2"), "pp=3");
  expect_same_run(three, reference, 4, "pp=3");
  // Tensor parallelism inside the stages, and evaluation every other step, before which the
  // pipeline drains (no result changes).
  const fs::path run = train("gpt", 2, 2, "gpt_tp2_pp2",
                             k2bw + " train.eval_every=2 train.eval_steps=1");
  expect_same_losses(losses(run), losses(dir_ / "gpt_pp2"), "tp=2 pp=2");
  expect_same_run(run, reference, 4, "tp=2 pp=2");
}

TEST_F(TwoBwTraining, LossesLeaveTheSynchronousRunAfterTheFirstStep) {
  const std::vector<double> two_bw = losses(train("gpt", 1, 2, "2bw", k2bw));
  const std::vector<double> one_f_one_b =
      losses(train("gpt", 1, 2, "1f1b", "parallel.pipeline=" + quoted("1f1b")));
  ASSERT_EQ(two_bw.size(), 4u);
  ASSERT_EQ(one_f_one_b.size(), 4u);
  // Batch 0 computes on W(0) under both; batch 1 on W(0) under 2bw but W(1) under 1F1B.
  EXPECT_NEAR(two_bw[0], one_f_one_b[0], 1e-10 * std::abs(one_f_one_b[0]));
  for (std::size_t t = 1; t < two_bw.size(); ++t)
    EXPECT_GT(std::abs(two_bw[t] - one_f_one_b[t]), 1e-4 * std::abs(one_f_one_b[t]))
        << "step " << t + 1;
}

TEST_F(TwoBwTraining, CheckpointMidRunResumesWithTheSameLossesAndWeights) {
  const fs::path source =
      train("gpt", 1, 2, "source", k2bw + " train.steps=5 checkpoint.every=2 checkpoint.keep=0");
  const std::vector<double> source_losses = losses(source);
  ASSERT_EQ(source_losses.size(), 5u);
  // Draining for the checkpoints changes nothing against a run that drains only at its end.
  expect_same_losses(source_losses, losses(train("gpt", 1, 2, "undrained", k2bw + " train.steps=5")),
                     "checkpoint drains");
  const fs::path resumed = dir_ / "resumed";
  fs::create_directories(resumed / "ckpt");
  fs::copy(source / "ckpt/step_2", resumed / "ckpt/step_2", fs::copy_options::recursive);
  train("gpt", 1, 2, "resumed", k2bw + " train.steps=5 checkpoint.resume=true");
  expect_same_losses(losses(resumed), {source_losses.begin() + 2, source_losses.end()}, "resumed");
  expect_same_run(resumed, source, 5, "resumed");
}

TEST_F(TwoBwTraining, TooFewMicroBatchesPerStepIsAClearError) {
  const std::string command = oases::testing::mpirun_prefix(2) + OASES_BINARY + " train --config " +
                              config_of("gpt").string() + " --set parallel.pp=2 " + k2bw +
                              " train.global_batch=4";
  const Result r = run_command(command);
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const std::string part :
       {"parallel.pipeline = \"2bw\" needs more micro-batches per step than pipeline stages",
        "train.global_batch = 4", "= 2 micro-batches with parallel.pp = 2",
        "valid: train.global_batch = 6, 8, ..."})
    EXPECT_NE(r.output.find(part), std::string::npos) << "missing \"" << part << "\" in\n"
                                                       << r.output;
}

// ZeRO-3 over dp 2: each rank keeps its blocks of both weight versions; the run trains what
// ZeRO-0 trains, its checkpoints (the stashed version gathered whole) equal ZeRO-0's, and a
// ZeRO-0 checkpoint resumes under ZeRO-3 with the same later losses and weights.
TEST_F(TwoBwTraining, ZeroThreeKeepsBlocksOfBothVersionsAndTrainsWhatZeroZeroTrains) {
  // 16 / (2 x 2) = 4 micro-batches per step on each data-parallel replica, more than 2 stages.
  const std::string settings = k2bw + " train.global_batch=16 train.steps=4 checkpoint.every=2 "
                               "checkpoint.keep=0";
  const fs::path zero0 = train("gpt", 1, 2, "dp2_zero0", settings, 2);
  const fs::path zero3 = train("gpt", 1, 2, "dp2_zero3", settings + " parallel.zero=3", 2);
  expect_same_losses(losses(zero3), losses(zero0), "zero 3");
  expect_same_run(zero3, zero0, 2, "zero 3 step 2");
  expect_same_run(zero3, zero0, 4, "zero 3 step 4");
  const fs::path resumed = dir_ / "dp2_zero3_resumed";
  fs::create_directories(resumed / "ckpt");
  fs::copy(zero0 / "ckpt/step_2", resumed / "ckpt/step_2", fs::copy_options::recursive);
  train("gpt", 1, 2, "dp2_zero3_resumed", settings + " parallel.zero=3 checkpoint.resume=true", 2);
  const std::vector<double> straight = losses(zero0);
  ASSERT_EQ(straight.size(), 4u);
  expect_same_losses(losses(resumed), {straight.begin() + 2, straight.end()}, "resumed at zero 3");
  expect_same_run(resumed, zero0, 4, "resumed at zero 3");
}

}  // namespace
