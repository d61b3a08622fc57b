#include "core/buffer.h"
#include "core/error.h"
#include "core/device.h"
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

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

TEST(Tensor, ViewsKeepTheParentsRowStride) {
  std::vector<double> values(4 * 6);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  const Tensor m = Tensor::of(values.data(), {4, 6});
  EXPECT_TRUE(m.is_contiguous());
  EXPECT_EQ(m.stride(0), 6);
  EXPECT_EQ(m.device(), Device::cpu());
  // The k block of a [n, q|k|v] matrix: columns [2, 4) of every row.
  const Tensor k = m.columns(2, 4);
  EXPECT_EQ(k.shape(), Shape({4, 2}));
  EXPECT_EQ(k.stride(0), 6);
  EXPECT_FALSE(k.is_contiguous());
  EXPECT_EQ(k.data<double>()[0], 2.0);
  EXPECT_EQ(k.data<double>()[k.stride(0) + 1], 9.0);
  EXPECT_THROW(k.reshaped({8}), InternalError);  // a strided view has no flat reshape
  const Tensor last_rows = m.rows(1, 3);
  EXPECT_TRUE(last_rows.is_contiguous());
  EXPECT_EQ(last_rows.data<double>()[0], 6.0);
  EXPECT_EQ(k.rows(1, 2).data<double>()[0], 8.0);
  const Tensor piece = m.view(5, {3});
  EXPECT_EQ(piece.data<double>()[2], 7.0);
  EXPECT_THROW(m.view(20, {5}), InternalError);
  EXPECT_EQ(m.as_matrix(8).shape(), Shape({3, 8}));
  EXPECT_THROW(m.columns(3, 7), InternalError);
}

TEST(Buffer, OnlyTheCpuDeviceIsAvailableInThisBuild) {
  const Buffer cpu(128, Device::cpu());
  EXPECT_EQ(cpu.tensor(DType::f64, {16}).device(), Device::cpu());
  EXPECT_THROW(cpu.tensor(DType::f64, {17}), InternalError);
  try {
    Buffer gpu(128, Device::cuda(0));
    FAIL() << "a CUDA buffer in a CPU build";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("device cuda:0 is not available"), std::string::npos)
        << e.what();
  }
}

TEST(Stream, CpuStreamsAndEventsCompleteInline) {
  Stream compute, communication;
  Event done;
  EXPECT_FALSE(done.recorded());
  EXPECT_TRUE(done.query());  // never recorded: nothing to wait for
  done.record(communication);
  EXPECT_TRUE(done.recorded());
  EXPECT_TRUE(done.query());  // CPU work ran inline before record() returned
  done.make_wait(compute);
  done.synchronize();
  compute.synchronize();
  EXPECT_THROW(Stream(Device::cuda(1)), UserError);
}

TEST(Arena, AllocatesZeroedAlignedMemoryAcrossBlocks) {
  Arena arena(256);
  double* a = arena.allocate<double>(10);
  double* b = arena.allocate<double>(100);  // larger than a block: gets its own
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a[i], 0.0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b[i], 0.0);
  EXPECT_GE(arena.bytes_in_use(), 110 * sizeof(double));
}

// The message is for users; the source position stays with the error for the debug log.
TEST(Errors, CheckThrowsUserErrorKeepingItsLocationApart) {
  try {
    OASES_CHECK(1 + 1 == 3, "model.heads = {} must divide model.hidden = {}", 5, 512);
    FAIL() << "no throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.heads = 5 must divide model.hidden = 512"),
              std::string::npos);
    EXPECT_EQ(std::string(e.what()).find("tensor_test.cc"), std::string::npos);
    EXPECT_NE(std::string(e.location()).find("tensor_test.cc"), std::string::npos);
  }
}

}  // namespace
}  // namespace oases
