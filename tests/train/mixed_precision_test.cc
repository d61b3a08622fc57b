// Mixed precision (train.precision = "bf16" / "fp16"): 16-bit activations and weight copy over
// fp32 master weights, gradients and optimizer state; fp16's dynamic loss scaling with skipped
// steps; training that ends where fp32 ends; checkpoints that resume bit for bit and move
// between precisions.
#include "train/engine.h"

#include "data/prepare_data.h"
#include "io/safetensors.h"
#include "support/numbers.h"
#include "support/runs.h"
#include "support/tiny_run.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::relative_difference;
using oases::testing::values;

namespace fs = std::filesystem;

// The tiny run (its 16-bit products pinned to "convert+sgemm") in `precision`.
plan::RunConfig tiny_engine_config(const std::string& precision) {
  plan::RunConfig c = testing::tiny_run();
  c.train.steps = 20;
  c.train.lr = 1e-2;
  c.train.min_lr = 1e-3;
  c.train.warmup_steps = 2;
  c.train.precision = precision;
  return c;
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint32_t stream) {
  return testing::philox_tokens(0, stream, static_cast<std::int64_t>(n), 50, {7, 9});
}

// The gradient of one batch in each precision against fp64's. Every activation a 16-bit run
// keeps or passes on is rounded once, relative error at most u (2^-8 for bf16, 2^-11 for fp16),
// and products and statistics are exact to fp32. A transformer layer rounds about six tensors
// in forward (norm output, q|k|v, attention output, the projection's partial sums, the residual
// sum, the MLP's pre- and post-activation) and as many gradients in backward, and the weights
// are rounded once: 12 L + 4 roundings along the way, L the layers. Their errors are
// independent from element to element and tensor to tensor, so they add in quadrature: the
// 16-bit gradients are within sqrt(12 L + 4) u of fp64's. fp32's long GEMM sums are not
// covered by that count; it stays within the linear sum (12 L + 4) u of its own 2^-24.
TEST(MixedPrecision, GradientsAreWithinTheFormatsRoundingOfFp64) {
  const auto in = tokens(8 * 16, 1), out = tokens(8 * 16, 2);
  TrainingEngine reference(tiny_engine_config("fp64"));
  reference.compute_gradients(0, in.data(), out.data(), 8);
  const std::vector<double> want = values(reference.model().grads());
  const double layers = 2;
  for (const auto& [precision, unit] : std::vector<std::pair<std::string, double>>{
           {"bf16", std::ldexp(1.0, -8)}, {"fp16", std::ldexp(1.0, -11)}, {"fp32", std::ldexp(1.0, -24)}}) {
    TrainingEngine engine(tiny_engine_config(precision));
    EXPECT_EQ(engine.model().grads().dtype(), DType::f32) << precision;
    EXPECT_EQ(engine.model().params().dtype(), DType::f32) << precision;
    engine.compute_gradients(0, in.data(), out.data(), 8);
    const double error = relative_difference(values(engine.model().grads()), want);
    std::printf("%s: gradient relative error %.3g = %.2f u\n", precision.c_str(), error,
                error / unit);
    const double roundings = 12 * layers + 4;
    EXPECT_LT(error, (precision == "fp32" ? roundings : std::sqrt(roundings)) * unit) << precision;
    EXPECT_GT(error, 0.0) << precision;  // it did compute in fewer bits than fp64
  }
}

// The same with mixture-of-experts layers (every other layer; noisy top-k keeping all four
// experts, so no routing decision can flip between precisions, with router noise, the
// auxiliary and z losses and expert dropout). The router runs in f32 from the 16-bit input and
// weights; an MoE layer rounds its experts' pre- and post-activations and outputs and the
// combined output in forward, and as many gradients and the slots' gradients in backward: 8
// roundings more per MoE layer than the count above.
TEST(MixedPrecision, MoeGradientsAreWithinTheFormatsRoundingOfFp64) {
  const auto in = tokens(8 * 16, 1), out = tokens(8 * 16, 2);
  const auto moe_config = [](const std::string& precision) {
    plan::RunConfig c = tiny_engine_config(precision);
    c.model.moe_every = 2;
    c.model.experts = 4;
    c.model.moe_gate = ops::MoeGate::noisy_top_k;
    c.model.moe_top_k = 4;
    c.model.moe_router_noise = 1.0;
    c.model.moe_aux_loss_coef = 0.1;
    c.model.moe_z_loss_coef = 0.01;
    c.model.expert_dropout = 0.2;
    c.validate();
    return c;
  };
  TrainingEngine reference(moe_config("fp64"));
  reference.compute_gradients(0, in.data(), out.data(), 8);
  const std::vector<double> want = values(reference.model().grads());
  const double layers = 2, moe_layers = 1;
  const double roundings = 12 * layers + 4 + 8 * moe_layers;
  for (const auto& [precision, unit] : std::vector<std::pair<std::string, double>>{
           {"bf16", std::ldexp(1.0, -8)}, {"fp16", std::ldexp(1.0, -11)}, {"fp32", std::ldexp(1.0, -24)}}) {
    TrainingEngine engine(moe_config(precision));
    engine.compute_gradients(0, in.data(), out.data(), 8);
    const double error = relative_difference(values(engine.model().grads()), want);
    std::printf("MoE %s: gradient relative error %.3g = %.2f u\n", precision.c_str(), error,
                error / unit);
    EXPECT_LT(error, (precision == "fp32" ? roundings : std::sqrt(roundings)) * unit) << precision;
    EXPECT_GT(error, 0.0) << precision;
  }
}

// The step whose gradient overflows is skipped (the parameters stay as they were) and counted;
// with hysteresis 2 the first overflow keeps the scale and the second halves it; after
// train.loss_scale_window clean steps the scale doubles back.
TEST(LossScaling, AnInjectedOverflowIsSkippedBacksOffAndGrowsBack) {
  plan::RunConfig c = tiny_engine_config("fp16");
  c.train.initial_loss_scale = 1024;
  c.train.loss_scale_window = 3;
  c.train.hysteresis = 2;
  TrainingEngine engine(c);
  const auto in = tokens(8 * 16, 3), out = tokens(8 * 16, 4);
  std::vector<double> scales;
  std::vector<bool> skipped;
  for (std::int64_t step = 0; step < 9; ++step) {
    if (step == 2 || step == 3) engine.inject_gradient_overflow(step);
    const std::vector<double> before = values(engine.model().params());
    const StepResult r = engine.train_step(step, in.data(), out.data());
    scales.push_back(r.loss_scale);
    skipped.push_back(r.skipped);
    const std::vector<double> after = values(engine.model().params());
    if (r.skipped)
      EXPECT_EQ(after, before) << "step " << step << " was skipped but changed the parameters";
    else
      EXPECT_NE(after, before) << "step " << step;
    EXPECT_TRUE(std::isfinite(r.loss)) << step;
  }
  // Steps 0-1 clean; 2 overflows (hysteresis 2 -> 1, scale kept); 3 overflows (scale halves);
  // 4, 5, 6 clean: the scale doubles after the third.
  const std::vector<double> want_scales{1024, 1024, 1024, 1024, 512, 512, 512, 1024, 1024};
  const std::vector<bool> want_skipped{false, false, true, true, false, false, false, false, false};
  EXPECT_EQ(scales, want_scales);
  EXPECT_EQ(skipped, want_skipped);
  EXPECT_EQ(engine.loss_scaler().skipped_steps(), 2);
}

// A scale far too large overflows fp16 for real (the logits' gradient exceeds 65504): those
// steps are skipped, the scale halves each time (hysteresis 1) until the gradients fit, and
// then training proceeds with finite losses.
TEST(LossScaling, ARealOverflowIsSkippedUntilTheScaleFits) {
  plan::RunConfig c = tiny_engine_config("fp16");
  c.train.initial_loss_scale = std::ldexp(1.0, 40);
  c.train.hysteresis = 1;
  TrainingEngine engine(c);
  const auto in = tokens(8 * 16, 5), out = tokens(8 * 16, 6);
  std::int64_t first_applied = -1;
  double first_loss = 0, last_loss = 0;
  for (std::int64_t step = 0; step < 40; ++step) {
    const StepResult r = engine.train_step(step, in.data(), out.data());
    ASSERT_TRUE(std::isfinite(r.loss)) << step;
    if (!r.skipped && first_applied < 0) {
      first_applied = step;
      first_loss = r.loss;
    }
    last_loss = r.loss;
  }
  std::printf("first applied step %lld at scale %g; loss %.4f -> %.4f\n",
              static_cast<long long>(first_applied), engine.loss_scaler().scale(), first_loss,
              last_loss);
  // 2^40 x (1 / 128 tokens) is 2^33: far beyond fp16's 65504 ~ 2^16, so at least 17 halvings.
  EXPECT_GE(first_applied, 17);
  EXPECT_EQ(engine.loss_scaler().skipped_steps(), first_applied);
  EXPECT_LE(engine.loss_scaler().scale(), std::ldexp(1.0, 40 - first_applied));
  EXPECT_LT(last_loss, first_loss);
}

// Without loss scaling (bf16, fp32) a non-finite gradient stops the run as it always did.
TEST(LossScaling, Bf16StopsOnANonFiniteGradient) {
  TrainingEngine engine(tiny_engine_config("bf16"));
  const auto in = tokens(8 * 16, 3), out = tokens(8 * 16, 4);
  engine.inject_gradient_overflow(0);
  try {
    engine.train_step(0, in.data(), out.data());
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged at step 1"), std::string::npos)
        << e.what();
  }
}

// Activations (slots, scratch and kept sets) take half the bytes in 16 bits, plus the fp32
// statistics kept beside them.
TEST(MixedPrecision, ActivationsTakeAboutHalfTheMemory) {
  TrainingEngine fp32(tiny_engine_config("fp32")), bf16(tiny_engine_config("bf16"));
  const double ratio =
      static_cast<double>(bf16.activation_bytes()) / static_cast<double>(fp32.activation_bytes());
  std::printf("activations: fp32 %zu bytes, bf16 %zu bytes (%.3f)\n", fp32.activation_bytes(),
              bf16.activation_bytes(), ratio);
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.6);
  // And the whole: a 16-bit copy of the parameters beside the fp32 master and gradients.
  EXPECT_LT(bf16.memory_bytes(), fp32.memory_bytes());
}

// fp8 compression of a bf16 run's kept sets (parallel.activation_compression = "fp8"): the
// statistics kept beside the activations stay as they are, the measured activation peak equals
// the schedule's prediction and falls below the uncompressed run's, and the gradient moves by
// about fp8's rounding: within (2 L + 2) x 2^-4 of the uncompressed bf16 gradient, as the
// compressed kept sets of the fp32 runs are (tests/mpi/activation_compression_runs_test.cc).
TEST(MixedPrecision, Fp8CompressionOfBf16KeptSets) {
  const auto in = tokens(8 * 16, 1), out = tokens(8 * 16, 2);
  plan::RunConfig plain_config = tiny_engine_config("bf16");
  plain_config.parallel.recompute = "none";
  plan::RunConfig compressed_config = plain_config;
  compressed_config.parallel.activation_compression = "fp8";
  TrainingEngine plain(plain_config), compressed(compressed_config);
  plain.compute_gradients(0, in.data(), out.data(), 8);
  const StepResult step = compressed.train_step(0, in.data(), out.data());
  EXPECT_EQ(step.peak_activation_bytes, compressed.activation_bytes());
  EXPECT_LT(compressed.activation_bytes(), plain.activation_bytes());
  TrainingEngine again(compressed_config);
  again.compute_gradients(0, in.data(), out.data(), 8);
  const double error =
      relative_difference(values(again.model().grads()), values(plain.model().grads()));
  std::printf("fp8 over bf16: gradient relative change %.3g; activations %zu -> %zu bytes\n",
              error, plain.activation_bytes(), compressed.activation_bytes());
  EXPECT_GT(error, 0.0);
  EXPECT_LT(error, (2 * 2 + 2) * std::ldexp(1.0, -4));
}

// Runs of a small GPT on real text (Debian's fortunes, byte-level).
class MixedPrecisionRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string corpus = "/usr/share/games/fortunes/fortunes";
    ASSERT_TRUE(fs::exists(corpus)) << "install Debian's fortunes package";
    dir_ = testing::fresh_test_folder("mixed_precision_runs");
    data::prepare_data({corpus}, (dir_ / "data").string(), 0.05, "byte");
  }
  plan::RunConfig config(const std::string& precision, std::int64_t steps) const {
    plan::RunConfig c = plan::parse_run_config(R"(
[model]
layers = 2
hidden = 96
heads = 4
ffn_hidden = 384
vocab_size = 256
seq_len = 64
[train]
micro_batch = 8
global_batch = 16
lr = 3e-3
min_lr = 3e-4
warmup_steps = 20
lr_decay_steps = 300
eval_steps = 8
[log]
peak_tflops = 1.0
)", "mixed_precision_test", {"data.path=\"" + (dir_ / "data").string() + "\""});
    c.train.precision = precision;
    c.train.steps = steps;
    c.train.eval_every = steps;
    return c;
  }
  static TrainSummary train(const plan::RunConfig& c) {
    TrainOptions options;
    options.progress = false;
    return run_training(c, options);
  }
  static std::vector<double> losses(const TrainSummary& s) {
    std::vector<double> out;
    for (const StepRecord& r : s.steps) out.push_back(r.loss);
    return out;
  }
  fs::path dir_;
};

// 300 steps in bf16 and in fp16 end within 3% of the fp32 run's validation loss.
TEST_F(MixedPrecisionRuns, Bf16AndFp16EndWithin3PercentOfFp32) {
  const TrainSummary fp32 = train(config("fp32", 300));
  ASSERT_TRUE(fp32.final_val_loss);
  for (const std::string precision : {"bf16", "fp16"}) {
    const TrainSummary run = train(config(precision, 300));
    ASSERT_TRUE(run.final_val_loss) << precision;
    std::printf("val_loss after 300 steps: fp32 %.4f, %s %.4f (%+.2f%%)\n", *fp32.final_val_loss,
                precision.c_str(), *run.final_val_loss,
                100 * (*run.final_val_loss / *fp32.final_val_loss - 1));
    EXPECT_NEAR(*run.final_val_loss, *fp32.final_val_loss, 0.03 * *fp32.final_val_loss)
        << precision;
    // Well trained: byte unigram statistics alone reach about 3.3 nats.
    EXPECT_LT(*run.final_val_loss, 3.0) << precision;
    if (precision == "fp16") {
      EXPECT_EQ(run.steps.back().loss_scale, 65536) << "no overflow expected at this size";
      EXPECT_EQ(run.steps.back().skipped_steps, 0);
    }
  }
}

// A mixed-precision run stopped at a checkpoint and resumed repeats the uninterrupted run bit
// for bit: the fp32 master weights, the optimizer state, fp16's loss scaler and the 16-bit
// product path all come back.
TEST_F(MixedPrecisionRuns, ResumeIsBitwise) {
  for (const std::string precision : {"bf16", "fp16"}) {
    const fs::path ckpt = dir_ / ("ckpt_" + precision), whole = dir_ / ("whole_" + precision);
    plan::RunConfig c = config(precision, 6);
    c.train.eval_every = 0;
    if (precision == "fp16") {  // the scale moves during the run: it must resume too
      c.train.loss_scale_window = 2;
      c.train.initial_loss_scale = 1024;
    }
    c.checkpoint.dir = whole.string();
    const TrainSummary uninterrupted = train(c);
    c.checkpoint.dir = ckpt.string();
    c.checkpoint.every = 3;
    train(c);
    fs::remove_all(ckpt / "step_6");
    c.checkpoint.resume = true;
    const TrainSummary resumed = train(c);
    ASSERT_EQ(resumed.start_step, 3) << precision;
    const std::vector<double> all = losses(uninterrupted);
    EXPECT_EQ(losses(resumed), std::vector<double>(all.begin() + 3, all.end())) << precision;
    EXPECT_EQ(resumed.steps.back().loss_scale, uninterrupted.steps.back().loss_scale);
    if (precision == "fp16") {
      EXPECT_EQ(uninterrupted.steps.back().loss_scale, 4096);
    }
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      testing::expect_same_tensors(ckpt / "step_6" / file, whole / "step_6" / file,
                                   precision + " " + file, 0.0);
    // The checkpoint holds fp32 master weights under the usual names.
    const auto model = io::SafetensorsFile::open((ckpt / "step_6" / "model.safetensors").string());
    EXPECT_EQ(model.info("h.0.attn.c_attn.weight").dtype, DType::f32);
  }
}

// A bf16 checkpoint starts an fp32 run and an fp32 checkpoint a bf16 run: the master weights
// are fp32 either way, and training goes on from where it was.
TEST_F(MixedPrecisionRuns, CheckpointsMoveBetweenPrecisions) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"bf16", "fp32"}, {"fp32", "bf16"}, {"fp16", "bf16"}}) {
    const fs::path ckpt = dir_ / ("ckpt_" + from + "_" + to);
    plan::RunConfig c = config(from, 40);
    c.train.eval_every = 0;
    c.checkpoint.dir = ckpt.string();
    const TrainSummary first = train(c);
    plan::RunConfig d = config(to, 60);
    d.train.eval_every = 0;
    d.checkpoint.dir = ckpt.string();
    d.checkpoint.resume = true;
    const TrainSummary second = train(d);
    ASSERT_EQ(second.start_step, 40) << from << " -> " << to;
    // The next step's loss continues the first run's (it is not a fresh model's ~5.5).
    EXPECT_NEAR(second.steps.front().loss, first.steps.back().loss, 0.05 * first.steps.back().loss)
        << from << " -> " << to;
    EXPECT_LT(second.steps.back().loss, first.steps.back().loss) << from << " -> " << to;
  }
}

}  // namespace
}  // namespace oases::train
