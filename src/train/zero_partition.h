// How ZeRO cuts one rank's gradient buckets (parallel.zero >= 1): each bucket summed over a
// group of more than one rank is cut into one block per rank of that group
// (optim::partition_range, where the optimizer allows a cut), and this rank owns the block of
// its place in the group; a bucket summed by nobody stays whole and is this rank's alone.
//
// The cuts depend only on the buckets, the optimizer and where this rank sits in each bucket's
// reduction group, so the engine (from its communicators) and the cluster simulation (from the
// mesh's layout of a shape-only model) cut alike and count the same memory.
#pragma once

#include "model/model.h"
#include "optim/flat_layout.h"
#include "optim/optimizer.h"
#include "optim/zero_partition.h"
#include "schedule/schedule.h"

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace oases::train {

// A rank's place in the group that sums a bucket's gradients.
struct GroupPlace {
  int size = 1;
  int rank = 0;
};

class ZeroPartition {
 public:
  // No partition: every bucket whole.
  ZeroPartition() = default;
  // The cuts of every bucket whose group (place_of) has more than one rank.
  ZeroPartition(const std::vector<model::Model::Bucket>& buckets, const optim::FlatLayout& whole,
                const optim::OptimizerConfig& optimizer,
                const std::function<GroupPlace(const model::Model::Bucket&)>& place_of);

  // Whether some bucket is cut.
  bool partitions() const { return !cut_.empty(); }
  // Whether bucket `bucket` is cut, and then its block offsets (group size + 1 of them), this
  // rank's block and the blocks' lengths.
  bool is_cut(int bucket) const { return cut_.contains(bucket); }
  const std::vector<std::int64_t>& cuts(int bucket) const { return cut_.at(bucket).cuts; }
  int block(int bucket) const { return cut_.at(bucket).block; }
  std::vector<std::int64_t> counts(int bucket) const;
  // The ids of the cut buckets, ascending.
  std::vector<int> cut_buckets() const;

  // visit(begin, end) for the range this rank updates of each bucket: its block of a cut one,
  // the whole of any other, in bucket order.
  void for_each_owned_range(const std::vector<model::Model::Bucket>& buckets,
                            const std::function<void(std::int64_t, std::int64_t)>& visit) const;
  // visit(begin, end) for the ranges of `bucket` other ranks own (none when it is whole).
  void for_each_foreign_range(const model::Model::Bucket& bucket,
                              const std::function<void(std::int64_t, std::int64_t)>& visit) const;
  // The ranges for_each_owned_range visits, and how many elements they hold.
  std::vector<optim::OwnedRange> owned_ranges(const std::vector<model::Model::Bucket>& buckets) const;
  std::int64_t owned_elements(const std::vector<model::Model::Bucket>& buckets) const;
  // ZeRO-3: the most bytes of other ranks' blocks (elements of `element` bytes) that `schedule`
  // holds gathered at once, between its GatherParams and ReleaseParams.
  std::size_t peak_gathered_bytes(const schedule::Schedule& schedule, const model::Model& model,
                                  std::size_t element) const;

 private:
  struct Cut {
    int block = 0;
    std::vector<std::int64_t> cuts;
  };
  std::map<int, Cut> cut_;
};

}  // namespace oases::train
