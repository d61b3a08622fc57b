// OffloadStore: an off-device home for state a rank touches only at the optimizer step
// (parallel.offload: optimizer state, and under mixed precision the fp32 master weights), the
// NVMe tier of ZeRO-Infinity on CPU ranks. It is one scratch file on local disk, unlinked as
// soon as it is created (a crash leaves nothing behind, and checkpoints are written as
// always), whose regions are mapped into memory. Between steps a region is written back to the
// file and dropped from memory (evict); before its use the engine asks for it to be read back
// ahead (prefetch), which the kernel does asynchronously while the step goes on.
//
//   store.allocate(n)  -> a Buffer over n zeroed bytes of the file (the store owns the mapping)
//   store.prefetch(p, n)   asynchronous read-ahead (MADV_WILLNEED)
//   store.evict_all()      write back (msync), drop from the page cache and this process
//   store.resident_bytes() what of the regions is in memory now (mincore)
//
// A GPU device will offload to host memory through the same interface.
#pragma once

#include "core/buffer.h"

#include <cstddef>
#include <string>
#include <vector>

namespace oases {

class OffloadStore {
 public:
  // Creates the scratch file in `dir`. UserError naming `setting` (the config key that gave
  // the folder), the folder and why, when it cannot be created there.
  OffloadStore(const std::string& dir, const std::string& setting);
  ~OffloadStore();
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  // `bytes` of zeroed storage at a page boundary of the file, valid for the store's lifetime.
  Buffer allocate(std::size_t bytes);
  // Starts reading the pages of [data, data + bytes) back into memory (the range must lie in
  // one region); returns at once.
  void prefetch(const void* data, std::size_t bytes);
  // Writes every region back to the file and drops its pages from memory.
  void evict_all();
  std::size_t resident_bytes() const;
  std::size_t allocated_bytes() const;

 private:
  struct Region {
    char* data = nullptr;
    std::size_t bytes = 0;   // asked for
    std::size_t mapped = 0;  // whole pages
    std::size_t offset = 0;  // in the file
  };
  int fd_ = -1;
  std::size_t file_bytes_ = 0;
  std::vector<Region> regions_;
};

}  // namespace oases
