// Training on a shard with a loss mask at dp = 2 with two micro-batches per rank (gradient
// accumulation), in fp64: each step's loss is the mean over the counted targets of the whole
// global batch and its update that mean's gradient, as one process computes them on the whole
// batch (compute_gradients, then plain SGD by hand), to relative 1e-10. The steps give the
// ranks unequal numbers of counted targets, none at all to one rank, and none to the whole
// batch (loss 0, a zero gradient, parameters unchanged).
#include "comm/mesh.h"
#include "core/philox.h"
#include "data/loader.h"
#include "data/token_shard.h"
#include "kernels/kernels.h"
#include "mpi_test_support.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/batches.h"
#include "train/engine.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::relative_difference;
using oases::testing::values;

namespace mpitest = comm::mpitest;

constexpr std::int64_t kGlobalBatch = 8, kSeq = 16, kVocab = 50, kSteps = 4;

// Plain SGD at a constant learning rate without weight decay or clipping: the update is
// -lr x gradient, which the reference applies by hand.
plan::RunConfig config(int dp, std::int64_t micro_batch) {
  plan::RunConfig c = oases::testing::tiny_run();
  c.model.seq_len = kSeq;
  c.model.dropout = 0.1;  // keyed by global sample: the same masks in both layouts
  c.train.micro_batch = micro_batch;
  c.train.global_batch = kGlobalBatch;
  c.train.steps = kSteps;
  c.train.precision = "fp64";
  c.train.optimizer = "sgd";
  c.train.momentum = 0;
  c.train.weight_decay = 0;
  c.train.grad_clip = 0;
  c.train.lr = 0.5;
  c.train.min_lr = 0.5;
  c.train.warmup_steps = 0;
  c.parallel.dp = dp;
  return c;
}

// Unshuffled, sample j of step s reads tokens [(8s + j) x 16, (8s + j + 1) x 16]: rank 0 has
// samples 0-3, rank 1 samples 4-7. Which targets count, per step:
//   0: about half of every sample's;  1: all of rank 0's, about one in eight of rank 1's;
//   2: none of rank 1's;  3: none at all.
data::TokenShard masked_shard() {
  data::TokenShard shard;
  shard.path = "memory";
  shard.tokenizer = "test";
  shard.vocab_size = kVocab;
  shard.token_width = 2;
  shard.version = 3;
  const std::int64_t count = kSteps * kGlobalBatch * kSeq + 1;
  const PhiloxKey key = philox_key(7, fnv1a64("loss_mask_mpitest"));
  for (std::int64_t i = 0; i < count; ++i) {
    const auto r = philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key);
    shard.tokens.push_back(static_cast<std::int32_t>(r[0] % kVocab));
    // Token i is a target of global sample (i - 1) / 16.
    const std::int64_t sample = std::max<std::int64_t>(i - 1, 0) / kSeq;
    const std::int64_t step = sample / kGlobalBatch;
    const bool rank0 = sample % kGlobalBatch < kGlobalBatch / 2;
    bool counts = false;
    switch (step) {
      case 0:
        counts = r[1] % 2 == 0;
        break;
      case 1:
        counts = rank0 || r[1] % 8 == 0;
        break;
      case 2:
        counts = rank0 && r[1] % 3 != 0;
        break;
      default:
        counts = false;
        break;
    }
    shard.loss_mask.push_back(counts ? 1 : 0);
  }
  shard.loss_mask[0] = 1;  // a target of no sample (the loader needs one counted token)
  return shard;
}

TEST(LossMask, DataParallelAccumulatedStepsEqualTheMeanOverCountedTargets) {
  ASSERT_EQ(mpitest::runtime().world_size(), 2);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  const int rank = mesh.dp_group().rank();
  const data::TokenShard shard = masked_shard();

  const plan::RunConfig parallel = config(2, 2);  // 4 rows per rank: 2 micro-batches each
  ASSERT_EQ(parallel.train.global_batch / 2 / parallel.train.micro_batch, 2);
  const data::DataLoader loader(shard, kSeq, kGlobalBatch, /*shuffle=*/false, 0);
  const BatchMaker batches(parallel, loader, kVocab);
  TrainingEngine engine(parallel, parallel_groups(mesh));
  TrainingEngine reference(config(1, 4));  // the same initial weights (seeded by name)
  ASSERT_EQ(
      relative_difference(values(engine.model().params()), values(reference.model().params())),
      0.0);

  std::vector<std::int64_t> rank_counts;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    Batch local, whole;
    batches.training(step, engine.first_local_sample(), engine.local_batch(), local);
    batches.training(step, 0, kGlobalBatch, whole);
    std::int64_t counted = 0, counted_here = 0;
    for (const std::int32_t t : whole.targets) counted += t >= 0;
    for (const std::int32_t t : local.targets) counted_here += t >= 0;
    rank_counts.push_back(counted_here);

    const std::vector<double> before = values(reference.model().params());
    const double want_loss =
        reference.compute_gradients(step, whole.inputs.data(), whole.targets.data(), kGlobalBatch);
    const std::vector<double> gradient = values(reference.model().grads());
    double norm = 0;
    for (const double g : gradient) norm += g * g;
    norm = std::sqrt(norm);
    std::vector<double> after = before;
    const double lr = reference.learning_rate(step);
    for (std::size_t i = 0; i < after.size(); ++i) after[i] -= lr * gradient[i];
    kernels::convert(Tensor::of(after.data(), {static_cast<std::int64_t>(after.size())}),
                     reference.model().params());
    reference.model().refresh_compute_params();

    const std::vector<double> engine_before = values(engine.model().params());
    const StepResult r = engine.train_step(step, local.inputs.data(), local.targets.data());
    if (counted == 0) {
      EXPECT_EQ(r.loss, 0.0) << "step " << step;
      EXPECT_EQ(r.grad_norm, 0.0) << "step " << step;
      EXPECT_TRUE(values(engine.model().params()) == engine_before) << "step " << step;
      continue;
    }
    EXPECT_NEAR(r.loss, want_loss, 1e-10 * want_loss) << "step " << step;
    EXPECT_NEAR(r.grad_norm, norm, 1e-10 * norm) << "step " << step;
    // The update itself (parameters after minus before) to 1e-10, not just the parameters.
    std::vector<double> update = values(engine.model().params()), want_update = after;
    for (std::size_t i = 0; i < update.size(); ++i) {
      update[i] -= engine_before[i];
      want_update[i] -= before[i];
    }
    EXPECT_LT(relative_difference(update, want_update), 1e-10) << "step " << step;
  }
  // The steps covered what they were meant to: unequal counts, a rank without any, none.
  if (rank == 1) {
    EXPECT_LT(rank_counts[1], 4 * kSeq / 2);
    EXPECT_EQ(rank_counts[2], 0);
  } else {
    EXPECT_EQ(rank_counts[1], 4 * kSeq);
    EXPECT_GT(rank_counts[2], 0);
  }
  EXPECT_EQ(rank_counts[3], 0);
}

}  // namespace
}  // namespace oases::train
