// WeightVersions (train/weight_versions.h): the two parameter versions of 2bw, swapped in place
// over the whole array or, under ZeRO-3, over the held ranges alone.
#include "train/weight_versions.h"

#include "core/buffer.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <vector>

namespace oases::train {
namespace {

std::vector<float> contents(const Tensor& t) {
  const float* p = t.data<float>();
  return {p, p + t.numel()};
}

TEST(WeightVersions, SwapsTheWholeArrayAndKeepsTheOlderVersion) {
  std::vector<float> params = {1, 2, 3, 4};
  const Tensor model = Tensor::of(params.data(), {4});
  WeightVersions versions(model, 0);
  EXPECT_EQ(contents(versions.older()), params);
  versions.begin_update();  // W(0) saved; the optimizer now makes W(1) in place
  for (float& p : params) p += 10;
  EXPECT_EQ(versions.newest(), 1);
  versions.use(0);
  EXPECT_EQ(params, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(contents(versions.older()), (std::vector<float>{11, 12, 13, 14}));
  versions.use(1);
  EXPECT_EQ(params, (std::vector<float>{11, 12, 13, 14}));
  EXPECT_THROW(versions.use(-1), InternalError);
}

// Under ZeRO-3 only the held blocks move: the rest of the model's array (other ranks' blocks,
// released) is left alone, and the other buffer reads zeros there.
TEST(WeightVersions, HeldRangesAloneAreKeptAndSwapped) {
  std::vector<float> params = {1, 2, 3, 4, 5, 6};
  const Tensor model = Tensor::of(params.data(), {6});
  WeightVersions versions(model, 3, {{1, 3}, {5, 6}});
  EXPECT_EQ(contents(versions.older()), (std::vector<float>{0, 2, 3, 0, 0, 6}));
  versions.begin_update();
  for (float& p : params) p *= 10;
  versions.use(3);
  EXPECT_EQ(params, (std::vector<float>{10, 2, 3, 40, 50, 6}));
  versions.use(4);
  EXPECT_EQ(params, (std::vector<float>{10, 20, 30, 40, 50, 60}));
  // A checkpoint gathers the older version whole, then gives the others' blocks back.
  float* older = versions.older().data<float>();
  older[0] = 7;
  older[4] = 8;
  versions.release_others();
  EXPECT_EQ(contents(versions.older()), (std::vector<float>{0, 2, 3, 0, 0, 6}));
  // Resuming: the stashed values land in the held ranges.
  std::vector<float> stashed = {-1, -2, -3, -4, -5, -6};
  versions.set_older(Tensor::of(stashed.data(), {6}));
  EXPECT_EQ(contents(versions.older()), (std::vector<float>{0, -2, -3, 0, 0, -6}));
  EXPECT_THROW(WeightVersions(model, 0, {{4, 7}}), InternalError);
}

}  // namespace
}  // namespace oases::train
