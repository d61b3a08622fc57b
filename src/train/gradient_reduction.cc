#include "train/gradient_reduction.h"

#include "core/buffer.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "model/param_layout.h"
#include "optim/clip.h"

#include <algorithm>

namespace oases::train {
namespace {

// Names of the parameters the first and the last pipeline stage both hold, in the first
// stage's layout order (empty without a pipeline).
std::vector<std::string> tied_params(const plan::RunPlan& plan, const comm::Communicator& tp,
                                     const comm::Communicator& pp) {
  std::vector<std::string> tied;
  if (pp.size() <= 1) return tied;
  const auto layout_of_stage = [&](int stage) {
    return model::model_param_layout(plan.config.model, tp.rank(), tp.size(), plan.layer_degrees,
                                     plan.pipeline.stage_ranges(stage));
  };
  const model::ParamLayout first_stage = layout_of_stage(0);
  const model::ParamLayout last_stage = layout_of_stage(pp.size() - 1);
  for (const auto& p : first_stage.params()) {
    for (const auto& q : last_stage.params())
      if (p.name == q.name) tied.push_back(p.name);
  }
  return tied;
}

}  // namespace

void GradientReduction::sum_token_shard_gradients(int bucket) {
  for (const model::Model::TokenShardGradients& g : model_.token_shard_gradients()) {
    if (g.bucket != bucket || g.group->size() == 1) continue;
    std::int64_t elements = 0;
    for (const auto& [begin, end] : g.ranges) elements += end - begin;
    const Tensor& grads = model_.grads();
    const Tensor packed = shard_staging_.tensor(grads.dtype(), {elements});
    std::int64_t at = 0;
    for (const auto& [begin, end] : g.ranges) {
      kernels::copy(grads.view(begin, {end - begin}), packed.view(at, {end - begin}));
      at += end - begin;
    }
    g.group->all_reduce(packed, comm::ReduceOp::sum);
    at = 0;
    for (const auto& [begin, end] : g.ranges) {
      kernels::copy(packed.view(at, {end - begin}), grads.view(begin, {end - begin}));
      at += end - begin;
    }
  }
}

double sum_over(comm::Communicator& group, double value) {
  group.all_reduce(Tensor::of(&value, {1}), comm::ReduceOp::sum);
  return value;
}

GradientReduction::GradientReduction(const plan::RunPlan& plan, model::Model& model,
                                     GradientGroups groups)
    : plan_(plan),
      model_(model),
      groups_(std::move(groups)),
      tied_params_(tied_params(plan, *groups_.tp, *groups_.pp)) {
  // Staging for the largest group of shard gradients, allocated once (no step allocates).
  std::int64_t most = 0;
  for (const model::Model::TokenShardGradients& g : model_.token_shard_gradients()) {
    std::int64_t elements = 0;
    for (const auto& [begin, end] : g.ranges) elements += end - begin;
    most = std::max(most, elements);
  }
  if (most > 0)
    shard_staging_ = Buffer(static_cast<std::size_t>(most) * dtype_size(model_.grads().dtype()),
                            model_.grads().device());
}

comm::Communicator* GradientReduction::group_of(const model::Model::Bucket& b) const {
  // An MoE layer's experts split over expert-parallel ranks: the ranks with the same experts.
  if (b.experts && groups_.ep) {
    comm::Communicator& replicas = groups_.expert_replicas(model_.layer_degree(b.layer));
    return replicas.size() > 1 ? &replicas : nullptr;
  }
  if (b.layer >= 0 && model_.layer_degree(b.layer) < groups_.tp->size()) {
    OASES_ASSERT(groups_.tp_replica_group, "layer {} at degree {} needs the replica groups",
                 b.layer, model_.layer_degree(b.layer));
    return &groups_.tp_replica_group(model_.layer_degree(b.layer));
  }
  return groups_.dp->size() == 1 || plan_.local_sgd ? nullptr : groups_.dp;
}

std::size_t GradientReduction::reduced_bucket_count() const {
  std::size_t count = 0;
  for (const model::Model::Bucket& b : model_.grad_buckets()) count += group_of(b) != nullptr;
  return count;
}

std::vector<std::string> GradientReduction::tied_params_here() const {
  comm::Communicator& pp = *groups_.pp;
  const bool holds_tied = pp.rank() == 0 || pp.rank() == pp.size() - 1;
  return holds_tied ? tied_params_ : std::vector<std::string>{};
}

void GradientReduction::sum_tied_gradients() {
  comm::Communicator& pp = *groups_.pp;
  const int last = pp.size() - 1;
  if (tied_params_.empty() || (pp.rank() != 0 && pp.rank() != last)) return;
  const int peer = pp.rank() == 0 ? last : 0;
  // Both stages add the other's copy to their own: a + b and b + a are the same number, so the
  // copies stay identical.
  for (std::size_t i = 0; i < tied_params_.size(); ++i) {
    const Tensor mine = model_.layout().view(model_.grads(), model_.layout().find(tied_params_[i]));
    Buffer storage(mine.nbytes());
    const Tensor theirs(storage.data(), mine.dtype(), mine.shape());
    // Tags above the pipeline's message slots: under 2bw activations and gradients between
    // these two stages may still be in flight, and must not match these receives.
    const int first_tag =
        static_cast<int>(plan_.local_batch() / model_.micro_batch()) * plan_.schedule.sub_batches;
    const int tag = first_tag + static_cast<int>(i);
    auto sent = pp.send_async(mine, peer, tag);
    auto received = pp.recv_async(theirs, peer, tag);
    received->wait();
    sent->wait();
    kernels::add(mine, theirs, mine);
  }
}

bool GradientReduction::is_tied(const std::string& name) const {
  return std::ranges::find(tied_params_, name) != tied_params_.end();
}

GradientReduction::LocalSquares GradientReduction::local_squares(const Tensor& flat,
                                                                 const ZeroSharding& zero) const {
  LocalSquares s;
  const ZeroPartition& cuts = zero.partition();
  const int first_expert_group = model::expert_group_of(model_.config().layers, 0);
  for (const auto& p : model_.layout().params()) {
    // A tied parameter's copies on the first and last stage hold the same values: the first
    // stage counts it.
    if (groups_.pp->rank() > 0 && is_tied(p.name)) continue;
    const bool expert = groups_.ep && p.group >= first_expert_group;
    if (cuts.is_cut(p.group)) {
      const auto block = static_cast<std::size_t>(cuts.block(p.group));
      const std::int64_t lo = std::max(p.offset, cuts.cuts(p.group)[block]);
      const std::int64_t hi = std::min(p.offset + p.numel(), cuts.cuts(p.group)[block + 1]);
      const double squares = lo < hi ? optim::sum_of_squares(flat, lo, hi) : 0.0;
      if (expert) {
        const int degree = model_.layer_degree(p.group - first_expert_group);
        s.expert_blocks[degree][p.parts == 1 ? 0 : 1] += squares;
        continue;
      }
      (p.parts == 1 && &zero.group(p.group) == groups_.dp ? s.replicated_blocks
                                                          : s.sharded_blocks) += squares;
      continue;
    }
    const double squares = p.parts == 1 || groups_.tp->rank() < p.parts
                               ? optim::sum_of_squares(flat, p.offset, p.offset + p.numel())
                               : 0.0;
    if (expert) (p.parts == 1 ? s.experts : s.expert_shards) += squares;
    else (p.parts == 1 ? s.replicated : s.sharded) += squares;
  }
  return s;
}

double GradientReduction::sum_of_squares(const Tensor& flat, const ZeroSharding& zero) const {
  // Every rank of the tensor-parallel group holds the same values for a parameter with one
  // part (replicated, or a layer at degree 1): it counts once. A parameter in k parts is held
  // by tp / k replicas of each part: the first replica (ranks below k) counts it, and the group
  // sums. Under ZeRO (a partitioned bucket) each rank counts only its block, whose values only
  // it holds reduced: a replicated parameter's blocks are summed over the data-parallel group
  // (each tensor-parallel rank holds the same ones); a split parameter's, and every block of a
  // bucket partitioned over a layer's replica group (tensor- and data-parallel ranks at once),
  // over both groups.
  // Under expert parallelism each expert-parallel rank holds other experts (identical on the
  // ranks that replicate them): their squares are summed over the expert-parallel group, split
  // ones (experts of a layer at degree k > 1) over the tensor-parallel group too, from its first
  // k ranks. ZeRO's blocks of them are first summed over the replicas of their shard.
  LocalSquares s = local_squares(flat, zero);
  if (zero.partitions()) {
    double blocks[2] = {s.replicated_blocks, s.sharded_blocks};
    groups_.dp->all_reduce(Tensor::of(blocks, {2}), comm::ReduceOp::sum);
    s.replicated += blocks[0];
    s.sharded += blocks[1];
  }
  if (groups_.ep) {
    for (auto& [degree, blocks] : s.expert_blocks) {
      comm::Communicator& replicas = groups_.expert_replicas(degree);
      if (replicas.size() > 1) replicas.all_reduce(Tensor::of(blocks.data(), {2}), comm::ReduceOp::sum);
      s.experts += blocks[0];
      if (groups_.tp->rank() < degree) s.expert_shards += blocks[1];
    }
    double totals[2] = {s.experts, s.expert_shards};
    groups_.ep->all_reduce(Tensor::of(totals, {2}), comm::ReduceOp::sum);
    s.replicated += totals[0];
    s.sharded += totals[1];
  }
  double squares = sum_over(*groups_.tp, s.sharded) + s.replicated;
  if (groups_.pp->size() > 1) squares = sum_over(*groups_.pp, squares);
  return squares;
}

}  // namespace oases::train
