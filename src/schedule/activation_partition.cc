// schedule::partition_kept_checkpoints (schedule.h): Partition, GatherSets and WaitSets around
// the backward-side wait of every replicated checkpoint.
#include "schedule/kept_intervals.h"
#include "schedule/schedule.h"

#include <vector>

namespace oases::schedule {

void partition_kept_checkpoints(const ops::Program& program, Schedule& schedule) {
  std::vector<std::vector<Instruction>> partitions_after(schedule.size()),
      gathers_before(schedule.size()), waits_before(schedule.size());
  for (const KeptInterval& interval : kept_intervals(program, schedule)) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(interval.segment)];
    if (interval.set != ops::kCheckpoint || !shape.checkpoint_replicated ||
        shape.collective_ranks <= 1 || interval.compute_between == 0)
      continue;
    Instruction ins{Op::partition};
    ins.segment = interval.segment;
    ins.micro_batch = interval.micro_batch;
    ins.sub_batch = interval.sub_batch;
    ins.batch = interval.batch;
    ins.chunk = interval.chunk;
    ins.sets = ops::kCheckpoint;
    partitions_after[interval.last_forward_read].push_back(ins);
    // The last compute instruction of another micro-batch or sub-batch after the Partition
    // and before the reader, else the last compute instruction there (one exists, since
    // compute runs between the two readers).
    std::size_t ahead = 0, nearest = 0;
    for (std::size_t i = interval.first_backward_read - 1; i > interval.last_forward_read; --i) {
      const Instruction& other = schedule[i];
      if (!is_compute_op(other.op)) continue;
      if (nearest == 0) nearest = i;
      if (other.micro_batch != interval.micro_batch || other.sub_batch != interval.sub_batch ||
          other.batch != interval.batch) {
        ahead = i;
        break;
      }
    }
    if (ahead == 0) ahead = nearest;
    ins.op = Op::gather_sets;
    gathers_before[ahead].push_back(ins);
    ins.op = Op::wait_sets;
    waits_before[interval.first_backward_read].push_back(ins);
  }

  Schedule out;
  out.reserve(schedule.size() * 2);
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    out.insert(out.end(), gathers_before[i].begin(), gathers_before[i].end());
    out.insert(out.end(), waits_before[i].begin(), waits_before[i].end());
    out.push_back(schedule[i]);
    out.insert(out.end(), partitions_after[i].begin(), partitions_after[i].end());
  }
  schedule = std::move(out);
}

}  // namespace oases::schedule
