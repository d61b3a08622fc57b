#include "train/zero_sharding.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <algorithm>

namespace oases::train {

ZeroSharding::ZeroSharding(const plan::RunPlan& plan, model::Model& model,
                           const optim::FlatLayout& whole, const GroupOf& group_of)
    : plan_(plan), model_(model) {
  if (plan.zero.stage == 0) return;
  zero_ = ZeroPartition(model.grad_buckets(), whole, plan.optimizer,
                        [&](const model::Model::Bucket& b) {
                          comm::Communicator* group = group_of(b);
                          if (group != nullptr && group->size() > 1) groups_[b.id] = group;
                          return group ? GroupPlace{group->size(), group->rank()} : GroupPlace{};
                        });
}

ZeroSharding::~ZeroSharding() {
  // The communicators outlive the engine, but not the parameters the gathers write into.
  for (auto& [bucket, gather] : param_gathers_) gather->wait();
}

void ZeroSharding::for_each_owned_range(const RangeVisitor& visit) const {
  zero_.for_each_owned_range(model_.grad_buckets(), visit);
}

std::vector<optim::OwnedRange> ZeroSharding::owned_ranges() const {
  return zero_.owned_ranges(model_.grad_buckets());
}

void ZeroSharding::for_each_foreign_range(int bucket, const RangeVisitor& visit) const {
  zero_.for_each_foreign_range(model_.bucket(bucket), visit);
}

std::unique_ptr<comm::Work> ZeroSharding::start_reduction(int bucket, comm::Communicator& group,
                                                          const Tensor& buffer) const {
  return zero_.is_cut(bucket)
             ? group.reduce_scatter_blocks_async(buffer, zero_.counts(bucket), comm::ReduceOp::sum)
             : group.all_reduce_async(buffer, comm::ReduceOp::sum);
}

void ZeroSharding::track_reduction(comm::Work* reduction, int bucket) {
  if (plan_.zero.stage < 2 || !zero_.is_cut(bucket)) return;
  // The other ranks' blocks of a bucket go back to the operating system as soon as its
  // reduction is seen complete (here, as later buckets start, and at the latest when the
  // optimizer step waits for them all).
  release_reduced_blocks(false);
  unreleased_.push_back({reduction, bucket});
}

void ZeroSharding::release_reduced_blocks(bool wait) {
  std::erase_if(unreleased_, [&](const UnreleasedBucket& pending) {
    if (!wait && !pending.reduction->test()) return false;
    pending.reduction->wait();  // a bf16 reduction widens its result here
    for_each_foreign_range(pending.bucket, [&](std::int64_t begin, std::int64_t end) {
      model_.release_grads(begin, end);
    });
    return true;
  });
}

void ZeroSharding::gather_whole_gradients(const std::vector<std::string>& names) {
  std::vector<std::unique_ptr<comm::Work>> gathers;
  for (const std::string& name : names) {
    const model::ParamSpec& p = model_.layout().find(name);
    if (!zero_.is_cut(p.group)) continue;
    // The parameter's share of each rank's block.
    std::vector<std::int64_t> counts;
    const std::vector<std::int64_t>& cuts = zero_.cuts(p.group);
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
      counts.push_back(std::max<std::int64_t>(0, std::min(cuts[i + 1], p.offset + p.numel()) -
                                                     std::max(cuts[i], p.offset)));
    gathers.push_back(group(p.group).all_gather_blocks_async(
        model_.layout().view(model_.grads(), p), std::move(counts)));
  }
  for (auto& work : gathers) work->wait();
}

std::unique_ptr<comm::Work> ZeroSharding::gather_blocks(int bucket, const Tensor& flat) const {
  const model::Model::Bucket& b = model_.bucket(bucket);
  return group(bucket).all_gather_blocks_async(flat.view(b.begin, {b.end - b.begin}),
                                               zero_.counts(bucket));
}

void ZeroSharding::step(optim::Optimizer& optimizer, const optim::StepInfo& info) {
  if (plan_.schedule.sharded_params) return step_sharded(optimizer, info);
  if (!zero_.partitions()) return step_whole(optimizer, info);
  if (plan_.schedule.deferred_param_gather) return step_deferring_gathers(optimizer, info);
  step_gathering(optimizer, info);
}

void ZeroSharding::step_sharded(optim::Optimizer& optimizer, const optim::StepInfo& info) {
  // ZeRO-3: each rank updates its own blocks; the next forward gathers them where needed.
  for (const model::Model::Bucket& b : model_.grad_buckets())
    optimizer.step(model_.params(), model_.grads(), b.begin, b.end, info);
  refresh_held_compute_params();
}

void ZeroSharding::step_whole(optim::Optimizer& optimizer, const optim::StepInfo& info) {
  optimizer.step(model_.params(), model_.grads(), info);
  model_.refresh_compute_params();
}

void ZeroSharding::step_deferring_gathers(optim::Optimizer& optimizer,
                                          const optim::StepInfo& info) {
  // ZeRO-1 and 2: each bucket's gather starts once its blocks are updated (with mixed
  // precision, those of the 16-bit copy; the master's only for a checkpoint) and is waited
  // for by the next run's schedule.
  for (const model::Model::Bucket& b : model_.grad_buckets()) {
    optimizer.step(model_.params(), model_.grads(), b.begin, b.end, info);
    if (!zero_.is_cut(b.id)) {
      model_.refresh_compute_params(b.begin, b.end);
      continue;
    }
    const auto block = static_cast<std::size_t>(zero_.block(b.id));
    model_.refresh_compute_params(zero_.cuts(b.id)[block], zero_.cuts(b.id)[block + 1]);
    stale_buckets_.insert(b.id);
    start_param_gather(b.id);
  }
}

void ZeroSharding::step_gathering(optim::Optimizer& optimizer, const optim::StepInfo& info) {
  // ZeRO: bucket by bucket, in the order the next forward reads them, so that the gather of
  // one bucket's updated blocks travels while the next bucket's blocks are updated.
  std::vector<std::unique_ptr<comm::Work>> gathers;
  for (const model::Model::Bucket& b : model_.grad_buckets()) {
    optimizer.step(model_.params(), model_.grads(), b.begin, b.end, info);
    if (zero_.is_cut(b.id)) gathers.push_back(gather_blocks(b.id, model_.params()));
  }
  for (auto& work : gathers) work->wait();
  model_.refresh_compute_params();
}

void ZeroSharding::start_param_gather(int bucket) {
  if (!stale_buckets_.contains(bucket) || param_gathers_.contains(bucket)) return;
  param_gathers_[bucket] = gather_blocks(bucket, model_.compute_params());
}

runtime::StepHooks ZeroSharding::with_param_hooks(runtime::StepHooks hooks) {
  if (plan_.schedule.deferred_param_gather) {
    // Only buckets updated since their last gather travel (most are on their way since the
    // update); the others are whole already.
    hooks.gather_params = [this](int bucket) { start_param_gather(bucket); };
    hooks.wait_params = [this](int bucket) {
      const auto gather = param_gathers_.find(bucket);
      if (gather == param_gathers_.end()) return;
      gather->second->wait();
      param_gathers_.erase(gather);
      stale_buckets_.erase(bucket);
    };
    return hooks;
  }
  if (!plan_.schedule.sharded_params) return hooks;
  // Buckets nobody else holds (not partitioned) stay whole: their instructions do nothing.
  hooks.gather_params = [this](int bucket) {
    if (!zero_.is_cut(bucket)) return;
    OASES_ASSERT(!param_gathers_.contains(bucket), "bucket {} gathered twice", bucket);
    param_gathers_[bucket] = gather_blocks(bucket, model_.compute_params());
  };
  hooks.wait_params = [this](int bucket) {
    const auto gather = param_gathers_.find(bucket);
    if (gather == param_gathers_.end()) return;
    gather->second->wait();
    param_gathers_.erase(gather);
  };
  hooks.release_params = [this](int bucket) {
    for_each_foreign_range(bucket, [&](std::int64_t begin, std::int64_t end) {
      model_.release_compute_params(begin, end);
    });
  };
  return hooks;
}

void ZeroSharding::finish_param_gathers() {
  for (auto& [bucket, gather] : param_gathers_) {
    gather->wait();
    stale_buckets_.erase(bucket);
  }
  param_gathers_.clear();
}

void ZeroSharding::shard_params() {
  finish_param_gathers();
  stale_buckets_.clear();  // whole parameters were written
  if (!plan_.schedule.sharded_params) return;
  refresh_held_compute_params();
  for (const int id : zero_.cut_buckets()) {
    for_each_foreign_range(id, [&](std::int64_t begin, std::int64_t end) {
      model_.release_compute_params(begin, end);
      if (model_.mixed_precision()) model_.release_master_params(begin, end);
    });
  }
}

void ZeroSharding::gather_whole_params(const Tensor* stashed) {
  finish_param_gathers();
  const bool sharded = plan_.schedule.sharded_params;
  const bool deferred = plan_.schedule.deferred_param_gather;
  if (!sharded && stale_buckets_.empty() && !model_.mixed_precision()) return;
  if (!sharded && !deferred) return;
  std::vector<std::unique_ptr<comm::Work>> gathers;
  for (const int id : zero_.cut_buckets()) {
    // Deferred gathers: the master copy's other blocks are stale in every bucket (only the
    // 16-bit copy is gathered ahead of use); without mixed precision only in stale buckets.
    if (deferred && !model_.mixed_precision() && !stale_buckets_.contains(id)) continue;
    gathers.push_back(gather_blocks(id, model_.params()));
  }
  // 2bw under ZeRO-3: the stashed version, which a checkpoint saves too.
  if (sharded && stashed != nullptr)
    for (const int id : zero_.cut_buckets()) gathers.push_back(gather_blocks(id, *stashed));
  for (auto& work : gathers) work->wait();
  if (deferred) {
    model_.refresh_compute_params();
    stale_buckets_.clear();
  }
}

void ZeroSharding::refresh_held_compute_params() {
  if (!plan_.schedule.sharded_params) return model_.refresh_compute_params();
  for_each_owned_range([&](std::int64_t begin, std::int64_t end) {
    model_.refresh_compute_params(begin, end);
  });
}

std::size_t ZeroSharding::peak_gathered_bytes(const schedule::Schedule& schedule) const {
  if (!plan_.schedule.sharded_params) return 0;
  return zero_.peak_gathered_bytes(schedule, model_, dtype_size(model_.compute_params().dtype()));
}

std::int64_t ZeroSharding::owned_start(const optim::Optimizer& mine,
                                       const optim::StateTensor& state) const {
  const auto& parts = mine.layout().params;
  const auto part = std::ranges::find(parts, state.param, &optim::ParamSlot::name);
  OASES_ASSERT(part != parts.end() && state.elementwise,
               "optimizer state {} of a part of {} that is not element-wise", state.name,
               state.param);
  return part->offset - model_.layout().find(state.param).offset;
}

Tensor ZeroSharding::owned_view(const optim::Optimizer& mine, const optim::StateTensor& state,
                                const Tensor& whole) const {
  return whole.numel() == state.view.numel() ? whole.reshaped(state.view.shape())
                                             : whole.view(owned_start(mine, state), {state.view.numel()});
}

void ZeroSharding::gather_whole_state(optim::Optimizer& mine, optim::Optimizer& whole) const {
  std::map<std::string, Tensor> whole_views;
  for (const optim::StateTensor& s : whole.state_tensors()) whole_views.emplace(s.name, s.view);
  // Each element of the state is this rank's or zero here; a sum over the owners then leaves
  // every value exactly as its owner holds it.
  for (const optim::StateTensor& s : mine.state_tensors())
    kernels::copy(s.view, owned_view(mine, s, whole_views.at(s.name)));
  for (const optim::StateTensor& s : whole.state_tensors()) {
    const int bucket = model_.layout().find(s.param).group;
    if (zero_.is_cut(bucket)) group(bucket).all_reduce(s.view, comm::ReduceOp::sum);
  }
}

void ZeroSharding::keep_owned_state(optim::Optimizer& whole, optim::Optimizer& mine) const {
  std::map<std::string, Tensor> whole_views;
  for (const optim::StateTensor& s : whole.state_tensors()) whole_views.emplace(s.name, s.view);
  for (const optim::StateTensor& s : mine.state_tensors())
    kernels::copy(owned_view(mine, s, whole_views.at(s.name)), s.view);
}

}  // namespace oases::train
