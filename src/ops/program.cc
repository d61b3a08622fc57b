#include "ops/program.h"

namespace oases::ops {

double Work::flops() const {
  double total = 0;
  for (const MatMul& m : matmuls) total += m.flops();
  return total;
}

Work& Work::operator+=(const Work& other) {
  matmuls.insert(matmuls.end(), other.matmuls.begin(), other.matmuls.end());
  bytes += other.bytes;
  return *this;
}

Work SegmentWork::forward() const {
  Work w = checkpoint;
  w += internals;
  w += core;
  w += output;
  return w;
}

Work SegmentWork::recompute(TensorSets sets) const {
  Work w;
  if (sets & kCheckpoint) w += checkpoint;
  if (sets & kInternals) w += internals;
  if (sets & kCore) w += core;
  if (sets & kOutput) w += output;
  return w;
}

Work SegmentWork::backward(int stage, bool input_only) const {
  Work w;
  if (static_cast<std::size_t>(stage) < backward_input.size())
    w = backward_input[static_cast<std::size_t>(stage)];
  if (stage == 0 && !input_only) w += backward_weight;
  return w;
}

}  // namespace oases::ops
