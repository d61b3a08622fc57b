// compress_kept_sets (schedule.h): Encode and Decode around each kept set's wait between its
// forward-side and backward-side readers, on every within-stage schedule; the verifier holds
// reads of encoded sets to be errors; peak_activation_bytes counts encoded blocks.
#include "schedule/schedule.h"

#include "core/error.h"
#include "support/gpt_program.h"
#include "support/schedule_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace oases::schedule {
namespace {

using ops::ActivationEncoding;

using Case = testing::ScheduleCase;

std::string describe(const Case& c, int micro_batches, int tp, ActivationEncoding encoding) {
  return std::string(name(c.kind)) + " " + std::string(name(c.recompute)) + " sb" +
         std::to_string(c.sub_batches) + " mb" + std::to_string(micro_batches) + " tp" +
         std::to_string(tp) + " " + ops::encoding_name(encoding);
}

Schedule without_encoding(const Schedule& schedule) {
  Schedule out;
  for (const Instruction& ins : schedule)
    if (ins.op != Op::encode && ins.op != Op::decode) out.push_back(ins);
  return out;
}

// Sets moved by `op` instructions, one per (instance, set): an instruction may move several.
std::size_t count(const Schedule& schedule, Op op) {
  std::size_t n = 0;
  for (const Instruction& ins : schedule)
    if (ins.op == op)
      for (auto set : {ops::kCheckpoint, ops::kInternals, ops::kCore}) n += (ins.sets & set) ? 1 : 0;
  return n;
}

TEST(CompressKeptSets, EverySchedulesCompressedFormVerifiesAndKeepsLess) {
  for (int tp : {1, 2}) {
    ops::Program program = testing::gpt_program(4, tp);
    for (ops::SegmentShape& shape : program.segments)
      shape.has_weight_part = shape.layer >= 0 || shape.name == "head_loss";
    for (const Case& c : testing::within_stage_schedules()) {
      for (int micro_batches : {1, 3}) {
        ScheduleSpec spec{c.kind, c.recompute, micro_batches, c.sub_batches, true};
        if (c.recompute == Recompute::sqrt) spec.recompute_every = 2;
        const Schedule plain = generate(program, spec);
        for (ActivationEncoding encoding :
             {ActivationEncoding::bf16, ActivationEncoding::fp8_e4m3}) {
          const std::string what = describe(c, micro_batches, tp, encoding);
          Schedule compressed = plain;
          compress_kept_sets(program, compressed, encoding);
          EXPECT_NO_THROW(verify_schedule(program, spec, compressed)) << what;
          // The pass only inserts, and every Encode is undone before backward reads the set.
          EXPECT_EQ(without_encoding(compressed), plain) << what;
          EXPECT_EQ(count(compressed, Op::encode), count(compressed, Op::decode)) << what;
          EXPECT_GT(count(compressed, Op::encode), 0u) << what;
          for (const Instruction& ins : compressed) {
            if (ins.op == Op::encode) {
              EXPECT_EQ(ins.encoding, encoding) << what;
            }
          }
          EXPECT_LT(peak_activation_bytes(program, compressed),
                    peak_activation_bytes(program, plain))
              << what;
        }
      }
    }
  }
}

// Megatron without recomputation keeps every set of a micro-batch until its backward: all but
// the head's logits (whose backward follows their forward at once) and the sets being
// converted at the moment stay encoded, so the peak falls nearly by the element-size ratio.
TEST(CompressKeptSets, WithoutRecomputationThePeakFallsByTheEncodingsShare) {
  const ops::Program program = testing::gpt_program(8);
  const ScheduleSpec spec{ScheduleKind::megatron, Recompute::none, 1, 1, true};
  const Schedule plain = generate(program, spec);
  const double before = static_cast<double>(peak_activation_bytes(program, plain));
  // What may stay wide at the peak: the head's sets, and one segment's sets (the largest) in
  // conversion, once wide and once encoded.
  std::size_t head = 0, largest = 0;
  for (const ops::SegmentShape& shape : program.segments) {
    const std::size_t bytes = shape.checkpoint_bytes + shape.internals_bytes + shape.core_bytes;
    if (shape.name == "head") head = bytes;
    else largest = std::max(largest, bytes);
  }
  for (ActivationEncoding encoding : {ActivationEncoding::bf16, ActivationEncoding::fp8_e4m3}) {
    Schedule compressed = plain;
    compress_kept_sets(program, compressed, encoding);
    const double after = static_cast<double>(peak_activation_bytes(program, compressed));
    const double share = static_cast<double>(ops::encoded_element_bytes(encoding)) / 4.0;
    EXPECT_GE(after, share * before) << ops::encoding_name(encoding);
    EXPECT_LE(after, share * before + static_cast<double>(head + 2 * largest))
        << ops::encoding_name(encoding);
  }
}

// The forward's own reads come before the Encode; the next segment's epilogue reads a
// segment's checkpoint, so that set is encoded only after the next Forward.
TEST(CompressKeptSets, ACheckpointIsEncodedAfterTheNextSegmentsForward) {
  const ops::Program program = testing::gpt_program(2);
  const ScheduleSpec spec{ScheduleKind::megatron, Recompute::none, 1, 1, true};
  Schedule s = generate(program, spec);
  compress_kept_sets(program, s, ActivationEncoding::bf16);
  const auto position = [&](Op op, int segment, ops::TensorSets sets) {
    const auto it = std::find_if(s.begin(), s.end(), [&](const Instruction& ins) {
      return ins.op == op && ins.segment == segment && (ins.sets & sets) == sets;
    });
    return it == s.end() ? -1 : static_cast<int>(it - s.begin());
  };
  // Segment 1 (attention.0): internals and core right after its own Forward, its checkpoint
  // after the Forward of segment 2 (mlp.0), which reads it as its residual.
  const int forward1 = position(Op::forward, 1, 0), forward2 = position(Op::forward, 2, 0);
  ASSERT_GE(forward1, 0);
  ASSERT_GE(forward2, 0);
  const int internals = position(Op::encode, 1, ops::kInternals | ops::kCore);
  const int checkpoint = position(Op::encode, 1, ops::kCheckpoint);
  EXPECT_GT(internals, forward1);
  EXPECT_LT(internals, forward2);
  EXPECT_GT(checkpoint, forward2);
  // Decoded right before its backward.
  const int decode = position(Op::decode, 1, ops::kInternals | ops::kCore);
  ASSERT_GE(decode, 0);
  EXPECT_EQ(s[static_cast<std::size_t>(decode) + 1].op, Op::backward);
  EXPECT_EQ(s[static_cast<std::size_t>(decode) + 1].segment, 1);
}

TEST(CompressKeptSets, TheVerifierRejectsReadingAnEncodedSet) {
  const ops::Program program = testing::gpt_program(2);
  const ScheduleSpec spec{ScheduleKind::megatron, Recompute::none, 2, 1, true};
  Schedule s = generate(program, spec);
  compress_kept_sets(program, s, ActivationEncoding::bf16);
  const auto first = [&](Op op) {
    return std::find_if(s.begin(), s.end(), [&](const Instruction& ins) { return ins.op == op; });
  };
  {
    Schedule broken = s;
    broken.erase(broken.begin() + (first(Op::decode) - s.begin()));
    try {
      verify_schedule(program, spec, broken);
      ADD_FAILURE() << "a backward reading an encoded set was accepted";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("while it is encoded"), std::string::npos) << e.what();
    }
  }
  {
    Schedule broken = s;
    broken.erase(broken.begin() + (first(Op::encode) - s.begin()));
    try {
      verify_schedule(program, spec, broken);
      ADD_FAILURE() << "a Decode of a set never encoded was accepted";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("which is not encoded"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace oases::schedule
