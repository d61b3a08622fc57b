// `oases profile` and `oases plan --degrees-only` end to end: under mpirun with tp = 2 the
// profile measures degrees 1 and 2 and the reshard between them, and the memory per parameter
// byte by kind, and reads back matching its config; the plan verb prints every layer at each
// degree and the chosen degrees with their memory per rank by kind, writes a plan file, and says
// by how much a memory limit no plan fits is too small.
#include "plan/run_config.h"
#include "planner/profile.h"
#include "support/command.h"
#include "support/runs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

namespace fs = std::filesystem;

namespace {

TEST(ProfileVerb, MeasuresEveryDegreeUnderMpirun) {
  const fs::path dir = fs::current_path() / "profile_runs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "tiny.toml") << R"(
[model]
layers = 2
hidden = 64
heads = 4
ffn_hidden = 128
vocab_size = 257
seq_len = 32
[train]
micro_batch = 4
global_batch = 4
threads = 1
[parallel]
tp = 2
)";
  const std::string out = (dir / "profile.json").string();
  const auto r = oases::testing::run_command(
      "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 " +
      std::string(OASES_BINARY) + " profile --config " + (dir / "tiny.toml").string() +
      " --steps 2 --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The run's schedule (auto: oases at tp 2) overlaps: its own steps at degree 2 measure how
  // compute and communication slow each other.
  EXPECT_NE(r.output.find("degree 2: under the oases schedule"), std::string::npos) << r.output;
  const auto profile = oases::planner::read_profile(out);
  const auto config = oases::plan::load_run_config((dir / "tiny.toml").string());
  EXPECT_NO_THROW(oases::planner::check_profile_matches(profile, config.model, 4, 2, {1, 2}, out));
  ASSERT_EQ(profile.degrees.size(), 2u);
  for (const auto& d : profile.degrees) {
    EXPECT_EQ(d.rows, d.degree);  // a sub-batch of 2 sequences over 2 / degree replicas
    for (const char* kind : {"embedding", "attention", "mlp", "head"}) {
      ASSERT_TRUE(d.segments.contains(kind)) << kind;
      EXPECT_GT(d.segments.at(kind).forward_s, 0) << kind;
    }
    EXPECT_GT(d.segments.at("attention").recompute_s, 0);
    EXPECT_GT(d.segments.at("mlp").backward0_s, 0);
    EXPECT_GT(d.collectives.at("attention.fwd_s"), 0);
    EXPECT_GT(d.collectives.at("mlp.bwd_s"), 0);
    EXPECT_GT(d.optimizer_s, 0);
  }
  // Half the weights per rank at degree 2 (heads and FFN columns split; LayerNorms whole).
  EXPECT_LT(profile.degrees[1].parameter_bytes_per_layer, profile.degrees[0].parameter_bytes_per_layer);
  // The vocab-parallel loss's reductions are the head's and head_softmax's forward collectives.
  EXPECT_GT(profile.degrees[1].collectives.at("head.fwd_s"), 0);
  EXPECT_GT(profile.degrees[1].collectives.at("head_softmax.fwd_s"), 0);
  EXPECT_FALSE(profile.degrees[0].collectives.contains("head_softmax.fwd_s"));
  // Two replicas of degree 1 sum their gradients; one replica of degree 2 has nobody to sum with.
  EXPECT_GT(profile.degrees[0].replica_reduce_per_layer_s, 0);
  // The degree-1 replicas' reduction also describes the link: one layer's fp32 gradients.
  EXPECT_EQ(profile.replica_link.ranks, 2);
  EXPECT_EQ(profile.replica_link.bytes, profile.degrees[0].parameter_bytes_per_layer);
  EXPECT_EQ(profile.replica_link.seconds, profile.degrees[0].replica_reduce_per_layer_s);
  EXPECT_EQ(profile.degrees[1].replica_reduce_per_layer_s, 0);
  EXPECT_GT(profile.degrees[0].parameter_bytes, profile.degrees[1].parameter_bytes);
  EXPECT_GT(profile.reshard_seconds(1, 2), 0);
  // fp32 AdamW without ZeRO or offload: one copy of the parameters, one of the gradients, two
  // moments; the settings they were measured under are recorded.
  EXPECT_EQ(profile.param_bytes_ratio, 1.0);
  EXPECT_EQ(profile.grad_bytes_ratio, 1.0);
  EXPECT_EQ(profile.optimizer_bytes_ratio, 2.0);
  EXPECT_EQ(profile.memory_settings(), "zero 0, offload none, precision fp32");

  const std::string plan_file = (dir / "plan.json").string();
  const std::string plan_command = std::string(OASES_BINARY) + " plan --degrees-only --config " +
                                   (dir / "tiny.toml").string() + " --profile " + out;
  const auto plan = oases::testing::run_command(plan_command + " --output " + plan_file);
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  for (const char* line : {"every layer at 1", "every layer at 2", "chosen", "degrees per layer: ",
                           "solved by the dynamic program", "memory per rank (pred.): params ",
                           "(state as profiled under zero 0, offload none, precision fp32)"})
    EXPECT_NE(plan.output.find(line), std::string::npos) << line << "\n" << plan.output;
  std::ifstream written(plan_file);
  ASSERT_TRUE(written.good());
  const std::string text((std::istreambuf_iterator<char>(written)), {});
  EXPECT_NE(text.find("\"format\": \"oases-plan\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"predicted_optimizer_bytes\""), std::string::npos) << text;
  const auto too_small =
      oases::testing::run_command(plan_command + " --set parallel.memory_limit=1000");
  EXPECT_NE(too_small.exit_code, 0);
  EXPECT_NE(too_small.output.find("parallel.memory_limit = 1000 bytes is too small for any plan"),
            std::string::npos)
      << too_small.output;

  // Without the launcher, a tp = 2 profile says how to launch it.
  const auto alone = oases::testing::run_command(std::string(OASES_BINARY) + " profile --config " +
                                                 (dir / "tiny.toml").string() + " --output " + out);
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_NE(alone.output.find("mpirun -np 2 oases profile"), std::string::npos) << alone.output;
}

// A profile measured in a sequence- or context-parallel layout holds that layout's segments and
// transfers; `oases simulate` and `oases plan --degrees-only` price the run's own program from
// it, and the activation memory they predict is what a training step of that layout measures.
TEST(ProfileVerb, MeasuresAndPricesSequenceAndContextParallelLayouts) {
  const fs::path dir = oases::testing::fresh_test_folder("profile_runs");
  ASSERT_EQ(oases::testing::prepare_fortunes_data(OASES_BINARY, dir).exit_code, 0);
  std::ofstream(dir / "tiny.toml") << R"(
[model]
layers = 2
hidden = 128
heads = 4
ffn_hidden = 256
vocab_size = 260
seq_len = 64
[train]
micro_batch = 8
global_batch = 8
steps = 1
threads = 1
[data]
path = ")" << (dir / "data").string()
                                   << "\"\n";
  struct Layout {
    std::string name, settings;
    int ranks;
    std::vector<std::string> kinds;        // segment kinds at the whole group's degree
    std::vector<std::string> collectives;  // measured on the wire (> 0)
  };
  const std::vector<Layout> layouts = {
      {"sp",
       "parallel.tp=2 parallel.sequence_parallel=true",
       2,
       {"attention_in", "mlp_in", "head_in", "attention", "mlp"},
       {"attention_in.fwd_s", "mlp_in.bwd_s", "mlp.fwd_s"}},
      // The ring's shift of the projected keys and values (forward), and of their gradients
      // back to the owner (the output projection's backward).
      {"ring",
       "parallel.cp=2 parallel.cp_kind=\\\"ring\\\"",
       2,
       {"attention", "attention_ring", "attention_out", "mlp"},
       {"attention.fwd_s", "attention_out.bwd_s"}},
      {"a2a",
       "parallel.cp=2 parallel.cp_kind=\\\"all-to-all\\\"",
       2,
       {"attention", "attention_core", "attention_out", "mlp"},
       {"attention.fwd_s", "attention_core.fwd_s", "attention_core.bwd_s"}}};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const std::string config =
        " --config " + (dir / "tiny.toml").string() + " --set " + layout.settings;
    const std::string out = (dir / (layout.name + ".json")).string();
    const auto profiled =
        oases::testing::run_command(oases::testing::mpirun_prefix(layout.ranks) + OASES_BINARY +
                                    " profile" + config + " --steps 1 --output " + out);
    ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
    const auto profile = oases::planner::read_profile(out);
    EXPECT_EQ(profile.layout.sequence_parallel, layout.name == "sp");
    EXPECT_EQ(profile.layout.cp, layout.name == "sp" ? 1 : 2);
    const oases::planner::DegreeProfile& whole = profile.degrees.back();
    for (const std::string& kind : layout.kinds) {
      ASSERT_TRUE(whole.segments.contains(kind)) << kind;
      EXPECT_GT(whole.segments.at(kind).forward_s, 0) << kind;
      EXPECT_GT(whole.segments.at(kind).backward0_s, 0) << kind;
    }
    for (const std::string& collective : layout.collectives) {
      ASSERT_TRUE(whole.collectives.contains(collective)) << collective;
      EXPECT_GT(whole.collectives.at(collective), 0) << collective;
    }
    if (layout.name != "sp") {
      // The context-parallel pair sums its gradients, as the run's replicas do.
      EXPECT_GT(whole.replica_reduce_per_layer_s, 0);
    }

    const auto simulated = oases::testing::run_command(std::string(OASES_BINARY) + " simulate" +
                                                       config + " --profile " + out);
    ASSERT_EQ(simulated.exit_code, 0) << simulated.output;
    std::smatch activations;
    ASSERT_TRUE(
        std::regex_search(simulated.output, activations, std::regex("activations ([0-9.]+)\\n")))
        << simulated.output;
    const fs::path run = dir / (layout.name + "_run");
    const auto trained = oases::testing::run_command(
        oases::testing::mpirun_prefix(layout.ranks) + OASES_BINARY + " train --quiet" + config +
        " log.metrics=" + oases::testing::quoted((run / "metrics.jsonl").string()) +
        " checkpoint.dir=" + oases::testing::quoted((run / "ckpt").string()));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const auto measured =
        oases::testing::metric_values(run / "metrics.jsonl", "peak_activation_bytes");
    ASSERT_EQ(measured.size(), 1u);
    // Printed in MiB to one decimal (of 3.5 to 7 MiB).
    EXPECT_GT(measured[0], 3 << 20);
    EXPECT_NEAR(std::stod(activations[1]), measured[0] / (1 << 20), 0.05 + 1e-9)
        << simulated.output;

    const auto planned = oases::testing::run_command(
        std::string(OASES_BINARY) + " plan --degrees-only" + config + " --profile " + out);
    ASSERT_EQ(planned.exit_code, 0) << planned.output;
    EXPECT_NE(planned.output.find("every plan predicted from the run's own program, with " +
                                  profile.layout.describe()),
              std::string::npos)
        << planned.output;
    // Under sequence parallelism only degree 2 is a candidate (a group of one has no
    // sequence-parallel segments).
    EXPECT_EQ(planned.output.find("every layer at 1") == std::string::npos, layout.name == "sp")
        << planned.output;

    // A profile of this layout does not price another.
    const auto other =
        oases::testing::run_command(std::string(OASES_BINARY) + " simulate --config " +
                                    (dir / "tiny.toml").string() + " --profile " + out);
    EXPECT_NE(other.exit_code, 0);
    EXPECT_NE(other.output.find("re-run `oases profile` with this config"), std::string::npos)
        << other.output;
  }
  // tp 2 x cp 2 needs four ranks.
  const auto short_of_ranks = oases::testing::run_command(
      oases::testing::mpirun_prefix(2) + OASES_BINARY + " profile --config " +
      (dir / "tiny.toml").string() + " --set parallel.tp=2 parallel.cp=2 --output " +
      (dir / "x.json").string());
  EXPECT_NE(short_of_ranks.exit_code, 0);
  EXPECT_NE(short_of_ranks.output.find("runs on 4 ranks (or a multiple); mpirun started 2"),
            std::string::npos)
      << short_of_ranks.output;
}

}  // namespace
