#include "schedule/pipeline_lowering.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace oases::schedule {
namespace {

// One point-to-point message between neighbouring ranks.
struct Message {
  Payload payload = Payload::activation;
  int from = 0, to = 0;
  int micro_batch = 0, sub_batch = 0;
  auto key() const { return std::tie(payload, from, to, micro_batch, sub_batch); }
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
std::vector<Message> messages_of(const PipelineSpec& spec, int rank, const PipelineAction& action,
                                 int sub_batches, bool needs) {
  const bool forward = action.kind == PipelineAction::forward;
  // A forward receives from the previous rank and sends to the next; a backward the reverse.
  const int peer = (forward == needs) ? rank - 1 : rank + 1;
  std::vector<Message> out;
  if (peer < 0 || peer >= spec.stages) return out;
  for (int sb = 0; sb < sub_batches; ++sb) {
    Message m;
    m.payload = forward ? Payload::activation : Payload::gradient;
    m.from = needs ? peer : rank;
    m.to = needs ? rank : peer;
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
    return messages_of(spec, rank, order_of(rank)[s.next], sub_batches, true);
  };

  bool progressed = true;
  while (progressed) {
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
        for (const Message& m : messages_of(spec, rank, action, sub_batches, false))
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
        events[static_cast<std::size_t>(m.from)].push_back({Event::send, {}, m});
        events[static_cast<std::size_t>(m.to)].push_back({Event::recv, {}, m});
        at(m.to).received.insert(m);
        s.unsent.pop_front();
        progressed = true;
      }
    }
  }

  std::string stuck;
  for (int rank = 0; rank < ranks; ++rank) {
    const RankState& s = at(rank);
    if (s.next == order_of(rank).size() && s.unsent.empty()) continue;
    stuck += fmt::format("{}rank {} at action {}{}", stuck.empty() ? "" : "; ", rank, s.next,
                         s.unsent.empty() ? "" : " with unsent messages");
  }
  OASES_ASSERT(stuck.empty(), "{} pipeline orders cannot be merged into messages: {}",
               name(spec.kind), stuck);
  return events;
}

Instruction message_instruction(const Event& event, int rank, int last_segment,
                                int sub_batches) {
  const Message& m = event.message;
  const bool sending = event.kind == Event::send;
  Instruction ins{sending ? Op::send : Op::recv};
  ins.payload = m.payload;
  // Activations leave through the last segment and enter through segment 0; gradients the
  // reverse.
  const bool at_output = (m.payload == Payload::activation) == sending;
  ins.segment = at_output ? last_segment : 0;
  ins.micro_batch = m.micro_batch;
  ins.sub_batch = m.sub_batch;
  ins.peer = sending ? m.to : m.from;
  ins.slot = m.micro_batch * sub_batches + m.sub_batch;
  ins.chunk = rank;
  return ins;
}

}  // namespace

Schedule lower_pipeline(const ops::Program& stage_program, const ScheduleSpec& within_stage,
                        const PipelineSpec& pipeline, int rank) {
  check_pipeline_spec(pipeline);
  check_spec(within_stage);
  OASES_CHECK(pipeline.kind == PipelineKind::gpipe || pipeline.kind == PipelineKind::one_f_one_b,
              "parallel.pipeline = \"{}\" is not lowered to instructions yet; valid: \"gpipe\", "
              "\"1f1b\"",
              name(pipeline.kind));
  OASES_CHECK(within_stage.training,
              "forward-only pipeline steps (evaluation, generation) are not lowered to "
              "instructions yet; valid: a training step");
  OASES_CHECK(within_stage.micro_batches == pipeline.micro_batches,
              "the within-stage schedule runs {} micro-batches but the pipeline {}; valid: the "
              "same number of micro-batches per step",
              within_stage.micro_batches, pipeline.micro_batches);
  OASES_CHECK(rank >= 0 && rank < pipeline.stages,
              "pipeline rank {} is outside the pipeline; valid: 0 to {}", rank,
              pipeline.stages - 1);
  OASES_ASSERT(!stage_program.segments.empty(), "empty stage program");
  OASES_ASSERT(stage_program.segments.front().input_from_peer == (rank > 0) &&
                   stage_program.segments.back().output_to_peer == (rank + 1 < pipeline.stages),
               "the program of pipeline rank {} of {} must {}start with an input_from_peer "
               "segment and {}end with an output_to_peer segment",
               rank, pipeline.stages, rank > 0 ? "" : "not ",
               rank + 1 < pipeline.stages ? "" : "not ");

  const PipelineOrders orders = pipeline_orders(pipeline);
  const std::vector<std::vector<Event>> events =
      merge_orders(pipeline, orders, within_stage.sub_batches);
  const int last_segment = static_cast<int>(stage_program.segments.size()) - 1;

  Schedule out;
  for (const Event& event : events[static_cast<std::size_t>(rank)]) {
    if (event.kind != Event::compute) {
      out.push_back(message_instruction(event, rank, last_segment, within_stage.sub_batches));
      continue;
    }
    const int mb = event.action.micro_batch;
    const Schedule part = event.action.kind == PipelineAction::forward
                              ? micro_batch_forward(stage_program, within_stage, mb)
                              : micro_batch_backward(stage_program, within_stage, mb);
    out.insert(out.end(), part.begin(), part.end());
  }
  append_gradient_reductions(stage_program, out);
  for (Instruction& ins : out) ins.chunk = rank;
  return out;
}

std::vector<LoweredAction> lower_actions(const ops::Program& stage_program,
                                         const ScheduleSpec& within_stage,
                                         const PipelineSpec& pipeline,
                                         const PipelineOrders& orders, int rank) {
  OASES_ASSERT(within_stage.training && pipeline.virtual_stages == 1,
               "lower_actions lowers training steps of one chunk per rank");
  const std::vector<std::vector<Event>> events =
      merge_orders(pipeline, orders, within_stage.sub_batches);
  const int last_segment = static_cast<int>(stage_program.segments.size()) - 1;
  std::vector<LoweredAction> out;
  for (const Event& event : events[static_cast<std::size_t>(rank)]) {
    LoweredAction lowered;
    if (event.kind != Event::compute) {
      const Message& m = event.message;
      lowered.action = {m.payload == Payload::activation ? PipelineAction::forward
                                                          : PipelineAction::backward,
                        rank, m.micro_batch};
      lowered.message = true;
      lowered.instructions.push_back(
          message_instruction(event, rank, last_segment, within_stage.sub_batches));
    } else {
      lowered.action = event.action;
      const int mb = event.action.micro_batch;
      lowered.instructions = event.action.kind == PipelineAction::forward
                                 ? micro_batch_forward(stage_program, within_stage, mb)
                                 : micro_batch_backward(stage_program, within_stage, mb);
      for (Instruction& ins : lowered.instructions) ins.chunk = rank;
    }
    out.push_back(std::move(lowered));
  }
  return out;
}

}  // namespace oases::schedule
