// Precision (train/precision.h) alone, on one rank: the 16-bit product path a run records,
// gradient reductions in bf16, and what a non-finite gradient norm does to a step under each
// loss-scaling policy.
#include "train/precision.h"

#include "comm/communicator.h"
#include "core/error.h"
#include "model/model.h"
#include "plan/run_plan.h"
#include "support/errors.h"
#include "support/tiny_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::user_error_of;

plan::RunPlan precision_plan(const std::string& precision) {
  plan::RunConfig c = oases::testing::tiny_run();
  c.train.precision = precision;
  return plan::make_run_plan(c);
}

// The model of `plan` on one rank.
std::unique_ptr<model::Model> make_model(const plan::RunPlan& plan, comm::Communicator& tp) {
  model::ModelOptions o = plan.model_options(0);
  o.tp = &tp;
  return std::make_unique<model::Model>(plan.config.model, o);
}

struct OneRank {
  comm::SelfCommunicator tp{"tp"}, dp{"dp"}, pp{"pp"};
};

TEST(Precision, SinglePrecisionRunsScaleNothingAndReduceTheGradientsThemselves) {
  OneRank groups;
  const plan::RunPlan plan = precision_plan("fp32");
  Precision precision(plan, groups.tp, groups.dp, groups.pp);
  EXPECT_EQ(precision.gemm16().description, "");
  EXPECT_EQ(precision.loss_scale(), 1.0);
  std::vector<float> grads = {1.5f, -2.0f};
  const Tensor view = Tensor::of(grads.data(), {2});
  const void* reduced = nullptr;
  precision.start_reduction(view, [&](const Tensor& buffer) {
    reduced = buffer.raw();
    return groups.dp.all_reduce_async(buffer, comm::ReduceOp::sum);
  })->wait();
  EXPECT_EQ(reduced, static_cast<const void*>(grads.data()));
}

TEST(Precision, APinnedPathIsUsedAndRecorded) {
  OneRank groups;
  plan::RunPlan plan = precision_plan("bf16");  // tiny_run pins "convert+sgemm"
  Precision precision(plan, groups.tp, groups.dp, groups.pp);
  EXPECT_EQ(precision.gemm16().description, "convert+sgemm (train.gemm16_path)");
  EXPECT_EQ(precision.gemm16().paths.bf16, kernels::Gemm16Path::convert_sgemm);
}

// "auto": the path measured on this rank is what the plan records, so a checkpoint stores the
// path the run multiplied with.
TEST(Precision, AMeasuredPathIsWrittenIntoThePlan) {
  OneRank groups;
  plan::RunConfig c = oases::testing::tiny_run();
  c.train.precision = "bf16";
  c.train.gemm16_path = "auto";
  plan::RunPlan plan = plan::make_run_plan(c);
  ASSERT_FALSE(plan.settings.gemm16_path.has_value());
  Precision precision(plan, groups.tp, groups.dp, groups.pp);
  precision.pin_gemm16_path(plan);
  ASSERT_TRUE(plan.settings.gemm16_path.has_value());
  EXPECT_EQ(*plan.settings.gemm16_path, precision.gemm16().paths.bf16);
  EXPECT_EQ(plan.config.train.gemm16_path,
            std::string(kernels::gemm16_path_name(precision.gemm16().paths.bf16)));
}

// train.grad_reduce_dtype = "bf16": the group sums a bf16 copy, and the sum comes back into
// the fp32 gradients (rounded to bf16's 8 bits) only when the work is waited for.
TEST(Precision, Bf16ReductionsTravelRoundedAndWidenWhenWaitedFor) {
  OneRank groups;
  plan::RunConfig c = oases::testing::tiny_run();
  c.train.precision = "bf16";
  c.train.grad_reduce_dtype = "bf16";
  const plan::RunPlan plan = plan::make_run_plan(c);
  Precision precision(plan, groups.tp, groups.dp, groups.pp);
  const float fine = 1.0f + 1.0f / 4096;  // below bf16's resolution at 1
  std::vector<float> grads = {fine, 3.0f};
  DType travelled = DType::f32;
  std::unique_ptr<comm::Work> work =
      precision.start_reduction(Tensor::of(grads.data(), {2}), [&](const Tensor& buffer) {
        travelled = buffer.dtype();
        return groups.dp.all_reduce_async(buffer, comm::ReduceOp::sum);
      });
  EXPECT_EQ(travelled, DType::bf16);
  EXPECT_EQ(grads[0], fine);
  work->wait();
  EXPECT_EQ(grads, (std::vector<float>{1.0f, 3.0f}));
  work->wait();  // a second wait changes nothing
  EXPECT_EQ(grads, (std::vector<float>{1.0f, 3.0f}));
}

// Without loss scaling a non-finite norm stops the run before any parameter changes; the
// message names the step (1-based), the first parameter whose gradient is not finite and advice.
TEST(Precision, WithoutScalingANonFiniteNormStopsTheRun) {
  OneRank groups;
  const plan::RunPlan plan = precision_plan("fp32");
  Precision precision(plan, groups.tp, groups.dp, groups.pp);
  const std::unique_ptr<model::Model> model = make_model(plan, groups.tp);
  EXPECT_TRUE(precision.admit_update(0, 1.5, *model));
  const model::ParamSpec& second = model->layout().params()[1];
  model->layout().view(model->grads(), second).data<float>()[0] =
      std::numeric_limits<float>::quiet_NaN();
  const std::string message = user_error_of(
      [&] { precision.admit_update(6, std::numeric_limits<double>::quiet_NaN(), *model); });
  EXPECT_NE(message.find("training diverged at step 7"), std::string::npos) << message;
  EXPECT_NE(message.find(second.name), std::string::npos) << message;
  EXPECT_NE(message.find("train.lr"), std::string::npos) << message;
}

// fp16's dynamic scaler: an injected overflow lands in the first gradient element on its step
// only; the step is skipped (not a stop), and with hysteresis 1 the scale halves at once.
TEST(Precision, Fp16SkipsAnOverflowedStepAndBacksOff) {
  OneRank groups;
  plan::RunConfig c = oases::testing::tiny_run();
  c.train.precision = "fp16";
  c.train.initial_loss_scale = 1024;
  c.train.hysteresis = 1;
  const plan::RunPlan plan = plan::make_run_plan(c);
  Precision precision(plan, groups.tp, groups.dp, groups.pp);
  const std::unique_ptr<model::Model> model = make_model(plan, groups.tp);
  EXPECT_EQ(precision.loss_scale(), 1024.0);
  precision.inject_gradient_overflow(1);
  std::vector<float> grads = {0.25f, 0.5f};
  precision.inject_overflow_if_due(0, Tensor::of(grads.data(), {2}));
  EXPECT_EQ(grads, (std::vector<float>{0.25f, 0.5f}));
  precision.inject_overflow_if_due(1, Tensor::of(grads.data(), {2}));
  EXPECT_TRUE(std::isinf(grads[0]));
  EXPECT_EQ(grads[1], 0.5f);
  EXPECT_TRUE(precision.admit_update(0, 2.0, *model));
  EXPECT_FALSE(precision.admit_update(1, std::numeric_limits<double>::infinity(), *model));
  EXPECT_EQ(precision.loss_scale(), 512.0);
  EXPECT_EQ(precision.loss_scaler().skipped_steps(), 1);
}

// A constant scale never moves, but still skips a step whose gradients overflowed.
TEST(Precision, AConstantScaleSkipsWithoutMoving) {
  OneRank groups;
  plan::RunConfig c = oases::testing::tiny_run();
  c.train.precision = "fp16";
  c.train.loss_scale = 128;
  const plan::RunPlan plan = plan::make_run_plan(c);
  Precision precision(plan, groups.tp, groups.dp, groups.pp);
  const std::unique_ptr<model::Model> model = make_model(plan, groups.tp);
  EXPECT_FALSE(precision.admit_update(0, std::numeric_limits<double>::quiet_NaN(), *model));
  EXPECT_EQ(precision.loss_scale(), 128.0);
  EXPECT_TRUE(precision.admit_update(1, 1.0, *model));
}

}  // namespace
}  // namespace oases::train
