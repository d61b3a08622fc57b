// PageableBuffer: a zero-initialised block of host memory whose pages can be given back to the
// operating system while the buffer lives (move-only). A released range reads as zeros again
// and takes memory only once written: ZeRO-2 keeps the whole gradient array addressable, so
// every backward accumulates where it always does, while only the blocks a rank owns (and the
// buckets still being reduced) stay resident.
//
// Pages come from an anonymous private mapping: nothing is touched at construction, so the
// buffer takes memory as it is written, page by page (4 KiB on x86-64 Linux).
#pragma once

#include "core/tensor.h"

#include <cstddef>

namespace oases {

class PageableBuffer {
 public:
  PageableBuffer() = default;
  explicit PageableBuffer(std::size_t bytes);
  ~PageableBuffer();
  PageableBuffer(PageableBuffer&& other) noexcept;
  PageableBuffer& operator=(PageableBuffer&& other) noexcept;
  PageableBuffer(const PageableBuffer&) = delete;
  PageableBuffer& operator=(const PageableBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Tensor tensor(DType dtype, Shape shape) const;

  // Zeroes bytes [offset, offset + bytes): the whole pages inside the range are given back
  // (they read as zeros and take no memory until written), the partial pages at its ends are
  // written with zeros.
  void release(std::size_t offset, std::size_t bytes);
  // Zeroes the whole buffer by writing only its resident pages (the others read as zeros):
  // what is given back stays given back.
  void zero_resident();
  // The bytes of the buffer's pages resident in memory now (mincore).
  std::size_t resident_bytes() const;
  static std::size_t page_size();

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;    // as asked for
  std::size_t mapped_ = 0;   // whole pages
};

}  // namespace oases
