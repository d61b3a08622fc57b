// Communicator: collectives over a fixed group of ranks. Every operation has an async form
// returning a Work handle; operations on one communicator complete in issue order (one FIFO
// per communicator, drained by its own progress thread on CPU), which lets every rank of a
// group agree on matching without any handshake.
//
// The contract makes no host-side assumption about where the data lives or when it is
// touched: a buffer passed to an async operation belongs to the communicator until wait()
// returns (on CUDA the operation will be ordered on a stream instead of a thread).
//
// Buffers are contiguous Tensors of f32, f64, bf16, f16, i32 or i64; element counts may be 0.
// Reductions of bf16 and f16 combine each pair of values exactly and round the result once to
// the format (ties to even), so their result depends on the order the backend combines ranks
// in, within (group size - 1) roundings. Every rank of the group must issue the same operations
// in the same order with matching sizes.
//
// This file has the interface and the single-rank communicator, whose collectives are copies
// or no-ops; comm/mpi_communicator.h has the MPI backend.
#pragma once

#include "core/tensor.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace oases::comm {

enum class ReduceOp { sum, max, min };

// When an operation was running on the wire: from the moment the communicator began it
// (after the operations issued before it, where they serialise) to its completion.
struct WorkTiming {
  std::chrono::steady_clock::time_point began;
  std::chrono::steady_clock::time_point finished;
};

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;   // blocks until the operation has completed (or aborts on timeout)
  virtual bool test() = 0;   // true once the operation has completed
  // Valid once wait() has returned; nullopt where the backend does not measure it (a group of
  // one completes everything at issue).
  virtual std::optional<WorkTiming> timing() const { return std::nullopt; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "tp", used in error messages

  // In place: buffer := op over ranks of buffer.
  virtual std::unique_ptr<Work> all_reduce_async(Tensor buffer, ReduceOp op) = 0;
  // output [size * n] := concatenation over ranks (in rank order) of input [n].
  virtual std::unique_ptr<Work> all_gather_async(Tensor input, Tensor output) = 0;
  // output [n] := op over ranks of input[rank * n, (rank + 1) * n) (input holds size * n).
  virtual std::unique_ptr<Work> reduce_scatter_async(Tensor input, Tensor output, ReduceOp op) = 0;
  // buffer := root's buffer.
  virtual std::unique_ptr<Work> broadcast_async(Tensor buffer, int root) = 0;
  // Point to point; a send matches the recv of the same tag from the same peer, in order.
  virtual std::unique_ptr<Work> send_async(Tensor buffer, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> recv_async(Tensor buffer, int peer, int tag) = 0;
  // input [size * n] -> output [size * n]: chunk j of input goes to rank j, and chunk i of
  // output comes from rank i.
  virtual std::unique_ptr<Work> all_to_all_async(Tensor input, Tensor output) = 0;
  // Variable chunks: send_counts[j] elements (consecutive, from the start of input) go to
  // rank j; recv_counts[i] elements arrive from rank i, laid out consecutively in output.
  virtual std::unique_ptr<Work> all_to_allv_async(Tensor input,
                                                  std::vector<std::int64_t> send_counts,
                                                  Tensor output,
                                                  std::vector<std::int64_t> recv_counts) = 0;
  virtual std::unique_ptr<Work> barrier_async() = 0;
  // One step of a ring: `send` goes to the rank `offset` places after this one (modulo size())
  // and `recv` (as large) is filled by the rank `offset` places before it; every rank of the
  // group takes part with the same offset, and steps match in the order they are issued. The
  // base version is a send and a receive of tag kShiftTag.
  virtual std::unique_ptr<Work> shift_async(Tensor send, Tensor recv, int offset);
  static constexpr int kShiftTag = 0x5348;

  // Collectives over the blocks of one buffer (ZeRO's partition of a gradient bucket): the
  // buffer is cut into size() consecutive blocks of counts[0], counts[1], ... elements (they sum
  // to buffer.numel(); a block may be empty), and rank r owns block r. Both work in place, so
  // a bucket is reduced and gathered where it lies in the flat arrays, whatever its sizes.
  //
  // Block r of rank r := op over ranks of their block r. The other blocks are unspecified
  // afterwards (MPI leaves them as they were; the base version all-reduces the whole buffer).
  virtual std::unique_ptr<Work> reduce_scatter_blocks_async(Tensor buffer,
                                                            std::vector<std::int64_t> counts,
                                                            ReduceOp op);
  // Block r of every rank := block r of rank r.
  virtual std::unique_ptr<Work> all_gather_blocks_async(Tensor buffer,
                                                        std::vector<std::int64_t> counts);

  // Names what the operations issued from now on are for ("F(attention.5, mb=1, sb=0)",
  // "reduce_grads(bucket=3)"), for the flight recorder (comm/flight_recorder.h); empty: nobody
  // says. Kept until the next call, whichever thread issues. IssuerLabel sets it for a scope.
  void set_issuer(std::string issuer) {
    std::lock_guard lock(issuer_mutex_);
    issuer_ = std::move(issuer);
  }
  std::string issuer() const {
    std::lock_guard lock(issuer_mutex_);
    return issuer_;
  }

  // Blocking forms.
  void all_reduce(Tensor buffer, ReduceOp op = ReduceOp::sum) { all_reduce_async(buffer, op)->wait(); }
  void all_gather(Tensor input, Tensor output) { all_gather_async(input, output)->wait(); }
  void reduce_scatter(Tensor input, Tensor output, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(input, output, op)->wait();
  }
  void broadcast(Tensor buffer, int root) { broadcast_async(buffer, root)->wait(); }
  void send(Tensor buffer, int peer, int tag = 0) { send_async(buffer, peer, tag)->wait(); }
  void recv(Tensor buffer, int peer, int tag = 0) { recv_async(buffer, peer, tag)->wait(); }
  void all_to_all(Tensor input, Tensor output) { all_to_all_async(input, output)->wait(); }
  void barrier() { barrier_async()->wait(); }

 protected:
  // InternalError unless counts has size() entries, none negative, summing to buffer.numel().
  void check_blocks(const Tensor& buffer, const std::vector<std::int64_t>& counts,
                    const char* op) const;

 private:
  mutable std::mutex issuer_mutex_;
  std::string issuer_;
};

// Labels the operations issued on `group` while it lives; the label before it comes back after.
class IssuerLabel {
 public:
  IssuerLabel(Communicator& group, std::string issuer)
      : group_(group), previous_(group.issuer()) {
    group_.set_issuer(std::move(issuer));
  }
  ~IssuerLabel() { group_.set_issuer(std::move(previous_)); }
  IssuerLabel(const IssuerLabel&) = delete;
  IssuerLabel& operator=(const IssuerLabel&) = delete;

 private:
  Communicator& group_;
  std::string previous_;
};

// A group of one rank: every collective is complete the moment it is issued.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string group_name = "self") : name_(std::move(group_name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
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
  std::unique_ptr<Work> barrier_async() override;

 private:
  std::string name_;
};

// A group's rank and size without the group: for building a rank's model to read its program
// (the shapes, collectives and work a simulator prices) on a machine that does not run the
// other ranks. Every operation is an InternalError naming the group.
class ShapeOnlyCommunicator final : public Communicator {
 public:
  ShapeOnlyCommunicator(int rank, int size, std::string group_name = "shape-only");
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  std::unique_ptr<Work> all_reduce_async(Tensor, ReduceOp) override { return refuse(); }
  std::unique_ptr<Work> all_gather_async(Tensor, Tensor) override { return refuse(); }
  std::unique_ptr<Work> reduce_scatter_async(Tensor, Tensor, ReduceOp) override { return refuse(); }
  std::unique_ptr<Work> broadcast_async(Tensor, int) override { return refuse(); }
  std::unique_ptr<Work> send_async(Tensor, int, int) override { return refuse(); }
  std::unique_ptr<Work> recv_async(Tensor, int, int) override { return refuse(); }
  std::unique_ptr<Work> all_to_all_async(Tensor, Tensor) override { return refuse(); }
  std::unique_ptr<Work> all_to_allv_async(Tensor, std::vector<std::int64_t>, Tensor,
                                          std::vector<std::int64_t>) override {
    return refuse();
  }
  std::unique_ptr<Work> barrier_async() override { return refuse(); }

 private:
  std::unique_ptr<Work> refuse() const;
  int rank_, size_;
  std::string name_;
};

}  // namespace oases::comm
