// Schedule generators and the verifier, on GPT-shaped programs.
#include "schedule/schedule.h"

#include "comm/communicator.h"
#include "core/error.h"
#include "model/model.h"
#include "support/gpt_program.h"
#include "support/stage_programs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <tuple>

namespace oases::schedule {
namespace {

using ops::kCheckpoint;
using ops::kCore;
using ops::kInternals;

using testing::gpt_program;

ScheduleSpec spec_of(ScheduleKind kind, Recompute recompute, int micro_batches = 1,
                     int sub_batches = 1, bool training = true) {
  return {kind, recompute, micro_batches, sub_batches, training};
}

// Every (schedule, recompute) pair that can run, with the sub-batch counts it takes.
std::vector<std::pair<ScheduleKind, Recompute>> valid_pairs() {
  return {{ScheduleKind::megatron, Recompute::none},       {ScheduleKind::megatron, Recompute::full},
          {ScheduleKind::megatron, Recompute::selective},  {ScheduleKind::fine_grained, Recompute::fine_grained},
          {ScheduleKind::cross_pass, Recompute::full},     {ScheduleKind::cross_pass, Recompute::none},
          {ScheduleKind::cross_pass, Recompute::selective}, {ScheduleKind::oases, Recompute::fine_grained},
          {ScheduleKind::oases_interleaved, Recompute::fine_grained},
          {ScheduleKind::oases_deferred, Recompute::fine_grained}};
}
bool overlapped(ScheduleKind kind) {
  return kind == ScheduleKind::cross_pass || kind == ScheduleKind::oases ||
         kind == ScheduleKind::oases_interleaved || kind == ScheduleKind::oases_deferred;
}

TEST(Generators, EveryScheduleVerifiesForEveryDegreeSubBatchCountAndDepth) {
  for (const auto& [kind, recompute] : valid_pairs()) {
    for (int tp : {1, 2, 4}) {
      for (int sub_batches : {1, 2, 4}) {
        if (!overlapped(kind) && sub_batches > 1) continue;
        for (int layers : {1, 2, 5}) {
          for (int micro_batches : {1, 3}) {
            for (bool training : {true, false}) {
              const ScheduleSpec spec = spec_of(kind, recompute, micro_batches, sub_batches, training);
              const std::string what = std::string(name(kind)) + "/" + std::string(name(recompute)) +
                                       " tp=" + std::to_string(tp) + " sb=" + std::to_string(sub_batches) +
                                       " layers=" + std::to_string(layers) +
                                       " mb=" + std::to_string(micro_batches) + (training ? "" : " eval");
              // Every rank of the group generates its own schedule from its own program.
              std::vector<Schedule> group;
              for (int rank = 0; rank < tp; ++rank) {
                const ops::Program program = gpt_program(layers, tp);
                group.push_back(generate(program, spec));
                EXPECT_NO_THROW(verify_schedule(program, spec, group.back())) << what;
              }
              EXPECT_NO_THROW(verify_collective_order(group)) << what;
            }
          }
        }
      }
    }
  }
}

// Per-layer degrees add reshard segments: a rise gathers rows in forward, a fall gathers the
// gradient in backward. Every generator handles them like any other collective.
TEST(Generators, MixedDegreeProgramsVerifyAndPlaceTheirReshards) {
  const std::vector<std::pair<std::vector<int>, int>> plans{
      {{1, 1, 2, 2}, 2}, {{2, 1, 2, 1}, 2}, {{4, 2, 1}, 4}, {{1, 4, 2}, 4}};
  for (const auto& [degrees, tp] : plans) {
    const ops::Program program = testing::gpt_program_with_degrees(degrees, tp);
    int rises = 0, falls = 0;
    for (const ops::SegmentShape& shape : program.segments) {
      rises += shape.has_forward_collective && shape.forward_kind == ops::CollectiveKind::all_gather;
      falls += shape.has_backward_collective && shape.backward_kind == ops::CollectiveKind::all_gather;
    }
    for (const auto& [kind, recompute] : valid_pairs()) {
      for (int sub_batches : {1, 2}) {
        if (!overlapped(kind) && sub_batches > 1) continue;
        const ScheduleSpec spec = spec_of(kind, recompute, 2, sub_batches);
        const std::string what = std::string(name(kind)) + "/" + std::string(name(recompute)) +
                                 " sb=" + std::to_string(sub_batches) + " plan of " +
                                 std::to_string(degrees.size()) + " at tp " + std::to_string(tp);
        const Schedule s = generate(program, spec);
        EXPECT_NO_THROW(verify_schedule(program, spec, s)) << what;
        int forward_gathers = 0, backward_gathers = 0;
        for (const Instruction& ins : s) {
          if (ins.op != Op::start) continue;
          const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
          if (shape.name.rfind("reshard.", 0) != 0) continue;
          (ins.direction == Direction::forward ? forward_gathers : backward_gathers)++;
        }
        EXPECT_EQ(forward_gathers, rises * 2 * sub_batches) << what;
        EXPECT_EQ(backward_gathers, falls * 2 * sub_batches) << what;
      }
    }
  }
}

TEST(Generators, MegatronPrintsTheExpectedInstructionList) {
  const Schedule s = generate(gpt_program(1), spec_of(ScheduleKind::megatron, Recompute::none));
  EXPECT_EQ(to_string(s),
            "Forward(seg=0, mb=0, sb=0)\n"
            "Start(fwd, seg=0, mb=0, sb=0)\n"
            "Wait(fwd, seg=0, mb=0, sb=0)\n"
            "Forward(seg=1, mb=0, sb=0)\n"
            "Start(fwd, seg=1, mb=0, sb=0)\n"
            "Wait(fwd, seg=1, mb=0, sb=0)\n"
            "Forward(seg=2, mb=0, sb=0)\n"
            "Start(fwd, seg=2, mb=0, sb=0)\n"
            "Wait(fwd, seg=2, mb=0, sb=0)\n"
            "Forward(seg=3, mb=0, sb=0)\n"
            "Backward(seg=3, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=3, mb=0, sb=0)\n"
            "Wait(bwd, seg=3, mb=0, sb=0)\n"
            "Backward(seg=3, stage=1, mb=0, sb=0)\n"
            "ReduceGrads(bucket=2)\n"
            "Free(seg=3, internals, mb=0, sb=0)\n"
            "Backward(seg=2, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=2, mb=0, sb=0)\n"
            "Wait(bwd, seg=2, mb=0, sb=0)\n"
            "Backward(seg=2, stage=1, mb=0, sb=0)\n"
            "Free(seg=2, checkpoint|internals, mb=0, sb=0)\n"
            "Backward(seg=1, stage=0, mb=0, sb=0)\n"
            "Start(bwd, seg=1, mb=0, sb=0)\n"
            "Wait(bwd, seg=1, mb=0, sb=0)\n"
            "Backward(seg=1, stage=1, mb=0, sb=0)\n"
            "ReduceGrads(bucket=1)\n"
            "Free(seg=1, checkpoint|internals|core, mb=0, sb=0)\n"
            "Backward(seg=0, stage=0, mb=0, sb=0)\n"
            "ReduceGrads(bucket=0)\n"
            "OptimizerStep\n");
}

// ReduceGrads names its bucket in `bucket`, one per ready_bucket of the program, and no
// segment.
TEST(Generators, ReduceGradsCarryTheProgramsReadyBuckets) {
  const ops::Program program = gpt_program(3);
  std::multiset<int> expected, reduced;
  for (const ops::SegmentShape& shape : program.segments)
    if (shape.ready_bucket >= 0) expected.insert(shape.ready_bucket);
  for (const auto& [kind, recompute] : valid_pairs()) {
    for (const Instruction& ins : generate(program, spec_of(kind, recompute, 2))) {
      if (ins.op != Op::reduce_grads) {
        EXPECT_EQ(ins.bucket, -1) << to_string(ins);
        continue;
      }
      EXPECT_EQ(ins.segment, -1) << to_string(ins);
      reduced.insert(ins.bucket);
    }
    EXPECT_EQ(reduced, expected) << name(kind);
    reduced.clear();
  }
}

// The backward pass of one layer under full recomputation replays the layer's forward,
// collectives included; fine-grained recomputation regenerates each segment alone.
TEST(Generators, RecomputationPoliciesRegenerateWhatTheyDropped) {
  const ops::Program program = gpt_program(1);
  const std::string full = to_string(generate(program, spec_of(ScheduleKind::megatron, Recompute::full)));
  EXPECT_NE(full.find("Free(seg=1, internals|core, mb=0, sb=0)\n"
                      "Start(fwd, seg=1, mb=0, sb=0)\n"), std::string::npos) << full;
  EXPECT_NE(full.find("Forward(seg=3, mb=0, sb=0)\n"
                      "Free(seg=2, checkpoint, mb=0, sb=0)\n"), std::string::npos) << full;
  EXPECT_NE(full.find("Recompute(seg=1, internals|core|output, mb=0, sb=0)\n"
                      "Start(fwd, seg=1, mb=0, sb=0, replay)\n"
                      "Wait(fwd, seg=1, mb=0, sb=0, replay)\n"
                      "Recompute(seg=2, checkpoint|internals|output, mb=0, sb=0)\n"
                      "Start(fwd, seg=2, mb=0, sb=0, replay)\n"
                      "Wait(fwd, seg=2, mb=0, sb=0, replay)\n"
                      "Backward(seg=2, stage=0, mb=0, sb=0)\n"), std::string::npos) << full;

  const std::string fine = to_string(generate(program, spec_of(ScheduleKind::fine_grained, Recompute::fine_grained)));
  EXPECT_EQ(fine.find("replay"), std::string::npos);
  EXPECT_NE(fine.find("Backward(seg=2, stage=1, mb=0, sb=0)\n"
                      "Free(seg=2, checkpoint|internals, mb=0, sb=0)\n"
                      "Recompute(seg=1, internals|core, mb=0, sb=0)\n"
                      "Backward(seg=1, stage=0, mb=0, sb=0)\n"), std::string::npos) << fine;

  const std::string selective = to_string(generate(program, spec_of(ScheduleKind::megatron, Recompute::selective)));
  EXPECT_NE(selective.find("Free(seg=1, core, mb=0, sb=0)\n"), std::string::npos) << selective;
  EXPECT_NE(selective.find("Recompute(seg=1, core, mb=0, sb=0)\n"
                           "Backward(seg=1, stage=0, mb=0, sb=0)\n"), std::string::npos) << selective;
}

// Counts of collectives per direction, as the table in schedule.h states.
TEST(Generators, CollectivesPerLayerMatchEachPolicy) {
  const int layers = 5, micro_batches = 2, sub_batches = 2;
  for (const auto& [kind, recompute] : valid_pairs()) {
    const int sb = overlapped(kind) ? sub_batches : 1;
    const Schedule s = generate(gpt_program(layers), spec_of(kind, recompute, micro_batches, sb));
    int forward = 0, replayed = 0, backward = 0;
    for (const Instruction& ins : s) {
      if (ins.op != Op::start) continue;
      if (ins.direction == Direction::backward) ++backward;
      else if (ins.replay) ++replayed;
      else ++forward;
    }
    const int instances = micro_batches * sb;
    EXPECT_EQ(forward, instances * (2 * layers + 1)) << name(kind);
    EXPECT_EQ(backward, instances * (2 * layers + 1)) << name(kind);
    EXPECT_EQ(replayed, recompute == Recompute::full ? instances * 2 * layers : 0)
        << name(kind) << "/" << name(recompute);
  }
}

// In the overlapped schedules every collective of a sub-batch is in flight while another
// sub-batch computes, the vocab-parallel loss's reductions (tp > 1) included; in megatron
// nothing computes between a Start and its Wait.
TEST(Generators, OverlappedSchedulesComputeAnotherSubBatchDuringEveryCollective) {
  for (const auto& [kind, recompute] : valid_pairs()) {
    const int sb = overlapped(kind) ? 2 : 1;
    const Schedule s = generate(gpt_program(2, 2), spec_of(kind, recompute, 2, sb));
    int loss_reductions = 0;
    for (const Instruction& x : s)
      loss_reductions += x.op == Op::start && x.direction == Direction::forward &&
                         (x.segment == 5 || x.segment == 6);
    EXPECT_EQ(loss_reductions, 2 * 2 * sb);  // maxima and sums of each instance
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i].op != Op::start) continue;
      bool other_computes = false;
      std::size_t j = i + 1;
      for (; j < s.size(); ++j) {
        const Instruction& x = s[j];
        if (x.op == Op::wait && x.segment == s[i].segment && x.direction == s[i].direction &&
            x.micro_batch == s[i].micro_batch && x.sub_batch == s[i].sub_batch && x.replay == s[i].replay)
          break;
        if ((x.op == Op::forward || x.op == Op::recompute || x.op == Op::backward) &&
            x.sub_batch != s[i].sub_batch)
          other_computes = true;
      }
      ASSERT_LT(j, s.size());
      if (overlapped(kind)) EXPECT_TRUE(other_computes) << name(kind) << " at " << to_string(s[i]);
      else EXPECT_EQ(j, i + 1) << name(kind) << " at " << to_string(s[i]);
    }
  }
}

TEST(Generators, OasesForwardRunsSubBatchesOffsetByOneSegment) {
  const Schedule s = generate(gpt_program(1), spec_of(ScheduleKind::oases, Recompute::fine_grained, 1, 2));
  const std::string text = to_string(s);
  EXPECT_EQ(text.rfind("Forward(seg=0, mb=0, sb=0)\n"
                       "Start(fwd, seg=0, mb=0, sb=0)\n"
                       "Forward(seg=0, mb=0, sb=1)\n"
                       "Start(fwd, seg=0, mb=0, sb=1)\n"
                       "Wait(fwd, seg=0, mb=0, sb=0)\n"
                       "Forward(seg=1, mb=0, sb=0)\n",
                       0),
            0u)
      << text;
  // In backward the recomputation of sub-batch 1 runs while sub-batch 0's collective flies.
  EXPECT_NE(text.find("Start(bwd, seg=2, mb=0, sb=0)\n"
                      "Wait(bwd, seg=3, mb=0, sb=1)\n"
                      "Backward(seg=3, stage=1, mb=0, sb=1)\n"
                      "ReduceGrads(bucket=2)\n"
                      "Free(seg=3, internals, mb=0, sb=1)\n"
                      "Recompute(seg=2, internals, mb=0, sb=1)\n"),
            std::string::npos)
      << text;
}

// oases-interleaved runs the same instructions as oases; its backward (and with it every
// gradient accumulation) keeps oases' relative order and each micro-batch's forward its own, so
// the results are equal bit for bit (a micro-batch's loss sum does not depend on when it
// runs); the forward of micro-batch k + 1 moves into the backward of k, and the first phases
// of the forward of k + 2 into the end of that backward, at the price of a second
// micro-batch's activations (and, for a model of one layer, whose first phases are all of it,
// part of a third).
TEST(Generators, OasesInterleavedRunsTheNextForwardDuringTheBackwardInOasesGradientOrder) {
  const auto only = [](const Schedule& s, auto keep) {
    Schedule out;
    std::copy_if(s.begin(), s.end(), std::back_inserter(out), keep);
    return out;
  };
  const auto gradient_path = [](const Instruction& x) {
    return x.op == Op::backward || x.op == Op::reduce_grads || x.op == Op::optimizer_step ||
           (x.op == Op::start && x.direction == Direction::backward);
  };
  const auto key = [](const Instruction& x) { return to_string(x); };
  for (int layers : {1, 3}) {
    for (int tp : {1, 2}) {
      for (int micro_batches : {1, 2, 3}) {
        for (int sub_batches : {1, 2}) {
          const std::string what = "layers=" + std::to_string(layers) + " tp=" + std::to_string(tp) +
                                   " mb=" + std::to_string(micro_batches) +
                                   " sb=" + std::to_string(sub_batches);
          const ops::Program program = gpt_program(layers, tp);
          const Schedule oases = generate(
              program, spec_of(ScheduleKind::oases, Recompute::fine_grained, micro_batches, sub_batches));
          const Schedule interleaved =
              generate(program, spec_of(ScheduleKind::oases_interleaved, Recompute::fine_grained,
                                        micro_batches, sub_batches));
          std::vector<std::string> a, b;
          std::transform(oases.begin(), oases.end(), std::back_inserter(a), key);
          std::transform(interleaved.begin(), interleaved.end(), std::back_inserter(b), key);
          std::sort(a.begin(), a.end());
          std::sort(b.begin(), b.end());
          EXPECT_EQ(a, b) << what << ": not the same instructions";
          EXPECT_EQ(only(interleaved, gradient_path), only(oases, gradient_path)) << what;
          for (int mb = 0; mb < micro_batches; ++mb) {
            const auto forward_of = [mb](const Instruction& x) {
              return x.op == Op::forward && x.micro_batch == mb;
            };
            EXPECT_EQ(only(interleaved, forward_of), only(oases, forward_of)) << what;
          }
          // Every micro-batch after the first starts its forward while the previous one's
          // backward still has work left: a Forward of k + 1 lies between two Backwards of k.
          for (int k = 0; k + 1 < micro_batches; ++k) {
            std::size_t first = interleaved.size(), last = 0;
            for (std::size_t i = 0; i < interleaved.size(); ++i)
              if (interleaved[i].op == Op::backward && interleaved[i].micro_batch == k) {
                first = std::min(first, i);
                last = i;
              }
            const auto inside = std::find_if(
                interleaved.begin() + static_cast<std::ptrdiff_t>(first),
                interleaved.begin() + static_cast<std::ptrdiff_t>(last), [&](const Instruction& x) {
                  return x.op == Op::forward && x.micro_batch == k + 1;
                });
            EXPECT_NE(inside, interleaved.begin() + static_cast<std::ptrdiff_t>(last))
                << what << ": micro-batch " << k + 1 << " waits for the backward of " << k;
            // The forward of k + 2 starts before the backward of k ends, but not before it
            // starts: at most two micro-batches ahead of the backward.
            if (k + 2 >= micro_batches) continue;
            std::size_t first_of_next = interleaved.size();
            for (std::size_t i = 0; i < interleaved.size(); ++i)
              if (interleaved[i].op == Op::forward && interleaved[i].micro_batch == k + 2) {
                first_of_next = i;
                break;
              }
            EXPECT_LT(first_of_next, last) << what << ": the forward of " << k + 2;
            EXPECT_GT(first_of_next, first) << what << ": the forward of " << k + 2;
          }
          if (micro_batches == 1) continue;
          EXPECT_GT(peak_activation_bytes(program, interleaved), peak_activation_bytes(program, oases))
              << what << ": two micro-batches' activations are live at once";
          EXPECT_LE(peak_activation_bytes(program, interleaved),
                    (layers == 1 ? 3 : 2) * peak_activation_bytes(program, oases))
              << what;
        }
      }
    }
  }
}

// A group of two ranks that only says its size: enough to build the programs of tensor-parallel
// models (nothing here runs their collectives).
class GroupOfTwo final : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "tp"; }
  std::unique_ptr<comm::Work> all_reduce_async(Tensor, comm::ReduceOp) override { return none(); }
  std::unique_ptr<comm::Work> all_gather_async(Tensor, Tensor) override { return none(); }
  std::unique_ptr<comm::Work> reduce_scatter_async(Tensor, Tensor, comm::ReduceOp) override {
    return none();
  }
  std::unique_ptr<comm::Work> broadcast_async(Tensor, int) override { return none(); }
  std::unique_ptr<comm::Work> send_async(Tensor, int, int) override { return none(); }
  std::unique_ptr<comm::Work> recv_async(Tensor, int, int) override { return none(); }
  std::unique_ptr<comm::Work> all_to_all_async(Tensor, Tensor) override { return none(); }
  std::unique_ptr<comm::Work> all_to_allv_async(Tensor, std::vector<std::int64_t>, Tensor,
                                                std::vector<std::int64_t>) override {
    return none();
  }
  std::unique_ptr<comm::Work> barrier_async() override { return none(); }

 private:
  static std::unique_ptr<comm::Work> none() {
    OASES_FAIL("GroupOfTwo runs no collectives");
  }
};

// The program of rank 0 of a tiny GPT or LLaMA at tp = 2 (vocab-parallel head: head_loss has a
// weight part, as every layer segment does).
ops::Program tiny_tp2_program(const std::string& arch, int sub_batches) {
  GroupOfTwo tp;
  model::ModelConfig c = testing::tiny_stage_model(arch, 2);
  c.kv_heads = arch == "llama" ? 2 : 0;  // one key/value head per rank of the pair
  return testing::tiny_stage_program(c, sub_batches, {}, &tp);
}

// oases-deferred runs oases-interleaved's instructions in its order, except that every backward
// of a segment with a weight part is input-only and its weight part runs once per instance:
// right after the input part, or before the Wait of a forward collective behind which only
// forward compute ran (with two micro-batches, at the end of the second forward). Deferred
// weight parts hold their sets alive, at most one micro-batch's at once.
TEST(Generators, OasesDeferredPlacesWeightPartsIntoForwardWindowsOfInterleavedMicroBatches) {
  const auto without_weight_parts = [](const Schedule& s) {
    Schedule out;
    for (Instruction x : s) {
      if (x.op == Op::backward_weight || x.op == Op::free || x.op == Op::reduce_grads) continue;
      x.input_only = false;
      out.push_back(x);
    }
    return out;
  };
  for (const std::string arch : {"gpt", "llama"}) {
    for (int sub_batches : {1, 2}) {
      const ops::Program program = tiny_tp2_program(arch, sub_batches);
      int weight_segments = 0;
      // What the weight parts of one micro-batch keep alive: the sets they read and the stashes.
      std::size_t weight_state = 0;
      for (const ops::SegmentShape& shape : program.segments) {
        weight_segments += shape.has_weight_part;
        if (shape.has_weight_part)
          weight_state += static_cast<std::size_t>(sub_batches) *
                          (shape.checkpoint_bytes + shape.internals_bytes + shape.core_bytes +
                           shape.deferred_gradient_bytes);
      }
      ASSERT_GT(weight_segments, 0) << arch;
      for (int micro_batches = 1; micro_batches <= 4; ++micro_batches) {
        const std::string what = arch + " sb=" + std::to_string(sub_batches) +
                                 " mb=" + std::to_string(micro_batches);
        const ScheduleSpec spec =
            spec_of(ScheduleKind::oases_deferred, Recompute::fine_grained, micro_batches, sub_batches);
        const Schedule deferred = generate(program, spec);
        EXPECT_NO_THROW(verify_schedule(program, spec, deferred)) << what;
        EXPECT_NO_THROW(verify_collective_order({deferred, generate(program, spec)})) << what;
        const ScheduleSpec interleaved_spec = spec_of(ScheduleKind::oases_interleaved,
                                                      Recompute::fine_grained, micro_batches, sub_batches);
        const Schedule interleaved = generate(program, interleaved_spec);
        EXPECT_EQ(without_weight_parts(deferred), without_weight_parts(interleaved)) << what;

        std::map<std::tuple<int, int, int>, int> weight_parts;
        int filling = 0;  // weight parts run in a forward collective's window
        for (std::size_t i = 0; i < deferred.size(); ++i) {
          const Instruction& x = deferred[i];
          if (x.op == Op::backward) {
            EXPECT_EQ(x.input_only, program.segments[static_cast<std::size_t>(x.segment)].has_weight_part)
                << what << " " << to_string(x);
          }
          if (x.op != Op::backward_weight) continue;
          ++weight_parts[{x.segment, x.micro_batch, x.sub_batch}];
          std::size_t next = i + 1;
          while (deferred[next].op == Op::backward_weight || deferred[next].op == Op::free) ++next;
          filling += deferred[next].op == Op::wait && deferred[next].direction == Direction::forward;
        }
        EXPECT_EQ(weight_parts.size(),
                  static_cast<std::size_t>(weight_segments * micro_batches * sub_batches)) << what;
        for (const auto& [instance, count] : weight_parts) EXPECT_EQ(count, 1) << what;
        // Micro-batch 0's forward has nothing to fill its windows with, and one micro-batch
        // runs as oases does. With two, the second forward ends behind windows that weight
        // parts fill; with more, the first phases of each later forward lead into the window
        // before and leave no forward collective without backward compute beside it, so every
        // weight part runs right after its input part (its collective already started).
        if (micro_batches == 2) EXPECT_GE(filling, 1) << what;
        else EXPECT_EQ(filling, 0) << what;
        EXPECT_LE(peak_activation_bytes(program, deferred),
                  peak_activation_bytes(program, interleaved) + weight_state) << what;
      }
    }
  }
}

TEST(Generators, IncompatibleCombinationsAreRejectedWithTheValidValues) {
  const ops::Program program = gpt_program(1);
  try {
    generate(program, spec_of(ScheduleKind::oases, Recompute::full, 1, 2));
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.recompute = \"full\" does not go with parallel.schedule = \"oases\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"cross-pass\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(generate(program, spec_of(ScheduleKind::megatron, Recompute::none, 1, 2)), UserError);
  EXPECT_THROW(generate(program, spec_of(ScheduleKind::fine_grained, Recompute::selective)),
               UserError);
  // Keeping everything recomputes nothing, which every kind can run.
  EXPECT_NO_THROW(generate(program, spec_of(ScheduleKind::fine_grained, Recompute::none)));
  try {
    parse_schedule_kind("zero-bubble", "parallel.schedule");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("valid: \"megatron\", \"fine-grained\", \"cross-pass\", \"oases\", \"oases-interleaved\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(generate(program, spec_of(ScheduleKind::oases_interleaved, Recompute::full, 2, 2)),
               UserError);
}

// Predicted peaks: fine-grained checkpoints cost one residual per segment, so oases stays
// near megatron with full recomputation and far below keeping everything.
TEST(Generators, OasesPeakActivationsStayNearFullRecomputation) {
  for (int layers : {1, 2, 5}) {
    const ops::Program program = gpt_program(layers, 2);
    const auto peak = [&](ScheduleKind kind, Recompute recompute, int sb) {
      return peak_activation_bytes(program, generate(program, spec_of(kind, recompute, 2, sb)));
    };
    const double none = static_cast<double>(peak(ScheduleKind::megatron, Recompute::none, 1));
    const double full = static_cast<double>(peak(ScheduleKind::megatron, Recompute::full, 1));
    // The micro-batch split in two: half-sized sets, two instances in flight.
    ops::Program halves = program;
    for (auto& shape : halves.segments) {
      shape.checkpoint_bytes /= 2;
      shape.internals_bytes /= 2;
      shape.core_bytes /= 2;
    }
    const double oases = static_cast<double>(peak_activation_bytes(
        halves, generate(halves, spec_of(ScheduleKind::oases, Recompute::fine_grained, 2, 2))));
    EXPECT_LE(oases, 1.5 * full) << layers << " layers";
    EXPECT_LT(oases, none) << layers << " layers";
    EXPECT_LT(full, none);
  }
}

// One hand-broken schedule per rule.
class Broken : public ::testing::Test {
 protected:
  static std::size_t find(const Schedule& s, const std::string& text) {
    for (std::size_t i = 0; i < s.size(); ++i)
      if (to_string(s[i]) == text) return i;
    ADD_FAILURE() << "no " << text;
    return 0;
  }
  static void expect_rejected(const ops::Program& program, const ScheduleSpec& spec,
                              const Schedule& s, const std::string& reason) {
    try {
      verify_schedule(program, spec, s);
      ADD_FAILURE() << "accepted a schedule that should fail with: " << reason;
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
  ops::Program program = gpt_program(2);
};

TEST_F(Broken, ForwardBeforeItsInputCollectiveCompleted) {
  const ScheduleSpec spec = spec_of(ScheduleKind::megatron, Recompute::none);
  Schedule s = generate(program, spec);
  const std::size_t wait = find(s, "Wait(fwd, seg=0, mb=0, sb=0)");
  std::swap(s[wait], s[wait + 1]);  // Forward(seg=1) reads the embedding before the reduction
  expect_rejected(program, spec, s, "reads a forward collective that was not waited on");
}

TEST_F(Broken, BackwardStageBeforeItsCollectiveOrBeforeTheNextSegment) {
  const ScheduleSpec spec = spec_of(ScheduleKind::oases, Recompute::fine_grained, 1, 2);
  Schedule s = generate(program, spec);
  Schedule early_stage = s;
  const std::size_t wait = find(early_stage, "Wait(bwd, seg=4, mb=0, sb=1)");
  early_stage.erase(early_stage.begin() + static_cast<std::ptrdiff_t>(wait));
  early_stage.insert(early_stage.end() - 1, s[wait]);
  expect_rejected(program, spec, early_stage, "stage 1 before its backward collective completed");

  Schedule out_of_order = s;
  const std::size_t b3 = find(out_of_order, "Backward(seg=3, stage=0, mb=0, sb=0)");
  const std::size_t b4 = find(out_of_order, "Backward(seg=4, stage=1, mb=0, sb=0)");
  std::swap(out_of_order[b3], out_of_order[b4]);
  expect_rejected(program, spec, out_of_order, "");
}

TEST_F(Broken, ReadAfterFree) {
  // Fine-grained without the recomputation: the backward reads freed internals.
  const ScheduleSpec spec = spec_of(ScheduleKind::fine_grained, Recompute::fine_grained);
  Schedule s = generate(program, spec);
  s.erase(s.begin() + static_cast<std::ptrdiff_t>(find(s, "Recompute(seg=3, internals|core, mb=0, sb=0)")));
  expect_rejected(program, spec, s, "reads internals of segment attention.1 after it was freed");

  // Full recomputation freeing h_l before the next segment's epilogue read it.
  const ScheduleSpec full = spec_of(ScheduleKind::megatron, Recompute::full);
  Schedule t = generate(program, full);
  const std::size_t free_h = find(t, "Free(seg=2, checkpoint, mb=0, sb=0)");
  const Instruction moved = t[free_h];
  t.erase(t.begin() + static_cast<std::ptrdiff_t>(free_h));
  t.insert(t.begin() + static_cast<std::ptrdiff_t>(find(t, "Forward(seg=3, mb=0, sb=0)")), moved);
  expect_rejected(program, full, t, "reads checkpoint of segment mlp.0 after it was freed");
}

// The vocab-parallel loss: head_softmax and head_loss read the logits the head keeps
// (SegmentShape::reads_sets_of). Forward-only schedules keep them until head_loss has run; a
// schedule that frees them earlier is rejected.
TEST_F(Broken, SetsReadByLaterSegmentsOutliveTheirReaders) {
  ops::Program split = gpt_program(1);
  const int head = static_cast<int>(split.segments.size()) - 1;
  split.segments[static_cast<std::size_t>(head)].has_forward_collective = true;
  ops::SegmentShape softmax{"head_softmax", true, false, 1};
  softmax.reads_sets_of = {head};
  ops::SegmentShape loss{"head_loss", false, false, 1};
  loss.reads_sets_of = {head};
  split.segments.push_back(softmax);
  split.segments.push_back(loss);
  for (const bool training : {true, false}) {
    ScheduleSpec spec = spec_of(ScheduleKind::oases, Recompute::fine_grained, 2, 2);
    spec.training = training;
    const Schedule s = generate(split, spec);
    EXPECT_NO_THROW(verify_schedule(split, spec, s));
    if (training) continue;
    // The head's internals die right after head_loss's Forward.
    const std::size_t loss_forward =
        find(s, "Forward(seg=" + std::to_string(head + 2) + ", mb=1, sb=1)");
    EXPECT_EQ(to_string(s[loss_forward + 1]),
              "Free(seg=" + std::to_string(head) + ", internals, mb=1, sb=1)");
    Schedule early = s;
    const Instruction moved = early[loss_forward + 1];
    early.erase(early.begin() + static_cast<std::ptrdiff_t>(loss_forward + 1));
    early.insert(early.begin() + static_cast<std::ptrdiff_t>(loss_forward), moved);
    expect_rejected(split, spec, early, "reads internals of segment head after it was freed");
  }
}

TEST_F(Broken, CollectivesInADifferentOrderOnOneRankOfTheGroup) {
  const ScheduleSpec spec = spec_of(ScheduleKind::oases, Recompute::fine_grained, 1, 2);
  const Schedule rank0 = generate(program, spec);
  // Rank 1 runs its sub-batches in the other order: valid alone, deadlocks with rank 0.
  Schedule rank1 = rank0;
  for (Instruction& ins : rank1)
    if (ins.op != Op::reduce_grads && ins.op != Op::optimizer_step) ins.sub_batch = 1 - ins.sub_batch;
  EXPECT_NO_THROW(verify_schedule(program, spec, rank1));
  try {
    verify_collective_order({rank0, rank0, rank1});
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("collective 0 of rank 2 is Start(fwd, seg=0, mb=0, sb=1)"), std::string::npos) << e.what();
  }
  Schedule missing = rank0;
  missing.erase(missing.begin() + static_cast<std::ptrdiff_t>(find(missing, "Start(bwd, seg=5, mb=0, sb=1)")));
  EXPECT_THROW(verify_collective_order({rank0, missing}), InternalError);
}

TEST_F(Broken, CollectiveMisuseLeaksAndEarlyReductions) {
  const ScheduleSpec spec = spec_of(ScheduleKind::megatron, Recompute::none);
  const Schedule s = generate(program, spec);
  Schedule no_wait = s;
  no_wait.erase(no_wait.begin() + static_cast<std::ptrdiff_t>(find(no_wait, "Wait(bwd, seg=5, mb=0, sb=0)")));
  expect_rejected(program, spec, no_wait, "");

  Schedule twice = s;
  const std::size_t start = find(twice, "Start(fwd, seg=1, mb=0, sb=0)");
  twice.insert(twice.begin() + static_cast<std::ptrdiff_t>(start) + 2, s[start]);
  expect_rejected(program, spec, twice, "");

  Schedule leak = s;
  leak.erase(leak.begin() + static_cast<std::ptrdiff_t>(find(leak, "Free(seg=3, checkpoint|internals|core, mb=0, sb=0)")));
  expect_rejected(program, spec, leak, "checkpoint is still live");

  Schedule early = s;
  const std::size_t reduce = find(early, "ReduceGrads(bucket=1)");
  const Instruction moved = early[reduce];
  early.erase(early.begin() + static_cast<std::ptrdiff_t>(reduce));
  early.insert(early.begin() + static_cast<std::ptrdiff_t>(find(early, "Backward(seg=3, stage=1, mb=0, sb=0)")), moved);
  expect_rejected(program, spec, early, "bucket 1 is not final");

  Schedule by_segment = s;  // the bucket id where a segment goes
  Instruction& reduce_by_segment = by_segment[find(by_segment, "ReduceGrads(bucket=1)")];
  reduce_by_segment.segment = reduce_by_segment.bucket;
  expect_rejected(program, spec, by_segment, "ReduceGrads names a segment");
}

}  // namespace
}  // namespace oases::schedule
