#include "schedule/pipeline_lowering.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace oases::schedule {
namespace {

// One point-to-point message between the ranks of neighbouring chunks.
struct Message {
  Payload payload = Payload::activation;
  int from = 0, to = 0;  // ranks
  int chunk = 0;         // the chunk that sends it
  int micro_batch = 0, sub_batch = 0;
  auto key() const { return std::tie(payload, from, to, chunk, micro_batch, sub_batch); }
  bool operator<(const Message& other) const { return key() < other.key(); }
};

// What a rank does next in the merged run: a compute action, or one end of a message.
struct Event {
  enum Kind : std::uint8_t { compute, send, recv };
  Kind kind = compute;
  PipelineAction action;  // compute
  Message message;        // send, recv
};

// The messages an action needs before it runs (needs) or produces when it has run.
std::vector<Message> messages_of(const PipelineSpec& spec, const PipelineAction& action,
                                 int sub_batches, bool needs) {
  const bool forward = action.kind == PipelineAction::forward;
  // A forward receives from the previous chunk and sends to the next; a backward (or its input
  // part) the reverse. A weight part talks to nobody.
  const int peer_chunk = (forward == needs) ? action.chunk - 1 : action.chunk + 1;
  std::vector<Message> out;
  if (peer_chunk < 0 || peer_chunk >= spec.chunks() ||
      action.kind == PipelineAction::backward_weight)
    return out;
  const int rank = spec.rank_of_chunk(action.chunk), peer = spec.rank_of_chunk(peer_chunk);
  for (int sb = 0; sb < sub_batches; ++sb) {
    Message m;
    m.payload = forward ? Payload::activation : Payload::gradient;
    m.from = needs ? peer : rank;
    m.to = needs ? rank : peer;
    m.chunk = needs ? peer_chunk : action.chunk;
    m.micro_batch = action.micro_batch;
    m.sub_batch = sb;
    out.push_back(m);
  }
  return out;
}

// Runs every rank's order together (see the header) and returns each rank's events.
std::vector<std::vector<Event>> merge_orders(const PipelineSpec& spec, const PipelineOrders& orders,
                                             int sub_batches) {
  const int ranks = spec.stages;
  struct RankState {
    std::size_t next = 0;
    std::deque<Message> unsent;
    std::set<Message> received;
  };
  std::vector<RankState> state(static_cast<std::size_t>(ranks));
  std::vector<std::vector<Event>> events(static_cast<std::size_t>(ranks));
  const auto at = [&](int rank) -> RankState& { return state[static_cast<std::size_t>(rank)]; };
  const auto order_of = [&](int rank) -> const std::vector<PipelineAction>& {
    return orders[static_cast<std::size_t>(rank)];
  };
  const auto needed_next = [&](int rank) {
    const RankState& s = at(rank);
    if (s.next == order_of(rank).size()) return std::vector<Message>{};
    return messages_of(spec, order_of(rank)[s.next], sub_batches, true);
  };

  const auto pass = [&](const Message& m) {
    events[static_cast<std::size_t>(m.from)].push_back({Event::send, {}, m});
    events[static_cast<std::size_t>(m.to)].push_back({Event::recv, {}, m});
    at(m.to).received.insert(m);
  };
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int rank = 0; rank < ranks; ++rank) {
      RankState& s = at(rank);
      while (s.unsent.empty() && s.next < order_of(rank).size()) {
        const std::vector<Message> needs = needed_next(rank);
        if (!std::all_of(needs.begin(), needs.end(),
                         [&](const Message& m) { return s.received.contains(m); }))
          break;
        for (const Message& m : needs) s.received.erase(m);
        const PipelineAction& action = order_of(rank)[s.next++];
        events[static_cast<std::size_t>(rank)].push_back({Event::compute, action, {}});
        for (const Message& m : messages_of(spec, action, sub_batches, false))
          s.unsent.push_back(m);
        progressed = true;
      }
    }
    for (int rank = 0; rank < ranks; ++rank) {
      RankState& s = at(rank);
      while (!s.unsent.empty()) {
        const Message m = s.unsent.front();
        const std::vector<Message> wanted = needed_next(m.to);
        if (std::find_if(wanted.begin(), wanted.end(), [&](const Message& w) {
              return w.key() == m.key();
            }) == wanted.end())
          break;
        pass(m);
        s.unsent.pop_front();
        progressed = true;
      }
    }
    if (progressed) continue;
    // Every rank waits: for a message, or for a receiver to need what it holds. In an
    // interleaved order two ranks can each hold what the other needs only after its next
    // action; the first held message then passes early (see the header).
    for (int rank = 0; rank < ranks && !progressed; ++rank) {
      RankState& s = at(rank);
      if (s.unsent.empty()) continue;
      pass(s.unsent.front());
      s.unsent.pop_front();
      progressed = true;
    }
  }

  std::string stuck;
  for (int rank = 0; rank < ranks; ++rank) {
    const RankState& s = at(rank);
    if (s.next == order_of(rank).size() && s.unsent.empty()) continue;
    stuck += fmt::format("{}rank {} at action {}{}", stuck.empty() ? "" : "; ", rank, s.next,
                         s.unsent.empty() ? "" : " with unsent messages");
  }
  OASES_ASSERT(stuck.empty(),
               "{} pipeline orders (P = {}, v = {}) cannot be merged into "
               "messages: {}",
               name(spec.kind), spec.stages, spec.virtual_stages, stuck);
  return events;
}

// The program's chunks, checked against the chunks rank `rank` holds.
std::vector<SegmentRange> checked_chunks(const ops::Program& program, const PipelineSpec& spec,
                                         int rank) {
  OASES_ASSERT(!program.segments.empty(), "empty stage program");
  const std::vector<SegmentRange> chunks = chunk_segment_ranges(program);
  OASES_ASSERT(static_cast<int>(chunks.size()) == spec.virtual_stages,
               "the program of pipeline rank {} holds {} chunks; the pipeline gives each rank {}",
               rank, chunks.size(), spec.virtual_stages);
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const int chunk = rank + static_cast<int>(k) * spec.stages;
    const bool first = chunk == 0, last = chunk == spec.chunks() - 1;
    const ops::SegmentShape& begin = program.segments[static_cast<std::size_t>(chunks[k].begin)];
    const ops::SegmentShape& end = program.segments[static_cast<std::size_t>(chunks[k].end - 1)];
    OASES_ASSERT(begin.input_from_peer == !first && end.output_to_peer == !last,
                 "chunk {} of {} (local chunk {} of pipeline rank {}) must {}start with an "
                 "input_from_peer segment and {}end with an output_to_peer segment",
                 chunk, spec.chunks(), k, rank, first ? "not " : "", last ? "not " : "");
  }
  return chunks;
}

Instruction message_instruction(const Message& m, bool sending, const PipelineSpec& spec,
                                const std::vector<SegmentRange>& chunks, int sub_batches) {
  Instruction ins{sending ? Op::send : Op::recv};
  // This rank's chunk: the sender, or the chunk one step along from it.
  const int step = m.payload == Payload::activation ? 1 : -1;
  const int chunk = sending ? m.chunk : m.chunk + step;
  const SegmentRange& range = chunks[static_cast<std::size_t>(chunk / spec.stages)];
  ins.payload = m.payload;
  // Activations leave through a chunk's last segment and enter through its first; gradients
  // the reverse.
  const bool at_output = (m.payload == Payload::activation) == sending;
  ins.segment = at_output ? range.end - 1 : range.begin;
  ins.micro_batch = m.micro_batch;
  ins.sub_batch = m.sub_batch;
  ins.peer = sending ? m.to : m.from;
  ins.slot =
      (m.chunk / spec.stages * spec.micro_batches + m.micro_batch) * sub_batches + m.sub_batch;
  ins.chunk = chunk;
  return ins;
}

// The compute instructions of one action (every sub-batch) over its chunk's segments.
Schedule action_instructions(const ops::Program& program, const ScheduleSpec& within_stage,
                             const PipelineAction& action, SegmentRange range) {
  const int mb = action.micro_batch;
  switch (action.kind) {
    case PipelineAction::forward: return micro_batch_forward(program, within_stage, mb, range);
    case PipelineAction::backward: return micro_batch_backward(program, within_stage, mb, range);
    case PipelineAction::backward_input:
      return micro_batch_backward_input(program, within_stage, mb, range);
    case PipelineAction::backward_weight:
      return micro_batch_backward_weight(program, within_stage, mb, range);
  }
  OASES_ASSERT(false, "unknown pipeline action {}", to_string(action));
  __builtin_unreachable();
}

// Inserts each post (RecvStart) of `posts` before the instruction of `schedule` at its
// position (schedule.size(): at the end). REQUIRES: positions in non-decreasing order, so the
// posts keep their order.
Schedule with_posts(const Schedule& schedule,
                    const std::vector<std::pair<std::size_t, Instruction>>& posts) {
  Schedule out;
  out.reserve(schedule.size() + posts.size());
  auto post = posts.begin();
  for (std::size_t i = 0; i <= schedule.size(); ++i) {
    for (; post != posts.end() && post->first == i; ++post) out.push_back(post->second);
    if (i < schedule.size()) out.push_back(schedule[i]);
  }
  OASES_ASSERT(post == posts.end(), "receive posts out of order");
  return out;
}

// Rank `rank`'s instructions from its merged events: each action's part over its chunk's
// segments, and the messages between them. In a forward-only step the Frees of a chunk's
// output segment wait for the Send that reads the output. A Recv event becomes a RecvWait
// where it stands and a RecvStart hoisted to right after the compute instructions of the
// action two before the one it precedes (the start of the step for the first two actions).
Schedule assemble(const ops::Program& program, const ScheduleSpec& within_stage,
                  const PipelineSpec& spec, const std::vector<SegmentRange>& chunks,
                  const std::vector<Event>& events) {
  std::map<std::tuple<int, int, int>, Schedule> held_frees;  // (segment, mb, sb)
  Schedule out;
  // Where each compute action's instructions end in `out`, and the posts with their positions.
  std::vector<std::size_t> action_ends;
  std::vector<std::pair<std::size_t, Instruction>> posts;
  for (const Event& event : events) {
    if (event.kind != Event::compute) {
      Instruction ins = message_instruction(event.message, event.kind == Event::send, spec,
                                            chunks, within_stage.sub_batches);
      if (ins.op == Op::recv) {
        const std::size_t actions = action_ends.size();
        posts.emplace_back(actions < 2 ? 0 : action_ends[actions - 2], ins);
        ins.op = Op::recv_wait;
      }
      out.push_back(ins);
      if (ins.op == Op::send && ins.payload == Payload::activation) {
        const auto held = held_frees.find({ins.segment, ins.micro_batch, ins.sub_batch});
        if (held != held_frees.end()) {
          out.insert(out.end(), held->second.begin(), held->second.end());
          held_frees.erase(held);
        }
      }
      continue;
    }
    const PipelineAction& action = event.action;
    const SegmentRange& range = chunks[static_cast<std::size_t>(action.chunk / spec.stages)];
    const int output = range.end - 1;
    const bool sends_output = program.segments[static_cast<std::size_t>(output)].output_to_peer;
    const Schedule part = action_instructions(program, within_stage, action, range);
    for (Instruction ins : part) {
      ins.chunk = action.chunk;
      if (!within_stage.training && sends_output && ins.op == Op::free && ins.segment == output)
        held_frees[{ins.segment, ins.micro_batch, ins.sub_batch}].push_back(ins);
      else
        out.push_back(ins);
    }
    action_ends.push_back(out.size());
  }
  OASES_ASSERT(held_frees.empty(), "a chunk's output was freed but never sent");
  return with_posts(out, posts);
}

}  // namespace

std::vector<SegmentRange> chunk_segment_ranges(const ops::Program& program) {
  std::vector<SegmentRange> out;
  const int segments = static_cast<int>(program.segments.size());
  int begin = 0;
  for (int s = 0; s < segments; ++s) {
    if (s + 1 < segments && !program.segments[static_cast<std::size_t>(s)].output_to_peer) continue;
    out.push_back({begin, s + 1});
    begin = s + 1;
  }
  return out;
}

Schedule lower_pipeline(const ops::Program& stage_program, const ScheduleSpec& within_stage,
                        const PipelineSpec& pipeline, int rank) {
  if (!within_stage.training) {
    return lower_forward_only_pipeline(stage_program, within_stage, pipeline.stages,
                                       pipeline.virtual_stages, rank);
  }
  check_pipeline_spec(pipeline);
  check_spec(within_stage);
  // The kinds lowered to instructions so far, and their names for the message.
  constexpr std::array kLowered{PipelineKind::gpipe, PipelineKind::one_f_one_b,
                                PipelineKind::interleaved, PipelineKind::zero_bubble};
  std::string lowered;
  for (PipelineKind kind : kLowered)
    lowered += fmt::format("{}\"{}\"", lowered.empty() ? "" : ", ", name(kind));
  OASES_CHECK(std::find(kLowered.begin(), kLowered.end(), pipeline.kind) != kLowered.end(),
              "parallel.pipeline = \"{}\" is not lowered to instructions yet; valid: {}",
              name(pipeline.kind), lowered);
  OASES_CHECK(within_stage.micro_batches == pipeline.micro_batches,
              "the within-stage schedule runs {} micro-batches but the pipeline {}; valid: the "
              "same number of micro-batches per step",
              within_stage.micro_batches, pipeline.micro_batches);
  OASES_CHECK(rank >= 0 && rank < pipeline.stages,
              "pipeline rank {} is outside the pipeline; valid: 0 to {}", rank,
              pipeline.stages - 1);
  const std::vector<SegmentRange> chunks = checked_chunks(stage_program, pipeline, rank);

  const PipelineOrders orders = pipeline_orders(pipeline);
  const std::vector<std::vector<Event>> events =
      merge_orders(pipeline, orders, within_stage.sub_batches);
  Schedule out = assemble(stage_program, within_stage, pipeline, chunks,
                          events[static_cast<std::size_t>(rank)]);
  append_gradient_reductions(stage_program, out);
  // A reduction belongs to the chunk whose backward made its bucket final.
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i].op == Op::reduce_grads && i > 0) out[i].chunk = out[i - 1].chunk;
    if (out[i].op == Op::optimizer_step) out[i].chunk = rank;
  }
  return out;
}

Schedule lower_forward_only_pipeline(const ops::Program& stage_program,
                                     const ScheduleSpec& within_stage, int stages,
                                     int virtual_stages, int rank) {
  OASES_ASSERT(!within_stage.training, "a forward-only pipeline of a training step");
  check_spec(within_stage);
  OASES_CHECK(stages >= 1 && virtual_stages >= 1,
              "parallel.pp = {} and parallel.virtual_stages = {} must be at least 1", stages,
              virtual_stages);
  OASES_CHECK(rank >= 0 && rank < stages,
              "pipeline rank {} is outside the pipeline; valid: 0 to {}", rank, stages - 1);
  PipelineSpec spec;
  spec.kind = virtual_stages > 1 ? PipelineKind::interleaved : PipelineKind::gpipe;
  spec.stages = stages;
  spec.virtual_stages = virtual_stages;
  spec.micro_batches = within_stage.micro_batches;
  const std::vector<SegmentRange> chunks = checked_chunks(stage_program, spec, rank);

  const int m = within_stage.micro_batches;
  PipelineOrders orders(static_cast<std::size_t>(stages));
  for (int r = 0; r < stages; ++r) {
    for (int group = 0; group < m; group += stages) {
      for (int k = 0; k < virtual_stages; ++k) {
        for (int mb = group; mb < std::min(group + stages, m); ++mb)
          orders[static_cast<std::size_t>(r)].push_back(
              {PipelineAction::forward, r + k * stages, mb});
      }
    }
  }
  const std::vector<std::vector<Event>> events =
      merge_orders(spec, orders, within_stage.sub_batches);
  return assemble(stage_program, within_stage, spec, chunks,
                  events[static_cast<std::size_t>(rank)]);
}

std::vector<LoweredAction> lower_actions(const ops::Program& stage_program,
                                         const ScheduleSpec& within_stage,
                                         const PipelineSpec& pipeline,
                                         const PipelineOrders& orders, int rank) {
  OASES_ASSERT(within_stage.training && pipeline.virtual_stages == 1,
               "lower_actions lowers training steps of one chunk per rank");
  const std::vector<std::vector<Event>> events =
      merge_orders(pipeline, orders, within_stage.sub_batches);
  const std::vector<SegmentRange> chunks = chunk_segment_ranges(stage_program);
  std::vector<LoweredAction> out;
  for (const Event& event : events[static_cast<std::size_t>(rank)]) {
    LoweredAction lowered;
    if (event.kind != Event::compute) {
      const Message& m = event.message;
      lowered.action = {m.payload == Payload::activation ? PipelineAction::forward
                                                          : PipelineAction::backward,
                        rank, m.micro_batch};
      lowered.message = true;
      lowered.instructions.push_back(message_instruction(m, event.kind == Event::send, pipeline,
                                                         chunks, within_stage.sub_batches));
      // Posted where it is waited: the 2BW stream keeps its receives blocking.
      if (lowered.instructions.back().op == Op::recv) {
        Instruction wait = lowered.instructions.back();
        wait.op = Op::recv_wait;
        lowered.instructions.push_back(wait);
      }
    } else {
      lowered.action = event.action;
      lowered.instructions =
          action_instructions(stage_program, within_stage, event.action, chunks.front());
      for (Instruction& ins : lowered.instructions) ins.chunk = rank;
    }
    out.push_back(std::move(lowered));
  }
  return out;
}

}  // namespace oases::schedule
