// Executor: interprets a Schedule on this rank, on three streams (core/device.h):
//   compute         Forward, Recompute, Backward and BackwardWeight, and everything else that
//                   reads or writes the segments' state and the activation store: Free,
//                   Encode, Decode and Partition, the segment calls that name a collective's
//                   or a message's buffers (forward_collective, backward_collective,
//                   gather_sets, send_buffer, recv_buffer) and a Send's copy into its staging
//                   buffer. Kernels parallelise internally.
//   communication   the segments' collectives (all-reduces of partial sums or of row maxima,
//                   all-gathers of reshards and of partitioned checkpoints, all-to-alls):
//                   issued on the group each segment names, then waited for.
//   point-to-point  pipeline Sends and Recvs over the point-to-point group.
// A Start runs the segment's call on the compute stream and records an event after it; the
// communication stream waits for that event and issues the collective. The Wait enqueues the
// wait for the collective's completion on the communication stream, records an event after
// it, and makes the compute stream wait for that event: the compute stream stands still, never
// the host. Sends and Recvs go the same way over the point-to-point stream, and a RecvWait is
// the compute stream waiting for the receive's event. A Free is compute-stream work: the
// memory it releases is reused only by work enqueued after it, once every earlier reader on
// the compute stream, and every collective or Send the compute stream waited for, is done.
//
// Why the segment calls run on the compute stream, not on the communication stream: they
// read (gather_sets changes) the activation store, which the compute stream's work changes,
// so anywhere else they would race with it. (Where the host only launches kernels, as on a
// GPU, the store's bookkeeping is the host's and the calls belong to the host.) Why one communication stream for every group and
// not one per communicator: each communicator already runs its operations in issue order on
// its own (comm/communicator.h), and a collective is issued only after the compute stream has
// passed its Start, hence every Wait before it, so a stream per group would let no collective
// start earlier; issuing them from one stream in schedule order also keeps the order in which
// this rank issues on each group the schedule's, which the ranks of a group must agree on.
//
// Hooks (StepHooks) are host code that touches what the compute stream reads and writes
// (gradients, parameters, the optimizer's state) and issues its own communication on groups
// the streams use too. Before calling one, the host synchronises every stream: the hook sees
// every instruction before it done and none after it started, as when everything ran inline,
// and each group still receives this rank's operations in schedule order. Ordering the hooks
// with events instead would need hooks that take streams; on immediate streams the
// synchronisation costs nothing. Hooks are timed by the host's clock, where they run.
//
// With immediate streams (the default, ExecutorOptions) every stream's work runs on the calling
// thread as it is enqueued, and a run is what it always was: compute inline, collectives and
// transfers issued asynchronously and waited where the schedule says. With asynchronous
// streams each stream has a thread of its own and the host only enqueues, synchronising at
// hooks and at the run's end (an error from a stream's work is rethrown by run()).
//
// Per run it reports the compute stream's busy time, the time it stood waiting for
// collectives (exposed communication) and for pipeline Recvs (the bubble), how long
// collectives were on the wire, and the peak activation memory. Durations come from events on
// the compute stream (the host clock inside the stream, when the stream reached them); a
// collective's or a Send's time on the wire comes from its communicator (comm::WorkTiming), or
// is the span from its issue to its completion where the backend does not measure it. A
// listener receives one structured record per instruction (what ran, which segment, on which
// lane, from when to when), from the host at the run's end, in the order the instructions
// report (below): the trace and the profiler are listeners.
#pragma once

#include "comm/communicator.h"
#include "core/buffer.h"
#include "core/device.h"
#include "ops/activation_store.h"
#include "ops/segment.h"
#include "schedule/schedule.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace oases::runtime {

struct StepHooks {
  std::function<void(int bucket)> reduce_grads;  // ReduceGrads(bucket) instruction
  std::function<void()> optimizer_step;  // OptimizerStep instruction
  // UseWeights(batch): the parameters segments read must hold the version `batch` computes with
  // (2bw weight stashing; schedule/pipeline_2bw.h).
  std::function<void(int batch)> use_weights = nullptr;
  // ZeRO-3: GatherParams(bucket) starts the gather of a bucket's parameters, WaitParams(bucket)
  // waits for it, ReleaseParams(bucket) gives back the blocks this rank does not own.
  std::function<void(int bucket)> gather_params = nullptr;
  std::function<void(int bucket)> wait_params = nullptr;
  std::function<void(int bucket)> release_params = nullptr;
};

struct ExecutionStats {
  double compute_seconds = 0;        // Forward, Recompute and Backward instructions
  // Compute lane blocked on collectives (and on Sends at the end, and on parameter gathers in
  // WaitParams).
  double exposed_comm_seconds = 0;
  // Compute lane blocked on a pipeline Recv: this rank's share of the pipeline bubble, kept
  // apart from exposed communication as sim::RankSimResult keeps it.
  double bubble_seconds = 0;
  double comm_seconds = 0;           // collectives in flight on the wire (union of intervals)
  // Of those: the MoE all-to-alls (dispatch and combine, both directions): the compute lane's
  // wait on them, and their time on the wire (summed).
  double exposed_all_to_all_seconds = 0;
  double all_to_all_seconds = 0;
  // And the context-parallel transfers (the attention's all-to-alls, or the ring's shifts, over
  // the cp group), the same two ways.
  double exposed_cp_seconds = 0;
  double cp_seconds = 0;
  int collectives = 0;               // collectives issued by the schedule
  std::size_t peak_activation_bytes = 0;  // slots and scratch + peak of the activation store

  ExecutionStats& operator+=(const ExecutionStats& other);
};

// point_to_point: pipeline Sends, from their issue to their completion.
enum class Lane { compute = 0, communication = 1, optimizer = 2, point_to_point = 3 };

// One instruction as it ran. Compute instructions: their run on the compute lane; collectives
// (reported at their Wait): their time on the wire, as the communicator measured it;
// ReduceGrads, OptimizerStep, GatherParams and ReleaseParams: the hook's run on the optimizer
// lane; a RecvWait or WaitParams: its wait on the compute lane (the lane can do nothing else
// meanwhile); a Send: its time on the wire on the point-to-point lane. Waits, RecvStarts,
// UseWeights, Frees, Encodes, Decodes and Partitions are not reported (a Wait's blocking shows
// in the stats). The compute lane is the compute stream.
struct InstructionRecord {
  using Clock = std::chrono::steady_clock;
  schedule::Instruction instruction;
  // Null for instructions without a segment (ReduceGrads, OptimizerStep, parameter ones).
  const ops::SegmentShape* segment = nullptr;
  ops::CollectiveKind collective = ops::CollectiveKind::all_reduce;  // for collectives
  comm::ReduceOp reduce = comm::ReduceOp::sum;
  Lane lane = Lane::compute;
  Clock::time_point began, finished;
  double seconds() const { return std::chrono::duration<double>(finished - began).count(); }
};

class InstructionListener {
 public:
  virtual ~InstructionListener() = default;
  virtual void record(const InstructionRecord& record) = 0;
};

namespace detail {
struct Flight;    // a collective or a message from its start to its completion
struct SendSlot;  // a Send slot's staging buffer and the send from it in flight
struct Measure;   // what a run measured, resolved at its end
struct RunState;  // a run's contexts, hooks, listener and measures
}  // namespace detail

// How the executor's streams run; fixed for the executor's life.
struct ExecutorOptions {
  StreamMode streams = StreamMode::immediate;
  // A test seam (plan::RunPlan::compute_delay_s): sleep added to every compute instruction,
  // inside its measured time, to make this rank a straggler.
  double compute_delay_seconds = 0;
};

class Executor {
 public:
  // `program` describes `segments` (same order); `static_activation_bytes`: activation memory
  // allocated once (slots, scratch), added to the store's peak.
  Executor(std::vector<std::unique_ptr<ops::Segment>>& segments, const ops::Program& program,
           ops::ActivationStore& store, std::size_t static_activation_bytes,
           ExecutorOptions options = {});
  // Drains the streams.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The group Send and Recv instructions talk over (pipeline stages: comm::Mesh::pp_group);
  // peers are ranks of it. Needed only by schedules with Send/Recv.
  void set_point_to_point(comm::Communicator* group) { peers_ = group; }
  StreamMode stream_mode() const { return compute_.mode(); }

  // Runs every instruction in order; with a listener, each one is also reported. Returns once
  // every stream has finished the run's work. When it throws (the first failure, whether of
  // the host or of a stream's work), the streams have finished or skipped the run's work, and
  // the collectives and receives the run left in flight are dropped.
  //
  // Send copies the segment's send_buffer into the staging buffer of its slot (the compute
  // stream waiting first for the slot's previous send to complete) and sends it, with the slot
  // as the message tag, so that the segment may reuse its buffer at once; RecvStart posts a
  // receive into the segment's recv_buffer (acquired then); RecvWait makes the compute stream
  // wait until that receive has arrived (counted as bubble_seconds). Every send has completed
  // and every posted receive has been waited when run() returns.
  //
  // GatherParams, WaitParams and ReleaseParams call their StepHooks (nothing where a hook is
  // null); WaitParams' hook blocks until the gather is in, and that time counts as exposed
  // communication, since the compute stream has to wait for it.
  //
  // The listener's records (InstructionRecord) come at the end, from the calling thread, in
  // schedule order of the instruction that reports each: a collective's at its Wait, a Send's
  // when its slot is next used or at the end.
  ExecutionStats run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                     const StepHooks& hooks, InstructionListener* listener = nullptr);
  // A run of a no-flush pipeline (schedule/pipeline_2bw.h): instructions of batch -1 run in
  // `previous_batch` (that batch's step, tokens and loss scale), those of batch 0 in `ctx`.
  ExecutionStats run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                     const ops::StepContext& previous_batch, const StepHooks& hooks,
                     InstructionListener* listener = nullptr);

 private:
  using Flight = detail::Flight;
  using SendSlot = detail::SendSlot;
  using Measure = detail::Measure;
  using RunState = detail::RunState;

  void dispatch(const schedule::Instruction& ins, RunState& run);
  void compute(const schedule::Instruction& ins, RunState& run);
  void keep_sets(const schedule::Instruction& ins);
  void start_collective(const schedule::Instruction& ins, RunState& run);
  void wait_collective(const schedule::Instruction& ins, RunState& run);
  void call_hook(const schedule::Instruction& ins, RunState& run);
  void send(const schedule::Instruction& ins, RunState& run);
  // Makes the compute stream wait for the send from `slot` (if any), reported to the listener.
  void finish_send(SendSlot& slot, RunState& run);
  void finish_sends(RunState& run);
  void post_receive(const schedule::Instruction& ins);
  void wait_receive(const schedule::Instruction& ins, RunState& run);
  // Makes the compute stream wait until `flight`, issued on `stream`, has completed; the
  // measure spans that wait on the compute stream.
  Measure complete(Stream& stream, std::shared_ptr<Flight> flight);
  // Every stream, even after one has failed; rethrows the first failure.
  void synchronize_streams();
  ExecutionStats resolve(RunState& run) const;

  ops::Segment& segment_of(const schedule::Instruction& ins) const {
    return *segments_[static_cast<std::size_t>(ins.segment)];
  }

  std::vector<std::unique_ptr<ops::Segment>>& segments_;
  const ops::Program& program_;
  ops::ActivationStore& store_;
  std::size_t static_bytes_;
  comm::Communicator* peers_ = nullptr;
  // Collectives started and not yet waited, by (segment, mb, sb, channel, replay).
  std::map<std::tuple<int, int, int, int, bool>, std::shared_ptr<Flight>> in_flight_;
  std::map<std::pair<ops::Payload, int>, std::shared_ptr<SendSlot>> send_slots_;  // by (payload, slot)
  // Receives posted by RecvStart and not yet waited, by (payload, segment, mb, sb).
  using ReceiveKey = std::tuple<ops::Payload, int, int, int>;
  static ReceiveKey receive_key(const schedule::Instruction& ins) {
    return {ins.payload, ins.segment, ins.micro_batch, ins.sub_batch};
  }
  std::map<ReceiveKey, std::shared_ptr<Flight>> receives_;
  std::vector<Measure> measures_;  // the current run's (runs reuse its memory)
  // Last, so that they are drained before what their work refers to goes.
  Stream compute_, communication_, point_to_point_;
  // The calling thread, as an immediate stream: its events time the hooks, which are host code.
  Stream host_;
  double compute_delay_seconds_ = 0;  // ExecutorOptions::compute_delay_seconds
};

}  // namespace oases::runtime
