// Reading and writing Hugging Face safetensors files, the checkpoint format (docs/checkpoints.md,
// "What a checkpoint holds"): a PyTorch user loads them with `safetensors.torch.load_file`, and
// an HF GPT-2 `model.safetensors` can initialise a run.
//
// File layout:
//   8 bytes    N, the header length (uint64, little-endian)
//   N bytes    JSON header (UTF-8), an object:
//                {"<tensor name>": {"dtype": "F32", "shape": [d0, d1, ...],
//                                   "data_offsets": [begin, end]}, ...,
//                 "__metadata__": {"key": "value", ...}}      (optional; string values only)
//              possibly padded with trailing spaces
//   data       the tensors' raw bytes, row-major, little-endian; data_offsets are byte
//              offsets relative to the start of this section, end - begin equals
//              numel(shape) * dtype size, and tensors do not overlap.
// dtype strings: F64 F32 F16 BF16 I64 I32 U16 U8 (the others in the format, e.g. BOOL, I8,
// F8_*, are rejected on open with a message naming the tensor).
//
// What SafetensorsWriter produces: the header is compact JSON with keys in byte order
// (nlohmann's object order) padded with spaces so the data section starts 8-byte aligned;
// the data section holds the tensors with no gaps, ordered by dtype size (largest first)
// and then by name, as the reference Rust implementation lays them out, so every tensor is
// aligned to its element size. Files are therefore byte-identical regardless of the order in
// which tensors were added.
#pragma once

#include "core/dtype.h"
#include "core/staging_memory.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::io {

// "F32" for DType::f32, ...
std::string_view safetensors_dtype_name(DType dtype);
// The DType for a safetensors dtype string, or nullopt when oases does not read that dtype.
std::optional<DType> parse_safetensors_dtype(std::string_view name);

// "[256, 64]"; "[]" for a scalar.
std::string shape_string(const std::vector<std::int64_t>& shape);

// One tensor's header entry. Offsets are relative to the data section.
struct SafetensorsTensorInfo {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t data_begin = 0;
  std::uint64_t data_end = 0;

  std::int64_t numel() const;
  std::uint64_t nbytes() const { return data_end - data_begin; }
};

// Collects tensors and metadata, then writes one file atomically (see atomic_file.h: the
// previous file at that path survives any failure before the final rename).
class SafetensorsWriter {
 public:
  // References `data` (numel(shape) * dtype_size(dtype) bytes), which must stay valid and
  // unchanged until write() returns. Names are unique, non-empty and not "__metadata__";
  // dimensions are >= 0 (violations are bugs: InternalError).
  void add(std::string name, DType dtype, std::vector<std::int64_t> shape, const void* data);
  // Like add(), but the writer keeps its own copy of the bytes (in `staging` when set: see
  // set_staging).
  void add_copy(std::string name, DType dtype, std::vector<std::int64_t> shape, const void* data);
  // Copies of add_copy() go into `staging` (which must outlive the writer's use and not be
  // rewound meanwhile) instead of allocations of the writer's own.
  void set_staging(StagingMemory* staging) { staging_ = staging; }
  void set_metadata(std::string key, std::string value);

  std::size_t size() const { return tensors_.size(); }
  // About the bytes write() produces (length, header and data): exact for the data, an
  // upper estimate for the header.
  std::uint64_t file_bytes() const;
  void write(const std::string& path) const;

 private:
  struct Entry {
    DType dtype;
    std::vector<std::int64_t> shape;
    const void* data;
    std::unique_ptr<std::byte[]> owned;  // holds the bytes for add_copy() without staging
  };
  Entry& insert(std::string name, DType dtype, std::vector<std::int64_t> shape);

  std::map<std::string, Entry, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
  StagingMemory* staging_ = nullptr;
};

// An open, validated safetensors file. The header is read and checked on open(); tensor
// bytes are read on demand, so opening a multi-GB checkpoint costs one small read. Every
// problem with the file is a UserError naming the file and what is wrong.
class SafetensorsFile {
 public:
  // Validates: the file holds the 8-byte length and a header of that length; the header is a
  // JSON object whose entries have a known dtype, a shape of non-negative integers and
  // data_offsets [begin, end] inside the data section with end - begin = the shape's byte
  // size; tensors do not overlap; __metadata__, if present, maps strings to strings.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  bool has(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  // UserError if absent.
  const SafetensorsTensorInfo& info(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads tensor `name` as f32 into `out` (numel(expected_shape) floats), converting from
  // F64, F16 or BF16 when stored so. UserError when the tensor is absent, its shape differs
  // from `expected_shape`, or its dtype is an integer type.
  void read_f32(std::string_view name, const std::vector<std::int64_t>& expected_shape,
                float* out) const;
  // As read_f32, into doubles (F32, F16 and BF16 values are exact in double).
  void read_f64(std::string_view name, const std::vector<std::int64_t>& expected_shape,
                double* out) const;
  // The tensor's stored bytes, as in the file.
  std::vector<std::byte> read_raw(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  void read_at(std::uint64_t offset, void* out, std::size_t size) const;
  template <class T>
  void read_as(std::string_view name, const std::vector<std::int64_t>& expected_shape,
               T* out) const;
  std::string closest_names(std::string_view name) const;  // for "no such tensor" messages

  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, SafetensorsTensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace oases::io
