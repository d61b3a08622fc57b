// The weights of a Hugging Face model folder read as one set of tensors, and written so.
//
// A folder holds its weights in one of two ways (what `save_pretrained` writes):
//   model.safetensors                         every tensor in one file
//   model.safetensors.index.json              a JSON object:
//     {"metadata": {"total_size": <bytes of all tensors>},
//      "weight_map": {"<tensor name>": "model-00001-of-00002.safetensors", ...}}
//   model-0000k-of-0000n.safetensors          the shards it names (any plain file names)
// The index names, for each tensor, the one shard that holds it. When both forms are present
// the index is taken (save_pretrained removes the single file when it shards).
//
// SafetensorsSet::open validates the whole set before any tensor is read: the index is a JSON
// object whose weight_map maps names to plain file names of the folder; every shard exists and
// is a valid safetensors file (io/safetensors.h); every tensor the index names is in the shard
// it names; no tensor is in two shards; no shard holds a tensor the index does not list; and
// total_size, where given, equals the tensors' bytes. Each violation is a UserError naming the
// file, the tensor and what was expected.
#pragma once

#include "io/safetensors.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace oases::io {

inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

class SafetensorsSet {
 public:
  // `path` is a folder holding model.safetensors.index.json or model.safetensors, an index
  // file, or a single safetensors file. UserError when it is none of these (naming what was
  // looked for) or the set is not valid (above).
  static SafetensorsSet open(const std::string& path);

  // What was opened: the index file, or the single safetensors file.
  const std::string& path() const { return path_; }
  bool sharded() const { return files_.size() > 1 || indexed_; }
  std::size_t file_count() const { return files_.size(); }

  bool has(std::string_view name) const { return owner_.find(name) != owner_.end(); }
  std::vector<std::string> names() const;  // sorted
  // UserError if absent.
  const SafetensorsTensorInfo& info(std::string_view name) const;
  // The file holding `name` (UserError if absent).
  const SafetensorsFile& file_of(std::string_view name) const;

  // As SafetensorsFile's, from whichever shard holds the tensor.
  void read_f32(std::string_view name, const std::vector<std::int64_t>& expected_shape,
                float* out) const;
  void read_f64(std::string_view name, const std::vector<std::int64_t>& expected_shape,
                double* out) const;
  std::vector<std::byte> read_raw(std::string_view name) const;

 private:
  std::string path_;
  bool indexed_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t, std::less<>> owner_;  // tensor -> index into files_
};

// One tensor to write: its bytes (`data`) must stay valid until write_safetensors_set returns,
// unless a TensorBytes callback provides them.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
};

// What write_safetensors_set wrote.
struct WrittenSafetensorsSet {
  std::vector<std::string> files;  // plain file names, in order (the index last, when written)
  std::uint64_t tensor_bytes = 0;  // the index's total_size
};

// Writes `tensors` into folder `dir` (created if missing) as save_pretrained does: one
// model.safetensors when their bytes fit `max_shard_bytes`, else shards
// model-0000k-of-0000n.safetensors (five-digit numbers) plus model.safetensors.index.json.
// Tensors are taken in the order given; a shard is closed when the next tensor would take it
// past max_shard_bytes (a tensor larger than the limit gets a shard of its own). Each file is
// written atomically; `metadata` goes into every shard's __metadata__ (e.g. {"format": "pt"},
// which transformers requires). With `bytes_of`, each tensor's bytes come from it (their size
// must match the shape: InternalError otherwise) and `data` is not read. Names must be unique
// (InternalError otherwise); max_shard_bytes must be positive (UserError naming --shard-size). The
// bytes of tensors[index], produced on demand: write_safetensors_set asks for the tensors of one
// shard just before writing it and drops them after, so a model larger than memory is written with
// one shard in memory at a time.
using TensorBytes = std::function<std::vector<std::byte>(std::size_t index)>;

WrittenSafetensorsSet write_safetensors_set(const std::string& dir,
                                            const std::vector<TensorToWrite>& tensors,
                                            std::uint64_t max_shard_bytes,
                                            const std::map<std::string, std::string>& metadata,
                                            const TensorBytes& bytes_of = {});

// "5GB", "500MB", "2GiB", "1000000": a byte count as --shard-size takes it (decimal units KB,
// MB, GB, TB as powers of 1000; binary KiB, MiB, GiB, TiB as powers of 1024; case-insensitive;
// a plain number is bytes). UserError naming `setting`, the text and the accepted forms.
std::uint64_t parse_byte_size(std::string_view text, std::string_view setting);

}  // namespace oases::io
