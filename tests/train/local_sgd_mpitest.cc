// Periodic synchronisation of data-parallel replicas (parallel.dp_sync_every, local SGD) at
// dp = 2, in fp64, against a reference that trains each replica as its own single-process
// engine on its half of every global batch and averages their parameters and optimizer state
// by hand every x steps: losses and parameters agree to relative 1e-10. dp_sync_every = 1 is
// the synchronous run itself.
#include "comm/mesh.h"
#include "kernels/kernels.h"
#include "mpi_test_support.h"
#include "support/numbers.h"
#include "support/tiny_run.h"
#include "train/engine.h"
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using oases::testing::relative_difference;
using oases::testing::values;

namespace mpitest = comm::mpitest;

constexpr std::int64_t kGlobalBatch = 8, kSeq = 16, kSteps = 9;

plan::RunConfig config(const std::string& optimizer, std::int64_t sync_every, int dp) {
  plan::RunConfig c = oases::testing::tiny_run();
  c.model.seq_len = kSeq;
  c.model.dropout = 0;  // the reference numbers its samples from 0 on each replica
  c.train.micro_batch = 2;
  c.train.global_batch = kGlobalBatch / (dp == 1 ? 2 : 1);  // a replica's share in the reference
  c.train.steps = kSteps;
  c.train.lr = 1e-2;
  c.train.min_lr = 1e-3;
  c.train.warmup_steps = 2;
  c.train.precision = "fp64";
  c.train.optimizer = optimizer;
  if (optimizer == "sgd") c.train.momentum = 0.9;
  c.parallel.dp = dp;
  c.parallel.dp_sync_every = sync_every;
  return c;
}

std::vector<std::int32_t> tokens(std::int64_t step, std::uint32_t stream) {
  return oases::testing::philox_tokens(step, stream, kGlobalBatch * kSeq, 50, {3, 5});
}

// Averages two engines' parameters and optimizer state into both, as a synchronisation does.
void average(TrainingEngine& a, TrainingEngine& b) {
  const auto mean_into = [](const Tensor& x, const Tensor& y) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double m = (x.data<double>()[i] + y.data<double>()[i]) * 0.5;
      x.data<double>()[i] = y.data<double>()[i] = m;
    }
  };
  mean_into(a.model().params(), b.model().params());
  auto sa = a.optimizer().state_tensors(), sb = b.optimizer().state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) mean_into(sa[i].view, sb[i].view);
}

TEST(LocalSgd, EveryXStepsEqualsTwoReplicasAveragedByHand) {
  ASSERT_EQ(mpitest::runtime().world_size(), 2);
  comm::Mesh mesh = comm::Mesh::create(mpitest::runtime(), 1, 2, 1, mpitest::test_options());
  const int rank = mesh.dp_group().rank();
  for (const std::string optimizer : {"adamw", "sgd"}) {
    for (const std::int64_t every : {1, 4}) {
      TrainingEngine engine(config(optimizer, every, 2), parallel_groups(mesh));
      TrainingEngine replica0(config(optimizer, 1, 1)), replica1(config(optimizer, 1, 1));
      const std::int64_t half = kGlobalBatch / 2 * kSeq;
      for (std::int64_t step = 0; step < kSteps; ++step) {
        const auto in = tokens(step, 1), out = tokens(step, 2);
        // This rank's half of the global batch, as the trainer hands it over.
        const StepResult r = engine.train_step(step, in.data() + rank * half,
                                               out.data() + rank * half, /*drain=*/false);
        const StepResult a = replica0.train_step(step, in.data(), out.data());
        const StepResult b = replica1.train_step(step, in.data() + half, out.data() + half);
        const bool synchronised = every == 1 || (step + 1) % every == 0;
        if (every > 1 && synchronised) average(replica0, replica1);
        // The reported loss is the mean over the whole global batch (of the replicas' losses
        // under local SGD; of the one model's synchronously, equal only at the first step).
        if (every > 1 || step == 0) {
          EXPECT_NEAR(r.loss, (a.loss + b.loss) / 2, 1e-10 * r.loss) << optimizer << " step " << step;
        }
        EXPECT_EQ(r.replica_divergence.has_value(), every > 1 && synchronised) << step;
        if (every > 1 && synchronised) {
          EXPECT_GT(r.replica_divergence.value_or(0.0), 0.0) << step;
        }
        if (every > 1) {
          const std::vector<double> want = values((rank == 0 ? replica0 : replica1).model().params());
          EXPECT_LT(relative_difference(values(engine.model().params()), want), 1e-10)
              << optimizer << " every " << every << " step " << step;
        }
      }
      if (every == 1) {
        // Synchronous: one step on the whole batch, which no pair of replicas reproduces.
        EXPECT_GT(relative_difference(values(engine.model().params()),
                                      values(replica0.model().params())),
                  1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace oases::train
