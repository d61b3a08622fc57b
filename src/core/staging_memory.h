// StagingMemory: host memory reused from one checkpoint save to the next, so that staging a
// checkpoint is a copy into pages that are already resident rather than into fresh
// allocations (whose page faults cost more than the copy: a fresh 0.5 GB buffer takes seconds
// to fault in on a virtual machine).
//
// A bump allocator over blocks that are kept: rewind() makes every block reusable without
// giving any back; allocate() hands out 64-byte aligned, uninitialised bytes, from the blocks
// in order, adding a block when none has room. Pointers stay valid until the next rewind() or
// the object's end. Not thread-safe: one staging at a time (its reader, a writer thread, must
// be done with the bytes before the next rewind()).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace oases {

class StagingMemory {
 public:
  std::byte* allocate(std::size_t bytes);
  void rewind();
  std::size_t capacity_bytes() const;  // held, resident once used

 private:
  struct Block {
    std::unique_ptr<std::byte[]> bytes;
    std::size_t size = 0;
    std::size_t used = 0;
  };
  std::vector<Block> blocks_;
  std::size_t current_ = 0;  // the block allocate() tries first
};

}  // namespace oases
