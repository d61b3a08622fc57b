// Communicator: collectives over a fixed group of ranks. Every operation has an async form
// returning a Work handle; operations on one communicator complete in issue order, which lets
// every rank of a group agree on matching without any handshake.
//
// The contract makes no host-side assumption about where the data lives or when it is
// touched: the buffer passed to an async operation belongs to the communicator until wait()
// returns (on CUDA it will be ordered on a stream).
//
// This file has the interface and the single-rank communicator, whose collectives are the
// identity; the MPI backend adds real groups.
#pragma once

#include "core/tensor.h"

#include <memory>
#include <string>

namespace oases::comm {

enum class ReduceOp { sum, max };

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;   // blocks until the operation has completed
  virtual bool test() = 0;   // true once the operation has completed
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "tp", used in error messages

  // In-place reduction of `buffer` across the group.
  virtual std::unique_ptr<Work> all_reduce_async(Tensor buffer, ReduceOp op) = 0;
  void all_reduce(Tensor buffer, ReduceOp op = ReduceOp::sum) { all_reduce_async(buffer, op)->wait(); }
};

// A group of one rank: every collective is complete the moment it is issued.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string group_name = "self") : name_(std::move(group_name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  std::unique_ptr<Work> all_reduce_async(Tensor buffer, ReduceOp op) override;

 private:
  std::string name_;
};

}  // namespace oases::comm
