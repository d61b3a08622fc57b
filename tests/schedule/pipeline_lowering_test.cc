// Pipeline lowering: the stage programs of small GPT and LLaMA models cut into P stages (or
// P x v chunks, v per rank, for the interleaved pipeline), lowered for GPipe, 1F1B and
// interleaved 1F1B under several within-stage schedules, and for forward-only steps; every
// rank's schedule verifies alone, the ranks' messages pair up and cannot deadlock under blocking
// Send/Recv, each rank computes in its pipeline order, and 1F1B keeps less than GPipe on the
// first rank.
#include "schedule/pipeline_lowering.h"

#include "core/error.h"
#include "support/stage_programs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <string>
#include <vector>

namespace oases::schedule {
namespace {

// The programs of `stages` stages of a model of stages + 1 layers (the last stage holds two),
// as each pipeline rank builds its own.
std::vector<ops::Program> stage_programs(const std::string& arch, int stages, int sub_batches) {
  return testing::tiny_stage_programs(testing::tiny_stage_model(arch, stages + 1), stages, 1,
                                      sub_batches);
}

// The programs of the P ranks of an interleaved pipeline over P x v chunks of a model of
// P v + 1 layers (the last chunk holds two): rank r builds chunks r, r + P, ... in one model.
std::vector<ops::Program> interleaved_programs(const std::string& arch, int stages,
                                               int virtual_stages, int sub_batches) {
  return testing::tiny_stage_programs(testing::tiny_stage_model(arch, stages * virtual_stages + 1),
                                      stages, virtual_stages, sub_batches);
}

struct WithinStage {
  ScheduleKind kind;
  Recompute recompute;
  int sub_batches;
};
const std::vector<WithinStage> kWithinStage{{ScheduleKind::megatron, Recompute::none, 1},
                                            {ScheduleKind::megatron, Recompute::full, 1},
                                            {ScheduleKind::cross_pass, Recompute::full, 2},
                                            {ScheduleKind::oases, Recompute::fine_grained, 2}};

ScheduleSpec within_spec(const WithinStage& w, int micro_batches) {
  return {w.kind, w.recompute, micro_batches, w.sub_batches, true};
}
PipelineSpec pipeline_spec(PipelineKind kind, int stages, int micro_batches) {
  PipelineSpec p;
  p.kind = kind;
  p.stages = stages;
  p.micro_batches = micro_batches;
  return p;
}

// The compute actions a lowered schedule runs, read back from its instructions: a forward
// starts with Forward of segment 0 on sub-batch 0, a backward with the first backward stage of
// the last segment on sub-batch 0.
std::vector<PipelineAction> actions_of(const ops::Program& program, const Schedule& schedule,
                                       int chunk) {
  const int last = static_cast<int>(program.segments.size()) - 1;
  std::vector<PipelineAction> out;
  for (const Instruction& ins : schedule) {
    if (ins.sub_batch != 0) continue;
    if (ins.op == Op::forward && ins.segment == 0)
      out.push_back({PipelineAction::forward, chunk, ins.micro_batch});
    if (ins.op == Op::backward && ins.segment == last && ins.stage == 0)
      out.push_back({PipelineAction::backward, chunk, ins.micro_batch});
  }
  return out;
}

TEST(PipelineLowering, EveryRankVerifiesFollowsItsOrderAndTheMessagesCannotDeadlock) {
  int lowered = 0;
  for (const std::string arch : {"gpt", "llama"}) {
    for (int stages : {2, 3, 4}) {
      for (const WithinStage& w : kWithinStage) {
        const std::vector<ops::Program> programs = stage_programs(arch, stages, w.sub_batches);
        for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
          for (int m : {1, stages, 2 * stages + 1}) {
            const std::string what =
                fmt::format("{} P={} {} m={} within {}/{} sb={}", arch, stages, name(kind), m,
                            name(w.kind), name(w.recompute), w.sub_batches);
            const PipelineSpec pipeline = pipeline_spec(kind, stages, m);
            const ScheduleSpec spec = within_spec(w, m);
            const PipelineOrders orders = pipeline_orders(pipeline);
            std::vector<Schedule> group;
            for (int rank = 0; rank < stages; ++rank) {
              const ops::Program& program = programs[static_cast<std::size_t>(rank)];
              group.push_back(lower_pipeline(program, spec, pipeline, rank));
              const Schedule& mine = group.back();
              EXPECT_NO_THROW(verify_schedule(program, spec, mine)) << what << " rank " << rank;
              EXPECT_EQ(actions_of(program, mine, rank), orders[static_cast<std::size_t>(rank)])
                  << what << " rank " << rank;
              // One message per sub-batch of every micro-batch for each direction and neighbour.
              int sends = 0, recvs = 0;
              for (const Instruction& ins : mine) {
                sends += ins.op == Op::send;
                recvs += ins.op == Op::recv;
                EXPECT_EQ(ins.chunk, rank) << what;
              }
              const int neighbours = (rank > 0) + (rank + 1 < stages);
              EXPECT_EQ(sends, neighbours * m * w.sub_batches) << what << " rank " << rank;
              EXPECT_EQ(recvs, neighbours * m * w.sub_batches) << what << " rank " << rank;
            }
            EXPECT_NO_THROW(verify_point_to_point(group)) << what;
            ++lowered;
          }
        }
      }
    }
  }
  EXPECT_EQ(lowered, 2 * 3 * 4 * 2 * 3);
}

// The compute actions of a schedule whose rank holds several chunks: a forward starts with
// Forward of the chunk's first segment on sub-batch 0, a backward with the first backward stage
// of its last segment; the chunk is the one the instruction names.
std::vector<PipelineAction> chunk_actions_of(const ops::Program& program, const Schedule& schedule) {
  const std::vector<SegmentRange> chunks = chunk_segment_ranges(program);
  std::vector<PipelineAction> out;
  for (const Instruction& ins : schedule) {
    if (ins.sub_batch != 0 || (ins.op != Op::forward && ins.op != Op::backward)) continue;
    for (const SegmentRange& range : chunks) {
      if (ins.op == Op::forward && ins.segment == range.begin)
        out.push_back({PipelineAction::forward, ins.chunk, ins.micro_batch});
      if (ins.op == Op::backward && ins.segment == range.end - 1 && ins.stage == 0)
        out.push_back({PipelineAction::backward, ins.chunk, ins.micro_batch});
    }
  }
  return out;
}

TEST(PipelineLowering, InterleavedRanksVerifyFollowTheirOrderAndTheMessagesCannotDeadlock) {
  int lowered = 0;
  for (const std::string arch : {"gpt", "llama"}) {
    for (int stages : {2, 3, 4}) {
      for (int v : {2, 4}) {
        // Built once per number of sub-batches: building a model costs more than lowering.
        std::map<int, std::vector<ops::Program>> programs_of;
        for (int sub_batches : {1, 2})
          programs_of[sub_batches] = interleaved_programs(arch, stages, v, sub_batches);
        for (const WithinStage& w : kWithinStage) {
          const std::vector<ops::Program>& programs = programs_of.at(w.sub_batches);
          for (int m : {stages, 2 * stages}) {
            const std::string what = fmt::format("{} P={} v={} m={} within {}/{} sb={}", arch,
                                                 stages, v, m, name(w.kind), name(w.recompute),
                                                 w.sub_batches);
            PipelineSpec pipeline = pipeline_spec(PipelineKind::interleaved, stages, m);
            pipeline.virtual_stages = v;
            const ScheduleSpec spec = within_spec(w, m);
            const PipelineOrders orders = pipeline_orders(pipeline);
            std::vector<Schedule> group;
            for (int rank = 0; rank < stages; ++rank) {
              const ops::Program& program = programs[static_cast<std::size_t>(rank)];
              ASSERT_EQ(chunk_segment_ranges(program).size(), static_cast<std::size_t>(v)) << what;
              group.push_back(lower_pipeline(program, spec, pipeline, rank));
              const Schedule& mine = group.back();
              EXPECT_NO_THROW(verify_schedule(program, spec, mine)) << what << " rank " << rank;
              EXPECT_EQ(chunk_actions_of(program, mine), orders[static_cast<std::size_t>(rank)])
                  << what << " rank " << rank;
              // Every chunk boundary of the rank carries one message per (mb, sb) each way: a
              // chunk receives unless it is chunk 0 and sends unless it is the last, both ways.
              int sends = 0, recvs = 0;
              std::set<std::tuple<Payload, int>> slots;
              for (const Instruction& ins : mine) {
                EXPECT_EQ(ins.chunk % stages, rank) << what << " " << to_string(ins);
                if (ins.op == Op::send) {
                  ++sends;
                  EXPECT_TRUE(slots.insert({ins.payload, ins.slot}).second)
                      << what << " slot reused: " << to_string(ins);
                  const int next = ins.payload == Payload::activation ? rank + 1 : rank - 1;
                  EXPECT_EQ(ins.peer, (next + stages) % stages) << what << " " << to_string(ins);
                  EXPECT_EQ(ins.slot, ((ins.chunk / stages) * m + ins.micro_batch) * w.sub_batches +
                                          ins.sub_batch)
                      << what << " " << to_string(ins);
                }
                recvs += ins.op == Op::recv;
              }
              const int boundaries = (v - (rank == 0)) + (v - (rank == stages - 1));
              EXPECT_EQ(sends, boundaries * m * w.sub_batches) << what << " rank " << rank;
              EXPECT_EQ(recvs, boundaries * m * w.sub_batches) << what << " rank " << rank;
            }
            EXPECT_NO_THROW(verify_point_to_point(group)) << what;
            ++lowered;
          }
          // Forward-only steps (validation) of any number of micro-batches.
          for (int m : {1, stages + 1}) {
            const std::string what = fmt::format("forward-only {} P={} v={} m={} sb={}", arch,
                                                 stages, v, m, w.sub_batches);
            ScheduleSpec spec = within_spec(w, m);
            spec.training = false;
            std::vector<Schedule> group;
            for (int rank = 0; rank < stages; ++rank) {
              const ops::Program& program = programs[static_cast<std::size_t>(rank)];
              group.push_back(lower_forward_only_pipeline(program, spec, stages, v, rank));
              EXPECT_NO_THROW(verify_schedule(program, spec, group.back())) << what << " rank " << rank;
              int forwards = 0;
              for (const Instruction& ins : group.back())
                forwards += ins.op == Op::forward && ins.sub_batch == 0;
              EXPECT_EQ(forwards, static_cast<int>(program.segments.size()) * m) << what;
            }
            EXPECT_NO_THROW(verify_point_to_point(group)) << what;
          }
        }
      }
    }
  }
  EXPECT_EQ(lowered, 2 * 3 * 2 * 4 * 2);
}

// A range over a whole program of one chunk gives what the plain parts give; over a later chunk
// it names that chunk's segments, generated as its own program.
TEST(PipelineLowering, SegmentRangePartsAreThePartsOfTheChunkAlone) {
  const std::vector<ops::Program> programs = interleaved_programs("gpt", 2, 2, 2);
  const ops::Program& program = programs[1];
  const std::vector<SegmentRange> chunks = chunk_segment_ranges(program);
  ASSERT_EQ(chunks.size(), 2u);
  ops::Program second;
  second.segments.assign(program.segments.begin() + chunks[1].begin, program.segments.end());
  for (bool training : {true, false}) {
    const ScheduleSpec spec{ScheduleKind::oases, Recompute::fine_grained, 2, 2, training};
    Schedule expected = micro_batch_forward(second, spec, 1);
    for (Instruction& ins : expected) ins.segment += chunks[1].begin;
    EXPECT_EQ(to_string(micro_batch_forward(program, spec, 1, chunks[1])), to_string(expected));
    if (!training) continue;
    expected = micro_batch_backward(second, spec, 1);
    for (Instruction& ins : expected) ins.segment += chunks[1].begin;
    EXPECT_EQ(to_string(micro_batch_backward(program, spec, 1, chunks[1])), to_string(expected));
  }
  const ops::Program whole = stage_programs("gpt", 1, 1).front();
  const ScheduleSpec spec{ScheduleKind::megatron, Recompute::selective, 2, 1, true};
  const SegmentRange all{0, static_cast<int>(whole.segments.size())};
  EXPECT_EQ(to_string(micro_batch_forward(whole, spec, 1, all)), to_string(micro_batch_forward(whole, spec, 1)));
  EXPECT_EQ(to_string(micro_batch_backward(whole, spec, 1, all)), to_string(micro_batch_backward(whole, spec, 1)));
}

// Messages of (mb, sb) use slot mb * sub_batches + sb, and a gradient message leaves right after
// the backward that computed it, before the rank computes anything else.
TEST(PipelineLowering, SlotsNameTheMicroBatchAndSubBatchAndGradientsLeaveAtOnce) {
  const std::vector<ops::Program> programs = stage_programs("gpt", 3, 2);
  const WithinStage w{ScheduleKind::oases, Recompute::fine_grained, 2};
  const PipelineSpec pipeline = pipeline_spec(PipelineKind::one_f_one_b, 3, 5);
  const Schedule s = lower_pipeline(programs[1], within_spec(w, 5), pipeline, 1);
  for (std::size_t i = 0; i < s.size(); ++i) {
    const Instruction& ins = s[i];
    const auto is_message = [](Op op) {
      return op == Op::send || op == Op::recv || op == Op::recv_wait;
    };
    if (!is_message(ins.op)) continue;
    EXPECT_EQ(ins.slot, ins.micro_batch * 2 + ins.sub_batch) << to_string(ins);
    const bool to_previous = (ins.op == Op::send) == (ins.payload == Payload::gradient);
    EXPECT_EQ(ins.peer, to_previous ? 0 : 2) << to_string(ins);
    if (ins.op == Op::send && ins.payload == Payload::gradient) {
      // Between the backward that produced it and this Send: only other messages.
      std::size_t j = i;
      while (j > 0 && is_message(s[j - 1].op)) --j;
      ASSERT_GT(j, 0u);
      EXPECT_TRUE(s[j - 1].op == Op::backward || s[j - 1].op == Op::free) << to_string(s[j - 1]);
      EXPECT_EQ(s[j - 1].micro_batch, ins.micro_batch) << to_string(ins);
    }
  }
}

// With one sub-batch the forward and backward parts of each micro-batch, in turn, followed by
// the reductions, are exactly what the within-stage generator emits.
TEST(PipelineLowering, ForwardAndBackwardPartsRebuildTheWithinStageSchedule) {
  const ops::Program program = stage_programs("llama", 1, 1).front();
  for (Recompute recompute : {Recompute::none, Recompute::full, Recompute::selective}) {
    const ScheduleSpec spec{ScheduleKind::megatron, recompute, 3, 1, true};
    Schedule rebuilt;
    for (int mb = 0; mb < 3; ++mb) {
      for (const Schedule& part : {micro_batch_forward(program, spec, mb),
                                   micro_batch_backward(program, spec, mb)})
        rebuilt.insert(rebuilt.end(), part.begin(), part.end());
    }
    append_gradient_reductions(program, rebuilt);
    EXPECT_EQ(to_string(rebuilt), to_string(generate(program, spec))) << name(recompute);
  }
}

TEST(PipelineLowering, OneFOneBKeepsLessThanGPipeOnTheFirstRank) {
  for (int stages : {2, 3, 4}) {
    for (const WithinStage& w : kWithinStage) {
      const std::vector<ops::Program> programs = stage_programs("gpt", stages, w.sub_batches);
      const int m = 2 * stages;
      const ScheduleSpec spec = within_spec(w, m);
      const auto peak = [&](PipelineKind kind) {
        return peak_activation_bytes(
            programs.front(), lower_pipeline(programs.front(), spec, pipeline_spec(kind, stages, m), 0));
      };
      const std::size_t gpipe = peak(PipelineKind::gpipe), one_f_one_b = peak(PipelineKind::one_f_one_b);
      EXPECT_LT(one_f_one_b, gpipe) << "P=" << stages << " " << name(w.kind) << "/"
                                    << name(w.recompute);
      if (w.recompute != Recompute::none) continue;
      // Without recomputation a forward keeps every set of the stage until that micro-batch's
      // backward frees them: the peak is the most micro-batches in flight times their sets,
      // plus the buffers of the two gradient receives posted by the end of the last forward:
      // that of the backward after it (posted after the action before it) and that of the
      // next backward (posted after it). GPipe: B(0) and B(1); 1F1B: B(m - P) and B(m - P + 1).
      std::size_t per_micro_batch = 0;
      for (const ops::SegmentShape& shape : programs.front().segments)
        for (auto set : {ops::kCheckpoint, ops::kInternals, ops::kCore})
          if (shape.sets & set) per_micro_batch += ops::bytes_of(shape, set);
      const std::size_t received = programs.front().segments.back().received_bytes;
      ASSERT_GT(received, 0u);
      for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
        const int in_flight = max_in_flight(pipeline_orders(pipeline_spec(kind, stages, m))).front();
        EXPECT_EQ(in_flight, kind == PipelineKind::gpipe ? m : stages);
        EXPECT_EQ(peak(kind), static_cast<std::size_t>(in_flight) * per_micro_batch +
                                  2 * w.sub_batches * received)
            << "P=" << stages << " " << name(kind);
      }
    }
  }
}

bool is_compute(Op op) {
  return op == Op::forward || op == Op::recompute || op == Op::backward ||
         op == Op::backward_weight;
}

// Every receive of a lowered schedule is posted (RecvStart) before it is waited (RecvWait),
// the posts in the order of the waits (so that the i-th post from a peer meets the i-th Send),
// and, wherever the rank computes anything before the wait, with compute instructions between
// the post and the wait: the transfer overlaps them. Returns how many receives had compute
// between their post and their wait.
int expect_receives_posted_ahead(const Schedule& schedule, const std::string& what) {
  std::map<std::tuple<Payload, int, int, int>, std::size_t> posted;  // (payload, s, mb, sb)
  std::vector<std::size_t> post_order, wait_order;
  int overlapped = 0;
  bool computed = false;
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const Instruction& ins = schedule[i];
    const auto key = std::tuple{ins.payload, ins.segment, ins.micro_batch, ins.sub_batch};
    computed |= is_compute(ins.op);
    if (ins.op == Op::recv) {
      EXPECT_TRUE(posted.emplace(key, i).second) << what << ": posted twice: " << to_string(ins);
      post_order.push_back(i);
    }
    if (ins.op != Op::recv_wait) continue;
    const auto post = posted.find(key);
    if (post == posted.end()) {
      ADD_FAILURE() << what << ": waited and never posted: " << to_string(ins);
      continue;
    }
    wait_order.push_back(post->second);
    int between = 0;
    for (std::size_t j = post->second + 1; j < i; ++j) between += is_compute(schedule[j].op);
    if (computed) {
      EXPECT_GE(between, 1) << what << ": " << to_string(ins) << " at " << i
                            << " was posted at " << post->second << " with nothing computed since";
    }
    overlapped += between > 0;
  }
  EXPECT_EQ(wait_order, post_order) << what << ": receives waited in another order than posted";
  return overlapped;
}

// The lowering hoists every receive's post ahead of the action before the one that needs it,
// for every pipeline kind it lowers, in training and forward-only steps.
TEST(PipelineLowering, ReceivesArePostedAtLeastOneComputeInstructionBeforeTheirWait) {
  for (int stages : {2, 3, 4}) {
    const WithinStage w{ScheduleKind::oases, Recompute::fine_grained, 2};
    const std::vector<ops::Program> programs = stage_programs("gpt", stages, w.sub_batches);
    const std::vector<ops::Program> chunked = interleaved_programs("gpt", stages, 2, w.sub_batches);
    for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b,
                              PipelineKind::interleaved, PipelineKind::zero_bubble}) {
      const int m = 2 * stages;
      const std::string what = fmt::format("P={} {} m={}", stages, name(kind), m);
      PipelineSpec pipeline = pipeline_spec(kind, stages, m);
      if (kind == PipelineKind::interleaved) pipeline.virtual_stages = 2;
      const std::vector<ops::Program>& rank_programs =
          kind == PipelineKind::interleaved ? chunked : programs;
      int overlapped = 0;
      for (int rank = 0; rank < stages; ++rank) {
        const Schedule s = lower_pipeline(rank_programs[static_cast<std::size_t>(rank)],
                                          within_spec(w, m), pipeline, rank);
        overlapped += expect_receives_posted_ahead(s, fmt::format("{} rank {}", what, rank));
      }
      // Each rank's receives but those its first action needs overlap compute.
      EXPECT_GT(overlapped, 0) << what;
    }
    ScheduleSpec evaluation = within_spec(w, stages + 1);
    evaluation.training = false;
    for (int rank = 0; rank < stages; ++rank) {
      const Schedule s = lower_forward_only_pipeline(chunked[static_cast<std::size_t>(rank)],
                                                     evaluation, stages, 2, rank);
      expect_receives_posted_ahead(s, fmt::format("forward-only P={} v=2 rank {}", stages, rank));
    }
  }
}

// Every pipeline kind that lowers (GPipe, 1F1B, interleaved with v = 2, zero-bubble) gives
// schedules that verify on each rank and together, with the receives posted early, for P from 2
// to 4 and two numbers of micro-batches (whole micro-batches here; the test above lowers two
// sub-batches).
TEST(PipelineLowering, EveryLoweredKindVerifiesWithEarlyPostedReceives) {
  int lowered = 0;
  for (int stages : {2, 3, 4}) {
    for (const WithinStage& w : {kWithinStage.front()}) {
      const std::vector<ops::Program> programs = stage_programs("llama", stages, w.sub_batches);
      const std::vector<ops::Program> chunked =
          interleaved_programs("llama", stages, 2, w.sub_batches);
      for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b,
                                PipelineKind::interleaved, PipelineKind::zero_bubble}) {
        for (int m : {stages, 2 * stages}) {
          const std::string what = fmt::format("P={} {} m={} within {} sb={}", stages,
                                               name(kind), m, name(w.kind), w.sub_batches);
          PipelineSpec pipeline = pipeline_spec(kind, stages, m);
          if (kind == PipelineKind::interleaved) pipeline.virtual_stages = 2;
          const std::vector<ops::Program>& rank_programs =
              kind == PipelineKind::interleaved ? chunked : programs;
          const ScheduleSpec spec = within_spec(w, m);
          std::vector<Schedule> group;
          for (int rank = 0; rank < stages; ++rank) {
            const ops::Program& program = rank_programs[static_cast<std::size_t>(rank)];
            group.push_back(lower_pipeline(program, spec, pipeline, rank));
            EXPECT_NO_THROW(verify_schedule(program, spec, group.back())) << what << " rank "
                                                                          << rank;
            int posts = 0, waits = 0;
            for (const Instruction& ins : group.back()) {
              posts += ins.op == Op::recv;
              waits += ins.op == Op::recv_wait;
            }
            EXPECT_EQ(posts, waits) << what << " rank " << rank;
          }
          EXPECT_NO_THROW(verify_point_to_point(group)) << what;
          ++lowered;
        }
      }
    }
  }
  EXPECT_EQ(lowered, 3 * 4 * 2);
}

TEST(PipelineLowering, RejectsWhatItCannotLowerNamingTheSetting) {
  const std::vector<ops::Program> programs = stage_programs("gpt", 2, 1);
  const ScheduleSpec spec{ScheduleKind::megatron, Recompute::none, 4, 1, true};
  const auto message_of = [&](PipelineSpec pipeline, ScheduleSpec within, int rank) {
    try {
      lower_pipeline(programs[rank > 0 ? 1 : 0], within, pipeline, rank);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Interleaved runs micro-batches in groups of P.
  const std::vector<ops::Program> interleaved_programs_of = interleaved_programs("gpt", 2, 2, 1);
  PipelineSpec interleaved = pipeline_spec(PipelineKind::interleaved, 2, 3);
  interleaved.virtual_stages = 2;
  ScheduleSpec three = spec;
  three.micro_batches = 3;
  try {
    lower_pipeline(interleaved_programs_of[0], three, interleaved, 0);
    ADD_FAILURE() << "3 micro-batches over 2 ranks lowered";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("a multiple of 2"), std::string::npos) << e.what();
  }
  EXPECT_NE(message_of(pipeline_spec(PipelineKind::gpipe, 2, 3), spec, 0).find("runs 4 micro-batches"),
            std::string::npos);
  // A forward-only step is the forward-only pipeline, whatever the kind.
  ScheduleSpec evaluation = spec;
  evaluation.training = false;
  EXPECT_EQ(to_string(lower_pipeline(programs[1], evaluation, pipeline_spec(PipelineKind::gpipe, 2, 7), 1)),
            to_string(lower_forward_only_pipeline(programs[1], evaluation, 2, 1, 1)));
  EXPECT_NE(message_of(pipeline_spec(PipelineKind::gpipe, 2, 4), spec, 2).find("pipeline rank 2"),
            std::string::npos);
  ScheduleSpec sub_batched = spec;
  sub_batched.sub_batches = 2;
  EXPECT_NE(message_of(pipeline_spec(PipelineKind::gpipe, 2, 4), sub_batched, 0).find("parallel.sub_batches"),
            std::string::npos);
}

}  // namespace
}  // namespace oases::schedule
