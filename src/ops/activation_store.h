// ActivationStore: the activations segments keep between their actions, keyed by
// (segment, micro-batch, sub-batch, tensor set). A set is acquired when a Forward or Recompute
// produces it and released when the schedule frees it, so how much is live at once, and its
// peak, are properties of the schedule. Released blocks are kept for reuse by the next
// acquisition of the same size (every step asks for the same sizes), so the steady state
// allocates nothing.
#pragma once

#include "core/buffer.h"
#include "ops/program.h"

#include <cstddef>
#include <map>
#include <tuple>
#include <vector>

namespace oases::ops {

struct ActivationKey {
  int segment = 0;
  int micro_batch = 0;
  int sub_batch = 0;
  TensorSet set = kCheckpoint;
  auto operator<=>(const ActivationKey&) const = default;
};

class ActivationStore {
 public:
  // Storage for `floats` floats under `key`, which must not be live; contents are unspecified.
  float* acquire(const ActivationKey& key, std::size_t floats);
  // The live block of `key` (InternalError when it is not live: a read after free).
  float* get(const ActivationKey& key) const;
  bool live(const ActivationKey& key) const { return live_.contains(key); }
  void release(const ActivationKey& key);

  std::size_t live_bytes() const { return live_bytes_; }
  std::size_t peak_bytes() const { return peak_bytes_; }
  void reset_peak() { peak_bytes_ = live_bytes_; }
  std::size_t reserved_bytes() const { return reserved_bytes_; }  // live and cached blocks
  std::size_t live_count() const { return live_.size(); }

 private:
  std::map<ActivationKey, Buffer> live_;
  std::map<std::size_t, std::vector<Buffer>> cached_;  // released blocks by size in bytes
  std::size_t live_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t reserved_bytes_ = 0;
};

}  // namespace oases::ops
