// LocalSgd (train/local_sgd.h) alone: when the replicas average, what a replica's gradient is
// divided by, and the averaging itself on hand-made values, as rank 0 of two replicas whose
// peer's contributions the test supplies (a stand-in group that adds them to every sum).
#include "train/local_sgd.h"

#include "comm/communicator.h"
#include "core/error.h"
#include "plan/run_plan.h"
#include "support/tiny_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <vector>

namespace oases::train {
namespace {

class DoneWork final : public comm::Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// Rank 0 of a group of two whose sums add the next of the peer's values (fp64, in call order);
// every other collective is a test failure.
class PeerSumGroup final : public comm::Communicator {
 public:
  explicit PeerSumGroup(std::deque<std::vector<double>> peer) : peer_(std::move(peer)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "dp"; }
  std::unique_ptr<comm::Work> all_reduce_async(Tensor buffer, comm::ReduceOp op) override {
    EXPECT_EQ(op, comm::ReduceOp::sum);
    EXPECT_FALSE(peer_.empty()) << "more sums than the test supplied";
    if (peer_.empty()) return std::make_unique<DoneWork>();
    const std::vector<double> theirs = peer_.front();
    peer_.pop_front();
    EXPECT_EQ(static_cast<std::int64_t>(theirs.size()), buffer.numel());
    double* mine = buffer.data<double>();
    for (std::size_t i = 0; i < theirs.size(); ++i) mine[i] += theirs[i];
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<comm::Work> all_gather_async(Tensor, Tensor) override { return unexpected(); }
  std::unique_ptr<comm::Work> reduce_scatter_async(Tensor, Tensor, comm::ReduceOp) override {
    return unexpected();
  }
  std::unique_ptr<comm::Work> broadcast_async(Tensor, int) override { return unexpected(); }
  std::unique_ptr<comm::Work> send_async(Tensor, int, int) override { return unexpected(); }
  std::unique_ptr<comm::Work> recv_async(Tensor, int, int) override { return unexpected(); }
  std::unique_ptr<comm::Work> all_to_all_async(Tensor, Tensor) override { return unexpected(); }
  std::unique_ptr<comm::Work> all_to_allv_async(Tensor, std::vector<std::int64_t>, Tensor,
                                                std::vector<std::int64_t>) override {
    return unexpected();
  }
  std::unique_ptr<comm::Work> barrier_async() override { return unexpected(); }
  std::size_t sums_left() const { return peer_.size(); }

 private:
  std::unique_ptr<comm::Work> unexpected() {
    ADD_FAILURE() << "local SGD only sums";
    return std::make_unique<DoneWork>();
  }
  std::deque<std::vector<double>> peer_;
};

plan::RunPlan local_sgd_plan(std::int64_t sync_every) {
  plan::RunConfig c = oases::testing::tiny_run();
  c.parallel.dp = 2;
  c.parallel.dp_sync_every = sync_every;
  return plan::make_run_plan(c);
}

double plain_sum_of_squares(const Tensor& flat) {
  double squares = 0;
  for (std::int64_t i = 0; i < flat.numel(); ++i) squares += flat.data<double>()[i] * flat.data<double>()[i];
  return squares;
}

TEST(LocalSgd, AveragesEveryXStepsAndWheneverTheCallerDrains) {
  const LocalSgd every_three(local_sgd_plan(3));
  ASSERT_TRUE(every_three.enabled());
  std::vector<std::int64_t> averaged;
  for (std::int64_t step = 0; step < 9; ++step)
    if (every_three.averages_after(step, false)) averaged.push_back(step);
  EXPECT_EQ(averaged, (std::vector<std::int64_t>{2, 5, 8}));
  EXPECT_TRUE(every_three.averages_after(0, true));
  // Synchronous data parallelism never averages: its replicas sum gradients every step.
  const LocalSgd synchronous(local_sgd_plan(1));
  EXPECT_FALSE(synchronous.enabled());
  EXPECT_FALSE(synchronous.averages_after(0, true));
}

TEST(LocalSgd, EachReplicaTakesTheMeanOverItsOwnBatch) {
  EXPECT_EQ(LocalSgd(local_sgd_plan(4)).gradient_count(30, 64), 30);
  EXPECT_EQ(LocalSgd(local_sgd_plan(1)).gradient_count(30, 64), 64);
}

// Replicas p0 = (1, 2) (this rank) and p1 = (3, 4): the mean is (2, 3), each replica is at
// squared distance 2 from it, so the divergence is sqrt((2 + 2) / 2 / |mean|^2) = sqrt(2 / 13).
// The optimizer state is averaged alike.
TEST(LocalSgd, AveragesParametersAndStateAndMeasuresTheDivergenceBefore) {
  std::vector<double> params = {1, 2}, moments = {10, 20};
  const std::vector<optim::StateTensor> state = {
      {"exp_avg.w", "w", Tensor::of(moments.data(), {2}), true, -1}};
  PeerSumGroup replicas({{3, 4},    // the peer's parameters
                         {2},       // its squared distance from the mean
                         {30, 40}}  // its moments
  );
  const double divergence = LocalSgd(local_sgd_plan(2)).average(
      Tensor::of(params.data(), {2}), state, replicas, plain_sum_of_squares);
  EXPECT_EQ(divergence, std::sqrt(2.0 / 13.0));
  EXPECT_EQ(params, (std::vector<double>{2, 3}));
  EXPECT_EQ(moments, (std::vector<double>{20, 30}));
  EXPECT_EQ(replicas.sums_left(), 0u);
}

TEST(LocalSgd, IdenticalReplicasDoNotDiverge) {
  std::vector<double> params = {1, -2, 0.5};
  PeerSumGroup replicas({{1, -2, 0.5}, {0}});
  EXPECT_EQ(LocalSgd(local_sgd_plan(2)).average(Tensor::of(params.data(), {3}), {}, replicas,
                                                plain_sum_of_squares),
            0.0);
  EXPECT_EQ(params, (std::vector<double>{1, -2, 0.5}));
  // A mean of zero has no norm to compare with: 0, not a division by zero.
  std::vector<double> opposite = {1, 1};
  PeerSumGroup mirrored({{-1, -1}, {2}});
  EXPECT_EQ(LocalSgd(local_sgd_plan(2)).average(Tensor::of(opposite.data(), {2}), {}, mirrored,
                                                plain_sum_of_squares),
            0.0);
  EXPECT_EQ(opposite, (std::vector<double>{0, 0}));
}

}  // namespace
}  // namespace oases::train
