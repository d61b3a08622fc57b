// The run plan: every word-valued setting parsed once, "auto" resolved, the flags that follow
// from several settings derived in one place, and the memory policy the engine, the planner
// and the simulator share.
#include "plan/run_plan.h"

#include "core/error.h"
#include "plan/settings.h"
#include "support/errors.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace oases::plan {
namespace {

using testing::user_error_of;

RunPlan plan_of(const std::vector<std::string>& overrides, int rank = 0) {
  return make_run_plan(parse_run_config("[model]\nlayers = 4\n", "test.toml", overrides), rank);
}

// Settings a word needs beside it to run: an interleaved pipeline needs stages and chunks, an
// overlapped schedule a tensor-parallel group, ... Words not listed need nothing else.
const std::map<std::string, std::vector<std::string>>& companions() {
  static const std::map<std::string, std::vector<std::string>> needs = {
      {"model.moe_gate", {"model.moe_every=2", "model.experts=4"}},
      {"parallel.pipeline", {"parallel.pp=2", "train.micro_batch=1", "train.global_batch=4"}},
      {"parallel.pipeline=interleaved", {"parallel.virtual_stages=2"}},
      {"parallel.pipeline_layers=auto", {}},
      {"parallel.plan", {"parallel.tp=2"}},
      {"parallel.offload", {"parallel.offload_dir=/tmp", "train.precision=bf16"}},
      {"parallel.activation_compression=bf16", {"train.precision=fp32"}},
      {"train.optimizer=adafactor", {}},
      {"train.grad_reduce_dtype", {"train.precision=bf16"}},
      {"train.gemm16_path", {"train.precision=bf16"}},
      {"parallel.schedule=oases", {"parallel.tp=2"}},
      {"parallel.schedule", {"parallel.tp=2", "parallel.recompute=auto"}},
      {"parallel.recompute=sqrt", {"parallel.schedule=megatron"}},
      {"parallel.recompute=full", {"parallel.schedule=megatron"}},
      {"parallel.recompute=selective", {"parallel.schedule=megatron"}},
      {"parallel.recompute=none", {"parallel.schedule=megatron"}},
      {"parallel.recompute=fine-grained", {"parallel.schedule=fine-grained"}},
      {"model.arch=bert", {"model.seq_len=8"}},
  };
  return needs;
}

// Every word of every word-valued setting, typed after --set without quotes as a user types
// it, is read as that word.
TEST(RunPlan, EveryWordOfEverySettingIsTakenUnquoted) {
  for (const WordSetting& setting : word_settings()) {
    for (const std::string& word : setting.words) {
      const std::string assignment = setting.key + "=" + word;
      std::vector<std::string> overrides;
      for (const std::string& key : {setting.key, assignment})
        if (const auto it = companions().find(key); it != companions().end())
          overrides.insert(overrides.end(), it->second.begin(), it->second.end());
      overrides.push_back(assignment);
      SCOPED_TRACE(assignment);
      RunConfig config;
      ASSERT_EQ(user_error_of([&] {
                  config = parse_run_config("[model]\nlayers = 4\n", "test.toml", overrides);
                }),
                "");
      const std::string toml = to_toml(config);
      EXPECT_NE(toml.find(setting.key.substr(setting.key.find('.') + 1) + " = \"" + word + "\""),
                std::string::npos)
          << toml;
    }
  }
}

TEST(RunPlan, UnknownWordsNameTheSettingTheWordAndTheValidOnes) {
  const std::string schedule = user_error_of([] { plan_of({"parallel.schedule=zigzag"}); });
  EXPECT_NE(schedule.find("parallel.schedule = \"zigzag\" is not known; valid: \"megatron\", "
                          "\"fine-grained\", \"cross-pass\", \"oases\", \"oases-interleaved\", "
                          "\"oases-deferred\", \"auto\""),
            std::string::npos)
      << schedule;
  const std::string arch = user_error_of([] { plan_of({"model.arch=gpt3"}); });
  EXPECT_NE(arch.find("model.arch = \"gpt3\" is not known; valid: \"gpt\", \"llama\", \"bert\""),
            std::string::npos)
      << arch;
  const std::string path = user_error_of([] { plan_of({"train.gemm16_path=blas"}); });
  EXPECT_NE(path.find("valid: \"auto\", \"convert+sgemm\", \"oneDNN\""), std::string::npos) << path;
}

TEST(RunPlan, ResolvesAutoSettings) {
  const RunPlan tp = plan_of({"parallel.tp=2"});
  EXPECT_EQ(tp.schedule.kind, schedule::ScheduleKind::oases);
  EXPECT_EQ(tp.schedule.recompute, schedule::Recompute::fine_grained);
  const RunPlan one = plan_of({});
  EXPECT_EQ(one.schedule.kind, schedule::ScheduleKind::megatron);
  EXPECT_EQ(one.schedule.recompute, schedule::Recompute::none);
  EXPECT_FALSE(one.settings.schedule.has_value());
  const RunPlan cross = plan_of({"parallel.schedule=cross-pass"});
  EXPECT_EQ(cross.schedule.recompute, schedule::Recompute::full);
}

TEST(RunPlan, DTypesAndLossScalingFollowThePrecision) {
  EXPECT_EQ(plan_of({}).dtypes.compute, DType::f32);
  EXPECT_FALSE(plan_of({}).dtypes.mixed());
  const RunPlan f64 = plan_of({"train.precision=fp64"});
  EXPECT_EQ(f64.dtypes.master, DType::f64);
  EXPECT_EQ(f64.dtypes.gradient_reduce, DType::f64);
  const RunPlan bf16 = plan_of({"train.precision=bf16", "train.grad_reduce_dtype=bf16"});
  EXPECT_EQ(bf16.dtypes.compute, DType::bf16);
  EXPECT_EQ(bf16.dtypes.master, DType::f32);
  EXPECT_EQ(bf16.dtypes.gradient_reduce, DType::bf16);
  EXPECT_EQ(bf16.loss_scaling.kind, LossScalingPlan::Kind::none);
  const RunPlan dynamic = plan_of({"train.precision=fp16", "train.initial_loss_scale=1024"});
  EXPECT_EQ(dynamic.loss_scaling.kind, LossScalingPlan::Kind::dynamic);
  EXPECT_EQ(dynamic.loss_scaling.initial_scale, 1024);
  const RunPlan constant = plan_of({"train.precision=fp16", "train.loss_scale=128"});
  EXPECT_EQ(constant.loss_scaling.kind, LossScalingPlan::Kind::constant);
  EXPECT_EQ(constant.loss_scaling.constant, 128);
}

// ZeRO partitions only buckets summed over more than one rank, and its schedule flags follow.
TEST(RunPlan, ZeroFlagsFollowWhatIsSummedOverRanks) {
  const RunPlan alone = plan_of({"parallel.zero=3"});
  EXPECT_FALSE(alone.zero.partitions);
  EXPECT_EQ(alone.zero.effective_stage(), 0);
  EXPECT_FALSE(alone.schedule.sharded_params);
  const RunPlan dp = plan_of({"parallel.zero=3", "parallel.dp=2", "train.global_batch=8"});
  EXPECT_TRUE(dp.zero.partitions);
  EXPECT_TRUE(dp.schedule.sharded_params);
  EXPECT_FALSE(dp.schedule.deferred_param_gather);
  const RunPlan mixed = plan_of({"parallel.zero=1", "parallel.tp=2", "parallel.plan=1,2,2,1"});
  EXPECT_TRUE(mixed.zero.partitions) << "layers at degree 1 sum over their replicas";
  EXPECT_TRUE(mixed.schedule.deferred_param_gather);
  const RunPlan two_bw = plan_of({"parallel.zero=2", "parallel.dp=2", "parallel.pipeline=2bw",
                                  "train.micro_batch=1", "train.global_batch=8"});
  EXPECT_TRUE(two_bw.pipeline.two_bw());
  EXPECT_FALSE(two_bw.schedule.deferred_param_gather) << "2bw waits at its update";
  const RunPlan local = plan_of({"parallel.dp=2", "parallel.dp_sync_every=4", "train.global_batch=8"});
  EXPECT_TRUE(local.local_sgd);
}

TEST(RunPlan, MeshCoordinatesFollowTheMeshLayout) {
  const RunPlan p = plan_of({"parallel.tp=2", "parallel.dp=2", "parallel.pp=2",
                             "train.global_batch=8", "train.micro_batch=1"},
                            5);
  EXPECT_EQ(p.mesh.world(), 8);
  EXPECT_EQ(p.mesh.tp_rank(), 1);
  EXPECT_EQ(p.mesh.dp_rank(), 0);
  EXPECT_EQ(p.mesh.pp_rank(), 1);
  EXPECT_EQ(p.for_rank(2).mesh.dp_rank(), 1);
  EXPECT_THROW(p.for_rank(8), InternalError);
}

TEST(RunPlan, PipelineStagesAndTheirLayers) {
  const RunPlan p = plan_of({"parallel.pp=2", "parallel.pipeline=interleaved",
                             "parallel.virtual_stages=2", "train.micro_batch=1",
                             "train.global_batch=4"});
  EXPECT_EQ(p.pipeline.counts(), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(p.pipeline.stage_ranges(1), (std::vector<model::LayerRange>{{1, 2}, {3, 4}}));
  const RunPlan whole = plan_of({});
  EXPECT_EQ(whole.pipeline.stage_ranges(0), (std::vector<model::LayerRange>{{0, 4}}));
  // Counts to be measured are an error only where they are needed.
  const RunPlan measured = plan_of({"parallel.pp=2", "parallel.pipeline_layers=auto",
                                    "train.micro_batch=1", "train.global_batch=4"});
  EXPECT_TRUE(measured.pipeline.chunk_layers.empty());
  EXPECT_NE(user_error_of([&] { measured.pipeline.stage_ranges(0); })
                .find("parallel.pipeline_layers = \"auto\" is resolved by `oases train`"),
            std::string::npos);
}

TEST(RunPlan, LayerDegreesComeFromTheListOrTheExperts) {
  EXPECT_TRUE(plan_of({"parallel.tp=2"}).layer_degrees.empty());
  EXPECT_EQ(plan_of({"parallel.tp=2", "parallel.plan=1,2,2,1"}).layer_degrees,
            (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(plan_of({"parallel.tp=2", "parallel.expert_tp=1", "model.moe_every=2",
                     "model.experts=4"})
                .layer_degrees,
            (std::vector<int>{2, 1, 2, 1}));
}

TEST(RunPlan, MemoryPolicyFollowsPrecisionPipelineAndZero) {
  const planner::MemoryPolicy fp32 = plan_of({}).memory_policy();
  EXPECT_EQ(fp32.master_element, 4u);
  EXPECT_EQ(fp32.working_element, 0u);
  EXPECT_EQ(fp32.weight_versions, 1);
  const planner::MemoryPolicy bf16 =
      plan_of({"train.precision=bf16", "parallel.zero=3", "parallel.dp=2", "train.global_batch=8",
               "parallel.offload=optimizer+params", "parallel.offload_dir=/tmp"})
          .memory_policy();
  EXPECT_EQ(bf16.working_element, 2u);
  EXPECT_EQ(bf16.zero_stage, 3);
  EXPECT_TRUE(bf16.offload_params);
  EXPECT_EQ(plan_of({"parallel.pipeline=2bw", "train.micro_batch=1", "train.global_batch=4"})
                .memory_policy()
                .weight_versions,
            2);
}

// The formula itself, by hand: 10 parameters of which this rank owns 4.
TEST(MemoryFigures, OneFormulaForEveryStage) {
  planner::MemorySizes sizes{.params = 10, .owned_params = 4, .gathered_bytes = 6,
                             .optimizer_state = 32, .activations = 100, .offload_store = 0};
  planner::MemoryPolicy policy{.master_element = 4, .working_element = 2};
  planner::MemoryFigures m = planner::memory_figures(policy, sizes);
  EXPECT_EQ(m.params, 10u * 4 + 10 * 2);
  EXPECT_EQ(m.working_copy, 10u * 2);
  EXPECT_EQ(m.grads, 40u);
  policy.zero_stage = 2;
  EXPECT_EQ(planner::memory_figures(policy, sizes).grads, 16u);
  EXPECT_EQ(planner::memory_figures(policy, sizes).params, 60u);
  policy.zero_stage = 3;
  m = planner::memory_figures(policy, sizes);
  EXPECT_EQ(m.working_copy, 4u * 2 + 6);
  EXPECT_EQ(m.params, 4u * 4 + 4 * 2 + 6);
  EXPECT_EQ(m.total(), m.params + m.grads + 32 + 100);
  policy.weight_versions = 2;
  policy.offload_params = true;
  sizes.offload_store = 72;  // the state and every master weight
  m = planner::memory_figures(policy, sizes);
  EXPECT_EQ(m.params, 2u * 4 * 4 + 4 * 2 + 6);
  EXPECT_EQ(m.offloaded, 72u - 6 * 4) << "only this rank's master blocks stand for memory";
}

// The straggler test seam: OASES_TEST_SLOW_RANK=<rank>:<ms> slows that world rank only; a
// malformed value names the variable.
TEST(RunPlan, TheSlowRankSeamSlowsOneRankOnly) {
  RunConfig config;
  config.parallel.dp = 2;
  config.train.global_batch = 2 * config.train.micro_batch;
  setenv("OASES_TEST_SLOW_RANK", "1:20", 1);
  EXPECT_DOUBLE_EQ(make_run_plan(config, 1).compute_delay_s, 0.02);
  EXPECT_DOUBLE_EQ(make_run_plan(config, 0).compute_delay_s, 0.0);
  setenv("OASES_TEST_SLOW_RANK", "one", 1);
  EXPECT_NE(testing::user_error_of([&] { make_run_plan(config, 0); }).find("OASES_TEST_SLOW_RANK"),
            std::string::npos);
  unsetenv("OASES_TEST_SLOW_RANK");
  EXPECT_DOUBLE_EQ(make_run_plan(config, 1).compute_delay_s, 0.0);
}

}  // namespace
}  // namespace oases::plan
