#include "ops/activation_store.h"

#include "core/error.h"

#include <algorithm>

namespace oases::ops {

std::string tensor_sets_name(TensorSets sets) {
  std::string out;
  const auto add = [&](TensorSet set, const char* name) {
    if (!(sets & set)) return;
    if (!out.empty()) out += '|';
    out += name;
  };
  add(kCheckpoint, "checkpoint");
  add(kInternals, "internals");
  add(kCore, "core");
  add(kOutput, "output");
  return out.empty() ? "-" : out;
}

namespace {
std::string describe(const ActivationKey& key) {
  return "segment " + std::to_string(key.segment) + " mb " + std::to_string(key.micro_batch) +
         " sb " + std::to_string(key.sub_batch) + " " +
         (key.set == kReceivedInput ? std::string("received input")
                                    : tensor_sets_name(key.set));
}
}  // namespace

Tensor ActivationStore::acquire(const ActivationKey& key, DType dtype, std::int64_t elements) {
  OASES_ASSERT(!live_.contains(key), "activation {} acquired while live", describe(key));
  const std::size_t bytes =
      std::max<std::size_t>(static_cast<std::size_t>(elements) * dtype_size(dtype), 1);
  Buffer block;
  auto cached = cached_.find(bytes);
  if (cached != cached_.end() && !cached->second.empty()) {
    block = std::move(cached->second.back());
    cached->second.pop_back();
  } else {
    block = Buffer(bytes, device_);
    reserved_bytes_ += bytes;
  }
  const Tensor view(block.data(), dtype, {elements}, device_);
  live_.emplace(key, Block{std::move(block), view});
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return view;
}

Tensor ActivationStore::get(const ActivationKey& key) const {
  const auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} read while not live", describe(key));
  return it->second.view;
}

void ActivationStore::release(const ActivationKey& key) {
  auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} freed while not live", describe(key));
  const std::size_t bytes = it->second.buffer.bytes();
  live_bytes_ -= bytes;
  cached_[bytes].push_back(std::move(it->second.buffer));
  live_.erase(it);
}

}  // namespace oases::ops
