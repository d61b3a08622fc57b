// ZeRO's partition of a bucket (optim/zero_partition.h): the cuts each kind of optimizer gets,
// the owned layout of a rank's blocks, and that optimizers over the owned layouts of every
// block, stepping the same flat arrays, together do bitwise what one optimizer over the whole
// layout does (fp64 and fp32), with 1/n of its state each.
#include "optim/optimizer.h"
#include "optim/zero_partition.h"
#include "kernels/finite_difference.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace oases::optim {
namespace {

using oases::testing::random_vector;

// Matrices, a stack of matrices, vectors, with gaps between them, and a vocabulary matrix whose
// last two rows are padding.
FlatLayout test_layout(DType dtype) {
  FlatLayout layout;
  layout.dtype = dtype;
  std::int64_t offset = 2;
  const auto add = [&](std::string name, std::vector<std::int64_t> shape, bool decay) {
    layout.params.push_back({std::move(name), offset, std::move(shape), decay});
    offset = layout.params.back().end() + 3;
  };
  add("h.0.attn.c_attn.weight", {6, 5}, true);
  add("h.0.ln_1.weight", {7}, false);
  add("h.0.mlp.c_fc.weight", {2, 3, 4}, true);
  add("h.0.mlp.c_proj.bias", {1}, false);
  add("wte.weight", {9, 3}, true);
  layout.params.back().full_shape = {7, 3};
  layout.params.back().padding = 6;
  add("ln_f.bias", {11}, false);
  layout.total_numel = offset;
  return layout;
}

OptimizerConfig settings(const std::string& name) {
  OptimizerConfig c;
  c.kind = parse_optimizer_kind(name);
  if (name == "sgd" || name == "sm3") c.momentum = 0.9;
  if (name == "adafactor") c.adafactor_beta1 = 0.9;
  return c;
}

TEST(ZeroPartition, ElementWiseOptimizersGetEqualBlocks) {
  const FlatLayout layout = test_layout(DType::f64);
  const auto any = [](const ParamSlot&) { return true; };
  EXPECT_EQ(partition_range(layout, 0, layout.total_numel, 1, any),
            (std::vector<std::int64_t>{0, layout.total_numel}));
  // 10 elements in 4 blocks of ceil(10 / 4) = 3: the last one shorter.
  EXPECT_EQ(partition_range(layout, 5, 15, 4, any), (std::vector<std::int64_t>{5, 8, 11, 14, 15}));
  // More blocks than elements: the trailing ones are empty.
  EXPECT_EQ(partition_range(layout, 5, 7, 4, any), (std::vector<std::int64_t>{5, 6, 7, 7, 7}));
}

TEST(ZeroPartition, FactoredOptimizersCutOnlyWhereTheyAccept) {
  const FlatLayout layout = test_layout(DType::f64);
  for (const std::string name : {"adafactor", "sm3"}) {
    const auto probe = make_optimizer(settings(name), FlatLayout{{}, 0, DType::f64});
    const auto accepts = [&](const ParamSlot& p) { return probe->accepts_cut(p); };
    for (const int members : {2, 3, 4, 7}) {
      const std::vector<std::int64_t> cuts =
          partition_range(layout, 0, layout.total_numel, members, accepts);
      ASSERT_EQ(cuts.size(), static_cast<std::size_t>(members + 1));
      for (std::size_t i = 1; i < cuts.size(); ++i) {
        EXPECT_LE(cuts[i - 1], cuts[i]) << name;
        for (const ParamSlot& p : layout.params) {
          if (cuts[i] > p.offset && cuts[i] < p.end()) {
            EXPECT_TRUE(probe->accepts_cut(p)) << name << " cut at " << cuts[i] << " in " << p.name;
          }
        }
      }
    }
  }
  // The nearer end of the parameter: attn's [2, 32) cut at 12 moves to 2, at 22 to 32.
  const auto none = [](const ParamSlot&) { return false; };
  EXPECT_EQ(partition_range(layout, 2, 32, 3, none), (std::vector<std::int64_t>{2, 2, 32, 32}));
}

TEST(ZeroPartition, OwnedLayoutKeepsWholeParametersAndCutsTheRestIntoVectors) {
  const FlatLayout layout = test_layout(DType::f32);
  const ParamSlot& wte = layout.params[4];
  // Half of attn's matrix; wte from its third row on, through its padding.
  const FlatLayout owned =
      owned_layout(layout, {{17, layout.params[1].end()}, {wte.offset + 6, wte.end()}});
  ASSERT_EQ(owned.params.size(), 3u);
  EXPECT_EQ(owned.total_numel, layout.total_numel);
  EXPECT_EQ(owned.params[0].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(owned.params[0].offset, 17);
  EXPECT_EQ(owned.params[0].shape, (std::vector<std::int64_t>{15}));
  EXPECT_TRUE(owned.params[0].weight_decay);
  EXPECT_EQ(owned.params[1].shape, layout.params[1].shape);  // ln_1 whole, as it is
  EXPECT_EQ(owned.params[2].shape, (std::vector<std::int64_t>{21}));
  EXPECT_EQ(owned.params[2].padding, 6);
  EXPECT_EQ(owned.param_numel(), 15 + 7 + 21);
}

// Every block of a partition stepped by its own optimizer over its owned layout, in turn, on
// shared arrays: bitwise the whole-layout optimizer, state included.
void expect_blocks_step_like_the_whole(const std::string& name, DType dtype, int members) {
  const FlatLayout layout = test_layout(dtype);
  const auto probe = make_optimizer(settings(name), FlatLayout{{}, 0, dtype});
  const std::vector<std::int64_t> cuts = partition_range(
      layout, 0, layout.total_numel, members,
      [&](const ParamSlot& p) { return probe->accepts_cut(p); });
  auto whole = make_optimizer(settings(name), layout);
  std::vector<std::unique_ptr<Optimizer>> blocks;
  std::size_t block_bytes = 0;
  for (int m = 0; m < members; ++m) {
    blocks.push_back(make_optimizer(
        settings(name), owned_layout(layout, {{cuts[static_cast<std::size_t>(m)],
                                               cuts[static_cast<std::size_t>(m) + 1]}})));
    block_bytes += blocks.back()->state_bytes();
  }
  if (name != "adafactor" && name != "sm3") {
    EXPECT_EQ(block_bytes, whole->state_bytes()) << name;
  }
  const std::size_t element = dtype_size(dtype);
  const auto n = static_cast<std::size_t>(layout.total_numel);
  std::vector<char> params(n * element), split_params(n * element), grads(n * element);
  const std::vector<double> init = random_vector(n, 3), gradient = random_vector(n, 4);
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == DType::f64) {
      reinterpret_cast<double*>(params.data())[i] = init[i];
      reinterpret_cast<double*>(grads.data())[i] = gradient[i];
    } else {
      reinterpret_cast<float*>(params.data())[i] = static_cast<float>(init[i]);
      reinterpret_cast<float*>(grads.data())[i] = static_cast<float>(gradient[i]);
    }
  }
  split_params = params;
  const auto flat = [&](std::vector<char>& bytes) {
    return Tensor(bytes.data(), dtype, {layout.total_numel});
  };
  for (std::int64_t step = 1; step <= 3; ++step) {
    whole->step(flat(params), flat(grads), {1e-2, step});
    for (auto& block : blocks) block->step(flat(split_params), flat(grads), {1e-2, step});
  }
  EXPECT_EQ(std::memcmp(params.data(), split_params.data(), params.size()), 0)
      << name << " " << dtype_name(dtype) << " in " << members << " blocks";
}

TEST(ZeroPartition, BlocksStepBitwiseLikeTheWholeLayout) {
  for (const std::string name : {"adamw", "sgd", "sm3", "adafactor"}) {
    for (const DType dtype : {DType::f64, DType::f32}) {
      for (const int members : {1, 2, 3, 5}) expect_blocks_step_like_the_whole(name, dtype, members);
    }
  }
}

}  // namespace
}  // namespace oases::optim
