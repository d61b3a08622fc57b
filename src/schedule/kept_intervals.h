// Live intervals of kept sets along a schedule: where a set produced by a Forward is read last
// on the forward side and first on the backward side. The passes that change how a set is held
// between the two (compress_kept_sets, partition_kept_checkpoints) share this reading of the
// schedule. Internal to schedule/.
#pragma once

#include "schedule/schedule.h"

#include <cstddef>
#include <vector>

namespace oases::schedule {

// One live interval of a set of instance (batch, segment, mb, sb), from the Forward that
// produced it to its Free, that some backward-side instruction reads.
struct KeptInterval {
  int batch = 0, segment = 0, micro_batch = 0, sub_batch = 0;
  ops::TensorSet set = ops::kCheckpoint;
  int chunk = 0;
  // The producing Forward, or a later forward-side reader (the segment's own collectives and
  // messages, the next segment's epilogue, a loss segment reading the head's logits).
  std::size_t last_forward_read = 0;
  // The first Recompute, Backward, BackwardWeight, backward collective or message reading it.
  std::size_t first_backward_read = 0;
  // Compute instructions strictly between the two: 0 means nothing else runs meanwhile.
  std::size_t compute_between = 0;
};

// Every such interval, in the order of their Frees. Sets a Recompute produces are read only
// backward-side and have none; sets still live at the end (carried to a later run) neither.
std::vector<KeptInterval> kept_intervals(const ops::Program& program, const Schedule& schedule);

bool is_compute_op(Op op);

}  // namespace oases::schedule
