#include "core/staging_memory.h"

#include <algorithm>
#include <cstdint>

namespace oases {
namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kMinimumBlock = std::size_t{64} << 20;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

std::byte* StagingMemory::allocate(std::size_t bytes) {
  const std::size_t need = aligned(std::max<std::size_t>(bytes, 1));
  for (; current_ < blocks_.size(); ++current_) {
    Block& block = blocks_[current_];
    if (block.size - block.used >= need) {
      std::byte* out = block.bytes.get() + block.used;
      block.used += need;
      return out;
    }
  }
  // new[] of std::byte leaves the bytes uninitialised: nothing is touched until copied into.
  // operator new aligns to at least 16; over-allocating keeps the 64-byte promise.
  Block block;
  block.size = std::max(need, kMinimumBlock) + kAlignment;
  block.bytes.reset(new std::byte[block.size]);
  const auto address = reinterpret_cast<std::uintptr_t>(block.bytes.get());
  block.used = (kAlignment - address % kAlignment) % kAlignment;
  std::byte* out = block.bytes.get() + block.used;
  block.used += need;
  blocks_.push_back(std::move(block));
  current_ = blocks_.size() - 1;
  return out;
}

void StagingMemory::rewind() {
  for (Block& block : blocks_) {
    const auto address = reinterpret_cast<std::uintptr_t>(block.bytes.get());
    block.used = (kAlignment - address % kAlignment) % kAlignment;
  }
  current_ = 0;
}

std::size_t StagingMemory::capacity_bytes() const {
  std::size_t total = 0;
  for (const Block& block : blocks_) total += block.size;
  return total;
}

}  // namespace oases
