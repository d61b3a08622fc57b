#include "core/buffer.h"

#include "core/error.h"
#include "core/time_breakdown.h"

#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

namespace oases {

namespace {
// From this size on a block is mapped rather than taken from the heap and cleared.
constexpr std::size_t kMappedFrom = std::size_t{1} << 20;
}  // namespace

void Buffer::Free::operator()(void* p) const {
  const TimedSection timed(TimeCategory::allocation);
  switch (owner) {
    case Owner::heap: std::free(p); break;
    case Owner::mapping: munmap(p, mapped_bytes); break;
    case Owner::elsewhere: break;
  }
}

Buffer Buffer::borrowed(void* data, std::size_t bytes, Device device) {
  Buffer buffer;
  buffer.data_ = std::unique_ptr<void, Free>(data, Free(Owner::elsewhere, 0));
  buffer.bytes_ = bytes;
  buffer.device_ = device;
  return buffer;
}

Buffer::Buffer(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  const TimedSection timed(TimeCategory::allocation);
  check_device_available(device);
  if (bytes == 0) return;
  const std::size_t rounded = (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
  if (rounded >= kMappedFrom) {
    // Page-aligned and zero until written; MAP_NORESERVE: pages never touched are never counted.
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    OASES_CHECK(p != MAP_FAILED, "out of host memory mapping {} bytes", bytes);
    data_ = std::unique_ptr<void, Free>(p, Free(Owner::mapping, rounded));
    return;
  }
  void* p = std::aligned_alloc(Arena::kAlignment, rounded);
  OASES_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded);
  data_.reset(p);
}

Tensor Buffer::tensor(DType dtype, Shape shape) const {
  OASES_ASSERT(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype) <= bytes_,
               "a {} {} tensor does not fit a buffer of {} bytes", dtype_name(dtype), shape.str(),
               bytes_);
  return Tensor(data(), dtype, shape, device_);
}

void* Arena::allocate_bytes(std::size_t bytes) {
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) return nullptr;
  if (blocks_.empty() || offset_in_last_ + rounded > blocks_.back().bytes()) {
    blocks_.emplace_back(std::max(rounded, block_bytes_), device_);
    offset_in_last_ = 0;
  }
  void* p = static_cast<char*>(blocks_.back().data()) + offset_in_last_;
  offset_in_last_ += rounded;
  in_use_ += rounded;
  return p;
}

Tensor Arena::allocate(DType dtype, Shape shape) {
  void* p = allocate_bytes(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  return Tensor(p, dtype, shape, device_);
}

}  // namespace oases
