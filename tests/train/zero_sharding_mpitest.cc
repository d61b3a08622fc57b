// ZeroSharding (train/zero_sharding.h) and GradientReduction (train/gradient_reduction.h)
// without an engine, over the data-parallel group of two ranks that sums every bucket of the
// tiny model: the cuts and owned blocks, ZeRO-2's release of reduced blocks, ZeRO-3's
// parameter pages between uses and the schedule's gather hooks, ZeRO-1's update with deferred
// gathers, the whole optimizer state assembled for a checkpoint, and the global sum of squares
// counting each block once. Run at 2 ranks.
#include "comm/mesh.h"
#include "core/buffer.h"
#include "core/error.h"
#include "mpi_test_support.h"
#include "optim/clip.h"
#include "optim/zero_partition.h"
#include "plan/run_plan.h"
#include "support/tiny_run.h"
#include "train/engine.h"
#include "train/gradient_reduction.h"
#include "train/zero_sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

namespace oases::train {
namespace {

namespace mpitest = comm::mpitest;

std::vector<double> contents(const Tensor& t) {
  const double* p = t.data<double>();
  return {p, p + t.numel()};
}

// The mesh's groups, every layer at parallel.tp and no experts split.
GradientGroups gradient_groups(comm::Mesh& mesh) {
  GradientGroups groups;
  groups.tp = &mesh.tp_group();
  groups.dp = &mesh.dp_group();
  groups.pp = &mesh.pp_group();
  return groups;
}

// One rank's tiny model in fp64 under parallel.zero = `zero` at dp = 2, with its parts.
struct Rank {
  explicit Rank(int zero, int dp = 2)
      : mesh(comm::Mesh::create(mpitest::runtime(), 1, dp, 1, mpitest::test_options())) {
    plan::RunConfig c = oases::testing::tiny_run();
    c.train.precision = "fp64";
    c.parallel.dp = dp;
    c.parallel.zero = zero;
    plan = plan::make_run_plan(c, mesh.world_rank());
    model::ModelOptions o = plan.model_options(0);
    o.tp = &mesh.tp_group();
    model = std::make_unique<model::Model>(plan.config.model, o);
    reduction = std::make_unique<GradientReduction>(plan, *model, gradient_groups(mesh));
    whole = flat_layout(model->layout(), model->dtype());
    zero_sharding = std::make_unique<ZeroSharding>(
        plan, *model, whole, [&](const model::Model::Bucket& b) { return reduction->group_of(b); });
  }
  // An optimizer over the blocks this rank owns.
  std::unique_ptr<optim::Optimizer> owned_optimizer() const {
    return optim::make_optimizer(plan.optimizer,
                                 optim::owned_layout(whole, zero_sharding->owned_ranges()));
  }
  comm::Communicator& dp() { return mesh.dp_group(); }

  comm::Mesh mesh;
  plan::RunPlan plan;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<GradientReduction> reduction;
  optim::FlatLayout whole;
  std::unique_ptr<ZeroSharding> zero_sharding;
};

// Element i of this rank's made-up gradients: different on the two ranks.
double gradient_value(int rank, std::int64_t i) {
  return (rank + 1) * 0.001 * static_cast<double>(i % 11 - 5);
}

TEST(ZeroSharding, EveryBucketSummedOverTheGroupIsCutIntoOneBlockPerRank) {
  Rank r(1);
  ZeroSharding& zero = *r.zero_sharding;
  ASSERT_TRUE(zero.partitions());
  std::int64_t owned = 0;
  for (const model::Model::Bucket& b : r.model->grad_buckets()) {
    ASSERT_TRUE(zero.is_cut(b.id)) << b.id;
    EXPECT_EQ(&zero.group(b.id), &r.dp());
    std::int64_t foreign = 0;
    zero.for_each_foreign_range(b.id, [&](std::int64_t begin, std::int64_t end) {
      foreign += end - begin;
    });
    const auto block = static_cast<std::size_t>(zero.partition().block(b.id));
    EXPECT_EQ(foreign + zero.partition().counts(b.id)[block], b.end - b.begin);
  }
  zero.for_each_owned_range([&](std::int64_t begin, std::int64_t end) { owned += end - begin; });
  // The two ranks' blocks cover the parameters once.
  double total = static_cast<double>(owned);
  r.dp().all_reduce(Tensor::of(&total, {1}));
  EXPECT_EQ(total, static_cast<double>(r.model->param_count()));
}

// ZeRO-2: a cut bucket is reduce-scattered in place; once its reduction is seen complete, the
// pages of the other rank's block go back, and this rank's block holds the sum of both.
TEST(ZeroSharding, Zero2GivesBackTheOtherBlockOfAReducedBucket) {
  Rank r(2);
  ZeroSharding& zero = *r.zero_sharding;
  const int rank = r.dp().rank();
  double* grads = r.model->grads().data<double>();
  for (std::int64_t i = 0; i < r.model->param_count(); ++i) grads[i] = gradient_value(rank, i);
  const std::size_t resident = r.model->resident_grad_bytes();
  std::vector<std::unique_ptr<comm::Work>> reductions;
  for (const model::Model::Bucket& b : r.model->grad_buckets()) {
    const Tensor bucket = r.model->grads().view(b.begin, {b.end - b.begin});
    reductions.push_back(zero.start_reduction(b.id, zero.group(b.id), bucket));
    zero.track_reduction(reductions.back().get(), b.id);
  }
  zero.release_reduced_blocks(true);
  EXPECT_LT(r.model->resident_grad_bytes(), resident);
  zero.for_each_owned_range([&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      ASSERT_EQ(grads[i], gradient_value(0, i) + gradient_value(1, i)) << i;
  });
  for (const model::Model::Bucket& b : r.model->grad_buckets())
    zero.for_each_foreign_range(b.id, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) ASSERT_EQ(grads[i], 0.0) << i;
    });
}

// ZeRO-3: between uses a rank holds its blocks alone; GatherParams brings a bucket whole (once
// at a time), WaitParams waits for it, ReleaseParams gives the other block back.
TEST(ZeroSharding, Zero3HoldsItsBlocksAndGathersABucketWhereTheScheduleReadsIt) {
  Rank r(3);
  ZeroSharding& zero = *r.zero_sharding;
  ASSERT_TRUE(zero.params_sharded());
  const std::vector<double> whole = contents(r.model->params());  // the same on both ranks
  const std::size_t resident = r.model->resident_param_bytes();
  zero.shard_params();
  EXPECT_LT(r.model->resident_param_bytes(), resident);
  const int bucket = r.model->grad_buckets()[1].id;
  const model::Model::Bucket& b = r.model->bucket(bucket);
  const auto bucket_values = [&] {
    const std::vector<double> all = contents(r.model->compute_params());
    return std::vector<double>(all.begin() + b.begin, all.begin() + b.end);
  };
  const std::vector<double> expected(whole.begin() + b.begin, whole.begin() + b.end);
  EXPECT_NE(bucket_values(), expected);

  const runtime::StepHooks hooks = zero.with_param_hooks({});
  hooks.gather_params(bucket);
  EXPECT_EQ(zero.gathers_in_flight(), 1u);
  EXPECT_THROW(hooks.gather_params(bucket), InternalError);
  hooks.wait_params(bucket);
  EXPECT_EQ(zero.gathers_in_flight(), 0u);
  EXPECT_EQ(bucket_values(), expected);
  hooks.release_params(bucket);
  zero.for_each_foreign_range(bucket, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      ASSERT_EQ(r.model->compute_params().data<double>()[i], 0.0) << i;
  });
  // For a checkpoint, every parameter made whole again.
  zero.gather_whole_params(nullptr);
  EXPECT_EQ(contents(r.model->params()), whole);
}

// ZeRO-1: each rank updates its blocks; the gathers of the others' blocks start with the
// update and are waited for where the next run's schedule reads each bucket. The result is
// bit for bit the update of the whole layout.
TEST(ZeroSharding, Zero1UpdatesItsBlocksAndDefersTheGathers) {
  Rank r(1);
  ZeroSharding& zero = *r.zero_sharding;
  ASSERT_TRUE(r.plan.schedule.deferred_param_gather);
  double* grads = r.model->grads().data<double>();
  for (std::int64_t i = 0; i < r.model->param_count(); ++i) grads[i] = gradient_value(0, i);
  // The reference: the whole layout's update of a copy.
  const std::int64_t n = r.model->param_count();
  Buffer reference_storage(r.model->params().nbytes()), grads_storage(r.model->grads().nbytes());
  const Tensor reference = reference_storage.tensor(DType::f64, {n});
  const Tensor reference_grads = grads_storage.tensor(DType::f64, {n});
  std::copy_n(r.model->params().data<double>(), n, reference.data<double>());
  std::copy_n(grads, n, reference_grads.data<double>());
  const optim::StepInfo info{1e-2, 1};
  optim::make_optimizer(r.plan.optimizer, r.whole)->step(reference, reference_grads, info);

  const std::unique_ptr<optim::Optimizer> mine = r.owned_optimizer();
  zero.step(*mine, info);
  EXPECT_EQ(zero.gathers_in_flight(), r.model->grad_buckets().size());
  const runtime::StepHooks hooks = zero.with_param_hooks({});
  for (const model::Model::Bucket& b : r.model->grad_buckets()) {
    hooks.gather_params(b.id);  // on its way already: nothing more starts
    hooks.wait_params(b.id);
  }
  EXPECT_EQ(zero.gathers_in_flight(), 0u);
  EXPECT_EQ(contents(r.model->params()), contents(reference));
}

// A checkpoint's whole optimizer state: each rank's blocks summed over their owners, then
// each owner keeps its blocks of a whole state again.
TEST(ZeroSharding, TheWholeOptimizerStateRoundTripsThroughItsOwners) {
  Rank r(1);
  ZeroSharding& zero = *r.zero_sharding;
  const int rank = r.dp().rank();
  const std::unique_ptr<optim::Optimizer> mine = r.owned_optimizer();
  double value = 1 + rank * 1000;
  for (const optim::StateTensor& s : mine->state_tensors()) {
    double* p = s.view.data<double>();
    for (std::int64_t i = 0; i < s.view.numel(); ++i) p[i] = value++;
  }
  const std::unique_ptr<optim::Optimizer> whole = optim::make_optimizer(r.plan.optimizer, r.whole);
  zero.gather_whole_state(*mine, *whole);
  // Both ranks hold the same whole state.
  for (const optim::StateTensor& s : whole->state_tensors()) {
    const std::vector<double> here = contents(s.view);
    std::vector<double> sum = here;
    r.dp().all_reduce(Tensor::of(sum.data(), {static_cast<std::int64_t>(sum.size())}));
    for (std::size_t i = 0; i < here.size(); ++i) ASSERT_EQ(sum[i], 2 * here[i]) << s.name;
  }
  const std::unique_ptr<optim::Optimizer> restored = r.owned_optimizer();
  zero.keep_owned_state(*whole, *restored);
  const std::vector<optim::StateTensor> before = mine->state_tensors();
  const std::vector<optim::StateTensor> after = restored->state_tensors();
  ASSERT_EQ(before.size(), after.size());
  for (std::size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(contents(after[i].view), contents(before[i].view)) << before[i].name;
}

// Each parameter is counted once: under ZeRO each rank counts its blocks and the group sums;
// without it every rank holds (and counts) the whole replica.
TEST(GradientReduction, TheSumOfSquaresCountsEveryElementOnce) {
  for (const int stage : {0, 1}) {
    Rank r(stage);
    const std::int64_t n = r.model->param_count();
    Buffer storage(static_cast<std::size_t>(n) * sizeof(double));
    const Tensor flat = storage.tensor(DType::f64, {n});
    for (std::int64_t i = 0; i < n; ++i) flat.data<double>()[i] = gradient_value(0, i);
    const double expected = optim::sum_of_squares(flat, 0, n);
    const double squares = r.reduction->sum_of_squares(flat, *r.zero_sharding);
    EXPECT_NEAR(squares, expected, 1e-13 * expected) << "zero " << stage;
    EXPECT_EQ(r.reduction->reduced_bucket_count(), r.model->grad_buckets().size());
    EXPECT_EQ(r.reduction->group_of(r.model->grad_buckets()[0]), &r.dp());
  }
}

TEST(GradientReduction, LocalSgdSumsNoGradients) {
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  plan::RunConfig c = oases::testing::tiny_run();
  c.parallel.dp = 2;
  c.parallel.dp_sync_every = 4;
  const plan::RunPlan plan = plan::make_run_plan(c, mesh.world_rank());
  model::ModelOptions o = plan.model_options(0);
  o.tp = &mesh.tp_group();
  model::Model model(plan.config.model, o);
  const GradientReduction reduction(plan, model, gradient_groups(mesh));
  EXPECT_EQ(reduction.reduced_bucket_count(), 0u);
  EXPECT_EQ(reduction.group_of(model.grad_buckets()[0]), nullptr);
  EXPECT_TRUE(reduction.tied_params_here().empty());
}

}  // namespace
}  // namespace oases::train
