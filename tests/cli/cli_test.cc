// End-to-end tests of the `oases` binary as a user runs it: bad input gives a clear error and
// a non-zero exit without touching what exists; runs are deterministic and resume exactly;
// training on real text lowers the validation loss.
#include "data/gpt2_tokenizer.h"

#include "support/command.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <vector>
#include <sys/wait.h>

namespace fs = std::filesystem;

namespace {

using Result = oases::testing::CommandResult;

Result run(const std::string& args) {
  return oases::testing::run_command(std::string(OASES_BINARY) + " " + args);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Real English text from Debian's fortunes package (installed by the test command).
const char* kCorpus = "/usr/share/games/fortunes/fortunes";

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::current_path() / "cli_runs" / info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(kCorpus)) << "install Debian's fortunes package";
    const Result r = run("prepare-data --input " + std::string(kCorpus) + " --output " +
                         (dir_ / "data").string() + " --val-fraction 0.1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    write_file(dir_ / "tiny.toml", R"(
[model]
layers = 2
hidden = 64
heads = 2
ffn_hidden = 256
vocab_size = 256
seq_len = 32
dropout = 0.1
[train]
micro_batch = 4
global_batch = 8
steps = 6
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
eval_every = 3
eval_steps = 2
threads = 2
[data]
path = ")" + (dir_ / "data").string() + R"("
[log]
peak_tflops = 1.0
)");
  }

  std::string train(const std::string& extra) {
    return "train --quiet --config " + (dir_ / "tiny.toml").string() + " " + extra;
  }

  std::vector<nlohmann::json> metrics(const fs::path& path) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  fs::path dir_;
};

void expect_error(const Result& r, const std::vector<std::string>& fragments) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const auto& f : fragments) EXPECT_NE(r.output.find(f), std::string::npos)
      << "expected '" << f << "' in:\n" << r.output;
}

TEST_F(Cli, EveryVerbHasHelp) {
  for (const char* verb : {"train", "prepare-data", "generate"}) {
    const Result r = run(std::string(verb) + " --help");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << r.output;
  }
}

// `oases profile` then `oases simulate` on a mixture-of-experts model, as a user runs them:
// the prediction names the layout and the MoE layers; a profile of another model, or a
// pipeline layout simulate does not predict, is an error saying what to run instead.
TEST_F(Cli, ProfileThenSimulateAnMoeModel) {
  const std::string config = "--config " + (dir_ / "tiny.toml").string();
  const std::string moe = " --set model.moe_every=2 model.experts=4 model.moe_gate=\\\"gshard\\\"";
  const std::string profile = (dir_ / "profile.json").string();
  const Result measured =
      run("profile " + config + moe + " --output " + profile + " --steps 1");
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  const nlohmann::json written = nlohmann::json::parse(read_file(profile));
  EXPECT_EQ(written.at("model").at("experts"), 4);
  EXPECT_TRUE(written.at("degrees").at(0).at("segments").contains("experts"));

  const Result predicted = run("simulate " + config + moe + " --profile " + profile);
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  for (const char* fragment : {"layer degrees 1,1 (MoE layers: 1", "predicted step ",
                               "predicted memory per rank "})
    EXPECT_NE(predicted.output.find(fragment), std::string::npos) << predicted.output;
  const auto step_at = predicted.output.find("predicted step ") + 15;
  EXPECT_GT(std::stod(predicted.output.substr(step_at)), 0.0) << predicted.output;
  // MFU against this host's peak of the precision the profile measured (fp32 here).
  const auto mfu_at = predicted.output.find("predicted MFU ");
  ASSERT_NE(mfu_at, std::string::npos) << predicted.output;
  const double mfu = std::stod(predicted.output.substr(mfu_at + 14));
  EXPECT_GT(mfu, 0.0) << predicted.output;
  EXPECT_LE(mfu, 100.0) << predicted.output;
  EXPECT_NE(predicted.output.find("of fp32 products (sgemm"), std::string::npos) << predicted.output;

  expect_error(run("simulate " + config + " --profile " + profile),
               {"mixture-of-experts model", "is dense", "re-run `oases profile`"});
  expect_error(run("simulate " + config + moe + " parallel.pp=2 --profile " + profile),
               {"parallel.pp = 2", "oases plan"});
}

// `oases simulate --cluster`: the config's ranks on a shipped cluster description, with the
// step, throughput, MFU and per-stage table, a Chrome trace, "does not fit" on a device too
// small, and one source of costs at a time.
TEST_F(Cli, SimulateOnAClusterDescription) {
  const std::string config = "--config " + (dir_ / "tiny.toml").string() +
                             " --set parallel.tp=2 parallel.pp=2 parallel.dp=2 "
                             "parallel.schedule=\\\"megatron\\\" train.global_batch=32";
  const std::string cluster =
      " --cluster " + std::string(OASES_SOURCE_DIR) + "/clusters/dgx-a100.toml";
  const std::string trace = (dir_ / "trace.json").string();
  const Result r = run("simulate " + config + cluster + " --trace " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* fragment : {"simulated step ", "on dgx-a100 (8 of 3072 devices", "tokens/s",
                               "MFU ", "exposed comm", "bubble s", "wrote "})
    EXPECT_NE(r.output.find(fragment), std::string::npos) << fragment << " in " << r.output;
  EXPECT_EQ(r.output.find("does not fit"), std::string::npos) << r.output;
  // "auto" on a cluster description decides by the device's stated peaks: an A100's bf16 is
  // 16x its fp32.
  const Result automatic = run("simulate " + config + " train.precision=\\\"auto\\\"" + cluster);
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  EXPECT_NE(automatic.output.find("train.precision = \"auto\" on dgx-a100: bf16 (device.peak_tflops: bf16 16.00x fp32)"),
            std::string::npos)
      << automatic.output;
  const nlohmann::json written = nlohmann::json::parse(read_file(trace));
  std::set<int> ranks;
  int computes = 0;
  for (const auto& event : written.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    ranks.insert(event.at("pid").get<int>());
    if (event.at("tid") == 0) ++computes;
    EXPECT_GE(event.at("dur").get<double>(), 0.0);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 4}));  // one rank per stage stands for its stage
  EXPECT_GT(computes, 0);

  const Result tiny_device =
      run("simulate " + config + cluster + " --cluster-set device.memory_gib=0.001");
  ASSERT_EQ(tiny_device.exit_code, 0) << tiny_device.output;
  for (const char* fragment : {"does not fit", "parameters ", "activations "})
    EXPECT_NE(tiny_device.output.find(fragment), std::string::npos) << tiny_device.output;

  expect_error(run("simulate " + config), {"--profile", "--cluster"});
  expect_error(run("simulate " + config + cluster + " --cluster-set topology.nodes=0"),
               {"topology.nodes"});
}

// `oases plan --degrees-only --cluster`: the degree planner priced on a cluster description. On
// links too slow for activations every layer runs at degree 1 (its weight gradients cross the
// link once per step); the chosen plan is then simulated under each ZeRO stage, and a pipelined
// config compares the pipeline schedules on the cluster. It takes one source of costs, one
// profile at most; without --degrees-only `oases plan` is the joint search, which needs a
// cluster description.
TEST_F(Cli, PlanForAClusterDescription) {
  const std::string planner_config =
      "--degrees-only --config " + std::string(OASES_SOURCE_DIR) + "/configs/planner.toml";
  const std::string cluster =
      " --cluster " + std::string(OASES_SOURCE_DIR) + "/clusters/rtx3090-pcie.toml";
  const Result slow = run("plan " + planner_config + cluster +
                          " --set parallel.dp=2 --cluster-set tier.pcie.link_gbs=0.05");
  ASSERT_EQ(slow.exit_code, 0) << slow.output;
  for (const char* fragment : {"degrees per layer: 1 1 1 1", "ZeRO stages on rtx3090-pcie",
                               "parallel.zero = 0", "parallel.zero = 3"})
    EXPECT_NE(slow.output.find(fragment), std::string::npos) << fragment << " in " << slow.output;
  const Result fast = run("plan " + planner_config + cluster);
  ASSERT_EQ(fast.exit_code, 0) << fast.output;
  EXPECT_NE(fast.output.find("degrees per layer: 2 2 2 2"), std::string::npos) << fast.output;

  const Result pipelined =
      run("plan " + planner_config + cluster +
          " --set parallel.pp=2 parallel.schedule=\\\"megatron\\\"");
  ASSERT_EQ(pipelined.exit_code, 0) << pipelined.output;
  for (const char* fragment : {"pipeline schedules on rtx3090-pcie", "pipeline = \"1f1b\"",
                               "pipeline = \"interleaved\", 2 chunks"})
    EXPECT_NE(pipelined.output.find(fragment), std::string::npos) << fragment << " in "
                                                                  << pipelined.output;
  expect_error(run("plan " + planner_config), {"--profile", "--cluster"});
  expect_error(run("plan " + planner_config + cluster + " --profile profile.json"),
               {"--profile", "--cluster", "both were given"});
  expect_error(run("plan " + planner_config + " --profile a.json --profile b.json"),
               {"--degrees-only takes one --profile; 2 were given"});
  expect_error(run("plan --config " + std::string(OASES_SOURCE_DIR) + "/configs/planner.toml"),
               {"--cluster", "--degrees-only"});
}

TEST_F(Cli, UnknownKeyNamesKeyAndValidKeys) {
  expect_error(run(train("--set train.learning_rate=1e-3")),
               {"train.learning_rate", "valid keys in [train]", "lr"});
  expect_error(run(train("--set optim.lr=1e-3")), {"[optim]", "valid sections"});
}

TEST_F(Cli, WrongTypeNamesKeyValueAndExpectedType) {
  expect_error(run(train("--set model.layers=\\\"four\\\"")),
               {"model.layers", "\"four\"", "a string", "expected an integer"});
  expect_error(run(train("--set train.lr=fast")), {"train.lr", "expected a number"});
}

TEST_F(Cli, HeadsMustDivideHidden) {
  expect_error(run(train("--set model.heads=3")), {"model.heads = 3", "model.hidden = 64"});
}

TEST_F(Cli, BatchArithmeticIsExplained) {
  expect_error(run(train("--set train.global_batch=6")),
               {"train.global_batch = 6", "train.micro_batch", "4"});
}

TEST_F(Cli, TruncatedOrForeignShardIsRejected) {
  const fs::path shard = dir_ / "data_train.bin";
  std::string bytes = read_file(shard);
  write_file(shard, bytes.substr(0, bytes.size() - 100));
  expect_error(run(train("")), {"data_train.bin", "truncated"});
  write_file(shard, "this is not a token shard at all, just some text");
  expect_error(run(train("")), {"data_train.bin"});
}

TEST_F(Cli, BadInitCheckpointIsRejectedAndNothingIsOverwritten) {
  // A first run leaves a checkpoint; a failing second run must leave it byte-for-byte intact.
  const fs::path ckpt = dir_ / "ckpt";
  Result r = run(train("--set checkpoint.dir=\\\"" + ckpt.string() + "\\\" train.steps=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path model = ckpt / "step_2" / "model.safetensors";
  ASSERT_TRUE(fs::exists(model));
  const std::string before = read_file(model);

  // A model with another hidden size: every tensor is mis-shaped.
  const fs::path other = dir_ / "other";
  r = run(train("--set model.hidden=32 train.steps=1 checkpoint.dir=\\\"" + other.string() + "\\\""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_error(run(train("--set checkpoint.dir=\\\"" + ckpt.string() + "\\\" --init-from " +
                         (other / "step_1" / "model.safetensors").string())),
               {"wte.weight", "[256, 32]", "[256, 64]"});
  // A model with fewer layers: tensors of layer 1 are missing.
  const fs::path shallow = dir_ / "shallow";
  r = run(train("--set model.layers=1 train.steps=1 checkpoint.dir=\\\"" + shallow.string() + "\\\""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_error(run(train("--set checkpoint.dir=\\\"" + ckpt.string() + "\\\" --init-from " +
                         (shallow / "step_1" / "model.safetensors").string())),
               {"h.1.", "no tensor"});
  EXPECT_EQ(read_file(model), before);
}

TEST_F(Cli, SameConfigTwiceGivesBitwiseEqualLosses) {
  ASSERT_EQ(run(train("--set log.metrics=\\\"" + (dir_ / "a.jsonl").string() + "\\\"")).exit_code, 0);
  ASSERT_EQ(run(train("--set log.metrics=\\\"" + (dir_ / "b.jsonl").string() + "\\\"")).exit_code, 0);
  const auto a = metrics(dir_ / "a.jsonl"), b = metrics(dir_ / "b.jsonl");
  // The record of step 0 (before training), then one per step.
  ASSERT_EQ(a.size(), 7u);
  ASSERT_EQ(b.size(), 7u);
  EXPECT_EQ(a[0]["val_loss"].get<double>(), b[0]["val_loss"].get<double>());
  for (std::size_t i = 1; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>());
  }
  for (const char* field : {"step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s",
                            "model_tflops", "mfu", "exposed_comm_s", "peak_mem_bytes", "time",
                            "tokens"})
    EXPECT_TRUE(a[1].contains(field)) << field;
  EXPECT_TRUE(a[3].contains("val_loss"));
}

TEST_F(Cli, StoppedAndResumedRunMatchesUninterruptedRunBitwise) {
  const std::string full_metrics = (dir_ / "full.jsonl").string();
  ASSERT_EQ(run(train("--set log.metrics=\\\"" + full_metrics + "\\\"")).exit_code, 0);

  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string part_metrics = (dir_ / "part.jsonl").string();
  Result r = run(train("--set train.steps=6 checkpoint.every=3 checkpoint.dir=\\\"" + ckpt +
                       "\\\" log.metrics=\\\"" + part_metrics + "\\\""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Pretend the run stopped after step 3: drop the later checkpoint, then resume.
  fs::remove_all(fs::path(ckpt) / "step_6");
  const std::string resumed_metrics = (dir_ / "resumed.jsonl").string();
  r = run(train("--set checkpoint.resume=true checkpoint.dir=\\\"" + ckpt +
                "\\\" log.metrics=\\\"" + resumed_metrics + "\\\""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto full = metrics(full_metrics), resumed = metrics(resumed_metrics);
  ASSERT_EQ(full.size(), 7u);  // step 0, then steps 1 to 6
  ASSERT_EQ(resumed.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i]["step"].get<int>(), static_cast<int>(i) + 4);
    EXPECT_EQ(resumed[i]["loss"].get<double>(), full[i + 4]["loss"].get<double>())
        << "step " << i + 4;
  }
}

// A step folder without its marker is not one a save leaves (saves publish complete folders
// by rename): the resumed run neither trusts nor deletes it, and says how to proceed; moved
// aside, the run resumes from the newest complete checkpoint.
TEST_F(Cli, AStepFolderWithoutItsMarkerStopsTheResumeAndIsKept) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(train("--set train.steps=4 checkpoint.every=2 checkpoint.keep=0 checkpoint.dir=\\\"" +
                      ckpt + "\\\"")).exit_code, 0);
  fs::remove(fs::path(ckpt) / "step_4" / "COMPLETE");
  const std::string resume = "train --config " + (dir_ / "tiny.toml").string() +
                             " --set train.steps=4 checkpoint.resume=true checkpoint.dir=\\\"" +
                             ckpt + "\\\"";
  Result r = run(resume);
  ASSERT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("step_4', a step folder without a COMPLETE marker"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "step_4" / "model.safetensors"));
  fs::rename(fs::path(ckpt) / "step_4", fs::path(ckpt) / "step_4.kept");
  r = run(resume);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt + "/step_2"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "step_4.kept" / "model.safetensors"));
}

std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// What `oases generate` printed on stdout: its output without the speed line on stderr,
// which it writes last.
std::string generated_text(const Result& r) {
  const std::size_t speed = r.output.rfind("generated ");
  EXPECT_NE(speed, std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" tokens/s (", speed), std::string::npos) << r.output;
  return r.output.substr(0, speed);
}

TEST_F(Cli, GenerateSamplesFromCheckpoint) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(train("--set train.steps=2 checkpoint.dir=\\\"" + ckpt + "\\\"")).exit_code, 0);
  // The five likeliest bytes of a briefly trained model are printable text.
  const std::string generate =
      "generate --checkpoint " + ckpt + " --max-new-tokens 20 --seed 3 --top-k 5";
  const Result r = run(generate + " --prompt Hello");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = generated_text(r);
  EXPECT_EQ(text.rfind("Hello", 0), 0u) << r.output;
  EXPECT_EQ(text.size(), 5u + 20u + 1u) << r.output;  // and a newline
  EXPECT_EQ(generated_text(run(generate + " --prompt Hello")), text);
  // The full recomputation chooses the same bytes, here in fp32.
  EXPECT_EQ(generated_text(run(generate + " --prompt Hello --no-kv-cache")), text);
  expect_error(run("generate --checkpoint " + (dir_ / "nope").string() + " --prompt x"),
               {"does not exist"});

  // An empty prompt starts a new document; so does no prompt at all.
  const Result empty = run(generate + " --prompt ''");
  ASSERT_EQ(empty.exit_code, 0) << empty.output;
  EXPECT_EQ(generated_text(empty).size(), 20u + 1u) << empty.output;
  EXPECT_EQ(generated_text(run(generate)), generated_text(empty));

  // Several samples, each after its own header line; the first is the one-sample run's.
  const Result three = run(generate + " --prompt Hello --num-samples 3");
  ASSERT_EQ(three.exit_code, 0) << three.output;
  const std::string samples = generated_text(three);
  EXPECT_EQ(samples.rfind("=== sample 0 ===\n" + text + "=== sample 1 ===\nHello", 0), 0u)
      << samples;
  EXPECT_NE(samples.find("=== sample 2 ===\nHello"), std::string::npos) << samples;
  EXPECT_EQ(samples.find("=== sample 3 ==="), std::string::npos) << samples;

  // A stop string (repeatable) cuts the sample right before its first occurrence.
  const std::string continuation = text.substr(5, 20);
  const std::string stop = continuation.substr(7, 2);
  const Result stopped =
      run(generate + " --prompt Hello --stop " + shell_quoted(stop) + " --stop 'no such text'");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_EQ(generated_text(stopped), "Hello" + continuation.substr(0, continuation.find(stop)) + "\n")
      << "stop '" << stop << "' in " << continuation;
}

TEST_F(Cli, GenerateRejectsBadSamplingOptions) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(train("--set train.steps=1 checkpoint.dir=\\\"" + ckpt + "\\\"")).exit_code, 0);
  const std::string generate = "generate --checkpoint " + ckpt + " --prompt x";
  expect_error(run(generate + " --top-p 1.5"), {"--top-p = 1.5", "(0, 1]"});
  expect_error(run(generate + " --top-p 0"), {"--top-p = 0", "(0, 1]"});
  expect_error(run(generate + " --num-samples 0"), {"--num-samples = 0", ">= 1"});
  expect_error(run(generate + " --slide-keep 33"),
               {"--slide-keep = 33", "at most model.seq_len = 32"});
}

TEST_F(Cli, WritesChromeTraceOfEveryInstruction) {
  const fs::path trace = dir_ / "trace.json";
  const Result r = run(train("--set train.steps=2 log.trace_steps=1 log.trace=\\\"" + trace.string() + "\\\""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(read_file(trace));
  int forwards = 0, backwards = 0, collectives = 0, optimizer = 0;
  for (const auto& e : json["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    forwards += name.rfind("F ", 0) == 0;
    backwards += name.rfind("B", 0) == 0;
    collectives += name.rfind("AR ", 0) == 0;
    optimizer += name == "OptimizerStep";
    EXPECT_GE(e["dur"].get<double>(), 0.0);
  }
  // One step: 2 micro-batches x (embedding + 2 x (attention, mlp) + head) segments.
  EXPECT_EQ(forwards, 2 * 6);
  EXPECT_EQ(backwards, 2 * (1 + 4 * 2 + 2));
  EXPECT_EQ(collectives, 2 * (5 + 4 + 1));
  EXPECT_EQ(optimizer, 1);
}

TEST_F(Cli, MemoryLimitIsEnforced) {
  expect_error(run(train("--set parallel.memory_limit=1000000")),
               {"parallel.memory_limit = 1000000", "needs"});
}

TEST_F(Cli, PrepareDataRejectsBadFraction) {
  expect_error(run("prepare-data --input " + std::string(kCorpus) + " --output " +
                   (dir_ / "x").string() + " --val-fraction 1.5"),
               {"1.5"});
}

}  // namespace

// GPT-2's tokenizer end to end: shards, a run on them, text generated and decoded with it.
TEST_F(Cli, Gpt2TokenizerPreparesTrainsAndGenerates) {
  const fs::path files = oases::data::default_gpt2_tokenizer_dir();
  if (!fs::exists(files / "encoder.json") || !fs::exists(files / "vocab.bpe"))
    GTEST_SKIP() << "no GPT-2 tokenizer files in " << files.string()
                 << "; bash scripts/install-deps.sh installs them";
  const std::string data = (dir_ / "gpt2").string();
  Result r = run("prepare-data --tokenizer gpt2 --input " + std::string(kCorpus) + " " +
                 std::string(kCorpus) + " --output " + data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("gpt2 tokenizer, vocab 50257"), std::string::npos) << r.output;
  const std::string checkpoints = (dir_ / "gpt2_ck").string();
  r = run(train("--set train.steps=2 train.eval_every=0 model.vocab_size=50257 data.tokenizer=gpt2 "
                "data.path=" + data + " checkpoint.dir=" + checkpoints));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run("generate --checkpoint " + checkpoints +
          " --prompt 'Hello world' --max-new-tokens 4 --tokenizer-dir " + files.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("Hello world", 0), 0u) << r.output;
  // Data made by one tokenizer and a config naming another do not mix.
  expect_error(run(train("--set train.steps=1 model.vocab_size=50257 data.path=" + data)),
               {"gpt2", "byte"});
  expect_error(run("prepare-data --tokenizer gpt2 --tokenizer-dir " + (dir_ / "none").string() +
                   " --input " + std::string(kCorpus) + " --output " + data),
               {(dir_ / "none" / "encoder.json").string(), "does not exist", "install-deps.sh"});
}
