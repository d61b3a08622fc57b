// Schedules as text (schedule.h: to_string, parse_instruction, parse_schedule): every op with
// every field it can carry prints and parses back to the same instruction, fields an op does
// not use print when set (so that instructions print alike exactly when they are equal), the
// printed forms other code compares stay as they were, malformed text is a UserError naming the
// line and what was expected, and every schedule the generators, pipeline lowerings and passes
// build (ZeRO-3 and deferred gathers, compression, partitioned checkpoints) round-trips.
#include "schedule/pipeline_2bw.h"
#include "schedule/pipeline_lowering.h"
#include "schedule/schedule.h"

#include "core/error.h"
#include "support/errors.h"
#include "support/gpt_program.h"
#include "support/stage_programs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace oases::schedule {

// Failures print instructions as text.
void PrintTo(const Instruction& ins, std::ostream* os) { *os << to_string(ins); }

namespace {

using ops::ActivationEncoding;
using ops::kCheckpoint;
using ops::kCore;
using ops::kInternals;
using ops::kOutput;

constexpr Op kEveryOp[] = {
    Op::forward,       Op::recompute,   Op::backward,      Op::backward_weight, Op::start,
    Op::wait,          Op::free,        Op::reduce_grads,  Op::optimizer_step,  Op::send,
    Op::recv,          Op::recv_wait,   Op::use_weights,   Op::encode,          Op::decode,
    Op::gather_params, Op::wait_params, Op::release_params, Op::partition,      Op::gather_sets,
    Op::wait_sets,
};

void expect_round_trip(const Instruction& ins) {
  const std::string text = to_string(ins);
  EXPECT_EQ(parse_instruction(text), ins) << text;
  EXPECT_EQ(to_string(parse_instruction(text)), text);
}

void expect_round_trip(const Schedule& schedule, const std::string& what) {
  ASSERT_FALSE(schedule.empty()) << what;
  const std::string text = to_string(schedule);
  EXPECT_EQ(parse_schedule(text), schedule) << what;
}

// An instruction of `op` as the generators build it, every field of its form set off its
// default: an instance (segment, micro-batch, sub-batch) on chunk 2 of batch -1, or a bucket.
Instruction full_form(Op op) {
  Instruction ins{op};
  const bool bucketed = op == Op::reduce_grads || is_parameter_op(op);
  if (!bucketed && op != Op::optimizer_step && op != Op::use_weights) {
    ins.segment = 7;
    ins.micro_batch = 3;
    ins.sub_batch = 1;
  }
  ins.chunk = 2;
  ins.batch = -1;
  if (bucketed) ins.bucket = 4;
  switch (op) {
    case Op::recompute: ins.sets = kCheckpoint | kInternals | kCore | kOutput; break;
    case Op::backward:
      ins.stage = 1;
      ins.direction = Direction::backward;
      ins.input_only = true;
      break;
    case Op::start:
    case Op::wait:
      ins.direction = Direction::forward;
      ins.replay = true;
      break;
    case Op::free: ins.sets = kInternals | kCore; break;
    case Op::encode:
    case Op::decode:
      ins.sets = kCheckpoint | kCore;
      ins.encoding = ActivationEncoding::fp8_e4m3;
      break;
    case Op::partition:
    case Op::gather_sets:
    case Op::wait_sets: ins.sets = kCheckpoint; break;
    case Op::send:
    case Op::recv:
    case Op::recv_wait:
      ins.payload = ops::Payload::gradient;
      ins.peer = 5;
      ins.slot = 9;
      break;
    default: break;
  }
  return ins;
}

TEST(ScheduleText, EveryOpWithEveryFieldOfItsFormRoundTrips) {
  for (const Op op : kEveryOp) {
    const Instruction ins = full_form(op);
    expect_round_trip(ins);
    // And with the optional fields at their defaults.
    Instruction plain = ins;
    plain.chunk = 0;
    plain.batch = 0;
    plain.replay = plain.input_only = false;
    expect_round_trip(plain);
  }
  EXPECT_EQ(to_string(full_form(Op::start)), "Start(fwd, seg=7, mb=3, sb=1, replay, chunk=2, batch=-1)");
  EXPECT_EQ(to_string(full_form(Op::backward)),
            "Backward(seg=7, stage=1, mb=3, sb=1, input-only, chunk=2, batch=-1)");
  EXPECT_EQ(to_string(full_form(Op::decode)),
            "Decode(seg=7, checkpoint|core, mb=3, sb=1, fp8, chunk=2, batch=-1)");
  EXPECT_EQ(to_string(full_form(Op::recv_wait)),
            "RecvWait(gradient, seg=7, mb=3, sb=1, peer=5, slot=9, chunk=2, batch=-1)");
  EXPECT_EQ(to_string(full_form(Op::recompute)),
            "Recompute(seg=7, checkpoint|internals|core|output, mb=3, sb=1, chunk=2, batch=-1)");
  EXPECT_EQ(to_string(full_form(Op::optimizer_step)), "OptimizerStep(chunk=2, batch=-1)");
  EXPECT_EQ(to_string(full_form(Op::use_weights)), "UseWeights(batch=-1, chunk=2)");
  EXPECT_EQ(to_string(full_form(Op::gather_params)), "GatherParams(bucket=4, chunk=2, batch=-1)");
}

// Fields outside an op's form print (as key=value, or their word) when they are off the op's
// default, so a test-built instruction with a stray field neither prints like a clean one nor
// loses the field on its way through text.
TEST(ScheduleText, FieldsAnOpDoesNotUsePrintWhenSetAndRoundTrip) {
  const std::vector<std::pair<const char*, void (*)(Instruction&)>> changes{
      {"seg=", [](Instruction& i) { i.segment = i.segment == 11 ? 12 : 11; }},
      {"stage=", [](Instruction& i) { i.stage = i.stage == 2 ? 3 : 2; }},
      {"direction", [](Instruction& i) {
         i.direction = i.direction == Direction::forward ? Direction::backward : Direction::forward;
       }},
      {"mb=", [](Instruction& i) { i.micro_batch += 5; }},
      {"sb=", [](Instruction& i) { i.sub_batch += 5; }},
      {"sets", [](Instruction& i) { i.sets = i.sets == kCore ? kInternals : kCore; }},
      {"replay", [](Instruction& i) { i.replay = !i.replay; }},
      {"input-only", [](Instruction& i) { i.input_only = !i.input_only; }},
      {"chunk=", [](Instruction& i) { i.chunk += 1; }},
      {"bucket=", [](Instruction& i) { i.bucket += 6; }},
      {"payload", [](Instruction& i) {
         i.payload = i.payload == ops::Payload::activation ? ops::Payload::gradient
                                                           : ops::Payload::activation;
       }},
      {"peer=", [](Instruction& i) { i.peer += 3; }},
      {"slot=", [](Instruction& i) { i.slot += 3; }},
      {"batch=", [](Instruction& i) { i.batch = i.batch == -1 ? 1 : -1; }},
      {"encoding", [](Instruction& i) {
         i.encoding = i.encoding == ActivationEncoding::bf16 ? ActivationEncoding::fp8_e4m3
                                                             : ActivationEncoding::bf16;
       }},
  };
  for (const Op op : kEveryOp) {
    for (const Instruction& base : {Instruction{op}, full_form(op)}) {
      Instruction every = base;
      for (const auto& [what, change] : changes) {
        Instruction changed = base;
        change(changed);
        ASSERT_NE(changed, base) << what;
        EXPECT_NE(to_string(changed), to_string(base)) << to_string(base) << " changed " << what;
        expect_round_trip(changed);
        change(every);
      }
      expect_round_trip(every);
    }
  }
  Instruction forward{Op::forward};
  forward.segment = 1;
  forward.bucket = 3;
  forward.peer = 2;
  EXPECT_EQ(to_string(forward), "Forward(seg=1, mb=0, sb=0, bucket=3, peer=2)");
  // A Backward's own direction is the backward one; the forward one is the odd value.
  Instruction backward{Op::backward};
  backward.segment = 1;
  EXPECT_EQ(to_string(backward), "Backward(seg=1, stage=0, mb=0, sb=0, fwd)");
  backward.direction = Direction::backward;
  EXPECT_EQ(to_string(backward), "Backward(seg=1, stage=0, mb=0, sb=0)");
}

// The forms other code compares (tests, traces, error messages) print as they always have.
TEST(ScheduleText, TheFormsInUseKeepTheirText) {
  EXPECT_EQ(to_string(Instruction{Op::optimizer_step}), "OptimizerStep");
  Instruction use{Op::use_weights};
  EXPECT_EQ(to_string(use), "UseWeights(batch=0)");
  use.batch = -1;
  EXPECT_EQ(to_string(use), "UseWeights(batch=-1, chunk=0)");
  expect_round_trip(use);
  for (const char* text : {
           "Forward(seg=0, mb=0, sb=0)",
           "Start(fwd, seg=0, mb=0, sb=1)",
           "Wait(bwd, seg=2, mb=0, sb=0)",
           "Free(seg=3, internals, mb=0, sb=0)",
           "ReduceGrads(bucket=0, chunk=1)",
           "Send(activation, seg=1, mb=0, sb=0, peer=1, slot=0)",
           "RecvStart(activation, seg=0, mb=0, sb=0, peer=0, slot=0, chunk=1)",
           "RecvWait(gradient, seg=0, mb=1, sb=0, peer=1, slot=1)",
           "Backward(seg=1, stage=0, mb=0, sb=0, input-only)",
           "GatherParams(bucket=1)",
           "ReleaseParams(bucket=0)",
       })
    EXPECT_EQ(to_string(parse_instruction(text)), text);
}

TEST(ScheduleText, ParsesFieldsInAnyOrderAndSkipsCommentsAndBlankLines) {
  const Schedule s = parse_schedule(
      "# the forward of one layer\n"
      "\n"
      "  Forward(mb=1, sb=0, seg=2)   # fields in any order\n"
      "Start(seg=2, sb=0, mb=1, fwd)\r\n"
      "\t\n"
      "Wait( fwd , seg = 2 , mb=1, sb=0 )\n"
      "OptimizerStep()\n"
      "OptimizerStep");
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(to_string(s),
            "Forward(seg=2, mb=1, sb=0)\n"
            "Start(fwd, seg=2, mb=1, sb=0)\n"
            "Wait(fwd, seg=2, mb=1, sb=0)\n"
            "OptimizerStep\n"
            "OptimizerStep\n");
  EXPECT_TRUE(parse_schedule("").empty());
  EXPECT_TRUE(parse_schedule("# nothing\n\n").empty());
}

void expect_rejected(const std::string& text, const std::vector<std::string>& parts) {
  const std::string message = testing::user_error_of([&] { parse_schedule(text); });
  ASSERT_FALSE(message.empty()) << "accepted: " << text;
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in\n"
                                                     << message;
}

TEST(ScheduleText, MalformedTextNamesTheLineAndWhatWasExpected) {
  const std::string good = "Forward(seg=0, mb=0, sb=0)\n# a comment\n";
  expect_rejected(good + "Forwrd(seg=1, mb=0, sb=0)",
                  {"schedule text line 3 (\"Forwrd(seg=1, mb=0, sb=0)\")",
                   "\"Forwrd\" is not an instruction; valid: Forward, Recompute, Backward, "
                   "BackwardWeight, Start, Wait, Free, ReduceGrads, OptimizerStep, Send, "
                   "RecvStart, RecvWait, UseWeights, Encode, Decode, GatherParams, WaitParams, "
                   "ReleaseParams, Partition, GatherSets, WaitSets"});
  expect_rejected(good + "  Forward(seg=1, mb=0)  # no sb",
                  {"line 3 (\"Forward(seg=1, mb=0)  # no sb\")",
                   "Forward needs sb=N; expected Forward(seg=N, mb=N, sb=N[, chunk=N][, batch=N])"});
  expect_rejected("Start(seg=1, mb=0, sb=0)",
                  {"line 1", "Start needs fwd|bwd; expected Start(fwd|bwd, seg=N, mb=N, sb=N"
                             "[, replay][, chunk=N][, batch=N])"});
  expect_rejected("Free(seg=1, mb=0, sb=0, colour=3)",
                  {"\"colour\" is not a field; expected Free(seg=N, SETS, mb=N, sb=N",
                   "fields: seg=N, stage=N, mb=N, sb=N, chunk=N, bucket=N, peer=N, slot=N, "
                   "batch=N;",
                   "SETS: checkpoint, internals, core, output joined by '|', or - for none"});
  expect_rejected("Free(seg=1, checkpoint|gradients, mb=0, sb=0)",
                  {"\"checkpoint|gradients\" is neither a key=value field nor a known word"});
  expect_rejected("Forward(seg=x, mb=0, sb=0)", {"seg=x: the value of seg must be an integer"});
  expect_rejected("Forward(seg=99999999999, mb=0, sb=0)", {"the value of seg must be an integer"});
  expect_rejected("Forward(seg=1, mb=0, sb=0, seg=2)", {"\"seg=2\" sets seg=N a second time"});
  expect_rejected("Start(fwd, bwd, seg=1, mb=0, sb=0)", {"\"bwd\" sets fwd|bwd a second time"});
  expect_rejected("Forward(seg=1, mb=0, sb=0", {"expected a closing parenthesis at the end"});
  expect_rejected("Forward(seg=1,, mb=0, sb=0)", {"an empty argument between commas"});
  expect_rejected("ReduceGrads", {"ReduceGrads needs bucket=N"});
  // One instruction alone names its text.
  EXPECT_EQ(testing::user_error_of([] { parse_instruction("Wait(fwd)"); }),
            "instruction text \"Wait(fwd)\": Wait needs seg=N; expected Wait(fwd|bwd, seg=N, "
            "mb=N, sb=N[, replay][, chunk=N][, batch=N])");
}

// ---- Real schedules ----

// Every (schedule, recompute) pair the generators accept, with sqrt's groups.
std::vector<ScheduleSpec> within_stage_specs() {
  const std::vector<std::pair<ScheduleKind, Recompute>> pairs{
      {ScheduleKind::megatron, Recompute::none},
      {ScheduleKind::megatron, Recompute::full},
      {ScheduleKind::megatron, Recompute::selective},
      {ScheduleKind::megatron, Recompute::sqrt},
      {ScheduleKind::fine_grained, Recompute::fine_grained},
      {ScheduleKind::cross_pass, Recompute::none},
      {ScheduleKind::cross_pass, Recompute::full},
      {ScheduleKind::cross_pass, Recompute::selective},
      {ScheduleKind::cross_pass, Recompute::sqrt},
      {ScheduleKind::oases, Recompute::fine_grained},
      {ScheduleKind::oases_interleaved, Recompute::fine_grained},
      {ScheduleKind::oases_deferred, Recompute::fine_grained}};
  std::vector<ScheduleSpec> out;
  for (const auto& [kind, recompute] : pairs)
    for (int sub_batches : {1, 2}) {
      if (sub_batches > 1 && (kind == ScheduleKind::megatron || kind == ScheduleKind::fine_grained))
        continue;
      ScheduleSpec spec{kind, recompute, 3, sub_batches, true};
      spec.recompute_every = 2;
      out.push_back(spec);
    }
  return out;
}

std::string describe(const ScheduleSpec& spec) {
  return fmt::format("{}/{} mb={} sb={}{}", name(spec.kind), name(spec.recompute),
                     spec.micro_batches, spec.sub_batches, spec.training ? "" : " forward-only");
}

// A named schedule.
struct Case {
  std::string what;
  Schedule schedule;
};

// The within-stage generators on GPT programs, tensor-parallel and not, with weight parts (so
// that oases-deferred defers them), and on a program with per-layer degrees.
std::vector<Case> generated_cases() {
  std::vector<Case> out;
  for (int tp : {1, 2}) {
    ops::Program program = testing::gpt_program(3, tp);
    for (ops::SegmentShape& shape : program.segments)
      shape.has_weight_part = shape.layer >= 0 || shape.name == "head_loss";
    for (ScheduleSpec spec : within_stage_specs())
      for (bool training : {true, false}) {
        spec.training = training;
        out.push_back({describe(spec) + fmt::format(" tp={}", tp), generate(program, spec)});
      }
  }
  const ops::Program mixed = testing::gpt_program_with_degrees({1, 2, 2, 1}, 2);
  for (const ScheduleSpec& spec : within_stage_specs())
    out.push_back({describe(spec) + " mixed degrees", generate(mixed, spec)});
  return out;
}

// Each segment reads the parameters of the bucket it belongs to (as param_sharding_test).
ops::Program with_param_buckets(ops::Program program) {
  int bucket = -1;
  for (ops::SegmentShape& shape : program.segments) {
    if (shape.ready_bucket >= 0) bucket = shape.ready_bucket;
    if (bucket >= 0 && shape.param_buckets.empty()) shape.param_buckets = {bucket};
  }
  return program;
}

// The passes after generation: ZeRO-3's gathers (resharding after forward or not), ZeRO-1/2's
// deferred gathers, compressed activations in both encodings, partitioned checkpoints.
std::vector<Case> pass_cases() {
  std::vector<Case> out;
  ops::Program program = with_param_buckets(testing::gpt_program(3, 2));
  for (ops::SegmentShape& shape : program.segments) {
    if (shape.layer < 0) continue;
    shape.collective_ranks = shape.degree = 2;
    shape.checkpoint_replicated = true;
  }
  for (const ScheduleSpec& base : within_stage_specs()) {
    for (bool reshard : {true, false}) {
      ScheduleSpec spec = base;
      spec.sharded_params = true;
      spec.reshard_after_forward = reshard;
      Schedule s = generate(program, spec);
      shard_parameters(program, spec, s);
      out.push_back({describe(spec) + (reshard ? " zero-3" : " zero-3 kept"), s});
    }
    ScheduleSpec deferred = base;
    deferred.deferred_param_gather = true;
    Schedule gathered = generate(program, deferred);
    shard_parameters(program, deferred, gathered);
    out.push_back({describe(base) + " deferred gathers", gathered});
    for (ActivationEncoding encoding : {ActivationEncoding::bf16, ActivationEncoding::fp8_e4m3}) {
      Schedule compressed = generate(program, base);
      compress_kept_sets(program, compressed, encoding);
      out.push_back({describe(base) + " compressed " + ops::encoding_name(encoding), compressed});
    }
    Schedule partitioned = generate(program, base);
    partition_kept_checkpoints(program, partitioned);
    out.push_back({describe(base) + " partitioned", partitioned});
  }
  return out;
}

// The stage programs of P ranks holding v chunks each of a GPT of P v + 1 layers: rank r
// builds chunks r, r + P, ...
std::vector<ops::Program> stage_programs(int stages, int virtual_stages, int sub_batches) {
  std::vector<ops::Program> out =
      testing::tiny_stage_programs(testing::tiny_stage_model("gpt", stages * virtual_stages + 1),
                                   stages, virtual_stages, sub_batches);
  for (ops::Program& program : out) program = with_param_buckets(program);
  return out;
}

PipelineSpec pipeline_of(PipelineKind kind, int stages, int virtual_stages, int micro_batches) {
  PipelineSpec p;
  p.kind = kind;
  p.stages = stages;
  p.virtual_stages = virtual_stages;
  p.micro_batches = micro_batches;
  return p;
}

// Every rank of GPipe, 1F1B, interleaved (v = 2) and zero-bubble pipelines of three stages,
// sharded by ZeRO-3 or not; forward-only pipelines; and 2bw runs of each kind, with the
// earlier runs' part they carry.
std::vector<Case> pipeline_cases() {
  std::vector<Case> out;
  const int stages = 3, m = 6;
  const std::vector<ops::Program> plain = stage_programs(stages, 1, 2);
  const std::vector<ops::Program> chunked = stage_programs(stages, 2, 2);
  for (const PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b,
                                  PipelineKind::interleaved, PipelineKind::zero_bubble}) {
    const bool interleaved = kind == PipelineKind::interleaved;
    const PipelineSpec pipeline = pipeline_of(kind, stages, interleaved ? 2 : 1, m);
    for (bool sharded : {false, true}) {
      ScheduleSpec spec{ScheduleKind::oases, Recompute::fine_grained, m, 2, true};
      spec.sharded_params = sharded;
      for (int rank = 0; rank < stages; ++rank) {
        const ops::Program& program = (interleaved ? chunked : plain)[static_cast<std::size_t>(rank)];
        Schedule s = lower_pipeline(program, spec, pipeline, rank);
        if (sharded) shard_parameters(program, spec, s);
        out.push_back({fmt::format("{}{} rank {}", name(kind), sharded ? " zero-3" : "", rank), s});
      }
    }
  }
  const ScheduleSpec forward_only{ScheduleKind::oases, Recompute::fine_grained, m, 2, false};
  for (int rank = 0; rank < stages; ++rank)
    out.push_back({fmt::format("forward-only rank {}", rank),
                   lower_forward_only_pipeline(chunked[static_cast<std::size_t>(rank)],
                                               forward_only, stages, 2, rank)});
  const ScheduleSpec within{ScheduleKind::megatron, Recompute::full, 4, 1, true};
  const std::vector<ops::Program> whole = stage_programs(stages, 1, 1);
  for (const TwoBwRun run : {TwoBwRun{false, true}, TwoBwRun{false, false}, TwoBwRun{true, false},
                             TwoBwRun{true, true}})
    for (int rank = 0; rank < stages; ++rank) {
      const LoweredRun lowered = lower_2bw_run(whole[static_cast<std::size_t>(rank)], within,
                                               pipeline_of(PipelineKind::two_bw, stages, 1, 4),
                                               rank, run);
      const std::string what = fmt::format("2bw carries_in={} drains={} rank {}", run.carries_in,
                                           run.drains, rank);
      out.push_back({what, lowered.schedule});
      if (!lowered.carry.earlier.empty())
        out.push_back({what + " earlier", lowered.carry.earlier});
    }
  return out;
}

TEST(ScheduleText, GeneratedSchedulesRoundTrip) {
  for (const Case& c : generated_cases()) expect_round_trip(c.schedule, c.what);
}

TEST(ScheduleText, ShardedCompressedAndPartitionedSchedulesRoundTrip) {
  for (const Case& c : pass_cases()) expect_round_trip(c.schedule, c.what);
}

TEST(ScheduleText, PipelineSchedulesRoundTrip) {
  for (const Case& c : pipeline_cases()) expect_round_trip(c.schedule, c.what);
}

// The real schedules above hold every op, replayed collectives and input-only backwards, so
// their round trips cover every form.
TEST(ScheduleText, TheRealSchedulesCoverEveryOp) {
  std::set<Op> seen;
  bool replay = false, input_only = false, previous_batch = false, fp8 = false;
  for (const std::vector<Case>& cases : {generated_cases(), pass_cases(), pipeline_cases()})
    for (const Case& c : cases)
      for (const Instruction& ins : c.schedule) {
        seen.insert(ins.op);
        replay = replay || ins.replay;
        input_only = input_only || ins.input_only;
        previous_batch = previous_batch || ins.batch == -1;
        fp8 = fp8 || ins.encoding == ActivationEncoding::fp8_e4m3;
      }
  for (const Op op : kEveryOp)
    EXPECT_TRUE(seen.contains(op)) << to_string(Instruction{op}) << " in no schedule";
  EXPECT_TRUE(replay);
  EXPECT_TRUE(input_only);
  EXPECT_TRUE(previous_batch);
  EXPECT_TRUE(fp8);
}

}  // namespace
}  // namespace oases::schedule
