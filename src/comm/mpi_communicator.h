// MpiCommunicator: the Communicator interface over an MPI communicator (OpenMPI on CPU).
//
// Execution. Every operation is queued in issue order and run by this communicator's own
// progress thread, which starts the matching nonblocking MPI call (MPI_Iallreduce,
// MPI_Iallgather, ...) and polls it with MPI_Test: back to back, yielding, for 50 us after
// each start or completion (small collectives finish within that), then with sleeps growing
// from 2 to 100 us, so that it never holds a core the compute thread needs. It sleeps on a
// condition variable while the queue is empty.
//  - Collectives run one at a time: each starts after every operation issued before it has
//    started, and the next operation waits until it has completed.
//  - Point-to-point operations start in issue order but do not hold up the queue: a send and
//    a recv issued back to back are in flight together, as MPI_Isend/MPI_Irecv are, so an
//    exchange around a ring does not deadlock on messages too large to be sent eagerly.
//  - Work handles complete in issue order: an operation is reported complete only once it
//    and everything issued before it on this communicator have completed.
//
// Sizes. Element counts of 0 are valid. Counts above options.max_elements_per_call (by
// default the MPI int limit) are split into chunks: all_reduce, broadcast, send and recv in
// contiguous pieces, all_gather and all_to_all per rank block (strided MPI datatypes),
// reduce_scatter as one MPI_Ireduce per rank block. all_to_allv is not split: its counts and
// offsets must each fit in an int, else it throws UserError when issued.
//
// Timeout. An operation that has not completed options.timeout_seconds after it started is
// reported to options.on_timeout (by default: message to stderr, then MPI_Abort), e.g.
//   oases: all_reduce of 1048576 f32 on group 'tp' (size 4) has not completed after 5 s on
//   rank 2 (world rank 6); a peer is missing or stuck
//
// Preconditions: MPI is initialised with MPI_THREAD_MULTIPLE (an MpiRuntime is alive) for the
// whole life of the communicator. Buffers are contiguous f32/f64/bf16/f16/i32/i64 tensors, untouched
// by the caller until the operation's wait() returns; input and output must not overlap,
// except for an all_gather whose input is exactly this rank's block of its output (done in
// place). Issue-time checks (shapes, dtypes, ranks, tags, overlap) throw InternalError and
// leave the queue as it was; failures of MPI itself abort the job (MPI's default error
// handler).
//
// Thread-safety: operations may be issued from any thread, but the ranks of a group must
// agree on the order of collectives, so in practice one thread issues them.
#pragma once

#include "comm/communicator.h"
#include "comm/mpi_runtime.h"

#include <mpi.h>

#include <memory>
#include <string>

namespace oases::comm {

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `comm`: every member must construct it at the same point. `comm` is
  // duplicated, so this communicator's traffic never matches anyone else's; the caller keeps
  // ownership of `comm`. `group_name` names the group in error messages ("tp", "dp", ...).
  MpiCommunicator(MPI_Comm comm, std::string group_name, MpiCommunicatorOptions options = {});
  // Waits for every operation issued so far (each is still subject to the timeout), then
  // stops the progress thread and frees the duplicated communicator.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::string name() const override;

  std::unique_ptr<Work> all_reduce_async(Tensor buffer, ReduceOp op) override;
  std::unique_ptr<Work> all_gather_async(Tensor input, Tensor output) override;
  std::unique_ptr<Work> reduce_scatter_async(Tensor input, Tensor output, ReduceOp op) override;
  std::unique_ptr<Work> broadcast_async(Tensor buffer, int root) override;
  std::unique_ptr<Work> send_async(Tensor buffer, int peer, int tag) override;
  std::unique_ptr<Work> recv_async(Tensor buffer, int peer, int tag) override;
  std::unique_ptr<Work> all_to_all_async(Tensor input, Tensor output) override;
  std::unique_ptr<Work> all_to_allv_async(Tensor input, std::vector<std::int64_t> send_counts,
                                          Tensor output,
                                          std::vector<std::int64_t> recv_counts) override;
  std::unique_ptr<Work> reduce_scatter_blocks_async(Tensor buffer,
                                                    std::vector<std::int64_t> counts,
                                                    ReduceOp op) override;
  std::unique_ptr<Work> all_gather_blocks_async(Tensor buffer,
                                                std::vector<std::int64_t> counts) override;
  std::unique_ptr<Work> barrier_async() override;

 private:
  class Engine;  // the queue, the progress thread and the MPI calls
  std::unique_ptr<Engine> engine_;
};

}  // namespace oases::comm
