#include "comm/communicator.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>

namespace oases::comm {
namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

std::unique_ptr<Work> done() { return std::make_unique<CompletedWork>(); }

void copy(Tensor from, Tensor to, const char* op) {
  OASES_ASSERT(from.dtype() == to.dtype() && from.numel() == to.numel() &&
                   from.is_contiguous() && to.is_contiguous(),
               "{} on a group of one: input {} {} and output {} {} differ", op,
               dtype_name(from.dtype()), from.shape().str(), dtype_name(to.dtype()),
               to.shape().str());
  if (from.raw() != to.raw() && from.nbytes() > 0) std::memmove(to.raw(), from.raw(), from.nbytes());
}

// Waits for every part of an operation made of several.
class AllOf final : public Work {
 public:
  explicit AllOf(std::vector<std::unique_ptr<Work>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& part : parts_) part->wait();
  }
  bool test() override {
    return std::ranges::all_of(parts_, [](auto& part) { return part->test(); });
  }
  // From the first part's beginning to the last part's end, where every part measures.
  std::optional<WorkTiming> timing() const override {
    std::optional<WorkTiming> whole;
    for (const auto& part : parts_) {
      const std::optional<WorkTiming> t = part->timing();
      if (!t) return std::nullopt;
      whole = whole ? WorkTiming{std::min(whole->began, t->began),
                                 std::max(whole->finished, t->finished)}
                    : *t;
    }
    return whole;
  }

 private:
  std::vector<std::unique_ptr<Work>> parts_;
};

}  // namespace

void Communicator::check_blocks(const Tensor& buffer, const std::vector<std::int64_t>& counts,
                                const char* op) const {
  OASES_ASSERT(counts.size() == static_cast<std::size_t>(size()),
               "{} on group '{}' (size {}): {} block counts", op, name(), size(), counts.size());
  std::int64_t total = 0;
  for (const std::int64_t count : counts) {
    OASES_ASSERT(count >= 0, "{} on group '{}': negative block count {}", op, name(), count);
    total += count;
  }
  OASES_ASSERT(total == buffer.numel() && buffer.is_contiguous(),
               "{} on group '{}': blocks of {} elements in all cut a buffer {} (contiguous: {})",
               op, name(), total, buffer.shape().str(), buffer.is_contiguous());
}

std::unique_ptr<Work> Communicator::reduce_scatter_blocks_async(Tensor buffer,
                                                                std::vector<std::int64_t> counts,
                                                                ReduceOp op) {
  check_blocks(buffer, counts, "reduce_scatter_blocks");
  return all_reduce_async(buffer, op);
}

std::unique_ptr<Work> Communicator::all_gather_blocks_async(Tensor buffer,
                                                            std::vector<std::int64_t> counts) {
  check_blocks(buffer, counts, "all_gather_blocks");
  std::vector<std::unique_ptr<Work>> parts;
  std::int64_t offset = 0;
  for (int root = 0; root < size(); ++root) {
    const std::int64_t count = counts[static_cast<std::size_t>(root)];
    parts.push_back(broadcast_async(buffer.view(offset, {count}), root));
    offset += count;
  }
  return std::make_unique<AllOf>(std::move(parts));
}

std::unique_ptr<Work> Communicator::shift_async(Tensor send, Tensor recv, int offset) {
  OASES_ASSERT(send.numel() == recv.numel() && send.dtype() == recv.dtype(),
               "shift on group '{}': sends {} {} and receives {} {}", name(),
               dtype_name(send.dtype()), send.shape().str(), dtype_name(recv.dtype()),
               recv.shape().str());
  const int n = size();
  const int to = ((rank() + offset) % n + n) % n, from = ((rank() - offset) % n + n) % n;
  if (to == rank()) {
    copy(send, recv, "shift");
    return done();
  }
  std::vector<std::unique_ptr<Work>> parts;
  parts.push_back(recv_async(recv, from, kShiftTag));
  parts.push_back(send_async(send, to, kShiftTag));
  return std::make_unique<AllOf>(std::move(parts));
}

std::unique_ptr<Work> SelfCommunicator::all_reduce_async(Tensor, ReduceOp) { return done(); }
std::unique_ptr<Work> SelfCommunicator::all_gather_async(Tensor input, Tensor output) {
  copy(input, output, "all_gather");
  return done();
}
std::unique_ptr<Work> SelfCommunicator::reduce_scatter_async(Tensor input, Tensor output, ReduceOp) {
  copy(input, output, "reduce_scatter");
  return done();
}
std::unique_ptr<Work> SelfCommunicator::broadcast_async(Tensor, int root) {
  OASES_ASSERT(root == 0, "broadcast from rank {} in a group of one", root);
  return done();
}
std::unique_ptr<Work> SelfCommunicator::send_async(Tensor, int peer, int) {
  OASES_ASSERT(false, "send to rank {} in a group of one", peer);
  return done();
}
std::unique_ptr<Work> SelfCommunicator::recv_async(Tensor, int peer, int) {
  OASES_ASSERT(false, "recv from rank {} in a group of one", peer);
  return done();
}
std::unique_ptr<Work> SelfCommunicator::all_to_all_async(Tensor input, Tensor output) {
  copy(input, output, "all_to_all");
  return done();
}
std::unique_ptr<Work> SelfCommunicator::all_to_allv_async(Tensor input,
                                                          std::vector<std::int64_t> send_counts,
                                                          Tensor output,
                                                          std::vector<std::int64_t> recv_counts) {
  OASES_ASSERT(send_counts.size() == 1 && recv_counts.size() == 1 &&
                   send_counts[0] == recv_counts[0],
               "all_to_allv on a group of one needs one matching count");
  copy(Tensor(input.raw(), input.dtype(), {send_counts[0]}),
       Tensor(output.raw(), output.dtype(), {recv_counts[0]}), "all_to_allv");
  return done();
}
std::unique_ptr<Work> SelfCommunicator::barrier_async() { return done(); }

ShapeOnlyCommunicator::ShapeOnlyCommunicator(int rank, int size, std::string group_name)
    : rank_(rank), size_(size), name_(std::move(group_name)) {
  OASES_ASSERT(size >= 1 && rank >= 0 && rank < size, "rank {} of a group of {}", rank, size);
}

std::unique_ptr<Work> ShapeOnlyCommunicator::refuse() const {
  OASES_ASSERT(false, "group {} describes a shape only (rank {} of {}): nothing can move over it",
               name_, rank_, size_);
  __builtin_unreachable();
}

}  // namespace oases::comm
