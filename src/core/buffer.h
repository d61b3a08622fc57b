// Buffer: an owning, 64-byte aligned, zero-initialised block of memory on a device
// (move-only). Blocks of a MiB or more are anonymous mappings, zero until written: they take
// memory page by page as they are touched, so a model built only to read its shapes (a
// simulated rank of a model far larger than this machine) costs address space, not memory. Arena: hands out aligned slices of Buffers it owns. Everything a training step
// touches is allocated from arenas or buffers at start-up, so the steady state allocates
// nothing.
#pragma once

#include "core/device.h"
#include "core/tensor.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace oases {

class Buffer {
 public:
  Buffer() = default;
  // UserError when `device` is not available in this build (core/device.h).
  explicit Buffer(std::size_t bytes, Device device = Device::cpu());
  // `bytes` of memory owned elsewhere (an OffloadStore's mapping, core/offload_store.h),
  // which must outlive the buffer; zero-initialised by its owner.
  static Buffer borrowed(void* data, std::size_t bytes, Device device = Device::cpu());
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;

  void* data() const { return data_.get(); }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  template <class T> T* as() const { return static_cast<T*>(data()); }
  // The buffer seen as a contiguous tensor (which must fit in it).
  Tensor tensor(DType dtype, Shape shape) const;

 private:
  enum class Owner { heap, mapping, elsewhere };
  struct Free {
    Free() : owner(Owner::heap), mapped_bytes(0) {}
    Free(Owner o, std::size_t mapped) : owner(o), mapped_bytes(mapped) {}
    Owner owner;
    std::size_t mapped_bytes;  // Owner::mapping: the length to unmap
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  std::size_t bytes_ = 0;
  Device device_{};
};

class Arena {
 public:
  static constexpr std::size_t kAlignment = 64;
  explicit Arena(std::size_t block_bytes = std::size_t{64} << 20, Device device = Device::cpu())
      : block_bytes_(block_bytes), device_(device) {}

  // Zero-initialised storage for n elements of T, valid as long as the arena lives.
  template <class T> T* allocate(std::size_t n) {
    return static_cast<T*>(allocate_bytes(n * sizeof(T)));
  }
  void* allocate_bytes(std::size_t bytes);
  // A zero-initialised contiguous tensor on the arena's device.
  Tensor allocate(DType dtype, Shape shape);

  std::size_t bytes_in_use() const { return in_use_; }
  Device device() const { return device_; }

 private:
  std::size_t block_bytes_;
  Device device_;
  std::vector<Buffer> blocks_;
  std::size_t offset_in_last_ = 0;
  std::size_t in_use_ = 0;
};

}  // namespace oases
