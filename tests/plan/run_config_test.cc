#include "plan/run_config.h"

#include "core/error.h"
#include "plan/run_plan.h"
#include "plan/settings.h"

#include <gtest/gtest.h>

#include <vector>

namespace oases::plan {
namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_run_config(toml, "test.toml", overrides);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// What the run plan makes of a config: the layers of each pipeline chunk, the layers of each
// chunk of one stage, the schedule and the layers' degrees.
std::vector<int> stage_layer_counts(const RunConfig& c) { return make_run_plan(c).pipeline.counts(); }
using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
Ranges stage_layer_ranges(const RunConfig& c, int stage) {
  Ranges out;
  for (const model::LayerRange& r : make_run_plan(c).pipeline.stage_ranges(stage))
    out.emplace_back(r.begin, r.end);
  return out;
}
schedule::ScheduleSpec schedule_spec(const RunConfig& c) { return make_run_plan(c).schedule; }
std::vector<int> layer_degrees(const RunConfig& c) { return make_run_plan(c).layer_degrees; }

// The error of stage_layer_counts on a config that parses.
std::string error_of_counts(const std::string& toml) {
  try {
    stage_layer_counts(parse_run_config(toml, "test.toml"));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, ParsesSectionsAndOverrides) {
  const RunConfig c = parse_run_config("[model]\nlayers = 3\n[train]\nlr = 1e-3\n", "t",
                                       {"train.lr=5e-4", "data.path=data/x", "model.dropout=0.2",
                                        "model.attention_dropout=0.15", "checkpoint.resume=true", "checkpoint.dir=\"runs/a\""});
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_DOUBLE_EQ(c.train.lr, 5e-4);
  EXPECT_EQ(c.data.path, "data/x");
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.2);
  EXPECT_DOUBLE_EQ(c.model.attention_dropout, 0.15);
  EXPECT_TRUE(c.checkpoint.resume);
  EXPECT_EQ(c.checkpoint.dir, "runs/a");
}

// Per-layer counts pass through --set as they are typed on a command line, unquoted.
TEST(RunConfig, CountListOverridesAreStrings) {
  const RunConfig c = parse_run_config("[model]\nlayers = 6\n[parallel]\npp = 2\n", "t",
                                       {"parallel.pipeline_layers=2,4"});
  EXPECT_EQ(c.parallel.pipeline_layers, "2,4");
  const RunConfig plan = parse_run_config("[model]\nlayers = 6\n[parallel]\ntp = 2\n", "t",
                                          {"parallel.plan=1, 2,2,1,2,2"});
  EXPECT_EQ(plan.parallel.plan, "1, 2,2,1,2,2");
  // Any other text that is not TOML is taken as the text it is, and its setting rejects what
  // it cannot read, naming the value.
  for (const std::string bad : {"2,", "2,,4", "2;4", "2,4x", "1e999999"}) {
    bool threw = false;
    try {
      parse_run_config("[parallel]\npp = 2\n", "t", {"parallel.pipeline_layers=" + bad});
    } catch (const UserError& e) {
      threw = std::string(e.what()).find("parallel.pipeline_layers = \"" + bad + "\"") !=
              std::string::npos;
    }
    EXPECT_TRUE(threw) << bad;
  }
  // Where a number is expected, something that starts like one and is not TOML is an error.
  EXPECT_NE(error_of("", {"train.steps=2x"}).find("is not a valid value"), std::string::npos);
}

TEST(RunConfig, IntegersAreAcceptedWhereNumbersAreExpected) {
  EXPECT_DOUBLE_EQ(parse_run_config("[train]\nlr = 1\nmin_lr = 0\n", "t").train.lr, 1.0);
}

TEST(RunConfig, PipelineSettingsParseRoundTripAndNameTheirErrors) {
  const RunConfig a = parse_run_config(
      "[model]\nlayers = 5\n[parallel]\npp = 2\npipeline = \"gpipe\"\npipeline_layers = \"3, 2\"\n", "t");
  EXPECT_EQ(stage_layer_counts(a), (std::vector<int>{3, 2}));
  EXPECT_EQ(stage_layer_ranges(a, 1), (Ranges{{3, 5}}));
  const RunConfig b = parse_run_config(to_toml(a), "round trip");
  EXPECT_EQ(b.parallel.pipeline, "gpipe");
  EXPECT_EQ(stage_layer_counts(b), (std::vector<int>{3, 2}));
  const RunConfig uniform = parse_run_config("[model]\nlayers = 5\n[parallel]\npp = 2\n", "t");
  EXPECT_EQ(uniform.parallel.pipeline, "1f1b");
  EXPECT_EQ(stage_layer_counts(uniform), (std::vector<int>{2, 3}));
  EXPECT_EQ(stage_layer_ranges(parse_run_config("", "t"), 0), (Ranges{{0, 4}}));

  EXPECT_NE(error_of("[parallel]\npp = 2\npipeline_layers = \"1,2\"\n")
                .find("parallel.pipeline_layers = \"1,2\" sums to 3 layers but model.layers = 4"),
            std::string::npos);
  EXPECT_NE(error_of("[parallel]\npp = 2\npipeline_layers = \"1,1,2\"\n").find("parallel.pipeline_layers = \"1,1,2\" has 3 counts"),
            std::string::npos);
  // "auto" is valid; its counts are measured at start-up (train/pipeline_split.h), so code
  // that needs them before is told so.
  EXPECT_EQ(error_of("[parallel]\npp = 2\npipeline_layers = \"auto\"\n"), "");
  EXPECT_NE(error_of_counts("[parallel]\npp = 2\npipeline_layers = \"auto\"\n").find("is resolved by `oases train`"),
            std::string::npos);
  EXPECT_NE(error_of("[parallel]\npipeline = \"zigzag\"\n").find("parallel.pipeline = \"zigzag\" is not known; valid: "),
            std::string::npos);
  // Explicit per-layer degrees run under a pipeline; the planner ("auto") does not plan stages.
  EXPECT_EQ(parse_run_config("[parallel]\npp = 2\ntp = 2\nplan = \"1,2,2,2\"\n", "t").parallel.plan,
            "1,2,2,2");
  EXPECT_NE(error_of("[parallel]\npp = 2\ntp = 2\nplan = \"auto\"\n")
                .find("parallel.plan = \"auto\" with parallel.pp = 2: the planner does not plan "
                      "pipeline stages yet; valid: parallel.plan = \"uniform\", explicit degrees "
                      "per layer (e.g. \"2,2,2,2\")"),
            std::string::npos);
}

// parallel.virtual_stages = v cuts the model into pp x v chunks; rank r holds chunks r, r + pp, ...
TEST(RunConfig, InterleavedPipelineSettingsParseRoundTripAndGiveEachRankItsChunks) {
  const std::string interleaved =
      "[model]\nlayers = 9\n[parallel]\npp = 2\npipeline = \"interleaved\"\n"
      "[train]\nmicro_batch = 1\nglobal_batch = 4\n";
  const RunConfig a = parse_run_config(interleaved, "t", {"parallel.virtual_stages=2"});
  EXPECT_EQ(a.parallel.virtual_stages, 2);
  // Uniform over 4 chunks: the extra layer goes to the last chunk.
  EXPECT_EQ(stage_layer_counts(a), (std::vector<int>{2, 2, 2, 3}));
  EXPECT_EQ(stage_layer_ranges(a, 0), (Ranges{{0, 2}, {4, 6}}));
  EXPECT_EQ(stage_layer_ranges(a, 1), (Ranges{{2, 4}, {6, 9}}));
  const RunConfig b = parse_run_config(to_toml(a), "round trip");
  EXPECT_EQ(b.parallel.virtual_stages, 2);
  EXPECT_EQ(to_toml(a), to_toml(b));
  // Explicit counts, one per chunk.
  const RunConfig c = parse_run_config(interleaved, "t",
                                       {"parallel.virtual_stages=2", "parallel.pipeline_layers=1,3,4,1"});
  EXPECT_EQ(stage_layer_ranges(c, 0), (Ranges{{0, 1}, {4, 8}}));
  EXPECT_EQ(stage_layer_ranges(c, 1), (Ranges{{1, 4}, {8, 9}}));
  // Without a pipeline, one range of every layer; with one chunk per rank, the stage's range.
  EXPECT_EQ(stage_layer_ranges(parse_run_config("[model]\nlayers = 3\n", "t"), 0), (Ranges{{0, 3}}));
  const RunConfig one = parse_run_config("[model]\nlayers = 5\n[parallel]\npp = 2\n", "t");
  EXPECT_EQ(stage_layer_ranges(one, 1), (Ranges{{2, 5}}));
  EXPECT_EQ(one.parallel.virtual_stages, 1);
}

TEST(RunConfig, BadInterleavedSettingsNameTheSettingTheValueAndWhatIsValid) {
  const std::string base = "[model]\nlayers = 8\n[parallel]\npp = 2\n[train]\nmicro_batch = 2\n";
  // virtual_stages > 1 needs the interleaved pipeline.
  std::string e = error_of(base, {"parallel.virtual_stages=2", "train.global_batch=8"});
  EXPECT_NE(e.find("parallel.virtual_stages = 2 needs parallel.pipeline = \"interleaved\" (found "
                   "\"1f1b\")"),
            std::string::npos) << e;
  // interleaved needs virtual_stages >= 2.
  e = error_of(base, {"parallel.pipeline=interleaved", "train.global_batch=8"});
  EXPECT_NE(e.find("parallel.pipeline = \"interleaved\" needs parallel.virtual_stages of 2 or more "
                   "model chunks per rank (found 1)"),
            std::string::npos) << e;
  // No pipeline to interleave.
  e = error_of("[parallel]\nvirtual_stages = 2\npipeline = \"interleaved\"\n");
  EXPECT_NE(e.find("parallel.virtual_stages = 2 needs a pipeline"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.pp of 2 or more"), std::string::npos) << e;
  // 3 micro-batches per step (6 / (2 x 1)) over 2 ranks: the nearest valid batches are 4 and 8.
  e = error_of(base, {"parallel.pipeline=interleaved", "parallel.virtual_stages=2",
                      "train.global_batch=6"});
  EXPECT_NE(e.find("train.global_batch / (train.micro_batch x parallel.dp) = 6 / (2 x 1) = 3, to "
                   "be a multiple of parallel.pp = 2; valid: train.global_batch = 4 or 8"),
            std::string::npos) << e;
  // Explicit counts name the number of chunks, pp x virtual_stages.
  e = error_of(base, {"parallel.pipeline=interleaved", "parallel.virtual_stages=2",
                      "train.global_batch=8", "parallel.pipeline_layers=4,4"});
  EXPECT_NE(e.find("parallel.pipeline_layers = \"4,4\" has 2 counts but parallel.pp x "
                   "parallel.virtual_stages = 4 chunks"),
            std::string::npos) << e;
  EXPECT_NE(e.find("2,2,2,2"), std::string::npos) << e;  // the valid uniform split
  // More chunks than layers.
  e = error_of(base, {"parallel.pipeline=interleaved", "parallel.virtual_stages=5",
                      "train.global_batch=8"});
  EXPECT_NE(e.find("parallel.pp x parallel.virtual_stages = 2 x 5 chunks is more than model.layers "
                   "= 8"),
            std::string::npos) << e;
  EXPECT_NE(e.find("virtual_stages up to 4"), std::string::npos) << e;
  e = error_of(base, {"parallel.virtual_stages=0"});
  EXPECT_NE(e.find("parallel.virtual_stages = 0 must be at least 1"), std::string::npos) << e;
}

TEST(RunConfig, RoundTripsThroughToml) {
  const RunConfig a = parse_run_config("[model]\nlayers = 7\nhidden = 96\nheads = 3\n[log]\nmetrics = \"m.jsonl\"\n", "t");
  const RunConfig b = parse_run_config(to_toml(a), "round trip");
  EXPECT_EQ(to_toml(a), to_toml(b));
  EXPECT_EQ(b.model.layers, 7);
  EXPECT_EQ(b.log.metrics, "m.jsonl");
}

TEST(RunConfig, LossScaleSettingsParseRoundTripAndNameTheirErrors) {
  const RunConfig a = parse_run_config(
      "[train]\nloss_scale = 0\ninitial_loss_scale = 4096\nmin_loss_scale = 2\n"
      "loss_scale_window = 50\nhysteresis = 3\n",
      "t");
  EXPECT_EQ(a.train.loss_scale, 0);
  EXPECT_EQ(a.train.initial_loss_scale, 4096);
  EXPECT_EQ(a.train.min_loss_scale, 2);
  EXPECT_EQ(a.train.loss_scale_window, 50);
  EXPECT_EQ(a.train.hysteresis, 3);
  const RunConfig b = parse_run_config(to_toml(a), "round trip");
  EXPECT_EQ(to_toml(a), to_toml(b));
  // Megatron's defaults, but starting at 2^16.
  const RunConfig d = parse_run_config("", "t");
  EXPECT_EQ(d.train.loss_scale, 0);
  EXPECT_EQ(d.train.initial_loss_scale, 65536);
  EXPECT_EQ(d.train.min_loss_scale, 1);
  EXPECT_EQ(d.train.loss_scale_window, 1000);
  EXPECT_EQ(d.train.hysteresis, 2);

  std::string e = error_of("", {"train.loss_scale=0.5"});
  EXPECT_NE(e.find("train.loss_scale = 0.5 must be 0 (dynamic scaling) or at least 1"),
            std::string::npos) << e;
  e = error_of("", {"train.min_loss_scale=0.25"});
  EXPECT_NE(e.find("train.min_loss_scale = 0.25 must be at least 1"), std::string::npos) << e;
  e = error_of("", {"train.initial_loss_scale=0.5"});
  EXPECT_NE(e.find("train.initial_loss_scale = 0.5 must be at least train.min_loss_scale = 1"),
            std::string::npos) << e;
  e = error_of("", {"train.loss_scale_window=0"});
  EXPECT_NE(e.find("train.loss_scale_window = 0 must be at least 1"), std::string::npos) << e;
  e = error_of("", {"train.hysteresis=0"});
  EXPECT_NE(e.find("train.hysteresis = 0 must be at least 1"), std::string::npos) << e;
}

TEST(RunConfig, ScheduleSettingsResolveAndIncompatibleOnesAreRejected) {
  // auto: oases with two sub-batches under tensor parallelism, megatron otherwise.
  RunConfig c = parse_run_config("[parallel]\ntp = 2\n[train]\nmicro_batch = 4\nglobal_batch = 8\n", "t");
  schedule::ScheduleSpec spec = schedule_spec(c);
  EXPECT_EQ(spec.kind, schedule::ScheduleKind::oases);
  EXPECT_EQ(spec.recompute, schedule::Recompute::fine_grained);
  EXPECT_EQ(spec.sub_batches, 2);
  EXPECT_EQ(spec.micro_batches, 2);
  c = parse_run_config("[train]\nmicro_batch = 3\nglobal_batch = 3\n", "t", {"parallel.schedule=\"cross-pass\""});
  spec = schedule_spec(c);
  EXPECT_EQ(spec.recompute, schedule::Recompute::full);
  EXPECT_EQ(spec.sub_batches, 1);  // an odd micro-batch does not split in two
  spec = schedule_spec(parse_run_config("", "t"));
  EXPECT_EQ(spec.kind, schedule::ScheduleKind::megatron);
  EXPECT_EQ(spec.recompute, schedule::Recompute::none);

  EXPECT_NE(error_of("[train]\nmicro_batch = 4\n", {"parallel.sub_batches=3", "parallel.schedule=\"oases\""})
                .find("parallel.sub_batches = 3 must divide train.micro_batch = 4 (sub-batches split "
                      "each micro-batch along the batch dimension); valid: 1, 2, 4"),
            std::string::npos);
  EXPECT_NE(error_of("", {"parallel.schedule=\"oases\"", "parallel.recompute=\"full\""})
                .find("parallel.recompute = \"full\" does not go with parallel.schedule = \"oases\""),
            std::string::npos);
  EXPECT_NE(error_of("", {"parallel.schedule=\"megatron\"", "parallel.sub_batches=2"})
                .find("parallel.sub_batches = 2 needs an overlapped schedule"),
            std::string::npos);
  EXPECT_NE(error_of("", {"parallel.schedule=\"1f1b\""})
                .find("parallel.schedule = \"1f1b\" is not known; valid: \"megatron\", "
                      "\"fine-grained\", \"cross-pass\", \"oases\""),
            std::string::npos);
  EXPECT_NE(error_of("", {"parallel.recompute=\"some\""})
                .find("parallel.recompute = \"some\" is not known; valid: \"none\", \"full\", "
                      "\"selective\", \"fine-grained\""),
            std::string::npos);
}

TEST(RunConfig, DataTokenizerIsOneOfTheKnownTokenizers) {
  EXPECT_EQ(parse_run_config("[data]\ntokenizer = \"gpt2\"\n", "t").data.tokenizer, "gpt2");
  EXPECT_EQ(parse_run_config("", "t", {"data.tokenizer=byte"}).data.tokenizer, "byte");
  EXPECT_EQ(parse_run_config("[data]\ntokenizer = \"bpe\"\n", "t").data.tokenizer, "bpe");
  const std::string error = error_of("[data]\ntokenizer = \"tiktoken\"\n");
  EXPECT_NE(error.find("data.tokenizer = \"tiktoken\" is not known; valid: \"byte\", \"gpt2\", "
                       "\"sentencepiece\", \"bpe\", \"wordpiece\""),
            std::string::npos)
      << error;
}

TEST(RunConfig, ErrorsNameTheSettingTheValueAndWhatIsValid) {
  EXPECT_NE(error_of("[model]\nlayerz = 3\n").find("unknown config key model.layerz; valid keys in [model]: "), std::string::npos);
  EXPECT_NE(error_of("[modle]\n").find("unknown config section [modle]"), std::string::npos);
  EXPECT_NE(error_of("[model]\nlayers = 2.5\n").find("model.layers = 2.5 is a floating-point number; expected an integer"), std::string::npos);
  EXPECT_NE(error_of("[train]\nlr = \"x\"\n").find("train.lr = \"x\" is a string; expected a number"), std::string::npos);
  EXPECT_NE(error_of("[model]\nhidden = 100\nheads = 3\n").find("model.heads = 3 must divide model.hidden = 100"), std::string::npos);
  EXPECT_NE(error_of("[train]\nmicro_batch = 4\nglobal_batch = 10\n").find("train.global_batch = 10 must be a multiple"), std::string::npos);
  EXPECT_NE(error_of("[model]\ndropout = 1.0\n").find("model.dropout = 1 must be in [0, 1)"), std::string::npos);
  EXPECT_NE(error_of("[model]\nattention_dropout = -0.5\n")
                .find("model.attention_dropout = -0.5 must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.lr"}).find("expected section.key=value"), std::string::npos);
  EXPECT_NE(error_of("", {"lr=3"}).find("section.key"), std::string::npos);
  EXPECT_NE(error_of("[model\n").find("not valid TOML"), std::string::npos);
  EXPECT_NE(error_of("[parallel]\ntp = 3\n").find("parallel.tp = 3 must divide model.heads = 4"), std::string::npos);
  EXPECT_NE(error_of("[parallel]\npp = 5\n").find("parallel.pp = 5 is more than model.layers = 4"), std::string::npos);
  EXPECT_NE(error_of("[train]\nprecision = \"bf8\"\n").find("train.precision = \"bf8\" is not known; valid: \"fp32\", \"bf16\", \"fp16\""), std::string::npos);
  EXPECT_NE(error_of("[train]\ngrad_reduce_dtype = \"fp8\"\n").find("train.grad_reduce_dtype = \"fp8\" is not known; valid: \"fp32\", \"bf16\""), std::string::npos);
  EXPECT_NE(error_of("[train]\ngrad_reduce_dtype = \"bf16\"\n").find("train.grad_reduce_dtype = \"bf16\" needs mixed precision"), std::string::npos);
  EXPECT_NE(error_of("[train]\ngemm16_path = \"blas\"\n").find("train.gemm16_path = \"blas\" is not known; valid: \"auto\""), std::string::npos);
  EXPECT_NE(error_of("[train]\nprecision = \"bf16\"\n[parallel]\nactivation_compression = \"bf16\"\n").find("parallel.activation_compression = \"bf16\" with train.precision = \"bf16\" would change nothing"), std::string::npos);
  EXPECT_EQ(error_of("[train]\nprecision = \"bf16\"\n[parallel]\nactivation_compression = \"fp8\"\n"), "");
  EXPECT_NE(error_of("[parallel]\npartition_activations = true\nactivation_compression = \"fp8\"\n")
                .find("parallel.partition_activations = true with parallel.activation_compression = \"fp8\" is not supported yet"),
            std::string::npos);
  EXPECT_EQ(error_of("[parallel]\ntp = 2\npartition_activations = true\n"), "");
  EXPECT_NE(error_of("[parallel]\nbucket_bytes = 100\n")
                .find("parallel.bucket_bytes = 100 is too small to carry a collective; valid: 0 (no bound) or at least 1024 bytes"),
            std::string::npos);
  EXPECT_EQ(error_of("[parallel]\nbucket_bytes = 50000000\n"), "");
  EXPECT_NE(error_of("[train]\nprecision = \"fp16\"\nglobal_batch = 8\nmicro_batch = 1\n[parallel]\npp = 2\npipeline = \"2bw\"\n").find("train.precision = \"fp16\" does not run with parallel.pipeline = \"2bw\""), std::string::npos);
  EXPECT_NE(error_of("[checkpoint]\nresume = true\n").find("checkpoint.dir"), std::string::npos);
  EXPECT_NE(error_of("[parallel]\ndp_sync_every = 0\n").find("parallel.dp_sync_every = 0 must be at least 1"), std::string::npos);
  EXPECT_NE(error_of("[parallel]\ndp_sync_every = 4\ntp = 2\nplan = \"1,1,2,2\"\n").find("parallel.dp_sync_every = 4 needs parallel.plan = \"uniform\""), std::string::npos);
  EXPECT_NE(error_of("[parallel]\nzero = 4\n").find("parallel.zero = 4 is not a ZeRO stage; valid: 0 (none), 1"), std::string::npos);
  EXPECT_NE(error_of("[parallel]\nzero = -1\n").find("parallel.zero = -1 is not a ZeRO stage"), std::string::npos);
  EXPECT_EQ(error_of("[train]\nglobal_batch = 8\n[parallel]\nzero = 3\ndp = 2\nzero3_reshard_after_forward = false\n"), "");
  EXPECT_EQ(error_of("[model]\nlayers = 4\n[train]\nglobal_batch = 8\nmicro_batch = 1\n[parallel]\nzero = 3\npp = 2\npipeline = \"2bw\"\n"), "");
  EXPECT_NE(error_of("[train]\nglobal_batch = 8\n[parallel]\nzero = 1\ndp = 2\ndp_sync_every = 4\n").find("parallel.zero = 1 with parallel.dp_sync_every = 4"), std::string::npos);
  EXPECT_EQ(error_of("[train]\nglobal_batch = 8\n[parallel]\nzero = 2\ndp = 2\n"), "");
}

TEST(RunConfig, FlightRecordSettingsResolveAndNameTheirErrors) {
  for (const char* bad : {"-1", "100001"})
    EXPECT_NE(error_of("", {std::string("log.flight_records=") + bad})
                  .find(std::string("log.flight_records = ") + bad + " must lie in [0, 100000]"),
              std::string::npos)
        << bad;
  EXPECT_EQ(error_of("", {"log.flight_records=100000"}), "");
  const auto folder = [](const std::vector<std::string>& overrides) {
    return parse_settings(parse_run_config("", "test.toml", overrides)).flight_dir;
  };
  EXPECT_EQ(folder({"log.flight_dir=/x/f", "log.metrics=runs/a/m.jsonl"}), "/x/f");
  EXPECT_EQ(folder({"log.metrics=runs/a/m.jsonl", "checkpoint.dir=runs/b/ckpt"}), "runs/a/flight");
  EXPECT_EQ(folder({"checkpoint.dir=runs/b/ckpt/"}), "runs/b/flight");
  EXPECT_EQ(folder({"log.metrics=m.jsonl"}), "flight");
  EXPECT_EQ(folder({}), "flight");
  EXPECT_EQ(folder({"log.flight_records=0", "log.flight_dir=/x/f"}), "");  // no recorder
}

TEST(RunConfig, MixtureOfExpertsSettingsRoundTripAndNameTheirErrors) {
  const std::string moe = "[model]\nmoe_every = 2\nexperts = 4\n";
  const RunConfig a = parse_run_config(moe + "moe_gate = \"gshard\"\ncapacity_factor = 1.25\n"
                                       "eval_capacity_factor = 2.0\nmoe_group_size = 64\n"
                                       "moe_z_loss_coef = 0.001\nexpert_dropout = 0.4\n", "t");
  EXPECT_TRUE(a.model.is_moe_layer(1));
  EXPECT_FALSE(a.model.is_moe_layer(2));
  EXPECT_EQ(a.model.moe_choices(), 2);
  const RunConfig b = parse_run_config(to_toml(a), "round trip");
  EXPECT_EQ(b.model.moe_gate, ops::MoeGate::gshard);
  EXPECT_EQ(b.model.capacity_factor, 1.25);
  EXPECT_EQ(b.model.moe_eval_capacity_factor(), 2.0);
  EXPECT_EQ(b.model.moe_group_tokens(), 64);
  EXPECT_EQ(b.model.expert_dropout, 0.4);
  // Expert choice has no top-k: its round trip must not invent one.
  EXPECT_EQ(parse_run_config(to_toml(parse_run_config(moe + "moe_gate = \"expert-choice\"\n", "t")), "rt")
                .model.moe_top_k, 0);
  // Parameters: every expert counts, FLOPs only the active ones (top-2 of 4: half the experts).
  const auto dense = parse_run_config("", "t").model;
  EXPECT_GT(a.model.parameter_count(), dense.parameter_count());
  EXPECT_LT(a.model.training_flops_per_token(), 6.0 * static_cast<double>(a.model.parameter_count()));

  EXPECT_NE(error_of(moe + "moe_top_k = 5\nmoe_gate = \"noisy-topk\"\n")
                .find("model.moe_top_k = 5 is more than model.experts = 4"), std::string::npos);
  EXPECT_NE(error_of(moe + "capacity_factor = 0\n").find("model.capacity_factor = 0 must be positive"),
            std::string::npos);
  EXPECT_NE(error_of(moe + "capacity_factor = -1\n").find("model.capacity_factor = -1 must be positive"),
            std::string::npos);
  EXPECT_NE(error_of(moe + "moe_gate = \"top2\"\n").find("model.moe_gate = \"top2\" is not known; valid: \"noisy-topk\""),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nmoe_every = 2\nexperts = 1\n").find("model.experts = 1 must be at least 2"),
            std::string::npos);
  EXPECT_NE(error_of(moe + "moe_gate = \"switch\"\nmoe_top_k = 2\n").find("the switch gate routes each token to one expert"),
            std::string::npos);
  EXPECT_NE(error_of(moe + "moe_gate = \"expert-choice\"\nmoe_top_k = 2\n").find("each expert chooses its tokens"),
            std::string::npos);
  EXPECT_NE(error_of(moe + "moe_group_size = 48\n").find("model.moe_group_size = 48 must divide model.seq_len = 128 or be a multiple of it"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\narch = \"bert\"\nmoe_every = 2\nexperts = 4\n").find("not \"bert\""),
            std::string::npos);
  // Experts split over the tensor-parallel group (the default), or whole with their layers at
  // degree 1.
  EXPECT_EQ(error_of(moe + "[parallel]\ntp = 2\n"), "");
  EXPECT_EQ(error_of(moe + "[parallel]\ntp = 2\nplan = \"2,1,2,1\"\n"), "");
  EXPECT_EQ(layer_degrees(parse_run_config(moe + "[parallel]\ntp = 2\n", "t")), std::vector<int>{});
  const RunConfig whole = parse_run_config(moe + "[parallel]\ntp = 2\nexpert_tp = 1\n", "t");
  EXPECT_EQ(layer_degrees(whole), (std::vector<int>{2, 1, 2, 1}));
  EXPECT_EQ(parse_run_config(to_toml(whole), "rt").parallel.expert_tp, 1);
  EXPECT_NE(error_of(moe + "[parallel]\ntp = 4\nexpert_tp = 2\n")
                .find("parallel.expert_tp = 2 with parallel.tp = 4: experts are either whole on each rank (1) or split"),
            std::string::npos);
  // A dense model takes no invalid value either (whatever the model, 2 is not a choice at tp 4).
  EXPECT_NE(error_of("[parallel]\ntp = 4\nexpert_tp = 2\n").find("parallel.expert_tp = 2 with parallel.tp = 4"),
            std::string::npos);
  EXPECT_EQ(error_of("[parallel]\ntp = 2\nexpert_tp = 1\n"), "");
  EXPECT_NE(error_of(moe + "[parallel]\ntp = 2\nexpert_tp = 1\nplan = \"2,2,2,1\"\n")
                .find("gives layer 1 (a mixture-of-experts layer) degree 2, but parallel.expert_tp = 1"),
            std::string::npos);
  EXPECT_EQ(error_of(moe + "[train]\nprecision = \"bf16\"\n"), "");
  EXPECT_EQ(error_of(moe + "[train]\nprecision = \"fp16\"\n"), "");
  EXPECT_NE(error_of(moe + "[parallel]\nactivation_compression = \"fp8\"\n")
                .find("parallel.activation_compression = \"fp8\" with mixture-of-experts layers"),
            std::string::npos);
  // Expert parallelism.
  const std::string batch = "[train]\nglobal_batch = 16\n";
  EXPECT_EQ(error_of(moe + batch + "[parallel]\ndp = 4\nep = 2\n"), "");
  EXPECT_EQ(parse_run_config(to_toml(parse_run_config(moe + batch + "[parallel]\ndp = 4\nep = 4\n", "t")), "rt")
                .parallel.ep, 4);
  EXPECT_NE(error_of("[model]\nmoe_every = 2\nexperts = 6\n" + batch + "[parallel]\ndp = 4\nep = 4\n")
                .find("model.experts = 6 is not divisible by parallel.ep = 4"), std::string::npos);
  EXPECT_NE(error_of(moe + batch + "[parallel]\ndp = 4\nep = 3\n").find("parallel.ep = 3 must divide parallel.dp = 4"),
            std::string::npos);
  EXPECT_NE(error_of(batch + "[parallel]\ndp = 2\nep = 2\n").find("the model has none (model.moe_every = 0)"),
            std::string::npos);
  EXPECT_NE(error_of(moe + "[parallel]\nep = 0\n").find("parallel.ep = 0 must be at least 1"), std::string::npos);
  EXPECT_NE(error_of(moe + batch + "[parallel]\ndp = 2\nep = 2\ndp_sync_every = 4\n").find("parallel.dp_sync_every = 4 with parallel.ep = 2"),
            std::string::npos);
}

// The cases below once hung, overflowed, read a disengaged optional or threw another exception
// type than UserError (found by fuzz/run_config_fuzzer.cc).
TEST(RunConfig, AbsurdSizesAreRejectedAtOnceListingValidValuesUpTo4096) {
  const std::string huge = "4611686018427387904";  // 2^62
  EXPECT_NE(error_of("[model]\nhidden = " + huge + "\nheads = " + huge + "\nffn_hidden = " + huge +
                     "\n[parallel]\ntp = 3\n")
                .find("valid tp for this model: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, "
                      "2048, 4096, ..."),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nmicro_batch = 1\nglobal_batch = " + huge + "\n[parallel]\ndp = 3\n")
                .find("or dp in {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, ...}"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nmicro_batch = " + huge + "\nglobal_batch = " + huge +
                     "\n[parallel]\nschedule = \"oases\"\nsub_batches = 3\n")
                .find("valid: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, ..."),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nmicro_batch = " + huge + "\nglobal_batch = " + huge +
                     "\n[parallel]\ndp = 4\n")
                .find("train.micro_batch x parallel.dp = 4611686018427387904 x 4 is too large"),
            std::string::npos);
  // Counts the schedule holds as int.
  EXPECT_NE(error_of("[train]\nmicro_batch = 1\nglobal_batch = 4294967296\n")
                .find("train.global_batch = 4294967296 makes 4294967296 micro-batches"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nmicro_batch = 4294967296\nglobal_batch = 4294967296\n"
                     "[parallel]\nschedule = \"oases\"\nsub_batches = 4294967296\n")
                .find("parallel.sub_batches = 4294967296 is too many"),
            std::string::npos);
  // The example plan in the message shows 8 layers, not model.layers of them.
  EXPECT_NE(error_of("[model]\nlayers = 1000000000000\n[parallel]\nplan = \"1, ,1\"\n")
                .find("an empty entry; write one degree per layer, e.g. \"1,1,1,1,1,1,1,1,...\""),
            std::string::npos);
}

TEST(RunConfig, AnIntegerWithoutAnExactDoubleIsRejectedWhereANumberIsExpected) {
  EXPECT_NE(error_of("[train]\nlr = 9007199254740993\n")
                .find("train.lr = 9007199254740993 has no exact floating-point value"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(parse_run_config("[train]\nlr = 9007199254740992\nmin_lr = 0\n", "t").train.lr,
                   9007199254740992.0);
}

TEST(RunConfig, BareWordOverridesMustBeUtf8) {
  EXPECT_EQ(
      parse_run_config("", "t", {"data.path=d\xc3\xa9j\xc3\xa0/\xe2\x82\xac/\xf0\x9f\x99\x82"})
          .data.path,
      "d\xc3\xa9j\xc3\xa0/\xe2\x82\xac/\xf0\x9f\x99\x82");
  // A stray byte, an overlong '/', a surrogate, a truncated sequence, beyond U+10FFFF.
  for (const char* bad : {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80"})
    EXPECT_NE(error_of("", {std::string("data.path=runs/") + bad})
                  .find("--set data.path: the value is not valid UTF-8 text"),
              std::string::npos)
        << bad;
}

// toml++ printed these as multi-line literal strings that ended early or lost their first
// line break.
TEST(RunConfig, EveryStringRoundTripsThroughToml) {
  for (const char* text :
       {"a\n'''b", "\nfirst line empty", "'''", "ends with\n'", "\\\n\"\t\x7f"}) {
    RunConfig a;
    a.log.metrics = text;
    const RunConfig b = parse_run_config(to_toml(a), "round trip");
    EXPECT_EQ(b.log.metrics, text);
    EXPECT_EQ(to_toml(b), to_toml(a));
  }
}

TEST(RunConfig, APlanNameTheSystemCannotLookUpIsNoPlanFile) {
  EXPECT_NE(
      error_of("", {"parallel.plan=" + std::string(5000, 'p')}).find("nor an existing plan file"),
      std::string::npos);
}

}  // namespace
}  // namespace oases::plan
