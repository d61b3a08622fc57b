// Recomputation and compression per transformer layer (ScheduleSpec::layer_recompute,
// compress_kept_sets with per-layer encodings): every kind runs mixed policies into schedules
// that verify, each layer keeps what its own policy keeps (the activation peak moves by
// exactly the difference of the layers' kept sets), pipelines read the entries of their own
// layers, and only the layers given an encoding are compressed.
#include "schedule/pipeline.h"
#include "schedule/pipeline_lowering.h"
#include "schedule/schedule.h"

#include "core/error.h"
#include "support/gpt_program.h"
#include "support/stage_programs.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace oases::schedule {
namespace {

using ops::ActivationEncoding;
using ops::kCheckpoint;
using ops::kCore;
using ops::kInternals;

constexpr int kLayers = 4;

ScheduleSpec spec_of(ScheduleKind kind, std::vector<Recompute> layers, int micro_batches,
                     int sub_batches) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.micro_batches = micro_batches;
  spec.sub_batches = sub_batches;
  // The segments outside the layers take the kind's own policy, as plan::resolve_schedule
  // gives them.
  spec.recompute = kind == ScheduleKind::megatron     ? Recompute::none
                   : kind == ScheduleKind::cross_pass ? Recompute::full
                                                      : Recompute::fine_grained;
  spec.layer_recompute = std::move(layers);
  return spec;
}

ScheduleSpec uniform(ScheduleKind kind, Recompute policy, int micro_batches, int sub_batches) {
  return spec_of(kind, std::vector<Recompute>(kLayers, policy), micro_batches, sub_batches);
}

std::string describe(const ScheduleSpec& spec) {
  return fmt::format("{} [{}] mb{} sb{}", name(spec.kind), recompute_words(spec),
                     spec.micro_batches, spec.sub_batches);
}

// The mixed policies each kind runs, and the uniform ones they lie between.
struct Mix {
  ScheduleKind kind;
  int sub_batches;
  std::vector<Recompute> layers;
  Recompute least_kept, most_kept;
};
std::vector<Mix> mixes() {
  using enum Recompute;
  const std::vector<Recompute> fine_and_none{fine_grained, none, none, fine_grained};
  return {
      {ScheduleKind::megatron, 1, {full, none, selective, none}, full, none},
      {ScheduleKind::megatron, 1, {none, full, fine_grained, full}, full, none},
      {ScheduleKind::cross_pass, 2, {full, none, selective, none}, full, none},
      {ScheduleKind::cross_pass, 2, {selective, full, full, none}, full, none},
      {ScheduleKind::fine_grained, 1, fine_and_none, fine_grained, none},
      {ScheduleKind::oases, 2, fine_and_none, fine_grained, none},
      {ScheduleKind::oases, 2, {none, fine_grained, fine_grained, none}, fine_grained, none},
      {ScheduleKind::oases_interleaved, 2, fine_and_none, fine_grained, none},
      {ScheduleKind::oases_deferred, 2, fine_and_none, fine_grained, none},
  };
}

TEST(LayerRecompute, EveryKindRunsMixedPoliciesIntoSchedulesThatVerify) {
  for (int tp : {1, 2}) {
    ops::Program program = testing::gpt_program(kLayers, tp);
    for (ops::SegmentShape& shape : program.segments)
      shape.has_weight_part = shape.layer >= 0 || shape.name == "head_loss";
    for (const Mix& mix : mixes()) {
      for (int micro_batches : {1, 2, 3}) {
        const ScheduleSpec spec = spec_of(mix.kind, mix.layers, micro_batches, mix.sub_batches);
        const std::string what = describe(spec) + " tp" + std::to_string(tp);
        Schedule schedule;
        ASSERT_NO_THROW(schedule = generate(program, spec)) << what;
        EXPECT_NO_THROW(verify_schedule(program, spec, schedule)) << what;
        // Each layer recomputes as its own policy says: a full layer replays its forward
        // collectives, the others never do; a layer without recomputation recomputes nothing.
        for (const Instruction& ins : schedule) {
          if (ins.segment < 0) continue;
          const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
          if (shape.layer < 0) continue;
          const Recompute policy = mix.layers[static_cast<std::size_t>(shape.layer)];
          if (ins.op == Op::start && ins.replay) {
            EXPECT_EQ(policy, Recompute::full) << what << ": " << to_string(ins);
          }
          if (ins.op == Op::recompute) {
            EXPECT_NE(policy, Recompute::none) << what << ": " << to_string(ins);
          }
          if (ins.op == Op::recompute && policy == Recompute::selective) {
            EXPECT_EQ(ins.sets, kCore) << what << ": " << to_string(ins);
          }
        }
      }
    }
  }
}

TEST(LayerRecompute, TheProgramsOfEveryArchitectureRunMixedPolicies) {
  for (const std::string arch : {"gpt", "llama", "bert"}) {
    const model::ModelConfig model = testing::tiny_stage_model(arch, kLayers);
    for (const Mix& mix : mixes()) {
      const ops::Program program = testing::tiny_stage_program(model, mix.sub_batches);
      const ScheduleSpec spec = spec_of(mix.kind, mix.layers, 3, mix.sub_batches);
      Schedule schedule;
      ASSERT_NO_THROW(schedule = generate(program, spec)) << arch << " " << describe(spec);
      EXPECT_NO_THROW(verify_schedule(program, spec, schedule)) << arch << " " << describe(spec);
    }
  }
}

TEST(LayerRecompute, AListOfOnePolicyIsThatPolicy) {
  const ops::Program program = testing::gpt_program(kLayers, 2);
  for (ScheduleKind kind : {ScheduleKind::megatron, ScheduleKind::cross_pass}) {
    for (Recompute policy : {Recompute::none, Recompute::selective, Recompute::full}) {
      ScheduleSpec whole = spec_of(kind, {}, 2, kind == ScheduleKind::megatron ? 1 : 2);
      whole.recompute = policy;
      const ScheduleSpec listed = uniform(kind, policy, 2, whole.sub_batches);
      EXPECT_EQ(generate(program, listed), generate(program, whole)) << describe(listed);
    }
  }
  for (ScheduleKind kind :
       {ScheduleKind::oases, ScheduleKind::oases_interleaved, ScheduleKind::oases_deferred}) {
    const ScheduleSpec whole = spec_of(kind, {}, 3, 2);
    const ScheduleSpec listed = uniform(kind, Recompute::fine_grained, 3, 2);
    EXPECT_EQ(generate(program, listed), generate(program, whole)) << describe(listed);
  }
}

// What a layer of testing::gpt_program keeps between the passes under a policy: none, all its
// sets; selective, all but the attention's core; full, the layer's input (the attention's
// checkpoint) alone; fine-grained, both segments' checkpoints (r_l and h_l).
std::size_t kept_bytes(const ops::Program& program, int layer, Recompute policy) {
  const ops::SegmentShape& attention = program.segments[static_cast<std::size_t>(1 + 2 * layer)];
  const ops::SegmentShape& mlp = program.segments[static_cast<std::size_t>(2 + 2 * layer)];
  const std::size_t all = attention.checkpoint_bytes + attention.internals_bytes +
                          attention.core_bytes + mlp.checkpoint_bytes + mlp.internals_bytes;
  switch (policy) {
    case Recompute::none:
      return all;
    case Recompute::selective:
      return all - attention.core_bytes;
    case Recompute::full:
      return attention.checkpoint_bytes;
    case Recompute::fine_grained:
      return attention.checkpoint_bytes + mlp.checkpoint_bytes;
    case Recompute::sqrt:
      break;
  }
  ADD_FAILURE() << "no kept bytes for sqrt";
  return 0;
}

// The peak comes where every layer but the last holds what its policy keeps (the end of the
// forward pass, or the last layer's recomputation just after it) in each sub-batch: with the
// last layer's policy as in a uniform run, a mixed run's peak is the uniform one's plus, per
// earlier layer and sub-batch, the difference of the two policies' kept bytes.
TEST(LayerRecompute, ThePeakMovesByTheDifferenceOfEachLayersKeptSets) {
  const ops::Program program = testing::gpt_program(kLayers, 1);
  int exact = 0;
  for (const Mix& mix : mixes()) {
    for (int micro_batches : {1, 2}) {
      const ScheduleSpec spec = spec_of(mix.kind, mix.layers, micro_batches, mix.sub_batches);
      const std::string what = describe(spec);
      const std::size_t peak = peak_activation_bytes(program, generate(program, spec));
      const auto uniform_peak = [&](Recompute policy) {
        return peak_activation_bytes(
            program, generate(program, uniform(mix.kind, policy, micro_batches, mix.sub_batches)));
      };
      const std::size_t least = uniform_peak(mix.least_kept), most = uniform_peak(mix.most_kept);
      EXPECT_LT(least, peak) << what;
      EXPECT_LT(peak, most) << what;
      // The kinds that run one instance at a time (or the sub-batches of one micro-batch side
      // by side, each keeping its earlier layers).
      if (mix.kind == ScheduleKind::oases_interleaved || mix.kind == ScheduleKind::oases_deferred)
        continue;
      for (Recompute reference : {mix.least_kept, mix.most_kept}) {
        if (mix.layers.back() != reference) continue;
        long long expected = static_cast<long long>(uniform_peak(reference));
        for (int layer = 0; layer + 1 < kLayers; ++layer)
          expected +=
              mix.sub_batches * (static_cast<long long>(kept_bytes(
                                     program, layer, mix.layers[static_cast<std::size_t>(layer)])) -
                                 static_cast<long long>(kept_bytes(program, layer, reference)));
        EXPECT_EQ(static_cast<long long>(peak), expected)
            << what << " against uniform " << name(reference);
        ++exact;
      }
    }
  }
  EXPECT_GE(exact, 8);
}

TEST(LayerRecompute, PipelineStagesReadTheEntriesOfTheirOwnLayers) {
  using enum Recompute;
  const model::ModelConfig model = testing::tiny_stage_model("gpt", kLayers);
  const std::vector<ops::Program> programs = testing::tiny_stage_programs(model, 2, 1, 1);
  for (const std::vector<Recompute>& layers :
       {std::vector<Recompute>{full, full, none, none},
        std::vector<Recompute>{none, selective, full, none}}) {
    PipelineSpec pipeline;
    pipeline.kind = PipelineKind::one_f_one_b;
    pipeline.stages = 2;
    pipeline.micro_batches = 3;
    const ScheduleSpec spec = spec_of(ScheduleKind::megatron, layers, 3, 1);
    std::vector<Schedule> group;
    for (int rank = 0; rank < 2; ++rank) {
      const ops::Program& program = programs[static_cast<std::size_t>(rank)];
      group.push_back(lower_pipeline(program, spec, pipeline, rank));
      const std::string what = describe(spec) + " rank " + std::to_string(rank);
      EXPECT_NO_THROW(verify_schedule(program, spec, group.back())) << what;
      // The layers this stage holds, and the policies its schedule shows for them.
      std::set<int> held, replayed, recomputed;
      for (const ops::SegmentShape& shape : program.segments)
        if (shape.layer >= 0) held.insert(shape.layer);
      for (const Instruction& ins : group.back()) {
        if (ins.segment < 0) continue;
        const int layer = program.segments[static_cast<std::size_t>(ins.segment)].layer;
        if (ins.op == Op::start && ins.replay) replayed.insert(layer);
        if (ins.op == Op::recompute) recomputed.insert(layer);
      }
      for (int layer : held) {
        const Recompute policy = layers[static_cast<std::size_t>(layer)];
        EXPECT_EQ(replayed.contains(layer), policy == full) << what << " layer " << layer;
        EXPECT_EQ(recomputed.contains(layer), policy != none) << what << " layer " << layer;
      }
      EXPECT_EQ(held, (rank == 0 ? std::set<int>{0, 1} : std::set<int>{2, 3})) << what;
    }
    EXPECT_NO_THROW(verify_point_to_point(group)) << describe(spec);
  }
}

TEST(LayerRecompute, PoliciesAKindCannotRunAreRejectedNamingTheLayer) {
  using enum Recompute;
  const auto message = [](const ScheduleSpec& spec) {
    try {
      check_spec(spec);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string m = message(spec_of(ScheduleKind::oases, {fine_grained, full, none, none}, 1, 2));
  EXPECT_NE(m.find("parallel.recompute = \"fine-grained,full,none,none\" gives layer 1 \"full\""),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("parallel.schedule = \"oases\""), std::string::npos) << m;
  EXPECT_NE(m.find("valid per layer: \"fine-grained\" or \"none\""), std::string::npos) << m;
  m = message(
      spec_of(ScheduleKind::fine_grained, {fine_grained, fine_grained, selective, none}, 1, 1));
  EXPECT_NE(m.find("gives layer 2 \"selective\""), std::string::npos) << m;
  EXPECT_NE(m.find("schedule = \"megatron\" for another policy"), std::string::npos) << m;
  m = message(spec_of(ScheduleKind::megatron, {full, sqrt, none, none}, 1, 1));
  EXPECT_NE(m.find("gives layer 1 \"sqrt\""), std::string::npos) << m;
  EXPECT_NE(m.find("valid per layer: \"none\", \"full\", \"selective\", \"fine-grained\""),
            std::string::npos)
      << m;
  EXPECT_EQ(message(spec_of(ScheduleKind::cross_pass, {full, none, selective, fine_grained}, 1, 2)),
            "");
  // No layer recomputes under the fine-grained kinds either: "none" as the whole policy.
  ScheduleSpec none_at_all = spec_of(ScheduleKind::oases_interleaved, {}, 3, 2);
  none_at_all.recompute = none;
  EXPECT_EQ(message(none_at_all), "");
}

TEST(LayerRecompute, DescriptionsAreShort) {
  using enum Recompute;
  EXPECT_EQ(describe_recompute(spec_of(ScheduleKind::megatron, {full, full, none, none}, 1, 1)),
            "per layer: full x2, none x2");
  EXPECT_EQ(recompute_words(spec_of(ScheduleKind::megatron, {full, none, selective, none}, 1, 1)),
            "full,none,selective,none");
  std::vector<Recompute> alternating;
  for (int l = 0; l < 12; ++l)
    alternating.push_back(l % 3 == 0 ? full : l % 3 == 1 ? none : selective);
  alternating.back() = none;
  EXPECT_EQ(describe_recompute(spec_of(ScheduleKind::megatron, alternating, 1, 1)),
            "per layer: 5 none, 4 full, 3 selective");
  ScheduleSpec whole = spec_of(ScheduleKind::megatron, {}, 1, 1);
  whole.recompute = selective;
  EXPECT_EQ(describe_recompute(whole), "selective");
  EXPECT_EQ(recompute_words(whole), "selective");
}

// ---- Compression per layer ----

TEST(LayerCompression, OnlyTheChosenLayersAreEncodedEachInItsOwnEncoding) {
  const std::vector<std::optional<ActivationEncoding>> encodings{
      std::nullopt, ActivationEncoding::bf16, std::nullopt, ActivationEncoding::fp8_e4m3};
  for (int tp : {1, 2}) {
    const ops::Program program = testing::gpt_program(kLayers, tp);
    for (const Mix& mix : mixes()) {
      const ScheduleSpec spec = spec_of(mix.kind, mix.layers, 2, mix.sub_batches);
      const std::string what = describe(spec) + " tp" + std::to_string(tp);
      const Schedule plain = generate(program, spec);
      Schedule compressed = plain;
      compress_kept_sets(program, compressed, encodings);
      EXPECT_NO_THROW(verify_schedule(program, spec, compressed)) << what;
      std::set<int> encoded_layers;
      Schedule rest;
      for (const Instruction& ins : compressed) {
        if (ins.op != Op::encode && ins.op != Op::decode) {
          rest.push_back(ins);
          continue;
        }
        const int layer = program.segments[static_cast<std::size_t>(ins.segment)].layer;
        ASSERT_GE(layer, 0) << what << ": " << to_string(ins);
        const auto& encoding = encodings[static_cast<std::size_t>(layer)];
        ASSERT_TRUE(encoding.has_value()) << what << ": " << to_string(ins);
        if (ins.op == Op::encode) {
          EXPECT_EQ(ins.encoding, *encoding) << what << ": " << to_string(ins);
        }
        encoded_layers.insert(layer);
      }
      EXPECT_EQ(rest, plain) << what;
      // Each chosen layer keeps something across other compute (with two micro-batches every
      // kind runs the other's or a later segment's compute in between).
      EXPECT_EQ(encoded_layers, (std::set<int>{1, 3})) << what;
      EXPECT_LT(peak_activation_bytes(program, compressed), peak_activation_bytes(program, plain))
          << what;
    }
  }
}

TEST(LayerCompression, EveryLayerEncodedIsTheWholeModelFormWithoutTheOutsideSegments) {
  const ops::Program program = testing::gpt_program(kLayers, 2);
  for (const Mix& mix : mixes()) {
    const ScheduleSpec spec = spec_of(mix.kind, mix.layers, 3, mix.sub_batches);
    const Schedule plain = generate(program, spec);
    Schedule whole = plain, per_layer = plain;
    compress_kept_sets(program, whole, ActivationEncoding::bf16);
    compress_kept_sets(
        program, per_layer,
        std::vector<std::optional<ActivationEncoding>>(kLayers, ActivationEncoding::bf16));
    Schedule whole_in_layers;
    for (const Instruction& ins : whole) {
      const bool moves_sets = ins.op == Op::encode || ins.op == Op::decode;
      if (moves_sets && program.segments[static_cast<std::size_t>(ins.segment)].layer < 0) continue;
      whole_in_layers.push_back(ins);
    }
    EXPECT_EQ(per_layer, whole_in_layers) << describe(spec);
    std::vector<std::optional<ActivationEncoding>> nothing(kLayers);
    Schedule untouched = plain;
    compress_kept_sets(program, untouched, nothing);
    EXPECT_EQ(untouched, plain) << describe(spec);
  }
}

}  // namespace
}  // namespace oases::schedule
