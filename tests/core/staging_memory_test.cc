// Staging memory: aligned, non-overlapping allocations; after rewind() the same bytes are
// handed out again in the same order, so a save's pages stay resident from one save to the
// next; it grows when a save needs more.
#include "core/staging_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace oases {
namespace {

TEST(StagingMemory, AllocationsAreAlignedAndDisjointAndReusedAfterRewind) {
  StagingMemory staging;
  const std::vector<std::size_t> sizes = {1, 100, 64, 3 << 20, 7, 70 << 20, 12};
  std::vector<std::byte*> first;
  for (const std::size_t size : sizes) {
    std::byte* p = staging.allocate(size);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
    std::memset(p, static_cast<int>(first.size() + 1), size);  // all of it is usable
    first.push_back(p);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i)  // nothing overwrote an earlier allocation
    EXPECT_EQ(static_cast<int>(first[i][sizes[i] - 1]), static_cast<int>(i + 1)) << i;
  const std::size_t capacity = staging.capacity_bytes();
  EXPECT_GE(capacity, std::size_t{73} << 20);
  staging.rewind();
  for (std::size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(staging.allocate(sizes[i]), first[i]);
  EXPECT_EQ(staging.capacity_bytes(), capacity) << "a repeated save needs no new memory";
  staging.rewind();
  staging.allocate(std::size_t{200} << 20);  // a larger save grows it
  EXPECT_GT(staging.capacity_bytes(), capacity);
}

}  // namespace
}  // namespace oases
