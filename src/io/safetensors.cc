#include "io/safetensors.h"

#include "core/regular_file.h"
#include "core/error.h"
#include "core/atomic_file.h"
#include "io/untrusted_json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace oases::io {
namespace {

using nlohmann::json;

// Tensor bytes are copied between the file and memory unchanged, which is only right when the
// host stores numbers little-endian as the format does.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::f64, "F64"}, {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
    {DType::i64, "I64"}, {DType::i32, "I32"}, {DType::u16, "U16"}, {DType::u8, "U8"},
};

std::string supported_dtype_list() {
  std::string out;
  for (const DTypeName& d : kDTypeNames)
    out += fmt::format("{}{}", out.empty() ? "" : ", ", d.name);
  return out;
}

// Byte size of a shape, or nullopt when a dimension is negative or the element count
// (multiplied in order, as SafetensorsTensorInfo::numel does) or the byte size overflows:
// a zero dimension does not excuse a product of the dimensions before it that overflowed.
std::optional<std::uint64_t> byte_size(const std::vector<std::int64_t>& shape, DType dtype) {
  std::int64_t elements = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(elements, d, &elements)) return std::nullopt;
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(elements), dtype_size(dtype), &bytes))
    return std::nullopt;
  return bytes;
}

float half_to_float(std::uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    value = mantissa == 0 ? INFINITY : NAN;
  } else {
    value = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
  }
  return negative ? -value : value;
}

float bf16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

std::size_t common_prefix(std::string_view a, std::string_view b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames)
    if (d.dtype == dtype) return d.name;
  OASES_ASSERT(false, "dtype {} has no safetensors name", dtype_name(dtype));
  return {};
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (const DTypeName& d : kDTypeNames)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::int64_t SafetensorsTensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

// -----------------------------------------------------------------------------------------
// Writer

SafetensorsWriter::Entry& SafetensorsWriter::insert(std::string name, DType dtype,
                                                    std::vector<std::int64_t> shape) {
  OASES_ASSERT(!name.empty() && name != "__metadata__", "invalid tensor name '{}'", name);
  OASES_ASSERT(byte_size(shape, dtype).has_value(), "tensor '{}' has invalid shape {}", name,
               shape_string(shape));
  auto [it, inserted] =
      tensors_.emplace(std::move(name), Entry{dtype, std::move(shape), nullptr, {}});
  OASES_ASSERT(inserted, "tensor '{}' added twice", it->first);
  return it->second;
}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<std::int64_t> shape,
                            const void* data) {
  Entry& entry = insert(std::move(name), dtype, std::move(shape));
  OASES_ASSERT(data != nullptr || *byte_size(entry.shape, dtype) == 0, "null data");
  entry.data = data;
}

void SafetensorsWriter::add_copy(std::string name, DType dtype, std::vector<std::int64_t> shape,
                                 const void* data) {
  Entry& entry = insert(std::move(name), dtype, std::move(shape));
  const std::size_t bytes = *byte_size(entry.shape, dtype);
  OASES_ASSERT(data != nullptr || bytes == 0, "null data");
  std::byte* copy = nullptr;
  if (staging_) {
    copy = staging_->allocate(bytes);
  } else {
    entry.owned.reset(new std::byte[std::max<std::size_t>(bytes, 1)]);  // uninitialised
    copy = entry.owned.get();
  }
  if (bytes > 0) std::memcpy(copy, data, bytes);
  entry.data = copy;
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::uint64_t SafetensorsWriter::file_bytes() const {
  std::uint64_t bytes = 8 + 64 * (tensors_.size() + metadata_.size() + 1);  // header, roughly
  for (const auto& [name, entry] : tensors_) bytes += *byte_size(entry.shape, entry.dtype) + name.size();
  for (const auto& [key, value] : metadata_) bytes += key.size() + value.size();
  return bytes;
}

void SafetensorsWriter::write(const std::string& path) const {
  // Largest elements first keeps every tensor aligned to its element size without padding
  // (the format allows no gaps between tensors).
  std::vector<std::pair<const std::string*, const Entry*>> order;
  for (const auto& [name, entry] : tensors_) order.emplace_back(&name, &entry);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second->dtype) > dtype_size(b.second->dtype);
  });

  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, entry] : order) {
    const std::uint64_t bytes = *byte_size(entry->shape, entry->dtype);
    header[*name] = {{"dtype", safetensors_dtype_name(entry->dtype)},
                     {"shape", entry->shape},
                     {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;

  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] =
        static_cast<std::uint8_t>(static_cast<std::uint64_t>(header_text.size()) >> (8 * i));

  AtomicFileWriter file(path);
  file.write(length, sizeof(length));
  file.write(header_text);
  for (const auto& [name, entry] : order)
    file.write(entry->data, *byte_size(entry->shape, entry->dtype));
  file.commit();
}

// -----------------------------------------------------------------------------------------
// Reader

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::read_at(std::uint64_t offset, void* out, std::size_t size) const {
  char* dst = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, dst, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    OASES_CHECK(n >= 0, "cannot read safetensors file '{}' at byte {}: {}", path_, offset,
                std::strerror(errno));
    OASES_CHECK(n > 0,
                "safetensors file '{}' ended at byte {} while reading; was it truncated "
                "or replaced after it was opened?",
                path_, offset);
    dst += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  ReadableFile opened = ReadableFile::open(path, "safetensors file");
  const std::uint64_t file_bytes = opened.size();
  file.fd_ = opened.release();

  OASES_CHECK(file_bytes >= 8,
              "safetensors file '{}' is truncated: it holds {} bytes, less than the 8-byte header "
              "length field",
              path, file_bytes);
  std::uint8_t length_bytes[8];
  file.read_at(0, length_bytes, sizeof(length_bytes));
  std::uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= std::uint64_t{length_bytes[i]} << (8 * i);
  OASES_CHECK(header_bytes <= file_bytes - 8,
              "safetensors file '{}' is truncated or not a safetensors file: its first 8 bytes "
              "give a header length of {} bytes, but only {} bytes follow them",
              path, header_bytes, file_bytes - 8);
  OASES_CHECK(header_bytes >= 2,
              "safetensors file '{}' has a header length of {} bytes, too "
              "short for a JSON object",
              path, header_bytes);
  file.data_start_ = 8 + header_bytes;
  const std::uint64_t data_bytes = file_bytes - file.data_start_;

  std::string header_text(static_cast<std::size_t>(header_bytes), '\0');
  file.read_at(8, header_text.data(), header_text.size());
  OASES_CHECK(header_text.front() == '{',
              "safetensors file '{}' does not start its header with a JSON object ('{{'); it is "
              "not a safetensors file or is damaged",
              path);
  json header;
  try {
    header = parse_untrusted_json(header_text, fmt::format("safetensors file '{}'", path));
  } catch (const json::exception& e) {
    OASES_FAIL("safetensors file '{}' has a malformed JSON header: {}", path, e.what());
  }
  OASES_CHECK(header.is_object(), "safetensors file '{}': the header is not a JSON object", path);

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      OASES_CHECK(entry.is_object(),
                  "safetensors file '{}': __metadata__ must be an object of strings, found {}",
                  path, entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        OASES_CHECK(value.is_string(),
                    "safetensors file '{}': __metadata__ value of '{}' must be a string, found {}",
                    path, key, value.dump());
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    OASES_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                    entry.contains("data_offsets"),
                "safetensors file '{}': entry '{}' must be an object with dtype, shape and "
                "data_offsets, found {}",
                path, name, entry.dump());
    SafetensorsTensorInfo info;

    const json& dtype = entry["dtype"];
    OASES_CHECK(dtype.is_string(), "safetensors file '{}': tensor '{}' has dtype {}, not a string",
                path, name, dtype.dump());
    const std::optional<DType> parsed = parse_safetensors_dtype(dtype.get<std::string>());
    OASES_CHECK(parsed.has_value(),
                "safetensors file '{}': tensor '{}' has dtype {}, which oases does not read "
                "(supported: {})",
                path, name, dtype.dump(), supported_dtype_list());
    info.dtype = *parsed;

    const json& shape = entry["shape"];
    OASES_CHECK(shape.is_array(), "safetensors file '{}': tensor '{}' has shape {}, not an array",
                path, name, shape.dump());
    for (const json& d : shape) {
      OASES_CHECK(d.is_number_unsigned() && d.get<std::uint64_t>() <= INT64_MAX,
                  "safetensors file '{}': tensor '{}' has shape {}; dimensions must be "
                  "non-negative integers",
                  path, name, shape.dump());
      info.shape.push_back(d.get<std::int64_t>());
    }

    const json& offsets = entry["data_offsets"];
    OASES_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                "safetensors file '{}': tensor '{}' has data_offsets {}; expected [begin, end] "
                "with non-negative integers",
                path, name, offsets.dump());
    info.data_begin = offsets[0].get<std::uint64_t>();
    info.data_end = offsets[1].get<std::uint64_t>();
    OASES_CHECK(info.data_begin <= info.data_end && info.data_end <= data_bytes,
                "safetensors file '{}': tensor '{}' has data_offsets [{}, {}] outside the data "
                "section of {} bytes (the file is truncated or damaged)",
                path, name, info.data_begin, info.data_end, data_bytes);
    const std::optional<std::uint64_t> expected = byte_size(info.shape, info.dtype);
    OASES_CHECK(expected.has_value(),
                "safetensors file '{}': tensor '{}' has shape {}, whose element count or byte "
                "size does not fit in 64 bits",
                path, name, shape_string(info.shape));
    OASES_CHECK(*expected == info.nbytes(),
                "safetensors file '{}': tensor '{}' of dtype {} and shape {} needs {} bytes, but "
                "its data_offsets [{}, {}] span {} bytes",
                path, name, dtype.get<std::string>(), shape_string(info.shape), *expected,
                info.data_begin, info.data_end, info.nbytes());
    file.tensors_.emplace(name, std::move(info));
  }

  std::vector<std::pair<const std::string*, const SafetensorsTensorInfo*>> by_offset;
  for (const auto& [name, info] : file.tensors_)
    if (info.nbytes() > 0) by_offset.emplace_back(&name, &info);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return a.second->data_begin < b.second->data_begin;
  });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [prev_name, prev] = by_offset[i - 1];
    const auto& [name, info] = by_offset[i];
    OASES_CHECK(info->data_begin >= prev->data_end,
                "safetensors file '{}': tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) "
                "overlap",
                path, *prev_name, prev->data_begin, prev->data_end, *name, info->data_begin,
                info->data_end);
  }
  // As the format's reference implementation requires, the tensors cover the data section
  // exactly: no gap between them and nothing after the last (bytes appended to a file, or a
  // header that lost a tensor, are damage).
  std::uint64_t covered = 0;
  for (const auto& [name, info] : by_offset) {
    OASES_CHECK(info->data_begin == covered,
                "safetensors file '{}': bytes [{}, {}) of the data section belong to no tensor "
                "(tensor '{}' starts at {}); the file is damaged",
                path, covered, info->data_begin, *name, info->data_begin);
    covered = info->data_end;
  }
  OASES_CHECK(covered == data_bytes,
              "safetensors file '{}' holds {} bytes after its tensors' data (the data section is "
              "{} bytes, its tensors end at {}); the file is damaged or something was appended",
              path, data_bytes - covered, data_bytes, covered);
  return file;
}

bool SafetensorsFile::has(std::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

std::string SafetensorsFile::closest_names(std::string_view name) const {
  // The names sharing the longest prefix usually reveal a naming-convention mismatch.
  std::vector<std::string> candidates = names();
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const std::string& a, const std::string& b) {
                     return common_prefix(a, name) > common_prefix(b, name);
                   });
  if (candidates.size() > 3) candidates.resize(3);
  if (candidates.empty()) return "it holds no tensors";
  return fmt::format("it holds {} tensors, the closest named '{}'", tensors_.size(),
                     fmt::join(candidates, "', '"));
}

const SafetensorsTensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it = tensors_.find(name);
  OASES_CHECK(it != tensors_.end(), "safetensors file '{}' has no tensor '{}'; {}", path_, name,
              closest_names(name));
  return it->second;
}

template <class T>
void SafetensorsFile::read_as(std::string_view name,
                              const std::vector<std::int64_t>& expected_shape, T* out) const {
  const auto it = tensors_.find(name);
  OASES_CHECK(it != tensors_.end(), "checkpoint '{}' has no tensor '{}' (expected shape {}); {}",
              path_, name, shape_string(expected_shape), closest_names(name));
  const SafetensorsTensorInfo& tensor = it->second;
  OASES_CHECK(tensor.shape == expected_shape,
              "checkpoint '{}': tensor '{}' has shape {} but the model needs {}", path_, name,
              shape_string(tensor.shape), shape_string(expected_shape));
  const auto n = static_cast<std::size_t>(tensor.numel());
  const std::uint64_t offset = data_start_ + tensor.data_begin;
  // Another stored type is read a block at a time and converted in parallel, so a tensor of
  // gigabytes needs no second copy of itself and its conversion keeps pace with the disk.
  const auto read_converted = [&](auto stored, const auto& to_value) {
    using S = decltype(stored);
    constexpr std::size_t kBlock = std::size_t{1} << 22;
    std::unique_ptr<S[]> block(new S[std::min(n, kBlock)]);
    for (std::size_t first = 0; first < n; first += kBlock) {
      const std::size_t count = std::min(kBlock, n - first);
      read_at(offset + first * sizeof(S), block.get(), count * sizeof(S));
      const S* values = block.get();
      T* target = out + first;
#pragma omp parallel for schedule(static) if (count >= 65536)
      for (std::size_t i = 0; i < count; ++i) target[i] = static_cast<T>(to_value(values[i]));
    }
  };
  const auto same = [](auto v) { return v; };
  switch (tensor.dtype) {
    case DType::f32:
      if constexpr (std::is_same_v<T, float>)
        return read_at(offset, out, n * sizeof(T));
      else
        return read_converted(float{}, same);
    case DType::f64:
      if constexpr (std::is_same_v<T, double>)
        return read_at(offset, out, n * sizeof(T));
      else
        return read_converted(double{}, same);
    case DType::f16:
      return read_converted(std::uint16_t{}, [](std::uint16_t h) { return half_to_float(h); });
    case DType::bf16:
      return read_converted(std::uint16_t{}, [](std::uint16_t b) { return bf16_to_float(b); });
    default:
      OASES_FAIL(
          "checkpoint '{}': tensor '{}' holds {} integers, which cannot be read as "
          "floating-point values",
          path_, name, safetensors_dtype_name(tensor.dtype));
  }
}

void SafetensorsFile::read_f32(std::string_view name,
                               const std::vector<std::int64_t>& expected_shape, float* out) const {
  read_as(name, expected_shape, out);
}

void SafetensorsFile::read_f64(std::string_view name,
                               const std::vector<std::int64_t>& expected_shape, double* out) const {
  read_as(name, expected_shape, out);
}

std::vector<std::byte> SafetensorsFile::read_raw(std::string_view name) const {
  const SafetensorsTensorInfo& tensor = info(name);
  std::vector<std::byte> bytes(static_cast<std::size_t>(tensor.nbytes()));
  read_at(data_start_ + tensor.data_begin, bytes.data(), bytes.size());
  return bytes;
}

}  // namespace oases::io
