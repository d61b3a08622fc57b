#include "sim/schedule_sim.h"

#include "core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace oases::sim {
namespace {

using CollectiveKey = std::tuple<int, int, int, int, bool>;

CollectiveKey key_of(const schedule::Instruction& ins) {
  return {ins.segment, ins.micro_batch, ins.sub_batch, schedule::collective_channel(ins),
          ins.replay};
}

// The two communication lanes and the compute lane as fluids: every lane does work at a rate
// set by what else is busy, and time advances to the next moment something finishes.
class Lanes {
 public:
  // `events`: where finished flows are recorded (null: nowhere), as rank `rank`'s.
  Lanes(const CostModel& costs, std::vector<SimEvent>* events, int rank)
      : costs_(costs), events_(events), rank_(rank) {}

  double now() const { return now_; }
  void start_collective(const CollectiveKey& key, double seconds, std::string name) {
    push(tp_, {key, seconds, -1, now_, 0, std::move(name)});
  }
  void start_reduction(double seconds, std::string name) {
    push(dp_, {{}, seconds, -1, now_, 0, std::move(name)});
  }
  // A parameter gather goes on the data-parallel lane behind what was issued there before.
  void start_gather(int bucket, double seconds, std::string name) {
    push(dp_, {{}, seconds, bucket, now_, 0, std::move(name)});
  }
  void record(SimEvent::Lane lane, std::string name, double begin, double end) {
    if (events_ != nullptr) events_->push_back({rank_, lane, std::move(name), begin, end});
  }
  bool done(const CollectiveKey& key) const { return finished_.contains(key); }
  void forget(const CollectiveKey& key) { finished_.erase(key); }
  void gathered_now(int bucket) { gathered_.insert(bucket); }
  bool gathered(int bucket) const { return gathered_.contains(bucket); }
  void forget_gather(int bucket) { gathered_.erase(bucket); }
  // Every transfer on the data-parallel lane (reductions and gathers) has finished.
  bool reductions_done() const { return dp_.empty(); }

  // Runs `work` seconds of compute (as timed alone); returns how long it took.
  double compute(double work) {
    const double began = now_;
    while (true) {
      settle();
      const double rate = !tp_.empty() || !dp_.empty() ? 1 / (1 + costs_.overlap_slowdown) : 1.0;
      if (work <= 0) break;
      const double dt = std::min(work / rate, next_comm_event(true));
      advance(dt, true);
      work -= dt * rate;
      if (work < 1e-15) work = 0;
    }
    return now_ - began;
  }

  // Lets the communication lanes run, with compute idle, until the clock reads `time`.
  void idle_until_time(double time) {
    while (true) {
      settle();
      if (now_ >= time) return;
      const double dt = next_comm_event(false);
      if (dt >= time - now_) {
        advance(time - now_, false);
        now_ = time;  // exactly, not now_ + (time - now_) rounded
      } else {
        advance(dt, false);
      }
    }
  }

  // Lets the communication lanes run, with compute idle, until `until()` holds.
  template <class Condition>
  void idle_until(Condition until) {
    while (true) {
      settle();
      if (until()) return;
      OASES_ASSERT(!tp_.empty() || !dp_.empty(), "waiting on nothing in flight");
      advance(next_comm_event(false), false);
    }
  }

 private:
  struct Flow {
    CollectiveKey key;
    double remaining;
    int gather = -1;  // data-parallel lane: the bucket a parameter gather brings in; -1: none
    double began = 0;  // when it reached the head of its lane and began to move
    std::uint64_t issued = 0;  // place in the rank's issue order (both lanes)
    std::string name;  // for the trace
  };

  void push(std::deque<Flow>& lane, Flow flow) {
    if (events_ == nullptr) flow.name.clear();
    flow.issued = issued_++;
    lane.push_back(std::move(flow));
  }
  void retire(std::deque<Flow>& lane, SimEvent::Lane kind) {
    Flow& head = lane.front();
    record(kind, std::move(head.name), head.began, now_);
    lane.pop_front();
    if (!lane.empty()) lane.front().began = now_;
  }

  // Rate of a lane's head flow (0 for an empty lane, or one waiting its turn on the link).
  double comm_rate(const std::deque<Flow>& lane, bool computing) const {
    if (lane.empty()) return 0.0;
    const double cpu = computing ? 1 / (1 + costs_.collective_slowdown) : 1.0;
    const std::deque<Flow>& other = &lane == &tp_ ? dp_ : tp_;
    if (!costs_.shared_link || other.empty()) return cpu;
    if (!costs_.shared_link_in_issue_order) return cpu * 0.5;
    // The earlier-issued head moves alone.
    return lane.front().issued < other.front().issued ? cpu : 0.0;
  }
  double next_comm_event(bool computing) const {
    double dt = std::numeric_limits<double>::infinity();
    for (const std::deque<Flow>* lane : {&tp_, &dp_}) {
      const double rate = comm_rate(*lane, computing);
      if (rate > 0) dt = std::min(dt, lane->front().remaining / rate);
    }
    return dt;
  }
  void advance(double dt, bool computing) {
    const double tp_rate = comm_rate(tp_, computing), dp_rate = comm_rate(dp_, computing);
    if (tp_rate > 0) tp_.front().remaining -= dt * tp_rate;
    if (dp_rate > 0) dp_.front().remaining -= dt * dp_rate;
    now_ += dt;
  }
  // Retires the flows that have finished (zero-length ones included).
  void settle() {
    while (!tp_.empty() && tp_.front().remaining <= 1e-15) {
      finished_.insert(tp_.front().key);
      retire(tp_, SimEvent::Lane::collectives);
    }
    while (!dp_.empty() && dp_.front().remaining <= 1e-15) {
      if (dp_.front().gather >= 0) gathered_.insert(dp_.front().gather);
      retire(dp_, SimEvent::Lane::data_parallel);
    }
  }

  const CostModel& costs_;
  std::vector<SimEvent>* events_;
  int rank_;
  double now_ = 0;
  std::deque<Flow> tp_, dp_;  // in issue order; only the first of each moves
  std::uint64_t issued_ = 0;
  std::set<CollectiveKey> finished_;
  std::set<int> gathered_;  // buckets whose gather has finished and not yet been waited
};

// One rank's instructions other than Send and Recv, run in order on its lanes.
class RankRun {
 public:
  RankRun(const CostModel& costs, std::vector<SimEvent>* events = nullptr, int rank = 0)
      : costs_(costs), lanes_(costs, events, rank), recording_(events != nullptr) {}

  Lanes& lanes() { return lanes_; }
  bool recording() const { return recording_; }
  RankSimResult& result() { return result_; }

  void run(const schedule::Instruction& ins) {
    using schedule::Op;
    switch (ins.op) {
      case Op::forward:
      case Op::recompute:
      case Op::backward:
      case Op::backward_weight: {
        const double began = lanes_.now();
        result_.compute_seconds += lanes_.compute(compute_seconds(ins));
        if (recording_) lanes_.record(SimEvent::Lane::compute, schedule::to_string(ins), began, lanes_.now());
        break;
      }
      case Op::start:
      case Op::gather_sets: {
        const double seconds = ins.op == Op::start ? costs_.collective(ins)
                               : costs_.gather_sets  ? costs_.gather_sets(ins)
                                                     : 0.0;
        lanes_.start_collective(key_of(ins), seconds, recording_ ? schedule::to_string(ins) : "");
        started_.insert(key_of(ins));
        result_.comm_seconds += seconds;
        break;
      }
      case Op::wait:
      case Op::wait_sets: {
        const CollectiveKey key = key_of(ins);
        OASES_ASSERT(started_.erase(key) == 1, "wait on a collective never started: {}",
                     schedule::to_string(ins));
        const double before = lanes_.now();
        lanes_.idle_until([&] { return lanes_.done(key); });
        result_.exposed_comm_seconds += lanes_.now() - before;
        lanes_.forget(key);
        break;
      }
      case Op::reduce_grads:
        if (costs_.reduce_grads)
          lanes_.start_reduction(costs_.reduce_grads(ins.bucket),
                                 recording_ ? fmt::format("reduce bucket {}", ins.bucket) : "");
        break;
      case Op::optimizer_step: {
        const double before = lanes_.now();
        lanes_.idle_until([&] { return lanes_.reductions_done(); });
        result_.exposed_comm_seconds += lanes_.now() - before;
        const double began = lanes_.now();
        lanes_.compute(costs_.optimizer_step);
        if (recording_) lanes_.record(SimEvent::Lane::compute, "optimizer step", began, lanes_.now());
        break;
      }
      case Op::gather_params:
        OASES_ASSERT(gathering_.insert(ins.bucket).second, "{} while the bucket is in flight",
                     schedule::to_string(ins));
        // Unpriced gathers are in place at once, not queued behind the reductions in flight.
        if (costs_.gather_params)
          lanes_.start_gather(ins.bucket, costs_.gather_params(ins.bucket),
                              recording_ ? fmt::format("gather bucket {}", ins.bucket) : "");
        else lanes_.gathered_now(ins.bucket);
        break;
      case Op::wait_params: {
        OASES_ASSERT(gathering_.erase(ins.bucket) == 1, "wait on a gather never started: {}",
                     schedule::to_string(ins));
        const double before = lanes_.now();
        lanes_.idle_until([&] { return lanes_.gathered(ins.bucket); });
        result_.exposed_comm_seconds += lanes_.now() - before;
        lanes_.forget_gather(ins.bucket);
        break;
      }
      case Op::release_params:
        // Dropping the blocks this rank does not own: nothing to move.
        break;
      case Op::free:
      case Op::partition:  // a copy of a slice: memory-bound, small against the producer
        break;
      case Op::use_weights:
        // A copy of the stage's parameters between two buffers (2bw): not in the cost model
        // yet, and small against the compute of a micro-batch.
        break;
      case Op::encode:
      case Op::decode:
        if (costs_.codec) {
          const double began = lanes_.now();
          result_.compute_seconds += lanes_.compute(costs_.codec(ins));
          if (recording_)
            lanes_.record(SimEvent::Lane::compute, schedule::to_string(ins), began, lanes_.now());
        }
        break;
      case Op::send:
      case Op::recv:
      case Op::recv_wait:
        OASES_ASSERT(false, "Send/Recv ({}) needs the other ranks: simulate_ranks prices them",
                     schedule::to_string(ins));
        break;
    }
  }

  // Ends the step at the end of the last instruction.
  void finish() { result_.step_seconds = lanes_.now(); }

 private:
  // A compute instruction's price; with a weight-gradient share, split backwards are priced
  // from the whole stages (CostModel::weight_gradient_share).
  double compute_seconds(const schedule::Instruction& ins) const {
    using schedule::Op;
    const double share = costs_.weight_gradient_share;
    if (share <= 0 || (ins.op != Op::backward_weight && !ins.input_only))
      return costs_.compute(ins);
    schedule::Instruction whole = ins;
    whole.op = Op::backward;
    whole.input_only = false;
    whole.direction = schedule::Direction::backward;
    if (ins.op == Op::backward_weight) {
      whole.stage = 0;
      return share * costs_.compute(whole);
    }
    return (ins.stage == 0 ? 1 - share : 1.0) * costs_.compute(whole);
  }

  const CostModel& costs_;
  Lanes lanes_;
  bool recording_;
  RankSimResult result_;
  std::set<CollectiveKey> started_;
  std::set<int> gathering_;  // buckets gathered and not yet waited
};

void check_costs(const CostModel& costs) {
  OASES_ASSERT(costs.compute && costs.collective, "cost model without compute or collective costs");
}

// The point-to-point link from one rank to another: its messages in issue order. The i-th
// message sent meets the i-th receive posted.
struct MessageLink {
  struct Message {
    std::size_t send_position;
    double arrival;
  };
  double free_at = 0;          // when the last message issued leaves the link
  std::vector<Message> sent;   // every message issued, in order
  int posted = 0, waited = 0;  // receives posted (RecvStart) and waited (RecvWait) so far
};

// A rank's posted receive, found by its RecvWait: which message of the link it takes.
using ReceiveKey = std::tuple<schedule::Payload, int, int, int>;  // (payload, segment, mb, sb)
ReceiveKey receive_key(const schedule::Instruction& ins) {
  return {ins.payload, ins.segment, ins.micro_batch, ins.sub_batch};
}

std::string describe(int rank, std::size_t position, const schedule::Schedule& schedule) {
  return fmt::format("rank {} instruction {} ({})", rank, position,
                     schedule::to_string(schedule[position]));
}

}  // namespace

SimResult simulate(const schedule::Schedule& schedule, const CostModel& costs) {
  check_costs(costs);
  RankRun rank(costs);
  for (const schedule::Instruction& ins : schedule) rank.run(ins);
  rank.finish();
  return rank.result();
}

MultiRankResult simulate_ranks(const std::vector<schedule::Schedule>& schedules,
                               const CostModel& costs) {
  return simulate_ranks(schedules, std::vector<CostModel>(schedules.size(), costs));
}

MultiRankResult simulate_ranks(const std::vector<schedule::Schedule>& schedules,
                               const std::vector<CostModel>& costs, bool record_events) {
  using schedule::Op;
  OASES_ASSERT(costs.size() == schedules.size(), "{} cost models for {} ranks", costs.size(),
               schedules.size());
  for (const CostModel& c : costs) check_costs(c);
  const int group = static_cast<int>(schedules.size());
  std::vector<SimEvent> events;
  std::vector<RankRun> ranks;
  ranks.reserve(schedules.size());
  for (int r = 0; r < group; ++r)
    ranks.emplace_back(costs[static_cast<std::size_t>(r)], record_events ? &events : nullptr, r);
  std::vector<std::size_t> next(schedules.size(), 0);  // each rank's next instruction
  std::map<std::pair<int, int>, MessageLink> links;           // (sender, receiver)
  // Per rank: its posted receives not yet waited: the index of their message on the link and
  // the RecvStart's position.
  struct Posted {
    int message;
    std::size_t position;
  };
  std::vector<std::map<ReceiveKey, Posted>> posted(schedules.size());

  auto peer_of = [&](int rank, std::size_t position) {
    const int peer = schedules[rank][position].peer;
    OASES_ASSERT(peer >= 0 && peer < group && peer != rank,
                 "{} names peer {}: not another rank of the group of {}",
                 describe(rank, position, schedules[rank]), peer, group);
    return peer;
  };

  // Runs `rank` until its end or a RecvWait whose message has not been sent yet. Each rank's
  // clock is its own: ranks touch only through messages, whose arrival is fixed when they are
  // sent, so the order in which ranks advance does not change the result. A RecvStart costs
  // nothing: it only fixes which message the receive takes.
  auto advance = [&](int rank) {
    const schedule::Schedule& schedule = schedules[rank];
    RankRun& run = ranks[rank];
    bool moved = false;
    for (; next[rank] < schedule.size(); ++next[rank], moved = true) {
      const std::size_t position = next[rank];
      const schedule::Instruction& ins = schedule[position];
      if (ins.op == Op::send) {
        MessageLink& link = links[{rank, peer_of(rank, position)}];
        const CostModel& sender = costs[static_cast<std::size_t>(rank)];
        const double seconds = sender.p2p ? sender.p2p(ins) : 0.0;
        const double leaves = std::max(link.free_at, run.lanes().now());
        link.free_at = leaves + seconds;
        link.sent.push_back({position, link.free_at});
        if (run.recording())
          run.lanes().record(SimEvent::Lane::messages, schedule::to_string(ins), leaves, link.free_at);
        run.result().p2p_seconds += seconds;
      } else if (ins.op == Op::recv) {
        MessageLink& link = links[{peer_of(rank, position), rank}];
        OASES_ASSERT(posted[rank].emplace(receive_key(ins), Posted{link.posted, position}).second,
                     "{} posts a receive already posted", describe(rank, position, schedule));
        ++link.posted;
      } else if (ins.op == Op::recv_wait) {
        const int peer = peer_of(rank, position);
        MessageLink& link = links[{peer, rank}];
        const auto post = posted[rank].find(receive_key(ins));
        OASES_ASSERT(post != posted[rank].end(), "{} waits for a receive never posted",
                     describe(rank, position, schedule));
        const int index = post->second.message;
        if (index >= static_cast<int>(link.sent.size())) break;  // blocked until the peer sends
        const MessageLink::Message message = link.sent[static_cast<std::size_t>(index)];
        const schedule::Instruction& sent = schedules[peer][message.send_position];
        const schedule::Instruction& receive = schedule[post->second.position];
        OASES_ASSERT(sent.payload == receive.payload && sent.micro_batch == receive.micro_batch &&
                         sent.sub_batch == receive.sub_batch && sent.slot == receive.slot,
                     "message {} from rank {} to rank {} does not match: {} meets {}", index,
                     peer, rank, describe(peer, message.send_position, schedules[peer]),
                     describe(rank, post->second.position, schedule));
        posted[rank].erase(post);
        ++link.waited;
        const double before = run.lanes().now();
        run.lanes().idle_until_time(message.arrival);
        run.result().bubble_seconds += run.lanes().now() - before;
      } else {
        run.run(ins);
      }
    }
    return moved;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int rank = 0; rank < group; ++rank) progress |= advance(rank);
  }

  std::vector<std::string> blocked;
  for (int rank = 0; rank < group; ++rank) {
    if (next[rank] == schedules[rank].size()) continue;
    const std::size_t position = next[rank];
    const int peer = schedules[rank][position].peer;
    const MessageLink& link = links[{peer, rank}];
    const std::size_t sent = link.sent.size();
    const std::string peer_state =
        next[peer] == schedules[peer].size()
            ? fmt::format("which ended after sending it {} message{}", sent, sent == 1 ? "" : "s")
            : fmt::format("which waits at {}", describe(peer, next[peer], schedules[peer]));
    blocked.push_back(fmt::format("{} waits for message {} from rank {}, {}",
                                  describe(rank, position, schedules[rank]),
                                  posted[rank].at(receive_key(schedules[rank][position])).message,
                                  peer,
                                  peer_state));
  }
  OASES_ASSERT(blocked.empty(), "the ranks cannot finish: a RecvWait waits for a Send that "
               "never comes: {}", fmt::join(blocked, "; "));
  for (const auto& [pair, link] : links) {
    const auto received = static_cast<std::size_t>(link.waited);
    OASES_ASSERT(link.sent.size() == received,
                 "rank {} sends {} messages to rank {}, which receives {}; the first not "
                 "received is {}",
                 pair.first, link.sent.size(), pair.second, received,
                 describe(pair.first, link.sent[received].send_position,
                          schedules[pair.first]));
  }

  MultiRankResult result;
  std::stable_sort(events.begin(), events.end(), [](const SimEvent& a, const SimEvent& b) {
    return std::tie(a.rank, a.begin) < std::tie(b.rank, b.begin);
  });
  result.events = std::move(events);
  for (RankRun& run : ranks) {
    run.finish();
    result.ranks.push_back(run.result());
    result.step_seconds = std::max(result.step_seconds, run.result().step_seconds);
  }
  return result;
}

double all_to_all_seconds(double bytes, int ranks, const Link& link) {
  if (ranks <= 1) return 0;
  OASES_ASSERT(link.bytes_per_second > 0, "an all-to-all over a link without bandwidth");
  const double block = bytes / ranks;
  return (ranks - 1) * (link.latency_seconds + block / link.bytes_per_second);
}

void price_all_to_alls(CostModel& costs, const ops::Program& program, const Link& link) {
  costs.collective = [&program, link, base = costs.collective](const schedule::Instruction& ins) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const bool forward = ins.direction == schedule::Direction::forward;
    if ((forward ? shape.forward_kind : shape.backward_kind) != ops::CollectiveKind::all_to_all)
      return base ? base(ins) : 0.0;
    const auto elements = static_cast<double>(forward ? shape.forward_collective_elements
                                                      : shape.backward_collective_elements);
    return all_to_all_seconds(
        elements * static_cast<double>(program.set_element_bytes),
        shape.context_parallel_ranks > 0 ? shape.context_parallel_ranks : shape.collective_ranks,
        link);
  };
}

}  // namespace oases::sim
