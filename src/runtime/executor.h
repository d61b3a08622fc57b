// Executor: interprets a Schedule on this rank. Compute instructions run on the calling thread
// (the compute lane; kernels parallelise internally); collectives are issued asynchronously on
// the group each segment names (the communication lane): all-reduces of partial sums (or of
// row maxima), all-gathers of reshards, waited on where the schedule says. Free instructions
// release tensor sets from the activation store, so the peak of live activations is a property
// of the schedule.
//
// Per run it reports the compute lane's busy time, the time it stood idle waiting on
// collectives (exposed communication) and on pipeline Recvs (the bubble), how long collectives
// were on the wire, and the peak activation memory. A listener receives one structured record per instruction (what ran,
// which segment, on which lane, from when to when): the trace and the profiler are listeners.
#pragma once

#include "comm/communicator.h"
#include "core/buffer.h"
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
// meanwhile); a Send: its time on the wire on the point-to-point lane. Waits, RecvStarts and
// Frees are not reported (a Wait's blocking shows in the stats).
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

class Executor {
 public:
  // `program` describes `segments` (same order); `static_activation_bytes`: activation memory
  // allocated once (slots, scratch), added to the store's peak.
  Executor(std::vector<std::unique_ptr<ops::Segment>>& segments, const ops::Program& program,
           ops::ActivationStore& store, std::size_t static_activation_bytes)
      : segments_(segments),
        program_(program),
        store_(store),
        static_bytes_(static_activation_bytes) {}

  // The group Send and Recv instructions talk over (pipeline stages: comm::Mesh::pp_group);
  // peers are ranks of it. Needed only by schedules with Send/Recv.
  void set_point_to_point(comm::Communicator* group) { peers_ = group; }

  // Runs every instruction in order; with a listener, each one is also reported.
  //
  // Send copies the segment's send_buffer into the staging buffer of its slot (waiting first
  // for the slot's previous send to complete) and sends it asynchronously, with the slot as
  // the message tag; RecvStart posts a receive into the segment's recv_buffer (acquired then)
  // and goes on; RecvWait blocks until that receive has arrived (counted as bubble_seconds).
  // Every send has completed and every posted receive has been waited when run() returns.
  //
  // GatherParams, WaitParams and ReleaseParams call their StepHooks (nothing where a hook is
  // null); WaitParams' hook blocks until the gather is in, and that time counts as exposed
  // communication, since the compute lane has to wait for it.
  ExecutionStats run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                     const StepHooks& hooks, InstructionListener* listener = nullptr);
  // A run of a no-flush pipeline (schedule/pipeline_2bw.h): instructions of batch -1 run in
  // `previous_batch` (that batch's step, tokens and loss scale), those of batch 0 in `ctx`.
  ExecutionStats run(const schedule::Schedule& schedule, const ops::StepContext& ctx,
                     const ops::StepContext& previous_batch, const StepHooks& hooks,
                     InstructionListener* listener = nullptr);

 private:
  // A send's copy of its tensor, so that the segment may reuse its buffer at once.
  struct Staged {
    Buffer buffer;
    std::unique_ptr<comm::Work> in_flight;
    std::chrono::steady_clock::time_point issued;
    schedule::Instruction instruction;
  };
  void send(const schedule::Instruction& ins, ops::Segment& segment,
            InstructionListener* listener);
  // Waits for the send staged in `staged` (if any); reports it to the listener.
  void finish_send(Staged& staged, InstructionListener* listener);

  struct InFlight {
    std::unique_ptr<comm::Work> work;
    std::chrono::steady_clock::time_point issued;
    ops::Segment::CollectiveCall call;
  };

  std::vector<std::unique_ptr<ops::Segment>>& segments_;
  const ops::Program& program_;
  ops::ActivationStore& store_;
  std::size_t static_bytes_;
  std::map<std::tuple<int, int, int, int, bool>, InFlight> in_flight_;
  comm::Communicator* peers_ = nullptr;
  std::map<std::pair<ops::Payload, int>, Staged> staged_;  // by (payload, slot)
  // Receives posted by RecvStart and not yet waited, by (payload, segment, mb, sb): the
  // instance's receive buffer they fill.
  using ReceiveKey = std::tuple<ops::Payload, int, int, int>;
  static ReceiveKey receive_key(const schedule::Instruction& ins) {
    return {ins.payload, ins.segment, ins.micro_batch, ins.sub_batch};
  }
  std::map<ReceiveKey, std::unique_ptr<comm::Work>> receives_;
};

}  // namespace oases::runtime
