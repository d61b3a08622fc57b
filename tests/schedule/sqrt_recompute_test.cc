// Recomputation in groups of k layers (recompute = sqrt, Chen et al. 2016) on GPT-shaped and
// real model programs: the schedules verify for every depth and group size, each layer segment
// is recomputed exactly once with exactly the sets its group dropped, groups of one layer are
// Megatron's full recomputation instruction for instruction, the predicted peak follows the
// group formula (L / k kept inputs plus one group's activations), and combinations that cannot
// run are rejected naming both settings.
#include "schedule/pipeline_lowering.h"
#include "schedule/schedule.h"

#include "core/error.h"
#include "model/model.h"
#include "support/gpt_program.h"
#include "support/stage_programs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace oases::schedule {
namespace {

using ops::kCheckpoint;
using ops::kCore;
using ops::kInternals;
using ops::kOutput;

ScheduleSpec sqrt_spec(ScheduleKind kind, int k, int micro_batches = 1, int sub_batches = 1) {
  ScheduleSpec spec{kind, Recompute::sqrt, micro_batches, sub_batches, true};
  spec.recompute_every = k;
  return spec;
}

// The schedules sqrt runs under, with their sub-batch counts.
const std::vector<std::pair<ScheduleKind, int>> kKinds{{ScheduleKind::megatron, 1},
                                                        {ScheduleKind::cross_pass, 2}};

std::string what_of(ScheduleKind kind, int layers, int k, int tp = 1, int micro_batches = 1) {
  return fmt::format("{} L={} k={} tp={} mb={}", name(kind), layers, k, tp, micro_batches);
}

TEST(SqrtRecompute, DefaultGroupSizeIsTheRoundedSquareRootOfTheLayers) {
  const std::map<int, int> expected{{1, 1},  {2, 1},  {3, 2},  {4, 2},  {6, 2},  {7, 3},
                                    {9, 3},  {12, 3}, {13, 4}, {16, 4}, {20, 4}, {21, 5},
                                    {48, 7}, {96, 10}};
  for (const auto& [layers, k] : expected)
    EXPECT_EQ(default_recompute_every(layers), k) << layers << " layers";
  EXPECT_EQ(default_recompute_every(0), 1);
}

TEST(SqrtRecompute, EveryDepthAndGroupSizeVerifies) {
  for (const auto& [kind, sub_batches] : kKinds)
    for (int tp : {1, 2})
      for (int layers = 1; layers <= 9; ++layers)
        for (int k = 1; k <= layers; ++k)
          for (int micro_batches : {1, 2}) {
            const std::string what = what_of(kind, layers, k, tp, micro_batches);
            const ScheduleSpec spec = sqrt_spec(kind, k, micro_batches, sub_batches);
            std::vector<Schedule> group;
            for (int rank = 0; rank < tp; ++rank) {
              const ops::Program program = testing::gpt_program(layers, tp);
              group.push_back(generate(program, spec));
              EXPECT_NO_THROW(verify_schedule(program, spec, group.back())) << what;
            }
            EXPECT_NO_THROW(verify_collective_order(group)) << what;
          }
}

// A group of one layer is a layer: sqrt with k = 1 is full recomputation.
TEST(SqrtRecompute, GroupsOfOneLayerAreFullRecomputation) {
  for (const auto& [kind, sub_batches] : kKinds)
    for (int layers = 1; layers <= 6; ++layers) {
      const ops::Program program = testing::gpt_program(layers, 2);
      const ScheduleSpec full{kind, Recompute::full, 2, sub_batches, true};
      EXPECT_EQ(to_string(generate(program, sqrt_spec(kind, 1, 2, sub_batches))),
                to_string(generate(program, full)))
          << what_of(kind, layers, 1);
    }
}

// What one instance of a sqrt schedule does to one segment, read off the instruction list.
struct SegmentLog {
  int recomputes = 0;
  ops::TensorSets recomputed = 0;
  int replays = 0;  // replayed forward collectives
  std::size_t first_recompute = 0, first_backward = 0, last_backward = 0;
};

// Per segment of micro-batch 0, sub-batch 0.
std::vector<SegmentLog> log_of(const ops::Program& program, const Schedule& schedule) {
  std::vector<SegmentLog> log(program.segments.size());
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const Instruction& ins = schedule[i];
    if (ins.segment < 0 || ins.micro_batch != 0 || ins.sub_batch != 0) continue;
    SegmentLog& s = log[static_cast<std::size_t>(ins.segment)];
    if (ins.op == Op::recompute) {
      if (s.recomputes++ == 0) s.first_recompute = i;
      s.recomputed |= ins.sets;
    }
    if (ins.op == Op::start && ins.replay) ++s.replays;
    if (ins.op == Op::backward) {
      if (s.first_backward == 0) s.first_backward = i;
      s.last_backward = i;
    }
  }
  return log;
}

// The sets live once the forward pass is over (just before the first backward instruction).
std::map<int, ops::TensorSets> kept_after_forward(const ops::Program& program,
                                                  const Schedule& schedule) {
  std::map<int, ops::TensorSets> live;
  for (const Instruction& ins : schedule) {
    if (ins.op == Op::backward) break;
    if (ins.op == Op::forward)
      live[ins.segment] |= program.segments[static_cast<std::size_t>(ins.segment)].sets;
    if (ins.op == Op::free) live[ins.segment] &= static_cast<ops::TensorSets>(~ins.sets);
  }
  std::erase_if(live, [](const auto& entry) { return entry.second == 0; });
  return live;
}

// Layer l belongs to group l / k; only the first layer of a group keeps its input (the
// attention segment's checkpoint) through the forward pass. In the backward pass every layer
// segment is recomputed once, with exactly what it dropped (its internals and core, and its
// checkpoint unless it opens its group) and its output, replaying its forward collective; a
// group's recomputation runs after every later group's backward and before its own.
TEST(SqrtRecompute, EachGroupKeepsOnlyItsFirstInputAndRecomputesWhatItDropped) {
  for (const auto& [kind, sub_batches] : kKinds)
    for (int layers = 1; layers <= 9; ++layers)
      for (int k = 1; k <= layers; ++k) {
        const std::string what = what_of(kind, layers, k);
        const ops::Program program = testing::gpt_program(layers);
        const Schedule schedule = generate(program, sqrt_spec(kind, k, 1, sub_batches));
        const int head = 1 + 2 * layers;
        std::map<int, ops::TensorSets> want_kept{{head, kInternals}};
        for (int l = 0; l < layers; l += k) want_kept[1 + 2 * l] = kCheckpoint;
        EXPECT_EQ(kept_after_forward(program, schedule), want_kept) << what;

        const std::vector<SegmentLog> log = log_of(program, schedule);
        for (int s = 0; s < static_cast<int>(program.segments.size()); ++s) {
          const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(s)];
          const SegmentLog& got = log[static_cast<std::size_t>(s)];
          if (shape.layer < 0) {
            EXPECT_EQ(got.recomputes, 0) << what << " " << shape.name;
            continue;
          }
          const bool opens_group = shape.name.rfind("attention.", 0) == 0 && shape.layer % k == 0;
          const ops::TensorSets want =
              static_cast<ops::TensorSets>((shape.sets & (kInternals | kCore)) | kOutput |
                                           (opens_group ? 0 : kCheckpoint));
          EXPECT_EQ(got.recomputes, 1) << what << " " << shape.name;
          EXPECT_EQ(got.recomputed, want) << what << " " << shape.name;
          EXPECT_EQ(got.replays, 1) << what << " " << shape.name;
          // The group's recomputation comes after the backward of every later segment and
          // before the backward of any segment of the group.
          const int group = shape.layer / k;
          for (int t = 0; t < static_cast<int>(program.segments.size()); ++t) {
            const ops::SegmentShape& other = program.segments[static_cast<std::size_t>(t)];
            const SegmentLog& their = log[static_cast<std::size_t>(t)];
            if (other.layer >= 0 && other.layer / k == group) {
              EXPECT_LT(got.first_recompute, their.first_backward) << what << " " << shape.name;
            } else if (t > s) {
              EXPECT_GT(got.first_recompute, their.last_backward) << what << " " << shape.name;
            }
          }
        }
      }
}

// Peak of a uniform toy program (every layer alike, no sets outside the layers), by hand. With
// C a checkpoint, A and M the attention's (internals + core) and the MLP's internals, G groups,
// group g of n_g layers:
//   backward, after group g's recomputation: (g + 1) C kept inputs + (2 n_g - 1) C
//     checkpoints of its other segments + n_g (A + M);
//   forward, at the Forward of a segment of layer l (before its Free): the kept inputs of the
//     groups opened before l, the previous segment's checkpoint (its epilogue's residual) and
//     the segment's own sets.
// When k divides L the backward term of the last group is (G - 1) C + k (2C + A + M): L / k
// inputs and k layers' worth, ~ 2 sqrt(L) layers at k = sqrt(L).
ops::Program uniform_program(int layers, std::size_t checkpoint, std::size_t attention,
                             std::size_t mlp) {
  ops::Program program;
  program.segments.push_back(ops::SegmentShape{"embedding", true, false, 1});
  for (int l = 0; l < layers; ++l) {
    for (const bool is_attention : {true, false}) {
      ops::SegmentShape shape{(is_attention ? "attention." : "mlp.") + std::to_string(l), true,
                              true, 2};
      shape.sets = kCheckpoint | kInternals;
      shape.checkpoint_bytes = checkpoint;
      shape.internals_bytes = is_attention ? attention : mlp;
      shape.layer = l;
      shape.recomputable = true;
      program.segments.push_back(shape);
    }
  }
  program.segments.push_back(ops::SegmentShape{"head", false, true, 2});
  return program;
}

std::size_t expected_peak(int layers, int k, std::size_t C, std::size_t A, std::size_t M) {
  std::size_t peak = 0;
  const int groups = (layers + k - 1) / k;
  for (int g = 0; g < groups; ++g) {
    const auto n = static_cast<std::size_t>(std::min(k, layers - g * k));
    peak = std::max(peak, static_cast<std::size_t>(g + 1) * C + (2 * n - 1) * C + n * (A + M));
  }
  for (int l = 0; l < layers; ++l) {
    const auto opened_before = static_cast<std::size_t>((l + k - 1) / k);
    const std::size_t previous = l > 0 ? C : 0;  // mlp of l - 1: read by attention l's epilogue
    peak = std::max(peak, opened_before * C + previous + C + A);
    // mlp l reads attention l's checkpoint (kept if it opens a group: counted once).
    const std::size_t opened_through = static_cast<std::size_t>(l / k + 1);
    const std::size_t attention_input = l % k == 0 ? 0 : C;
    peak = std::max(peak, opened_through * C + attention_input + C + M);
  }
  return peak;
}

TEST(SqrtRecompute, PredictedPeakFollowsTheGroupFormula) {
  const std::size_t C = 1000, A = 7000, M = 5000;
  for (int layers = 1; layers <= 16; ++layers) {
    const ops::Program program = uniform_program(layers, C, A, M);
    for (int k = 1; k <= layers; ++k) {
      const std::size_t got =
          peak_activation_bytes(program, generate(program, sqrt_spec(ScheduleKind::megatron, k)));
      EXPECT_EQ(got, expected_peak(layers, k, C, A, M)) << "L=" << layers << " k=" << k;
    }
  }
  // 16 layers in groups of 4: 4 inputs and 4 layers' worth, against 16 layers without
  // recomputation and 16 inputs plus one layer with full recomputation.
  const ops::Program program = uniform_program(16, C, A, M);
  const std::size_t layer = 2 * C + A + M;
  const auto peak = [&](const ScheduleSpec& spec) {
    return peak_activation_bytes(program, generate(program, spec));
  };
  EXPECT_EQ(peak(sqrt_spec(ScheduleKind::megatron, 4)), 3 * C + 4 * layer);
  EXPECT_EQ(peak({ScheduleKind::megatron, Recompute::none, 1, 1, true}), 16 * layer);
  EXPECT_EQ(peak({ScheduleKind::megatron, Recompute::full, 1, 1, true}),
            peak(sqrt_spec(ScheduleKind::megatron, 1)));
}

// The GPT program's proportions: the sqrt peak at the default k sits near 2 sqrt(L) layers'
// worth, and below no recomputation once there are several groups.
TEST(SqrtRecompute, PeakOfAGptProgramIsAboutTwoSquareRootsOfLayers) {
  for (int layers : {4, 9, 16, 25}) {
    const ops::Program program = testing::gpt_program(layers);
    const int k = default_recompute_every(layers);
    std::size_t layer = 0;
    for (const ops::SegmentShape& shape : program.segments)
      if (shape.layer == 0)
        layer += shape.checkpoint_bytes + shape.internals_bytes + shape.core_bytes;
    const auto peak = [&](const ScheduleSpec& spec) {
      return static_cast<double>(peak_activation_bytes(program, generate(program, spec)));
    };
    const double sqrt_peak = peak(sqrt_spec(ScheduleKind::megatron, k));
    const double none = peak({ScheduleKind::megatron, Recompute::none, 1, 1, true});
    const double head = static_cast<double>(program.segments.back().internals_bytes);
    EXPECT_LE(sqrt_peak, (layers / k + k) * static_cast<double>(layer) + head) << layers;
    EXPECT_GE(sqrt_peak, k * static_cast<double>(layer)) << layers;
    EXPECT_LT(sqrt_peak, none) << layers;
  }
}

// Real programs (GPT and LLaMA, built as the engine builds them): every group size verifies,
// and the peak shrinks from one group of L layers to groups of about sqrt(L).
TEST(SqrtRecompute, ModelProgramsVerifyForEveryGroupSize) {
  for (const std::string arch : {"gpt", "llama"}) {
    const model::ModelConfig c = testing::tiny_stage_model(arch, 7);
    for (const auto& [kind, sub_batches] : kKinds) {
      const ops::Program program = testing::tiny_stage_program(c, sub_batches);
      std::map<int, std::size_t> peak;
      for (int k = 1; k <= 7; ++k) {
        const ScheduleSpec spec = sqrt_spec(kind, k, 2, sub_batches);
        const Schedule schedule = generate(program, spec);
        EXPECT_NO_THROW(verify_schedule(program, spec, schedule)) << arch << " " << what_of(kind, 7, k);
        peak[k] = peak_activation_bytes(program, schedule);
      }
      EXPECT_LT(peak[3], peak[7]) << arch << " " << name(kind);
    }
  }
}

// A reshard between layers of different degrees cuts a group: the layer after it opens a group
// of its own (its checkpoint is the reshard's output, never recomputed).
TEST(SqrtRecompute, ReshardsCutGroups) {
  const ops::Program program = testing::gpt_program_with_degrees({2, 2, 1, 1, 1, 2}, 2);
  for (const auto& [kind, sub_batches] : kKinds) {
    for (int k = 1; k <= 6; ++k) {
      const ScheduleSpec spec = sqrt_spec(kind, k, 2, sub_batches);
      const Schedule schedule = generate(program, spec);
      const std::string what = what_of(kind, 6, k) + " with reshards";
      EXPECT_NO_THROW(verify_schedule(program, spec, schedule)) << what;
      for (const Instruction& ins : schedule) {
        if (ins.op != Op::recompute) continue;
        const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
        const ops::SegmentShape& before = program.segments[static_cast<std::size_t>(ins.segment - 1)];
        const bool after_reshard = before.name.rfind("reshard.", 0) == 0;
        const bool opens = shape.layer % k == 0 || after_reshard;
        if (shape.name.rfind("attention.", 0) == 0) {
          EXPECT_EQ((ins.sets & kCheckpoint) != 0, !opens) << what << " " << to_string(ins);
        }
      }
    }
  }
}

// Under a pipeline each stage replays the parts of groups it holds; the lowered schedules of
// every rank verify and their messages pair up.
TEST(SqrtRecompute, PipelineStagesVerify) {
  const model::ModelConfig c = testing::tiny_stage_model("gpt", 7);
  const int stages = 2;
  for (const auto& [kind, sub_batches] : kKinds) {
    const std::vector<ops::Program> programs =
        testing::tiny_stage_programs(c, stages, 1, sub_batches);
    for (PipelineKind pipeline_kind :
         {PipelineKind::gpipe, PipelineKind::one_f_one_b, PipelineKind::zero_bubble}) {
      for (int k : {1, 2, 3, 7}) {
        PipelineSpec pipeline;
        pipeline.kind = pipeline_kind;
        pipeline.stages = stages;
        pipeline.micro_batches = 4;
        const ScheduleSpec spec = sqrt_spec(kind, k, 4, sub_batches);
        const std::string what = what_of(kind, 7, k) + " pipeline " + std::string(name(pipeline_kind));
        std::vector<Schedule> group;
        for (int rank = 0; rank < stages; ++rank) {
          const ops::Program& program = programs[static_cast<std::size_t>(rank)];
          group.push_back(lower_pipeline(program, spec, pipeline, rank));
          EXPECT_NO_THROW(verify_schedule(program, spec, group.back())) << what << " rank " << rank;
        }
        EXPECT_NO_THROW(verify_point_to_point(group)) << what;
      }
    }
  }
}

TEST(SqrtRecompute, SchedulesThatRecomputeFineGrainedAreRejectedNamingBothSettings) {
  for (ScheduleKind kind : {ScheduleKind::fine_grained, ScheduleKind::oases,
                            ScheduleKind::oases_interleaved, ScheduleKind::oases_deferred}) {
    try {
      check_spec(sqrt_spec(kind, 2, 1, kind == ScheduleKind::fine_grained ? 1 : 2));
      ADD_FAILURE() << name(kind) << " accepted sqrt";
    } catch (const UserError& e) {
      const std::string message = e.what();
      for (const std::string& phrase :
           {std::string("parallel.recompute = \"sqrt\""),
            fmt::format("parallel.schedule = \"{}\"", name(kind)),
            std::string("valid: recompute = \"sqrt\" with schedule = \"megatron\" or "
                        "\"cross-pass\"")})
        EXPECT_NE(message.find(phrase), std::string::npos) << message;
    }
  }
  try {
    check_spec(sqrt_spec(ScheduleKind::megatron, 0));
    ADD_FAILURE() << "groups of 0 layers accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.recompute_every = 0"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_spec(sqrt_spec(ScheduleKind::cross_pass, 3, 2, 2)));
}

TEST(SqrtRecompute, DescriptionNamesTheGroupSize) {
  EXPECT_EQ(describe_recompute(sqrt_spec(ScheduleKind::megatron, 3)), "sqrt (groups of 3 layers)");
  EXPECT_EQ(describe_recompute(sqrt_spec(ScheduleKind::megatron, 1)), "sqrt (groups of 1 layer)");
  EXPECT_EQ(describe_recompute({ScheduleKind::megatron, Recompute::full, 1, 1, true}), "full");
  EXPECT_EQ(parse_recompute("sqrt", "parallel.recompute"), Recompute::sqrt);
}

}  // namespace
}  // namespace oases::schedule
