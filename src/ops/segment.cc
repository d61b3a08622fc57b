#include "ops/segment.h"

#include "core/error.h"

namespace oases::ops {

Segment::CollectiveCall Segment::forward_collective(int, int) {
  OASES_ASSERT(false, "segment {} has no forward collective", name());
  __builtin_unreachable();
}

Segment::CollectiveCall Segment::backward_collective(int, int) {
  OASES_ASSERT(false, "segment {} has no backward collective", name());
  __builtin_unreachable();
}

Tensor Segment::send_buffer(Payload, int, int) {
  OASES_ASSERT(false, "segment {} sends nothing to another pipeline stage", name());
  __builtin_unreachable();
}

Tensor Segment::recv_buffer(Payload, int, int) {
  OASES_ASSERT(false, "segment {} receives nothing from another pipeline stage", name());
  __builtin_unreachable();
}

void Segment::recompute(const StepContext&, int, int, TensorSets sets) {
  OASES_ASSERT(sets == 0, "segment {} has nothing to recompute ({} asked)", name(),
               tensor_sets_name(sets));
}

void Segment::backward_input(const StepContext& ctx, int mb, int sb, int stage) {
  backward(ctx, mb, sb, stage);
}

void Segment::backward_weight(const StepContext&, int, int) {
  OASES_ASSERT(false, "segment {} has no weight part to run on its own", name());
}

void Segment::release(int mb, int sb, TensorSets sets) {
  for (TensorSet set : {kCheckpoint, kInternals, kCore})
    if (sets & set) store_.release(key(mb, sb, set));
}

void Segment::encode(int mb, int sb, TensorSets sets, ActivationEncoding encoding) {
  for (TensorSet set : {kCheckpoint, kInternals, kCore})
    if (sets & set) store_.encode(key(mb, sb, set), encoding);
}

void Segment::decode(int mb, int sb, TensorSets sets) {
  for (TensorSet set : {kCheckpoint, kInternals, kCore})
    if (sets & set) store_.decode(key(mb, sb, set));
}

namespace {
comm::Communicator& checked_replica_group(const Segment& segment, TensorSets sets) {
  OASES_ASSERT(sets == kCheckpoint, "segment {}: only the checkpoint is partitioned ({} asked)",
               segment.name(), tensor_sets_name(sets));
  comm::Communicator* group = segment.replica_group();
  OASES_ASSERT(group != nullptr, "segment {} has no replicated checkpoint to partition",
               segment.name());
  return *group;
}
}  // namespace

void Segment::partition(int mb, int sb, TensorSets sets) {
  const comm::Communicator& group = checked_replica_group(*this, sets);
  store_.partition(key(mb, sb, kCheckpoint), group.rank(), group.size());
}

Segment::CollectiveCall Segment::gather_sets(int mb, int sb, TensorSets sets) {
  comm::Communicator& group = checked_replica_group(*this, sets);
  const ActivationStore::Unpartitioned whole = store_.unpartition(key(mb, sb, kCheckpoint));
  return {CollectiveKind::all_gather, comm::ReduceOp::sum, &group, whole.gathered, whole.own};
}

}  // namespace oases::ops
