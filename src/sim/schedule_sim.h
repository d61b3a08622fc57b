// Schedule simulator: runs a Schedule on a cost model instead of devices, with the executor's
// semantics. One compute lane runs Forward, Recompute, Backward and BackwardWeight back to
// back; the tensor-parallel collectives run on a communication lane in issue order (a
// collective begins when it is issued and the ones before it are done), so Start never blocks
// and Wait holds the compute lane until that collective ends. Data-parallel gradient reductions run on a lane of
// their own and the optimizer step waits for all of them. ZeRO-3's parameter gathers run on
// that data-parallel lane too, in issue order with the reductions (one communicator carries
// both): GatherParams puts the gather on the lane and goes on, WaitParams holds the compute
// lane until it has arrived (exposed communication, as a Wait's), ReleaseParams is free.
//
// Lanes running at once slow each other, as they do on shared hardware: compute runs at
// 1 / (1 + overlap_slowdown) of its speed while any communication is in flight (on CPUs the
// progress threads and the network stack take cores; on GPUs communication kernels take SMs);
// communication runs at 1 / (1 + collective_slowdown) while compute runs (the network stack
// waits for a core); and with `shared_link` the two communication lanes split the link's
// bandwidth while both are busy (or, with shared_link_in_issue_order, the head issued first
// moves alone). Time advances from one completion to the next, so only the
// overlapping parts of two activities slow down.
//
// simulate_ranks runs the schedules of a pipeline's ranks together, each with the semantics
// above, and prices their Send/Recv. A Send puts the message on the point-to-point link from
// the sender to its peer and the sender goes on; the messages of one ordered pair of ranks
// cross their link one at a time, in issue order, and links between different pairs run at
// once. A RecvStart is free; its RecvWait holds the receiver's compute lane until the message
// has arrived (nothing if it already has) while the receiver's collectives and reductions in
// flight go on; that wait is the rank's pipeline bubble. Messages match as the runtime matches
// them: the i-th Send from a to b with the i-th RecvStart at b from a. Point-to-point transfers
// neither slow nor are slowed by the other lanes: their cost is what the link takes alone.
#pragma once

#include "schedule/schedule.h"

#include <functional>
#include <string>
#include <vector>

namespace oases::sim {

struct CostModel {
  // Seconds of a Forward, Recompute or Backward instruction.
  std::function<double(const schedule::Instruction&)> compute;
  // Seconds a tensor-parallel collective (a Start instruction's) spends on the wire.
  std::function<double(const schedule::Instruction&)> collective;
  // Seconds of the data-parallel reduction of a gradient bucket; null: none.
  std::function<double(int bucket)> reduce_grads;
  // Seconds of the data-parallel all-gather of a bucket's parameters (a GatherParams
  // instruction's, ZeRO-3); null: free, the parameters are in place at once.
  std::function<double(int bucket)> gather_params;
  // Seconds of the tensor-parallel all-gather of a partitioned checkpoint (a GatherSets
  // instruction's, partition_kept_checkpoints); it runs on the collectives' lane in issue
  // order. Null: free, though still behind the collectives issued before it.
  std::function<double(const schedule::Instruction&)> gather_sets;
  // Seconds of an Encode or Decode instruction (compressed activations: one pass over the
  // set's values on the compute lane); null: free.
  std::function<double(const schedule::Instruction&)> codec;
  double optimizer_step = 0;
  double overlap_slowdown = 0;     // compute under in-flight communication takes (1 + this) x
  double collective_slowdown = 0;  // communication while compute runs takes (1 + this) x
  // The data-parallel reductions use the same link as the collectives' lane (the replicas of a
  // layer inside the tensor-parallel group, or the experts' all-to-alls between data-parallel
  // ranks that are also the layer's replicas).
  bool shared_link = false;
  // On a shared link, the two lanes' transfers move one at a time in the order they were
  // issued (a transport that keeps one process pair's messages in order) instead of splitting
  // the bandwidth.
  bool shared_link_in_issue_order = false;
  // Seconds a point-to-point message (a Send instruction's) spends on its link; null: none.
  std::function<double(const schedule::Instruction&)> p2p;
  // Zero-bubble's split backward, for costs that time whole backward stages (profiles do): the
  // fraction of a stage 0 that is weight-gradient work (the deferred GEMMs: about half of a
  // layer's stage 0, whose GEMMs dominate it, each weight gradient costing what its input
  // gradient does). When positive, an input-only stage 0 costs (1 - share) x compute() of the
  // whole stage, later input-only stages what the whole stage costs, and a BackwardWeight
  // share x compute() of its segment's whole stage 0; compute() is never asked about either.
  // 0: compute() prices input-only stages and BackwardWeight itself.
  double weight_gradient_share = 0;
};

struct SimResult {
  double step_seconds = 0;
  double compute_seconds = 0;       // compute lane busy (slowdown included)
  // Compute lane waiting on collectives (TP and DP: a Wait, the optimizer step's wait for the
  // reductions, a WaitParams).
  double exposed_comm_seconds = 0;
  double comm_seconds = 0;          // tensor-parallel lane busy
};

// One rank's schedule, which must have no Send, RecvStart or RecvWait (InternalError otherwise).
SimResult simulate(const schedule::Schedule& schedule, const CostModel& costs);

struct RankSimResult : SimResult {
  // step_seconds: when this rank's last instruction ends.
  double bubble_seconds = 0;  // compute lane waiting in RecvWaits
  double p2p_seconds = 0;     // this rank's outgoing messages on their links
};

// One activity of a simulated rank, for a trace of the step: an instruction on the compute
// lane, a collective on the tensor-parallel lane, a reduction or parameter gather on the
// data-parallel lane, a message on its link (from the moment it leaves to its arrival).
struct SimEvent {
  enum class Lane { compute, collectives, data_parallel, messages };
  int rank = 0;  // index into the simulated schedules
  Lane lane = Lane::compute;
  std::string name;  // schedule::to_string of the instruction (a reduction: "bucket N")
  double begin = 0, end = 0;
};

struct MultiRankResult {
  double step_seconds = 0;           // the slowest rank's
  std::vector<RankSimResult> ranks;  // ranks[r]: schedules[r]'s
  std::vector<SimEvent> events;      // with record_events: every activity, by rank then time
};

// The ranks of one point-to-point group run together: schedules[r] is rank r's and its peers
// are indices into `schedules`. One rank without Send and Recv gives simulate()'s result.
// InternalError when the messages cannot be delivered: a peer outside the group or the rank
// itself, a Send and its matching Recv that disagree on payload, micro-batch, sub-batch or
// slot, a Send nobody receives, or RecvWaits that wait forever (each blocked rank named with
// its position and what it waits for).
MultiRankResult simulate_ranks(const std::vector<schedule::Schedule>& schedules,
                               const CostModel& costs);
// The same with rank r's instructions priced by costs[r] (pipeline stages hold different
// segments; a message is priced by its sender's p2p), and, with record_events, every activity
// in MultiRankResult::events. REQUIRES: costs.size() == schedules.size().
MultiRankResult simulate_ranks(const std::vector<schedule::Schedule>& schedules,
                               const std::vector<CostModel>& costs, bool record_events = false);

// A rank's link to its peers: bandwidth in each direction and latency per message.
struct Link {
  double bytes_per_second = 0;
  double latency_seconds = 0;
};

// Seconds of an all-to-all among `ranks` ranks, each holding `bytes` in `ranks` equal blocks
// (its own block stays): a rank sends its ranks - 1 other blocks over its link, one peer after
// another, while receiving as many, so the exchange takes (ranks - 1) x (latency + block /
// bandwidth), the per-peer volume times the peers. One rank: nothing.
double all_to_all_seconds(double bytes, int ranks, const Link& link);

// Prices the all-to-alls of `program`'s segments (SegmentShape::forward_kind or backward_kind
// all_to_all: MoE dispatch and combine, over collective_ranks ranks, of *_collective_elements
// elements of program.set_element_bytes each) with all_to_all_seconds over `link`; every other
// collective keeps the price costs.collective gave it. `program` must outlive `costs`.
void price_all_to_alls(CostModel& costs, const ops::Program& program, const Link& link);

}  // namespace oases::sim
