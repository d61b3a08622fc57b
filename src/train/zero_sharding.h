// ZeroSharding: the training engine's part for ZeRO (parallel.zero), over one rank's model.
//
// ZeroPartition (train/zero_partition.h) says where each gradient bucket is cut; this part
// does the work that follows from the cuts, step by step:
//   - reductions: a cut bucket's gradients are reduce-scattered (each rank receives the sum of
//     its own block, in place), any other bucket's all-reduced; ZeRO-2 gives the pages of the
//     other ranks' blocks back as soon as a bucket's reduction is seen complete;
//   - updates: the optimizer (which holds the state of this rank's blocks only) updates this
//     rank's blocks; the other ranks' updated blocks are then gathered: at once (ZeRO-1 and 2),
//     deferred into the next run's schedule (schedule::ScheduleSpec::deferred_param_gather), or
//     not at all (ZeRO-3, whose schedule gathers each bucket where it is read);
//   - parameters between uses (ZeRO-3, schedule::ScheduleSpec::sharded_params): the schedule's
//     GatherParams, WaitParams and ReleaseParams, and the pages of the others' blocks given
//     back between runs;
//   - checkpoints: the whole optimizer state assembled from every rank's blocks, and a whole
//     state's blocks kept by their owners.
// Without ZeRO (or when no bucket is summed over more than one rank) nothing is cut, and every
// call reduces to what a run without ZeRO does.
//
// Invariants between the engine's calls: every gather this part starts is waited for before
// the parameters it writes are read whole (WaitParams, finish_param_gathers, or the destructor);
// under ZeRO-3 at most one gather per bucket is in flight, and none once a run has ended;
// stale buckets (deferred gathers) are exactly those whose other blocks changed in the last
// update and have not been gathered since.
//
// Who calls what: the engine constructs it after the model (the cuts need the model's buckets
// and the groups that sum them) and before the optimizer (which is made over owned_ranges());
// the engine's reduction hook calls start_reduction and track_reduction, its optimizer step
// calls release_reduced_blocks(true) and step(); every executor run gets its hooks through
// with_param_hooks. Collective calls (marked) must be made by every rank of the groups alike.
#pragma once

#include "comm/communicator.h"
#include "model/model.h"
#include "optim/flat_layout.h"
#include "optim/optimizer.h"
#include "optim/zero_partition.h"
#include "plan/run_plan.h"
#include "runtime/executor.h"
#include "schedule/schedule.h"
#include "train/zero_partition.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace oases::train {

class ZeroSharding {
 public:
  // The group that sums a bucket's gradients (null: nobody else holds them).
  using GroupOf = std::function<comm::Communicator*(const model::Model::Bucket&)>;
  using RangeVisitor = std::function<void(std::int64_t begin, std::int64_t end)>;

  // Under plan.zero.stage >= 1 cuts every bucket of `model` whose group (group_of) has more
  // than one rank, over that group; `whole` is the flat layout of the model's parameters (the
  // optimizer's cuts follow it). `plan`, `model` and the groups must outlive the part.
  ZeroSharding(const plan::RunPlan& plan, model::Model& model, const optim::FlatLayout& whole,
               const GroupOf& group_of);
  // Waits for the gathers in flight: they write into the model's parameters.
  ~ZeroSharding();
  ZeroSharding(const ZeroSharding&) = delete;
  ZeroSharding& operator=(const ZeroSharding&) = delete;

  const ZeroPartition& partition() const { return zero_; }
  bool partitions() const { return zero_.partitions(); }
  bool is_cut(int bucket) const { return zero_.is_cut(bucket); }
  // The group a cut bucket is summed, scattered and gathered over. REQUIRES: is_cut(bucket).
  comm::Communicator& group(int bucket) const { return *groups_.at(bucket); }
  // Whether parameters are partitioned between uses (ZeRO-3 over a group of more than one).
  bool params_sharded() const { return plan_.schedule.sharded_params; }
  // visit(begin, end) for the flat range of every bucket this rank updates: its block of a cut
  // bucket, the whole of any other, in bucket order; and those ranges as a list.
  void for_each_owned_range(const RangeVisitor& visit) const;
  std::vector<optim::OwnedRange> owned_ranges() const;
  // visit(begin, end) for the ranges of bucket `bucket` other ranks own (none unless cut).
  void for_each_foreign_range(int bucket, const RangeVisitor& visit) const;

  // The sum of bucket `bucket`'s gradients (or a copy of them) in `buffer` over `group`,
  // started: each rank's own block reduced in place when the bucket is cut, else an all-reduce.
  std::unique_ptr<comm::Work> start_reduction(int bucket, comm::Communicator& group,
                                              const Tensor& buffer) const;
  // ZeRO-2, after the reduction of a cut bucket started: first gives back the other ranks'
  // blocks of every earlier bucket whose reduction has completed, then remembers this one.
  // `reduction` must live until release_reduced_blocks(true). Nothing under other stages.
  void track_reduction(comm::Work* reduction, int bucket);
  // ZeRO-2: gives back the gradient pages outside this rank's block of every tracked bucket
  // whose reduction has completed (`wait`: of every one, waiting for them).
  void release_reduced_blocks(bool wait);
  // Gathers whole the reduced gradients of the parameters named (cut buckets only; each rank
  // holds only its block's sum), waiting for them. Collective over their buckets' groups.
  void gather_whole_gradients(const std::vector<std::string>& names);

  // The optimizer's update of this rank's parameters (params(), from grads()), then the
  // gathers the stage asks for, and the compute copy refreshed where this rank holds it.
  // Collective over the cut buckets' groups.
  void step(optim::Optimizer& optimizer, const optim::StepInfo& info);

  // `hooks` with the schedule's parameter instructions: ZeRO-3's GatherParams, WaitParams and
  // ReleaseParams, or deferred gathers' GatherParams and WaitParams (only buckets updated
  // since their last gather travel). Unchanged otherwise. The hooks refer to this part.
  runtime::StepHooks with_param_hooks(runtime::StepHooks hooks);
  // Gathers of parameters started and not yet waited for.
  std::size_t gathers_in_flight() const { return param_gathers_.size(); }
  // Waits for every gather of parameters in flight.
  void finish_param_gathers();
  // After whole parameters were written into the model's master copy (every rank alike):
  // ZeRO-3 refreshes the compute copy of this rank's blocks and gives back the pages of the
  // others' blocks; otherwise nothing is left to gather.
  void shard_params();
  // Makes the master parameters whole (blocking; collective): ZeRO-3 gathers every cut bucket,
  // and `stashed` (an array laid out like the parameters, or null) too; deferred gathers bring
  // the stale blocks and refresh the compute copy.
  void gather_whole_params(const Tensor* stashed);
  // The compute copy of the parameters this rank holds made current (under ZeRO-3 its blocks;
  // the others are gathered where the schedule needs them).
  void refresh_held_compute_params();
  // ZeRO-3: the most bytes of other ranks' blocks (in the compute type) `schedule` holds
  // gathered at once; 0 otherwise.
  std::size_t peak_gathered_bytes(const schedule::Schedule& schedule) const;

  // Checkpoints. `mine` is this rank's optimizer (over owned_ranges()), `whole` one over the
  // whole layout. gather_whole_state fills `whole` with every rank's state (collective over the
  // cut buckets' groups); keep_owned_state copies this rank's parts of `whole` into `mine`.
  // REQUIRES: partitions().
  void gather_whole_state(optim::Optimizer& mine, optim::Optimizer& whole) const;
  void keep_owned_state(optim::Optimizer& whole, optim::Optimizer& mine) const;

 private:
  // The four ways an update reaches the parameters (step()).
  void step_sharded(optim::Optimizer& optimizer, const optim::StepInfo& info);
  void step_whole(optim::Optimizer& optimizer, const optim::StepInfo& info);
  void step_deferring_gathers(optim::Optimizer& optimizer, const optim::StepInfo& info);
  void step_gathering(optim::Optimizer& optimizer, const optim::StepInfo& info);
  // Deferred gathers: starts the gather of bucket `bucket`'s updated blocks (of the compute
  // copy) unless it is not stale or already on its way.
  void start_param_gather(int bucket);
  // Starts the gather of cut bucket `bucket`'s blocks of `flat` (laid out like the parameters).
  std::unique_ptr<comm::Work> gather_blocks(int bucket, const Tensor& flat) const;
  // Where the part of a parameter that optimizer state `state` of `mine` (a cut parameter's,
  // so element-wise) belongs to starts in the whole parameter.
  std::int64_t owned_start(const optim::Optimizer& mine, const optim::StateTensor& state) const;
  // This rank's view of `state` (of `mine`) in the whole state tensor `whole`.
  Tensor owned_view(const optim::Optimizer& mine, const optim::StateTensor& state,
                    const Tensor& whole) const;

  const plan::RunPlan& plan_;
  model::Model& model_;
  ZeroPartition zero_;
  std::map<int, comm::Communicator*> groups_;  // by cut bucket; this rank owns block rank()
  // ZeRO-2: reductions started whose buckets still hold the other ranks' blocks.
  struct UnreleasedBucket {
    comm::Work* reduction = nullptr;  // owned by the step's list of reductions
    int bucket = 0;
  };
  std::vector<UnreleasedBucket> unreleased_;
  // The parameter gathers started (GatherParams, or a deferred one) and not waited for.
  std::map<int, std::unique_ptr<comm::Work>> param_gathers_;
  // Deferred gathers (ZeRO-1 and 2): buckets whose other ranks' blocks changed in the last
  // update and have not been gathered since.
  std::set<int> stale_buckets_;
};

}  // namespace oases::train
