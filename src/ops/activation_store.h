// ActivationStore: the activations segments keep between their actions, keyed by
// (segment, micro-batch, sub-batch, tensor set). A set is acquired when a Forward or Recompute
// produces it and released when the schedule frees it, so how much is live at once, and its
// peak, are properties of the schedule. Released blocks are kept for reuse by the next
// acquisition of the same size (every step asks for the same sizes), so the steady state
// allocates nothing. Blocks are 64-byte aligned memory on the store's device.
//
// A live block may be held encoded in fewer bits between its producer's last forward use and
// the backward that reads it (parallel.activation_compression, Gist's delayed precision
// reduction): encode() replaces it by a block of the same elements in the encoding, decode()
// brings it back to its own dtype, rounded by the encoding. While encoded it cannot be read.
// Both take the new block before they give up the old one, so for that moment both count.
//
// A live block whose contents are identical on the `parts` ranks of a group (a layer's
// checkpoint under tensor parallelism) may be held as this rank's slice alone between its last
// forward use and the backward that reads it (parallel.partition_activations, ZeRO-R's
// partitioned activation checkpoints): partition() keeps slice `part` of the block's elements cut
// into `parts` slices of ceil(elements / parts) (the last one padded); unpartition() takes a
// whole block back with the own slice in place and hands out where every slice goes, for the
// group's all-gather to fill. While partitioned a block cannot be read; after unpartition() it
// reads what the gather has written (the caller waits for it first).
#pragma once

#include "core/buffer.h"
#include "core/tensor.h"
#include "ops/program.h"

#include <cstddef>
#include <map>
#include <tuple>
#include <vector>

namespace oases::ops {

// Besides the schedule's sets, a segment that starts a pipeline stage keeps the activation it
// received under this key until its Forward has consumed it.
inline constexpr std::uint8_t kReceivedInput = 16;
// And a segment that ends a stage keeps the gradient of its output it received under this key
// until its backward has consumed it: the sub-batch's gradient slot may still hold the gradient
// the rank has yet to send to the previous stage (an interleaved pipeline's ring).
inline constexpr std::uint8_t kReceivedGradient = 32;
// An input-only backward (SegmentShape::has_weight_part) stashes the output gradients its
// deferred weight-gradient GEMMs need under this key until the instance's weight part runs.
inline constexpr std::uint8_t kDeferredGradients = 64;

struct ActivationKey {
  int segment = 0;
  int micro_batch = 0;
  int sub_batch = 0;
  std::uint8_t set = kCheckpoint;
  auto operator<=>(const ActivationKey&) const = default;
};

class ActivationStore {
 public:
  explicit ActivationStore(Device device = Device::cpu()) : device_(device) {}

  // A contiguous [elements] block of `dtype` under `key`, which must not be live; contents
  // are unspecified. An encoding rounds its first `encodable` elements (all when negative) and
  // keeps the rest as they are (the statistics of an ops::SetLayout).
  Tensor acquire(const ActivationKey& key, DType dtype, std::int64_t elements,
                 std::int64_t encodable = -1);
  // The live block of `key` (InternalError when it is not live: a read after free).
  Tensor get(const ActivationKey& key) const;
  bool live(const ActivationKey& key) const { return live_.contains(key); }
  void release(const ActivationKey& key);

  // Replaces the live, not encoded block of `key` by its encodable elements in `encoding`
  // followed by the rest of its bytes.
  void encode(const ActivationKey& key, ActivationEncoding encoding);
  // Replaces the encoded block of `key` by its elements in the block's own dtype again.
  void decode(const ActivationKey& key);
  bool encoded(const ActivationKey& key) const;

  // Keeps slice `part` of `parts` of the live, whole block of `key` (0 <= part < parts).
  void partition(const ActivationKey& key, int part, int parts);
  // The partitioned block of `key` made whole again: `gathered` is the padded block of parts x
  // slice elements (the block's own elements first), `own` this rank's slice within it, already
  // in place. An all-gather of `own` into `gathered` over the group fills the rest.
  struct Unpartitioned {
    Tensor gathered;
    Tensor own;
  };
  Unpartitioned unpartition(const ActivationKey& key);
  bool partitioned(const ActivationKey& key) const;
  // Elements of each slice when `elements` are cut into `parts`.
  static std::int64_t slice_elements(std::int64_t elements, int parts) {
    return (elements + parts - 1) / parts;
  }

  std::size_t live_bytes() const { return live_bytes_; }
  std::size_t peak_bytes() const { return peak_bytes_; }
  void reset_peak() { peak_bytes_ = live_bytes_; }
  std::size_t reserved_bytes() const { return reserved_bytes_; }  // live and cached blocks
  std::size_t live_count() const { return live_.size(); }

 private:
  struct Block {
    Buffer buffer;
    Tensor view;   // the elements in their own dtype; empty while encoded
    bool encoded = false;
    int part = 0, parts = 0;  // partitioned: this rank's slice of `parts`; 0 parts: whole
    ActivationEncoding encoding = ActivationEncoding::bf16;
    DType dtype = DType::f32;  // the elements' own dtype
    std::int64_t elements = 0;
    std::int64_t encodable = 0;  // the leading elements an encoding rounds
  };
  // A block of `bytes` from the cache or newly allocated, counted as live.
  Buffer take(std::size_t bytes);
  // Returns a block to the cache and stops counting it.
  void give_back(Buffer block);
  Device device_;
  std::map<ActivationKey, Block> live_;
  std::map<std::size_t, std::vector<Buffer>> cached_;  // released blocks by size in bytes
  std::size_t live_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t reserved_bytes_ = 0;
};

}  // namespace oases::ops
