#include "core/offload_store.h"

#include "core/error.h"
#include "core/pageable_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace oases {

OffloadStore::OffloadStore(const std::string& dir, const std::string& setting) {
  OASES_CHECK(!dir.empty(), "{} is empty: offloading needs a folder on local disk for its "
              "scratch file", setting);
  std::string path = (std::filesystem::path(dir) / "oases-offload-XXXXXX").string();
  fd_ = mkstemp(path.data());
  OASES_CHECK(fd_ >= 0, "{} = \"{}\": cannot create a scratch file there ({}); valid: an existing "
              "folder this process may write to", setting, dir, std::strerror(errno));
  // The name is not needed: the file lives while it is open and vanishes with the process.
  unlink(path.c_str());
}

OffloadStore::~OffloadStore() {
  for (const Region& r : regions_) munmap(r.data, r.mapped);
  if (fd_ >= 0) close(fd_);
}

Buffer OffloadStore::allocate(std::size_t bytes) {
  if (bytes == 0) return Buffer();
  const std::size_t page = PageableBuffer::page_size();
  Region r;
  r.bytes = bytes;
  r.mapped = (bytes + page - 1) / page * page;
  r.offset = file_bytes_;
  // The file grows with zeros: a fresh region reads as zeros, as optimizer state starts.
  OASES_CHECK(ftruncate(fd_, static_cast<off_t>(file_bytes_ + r.mapped)) == 0,
              "cannot grow the offload scratch file to {} bytes ({})", file_bytes_ + r.mapped,
              std::strerror(errno));
  void* p = mmap(nullptr, r.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                 static_cast<off_t>(r.offset));
  OASES_CHECK(p != MAP_FAILED, "cannot map {} bytes of the offload scratch file ({})", r.mapped,
              std::strerror(errno));
  r.data = static_cast<char*>(p);
  file_bytes_ += r.mapped;
  regions_.push_back(r);
  return Buffer::borrowed(r.data, bytes);
}

void OffloadStore::prefetch(const void* data, std::size_t bytes) {
  if (bytes == 0) return;
  const auto* p = static_cast<const char*>(data);
  const auto region = std::ranges::find_if(
      regions_, [&](const Region& r) { return p >= r.data && p + bytes <= r.data + r.mapped; });
  OASES_ASSERT(region != regions_.end(), "prefetch of {} bytes outside the offload store", bytes);
  const std::size_t page = PageableBuffer::page_size();
  const std::size_t first = static_cast<std::size_t>(p - region->data) / page * page;
  const std::size_t end = static_cast<std::size_t>(p + bytes - region->data);
  // Advice only: a failure costs the read-ahead, not correctness.
  (void)madvise(region->data + first, end - first, MADV_WILLNEED);
}

void OffloadStore::evict_all() {
  for (const Region& r : regions_) {
    OASES_CHECK(msync(r.data, r.mapped, MS_SYNC) == 0,
                "cannot write the offloaded state back to its scratch file ({})",
                std::strerror(errno));
    (void)madvise(r.data, r.mapped, MADV_DONTNEED);
  }
  // Clean pages of the file leave the page cache too.
  if (fd_ >= 0) (void)posix_fadvise(fd_, 0, static_cast<off_t>(file_bytes_), POSIX_FADV_DONTNEED);
}

std::size_t OffloadStore::resident_bytes() const {
  const std::size_t page = PageableBuffer::page_size();
  std::size_t resident = 0;
  std::vector<unsigned char> pages;
  for (const Region& r : regions_) {
    pages.assign(r.mapped / page, 0);
    OASES_ASSERT(mincore(r.data, r.mapped, pages.data()) == 0, "mincore failed");
    resident += static_cast<std::size_t>(std::ranges::count_if(
                    pages, [](unsigned char v) { return (v & 1) != 0; })) *
                page;
  }
  return resident;
}

std::size_t OffloadStore::allocated_bytes() const {
  std::size_t bytes = 0;
  for (const Region& r : regions_) bytes += r.bytes;
  return bytes;
}

}  // namespace oases
