#include "comm/communicator.h"

namespace oases::comm {
namespace {
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

std::unique_ptr<Work> SelfCommunicator::all_reduce_async(Tensor /*buffer*/, ReduceOp /*op*/) {
  return std::make_unique<CompletedWork>();
}

}  // namespace oases::comm
