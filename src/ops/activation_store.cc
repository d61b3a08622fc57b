#include "ops/activation_store.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <cstddef>
#include <cstring>

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

Buffer ActivationStore::take(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
  Buffer block;
  auto cached = cached_.find(bytes);
  if (cached != cached_.end() && !cached->second.empty()) {
    block = std::move(cached->second.back());
    cached->second.pop_back();
  } else {
    block = Buffer(bytes, device_);
    reserved_bytes_ += bytes;
  }
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return block;
}

void ActivationStore::give_back(Buffer block) {
  const std::size_t bytes = block.bytes();
  live_bytes_ -= bytes;
  cached_[bytes].push_back(std::move(block));
}

Tensor ActivationStore::acquire(const ActivationKey& key, DType dtype, std::int64_t elements,
                                std::int64_t encodable) {
  OASES_ASSERT(!live_.contains(key), "activation {} acquired while live", describe(key));
  OASES_ASSERT(encodable <= elements, "activation {}: {} encodable elements of {}", describe(key),
               encodable, elements);
  Buffer block = take(static_cast<std::size_t>(elements) * dtype_size(dtype));
  const Tensor view(block.data(), dtype, {elements}, device_);
  live_.emplace(key, Block{.buffer = std::move(block), .view = view, .dtype = dtype,
                           .elements = elements,
                           .encodable = encodable < 0 ? elements : encodable});
  return view;
}

Tensor ActivationStore::get(const ActivationKey& key) const {
  const auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} read while not live", describe(key));
  OASES_ASSERT(!it->second.encoded, "activation {} read while encoded", describe(key));
  OASES_ASSERT(it->second.parts == 0, "activation {} read while partitioned", describe(key));
  return it->second.view;
}

void ActivationStore::release(const ActivationKey& key) {
  auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} freed while not live", describe(key));
  give_back(std::move(it->second.buffer));
  live_.erase(it);
}

bool ActivationStore::encoded(const ActivationKey& key) const {
  const auto it = live_.find(key);
  return it != live_.end() && it->second.encoded;
}

void ActivationStore::encode(const ActivationKey& key, ActivationEncoding encoding) {
  auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} encoded while not live", describe(key));
  Block& block = it->second;
  OASES_ASSERT(!block.encoded, "activation {} encoded twice", describe(key));
  OASES_ASSERT(block.parts == 0, "activation {} encoded while partitioned", describe(key));
  OASES_ASSERT(device_.is_cpu(), "activation encoding runs on the CPU only");
  const auto encoded_bytes = static_cast<std::size_t>(block.encodable) * encoded_element_bytes(encoding);
  const std::size_t kept_bytes =
      static_cast<std::size_t>(block.elements - block.encodable) * dtype_size(block.dtype);
  Buffer packed = take(encoded_bytes + kept_bytes);
  const Tensor values = block.view.view(0, {block.encodable});
  switch (encoding) {
    case ActivationEncoding::bf16:
      kernels::convert(values, packed.tensor(DType::bf16, {block.encodable}));
      break;
    case ActivationEncoding::fp8_e4m3:
      // From f64 this rounds twice (through f32), harmlessly next to e4m3's 3 mantissa bits.
      kernels::encode_fp8(values, packed.tensor(DType::u8, {block.encodable}),
                          kernels::Fp8Format::e4m3);
      break;
  }
  const auto* tail = static_cast<const std::byte*>(block.view.raw()) +
                     static_cast<std::size_t>(block.encodable) * dtype_size(block.dtype);
  std::copy(tail, tail + kept_bytes, static_cast<std::byte*>(packed.data()) + encoded_bytes);
  give_back(std::move(block.buffer));
  block.buffer = std::move(packed);
  block.view = Tensor();
  block.encoded = true;
  block.encoding = encoding;
}

void ActivationStore::decode(const ActivationKey& key) {
  auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} decoded while not live", describe(key));
  Block& block = it->second;
  OASES_ASSERT(block.encoded, "activation {} decoded while not encoded", describe(key));
  Buffer wide = take(static_cast<std::size_t>(block.elements) * dtype_size(block.dtype));
  const Tensor values = wide.tensor(block.dtype, {block.encodable});
  switch (block.encoding) {
    case ActivationEncoding::bf16:
      kernels::convert(block.buffer.tensor(DType::bf16, {block.encodable}), values);
      break;
    case ActivationEncoding::fp8_e4m3:
      kernels::decode_fp8(block.buffer.tensor(DType::u8, {block.encodable}), values,
                          kernels::Fp8Format::e4m3);
      break;
  }
  const std::size_t encoded_bytes =
      static_cast<std::size_t>(block.encodable) * encoded_element_bytes(block.encoding);
  const std::size_t kept_bytes =
      static_cast<std::size_t>(block.elements - block.encodable) * dtype_size(block.dtype);
  const auto* tail = static_cast<const std::byte*>(block.buffer.data()) + encoded_bytes;
  std::copy(tail, tail + kept_bytes,
            static_cast<std::byte*>(wide.data()) +
                static_cast<std::size_t>(block.encodable) * dtype_size(block.dtype));
  give_back(std::move(block.buffer));
  block.buffer = std::move(wide);
  block.view = Tensor(block.buffer.data(), block.dtype, {block.elements}, device_);
  block.encoded = false;
}

bool ActivationStore::partitioned(const ActivationKey& key) const {
  const auto it = live_.find(key);
  return it != live_.end() && it->second.parts > 0;
}

void ActivationStore::partition(const ActivationKey& key, int part, int parts) {
  auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} partitioned while not live", describe(key));
  Block& block = it->second;
  OASES_ASSERT(!block.encoded && block.parts == 0,
               "activation {} partitioned while {}", describe(key),
               block.encoded ? "encoded" : "partitioned");
  OASES_ASSERT(parts >= 1 && part >= 0 && part < parts, "activation {}: slice {} of {}",
               describe(key), part, parts);
  OASES_ASSERT(device_.is_cpu(), "activation partitioning runs on the CPU only");
  const std::int64_t slice = slice_elements(block.elements, parts);
  const std::int64_t begin = std::min(block.elements, slice * part);
  const std::int64_t count = std::min(block.elements - begin, slice);
  const std::size_t element = dtype_size(block.dtype);
  Buffer kept = take(static_cast<std::size_t>(slice) * element);
  if (count > 0)
    std::memcpy(kept.data(),
                static_cast<const std::byte*>(block.view.raw()) + static_cast<std::size_t>(begin) * element,
                static_cast<std::size_t>(count) * element);
  give_back(std::move(block.buffer));
  block.buffer = std::move(kept);
  block.view = Tensor();
  block.part = part;
  block.parts = parts;
}

ActivationStore::Unpartitioned ActivationStore::unpartition(const ActivationKey& key) {
  auto it = live_.find(key);
  OASES_ASSERT(it != live_.end(), "activation {} gathered while not live", describe(key));
  Block& block = it->second;
  OASES_ASSERT(block.parts > 0, "activation {} gathered while not partitioned", describe(key));
  const std::int64_t slice = slice_elements(block.elements, block.parts);
  Buffer whole = take(static_cast<std::size_t>(slice * block.parts) * dtype_size(block.dtype));
  const Tensor gathered(whole.data(), block.dtype, {slice * block.parts}, device_);
  const Tensor own = gathered.view(slice * block.part, {slice});
  std::memcpy(own.raw(), block.buffer.data(), static_cast<std::size_t>(slice) * dtype_size(block.dtype));
  give_back(std::move(block.buffer));
  block.buffer = std::move(whole);
  block.view = gathered.view(0, {block.elements});
  block.parts = 0;
  return {gathered, own};
}

}  // namespace oases::ops
