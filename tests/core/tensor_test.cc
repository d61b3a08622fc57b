#include "core/buffer.h"
#include "core/error.h"
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace oases {
namespace {

TEST(Tensor, ShapeAndTypedAccess) {
  Arena arena(1024);
  float* p = arena.allocate<float>(24);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % Arena::kAlignment, 0u);
  Tensor t = Tensor::of(p, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.shape().str(), "[2, 3, 4]");
  EXPECT_EQ(t.data<float>(), p);
  EXPECT_THROW(t.data<double>(), InternalError);
  EXPECT_EQ(t.reshaped({6, 4}).shape(), Shape({6, 4}));
  EXPECT_THROW(t.reshaped({5, 5}), InternalError);
}

TEST(Arena, AllocatesZeroedAlignedMemoryAcrossBlocks) {
  Arena arena(256);
  double* a = arena.allocate<double>(10);
  double* b = arena.allocate<double>(100);  // larger than a block: gets its own
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a[i], 0.0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b[i], 0.0);
  EXPECT_GE(arena.bytes_in_use(), 110 * sizeof(double));
}

TEST(Errors, CheckThrowsUserErrorWithLocation) {
  try {
    OASES_CHECK(1 + 1 == 3, "model.heads = {} must divide model.hidden = {}", 5, 512);
    FAIL() << "no throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.heads = 5 must divide model.hidden = 512"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("tensor_test.cc"), std::string::npos);
  }
}

}  // namespace
}  // namespace oases
