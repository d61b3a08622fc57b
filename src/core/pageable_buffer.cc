#include "core/pageable_buffer.h"

#include "core/error.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace oases {

std::size_t PageableBuffer::page_size() {
  static const auto size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

PageableBuffer::PageableBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  mapped_ = (bytes + page_size() - 1) / page_size() * page_size();
  // MAP_NORESERVE: pages never touched are never counted (a shape-only model maps its ZeRO-3
  // parameters without touching them, larger than the host's memory for large models).
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  OASES_CHECK(p != MAP_FAILED, "out of host memory mapping {} bytes", bytes);
  data_ = p;
}

PageableBuffer::~PageableBuffer() {
  if (data_ != nullptr) munmap(data_, mapped_);
}

PageableBuffer::PageableBuffer(PageableBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

PageableBuffer& PageableBuffer::operator=(PageableBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, mapped_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

Tensor PageableBuffer::tensor(DType dtype, Shape shape) const {
  OASES_ASSERT(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype) <= bytes_,
               "a {} {} tensor does not fit a pageable buffer of {} bytes", dtype_name(dtype),
               shape.str(), bytes_);
  return Tensor(data_, dtype, shape);
}

void PageableBuffer::release(std::size_t offset, std::size_t bytes) {
  OASES_ASSERT(offset <= bytes_ && bytes <= bytes_ - offset,
               "release of bytes [{}, {}) of a pageable buffer of {}", offset, offset + bytes,
               bytes_);
  if (bytes == 0) return;
  char* base = static_cast<char*>(data_);
  const std::size_t page = page_size();
  const std::size_t first_page = (offset + page - 1) / page * page;
  const std::size_t end = offset + bytes;
  const std::size_t end_page = end / page * page;
  if (first_page >= end_page) {
    std::memset(base + offset, 0, bytes);
    return;
  }
  std::memset(base + offset, 0, first_page - offset);
  std::memset(base + end_page, 0, end - end_page);
  // Private anonymous pages given back read as zeros on the next access.
  OASES_ASSERT(madvise(base + first_page, end_page - first_page, MADV_DONTNEED) == 0,
               "madvise of {} bytes failed", end_page - first_page);
}

void PageableBuffer::zero_resident() {
  if (data_ == nullptr) return;
  const std::size_t page = page_size();
  std::vector<unsigned char> resident(mapped_ / page);
  OASES_ASSERT(mincore(data_, mapped_, resident.data()) == 0, "mincore failed");
  char* base = static_cast<char*>(data_);
  // Runs of resident pages at once; a page given back reads as zeros already.
  for (std::size_t i = 0; i < resident.size();) {
    if ((resident[i] & 1) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < resident.size() && (resident[j] & 1) != 0) ++j;
    std::memset(base + i * page, 0, std::min(j * page, bytes_) - std::min(i * page, bytes_));
    i = j;
  }
}

std::size_t PageableBuffer::resident_bytes() const {
  if (data_ == nullptr) return 0;
  const std::size_t pages = mapped_ / page_size();
  std::vector<unsigned char> resident(pages);
  OASES_ASSERT(mincore(data_, mapped_, resident.data()) == 0, "mincore failed");
  return static_cast<std::size_t>(std::ranges::count_if(resident, [](unsigned char r) {
           return (r & 1) != 0;
         })) *
         page_size();
}

}  // namespace oases
