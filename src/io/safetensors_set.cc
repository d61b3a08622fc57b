#include "io/safetensors_set.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <system_error>

namespace oases::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
// An index lists one entry per tensor: a few hundred thousand is far beyond any real model.
constexpr std::uint64_t kMaxIndexBytes = 64u << 20;

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// A shard name from an index: a plain file name, so the index cannot reach outside its folder.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const std::string& path) {
  std::error_code ec;
  fs::path index_path, single_path;
  if (fs::is_directory(path, ec)) {
    if (is_file(fs::path(path) / kSafetensorsIndexFile))
      index_path = fs::path(path) / kSafetensorsIndexFile;
    else if (is_file(fs::path(path) / kSingleFile))
      single_path = fs::path(path) / kSingleFile;
    else
      OASES_FAIL(
          "folder '{}' holds neither {} nor {}: it is not a Hugging Face model folder "
          "(its weights are one of those)",
          path, kSafetensorsIndexFile, kSingleFile);
  } else if (path.ends_with(".index.json")) {
    index_path = path;
  } else {
    single_path = path;
  }

  SafetensorsSet set;
  if (!single_path.empty()) {
    set.path_ = single_path.string();
    set.files_.push_back(SafetensorsFile::open(set.path_));
    for (const std::string& name : set.files_.front().names()) set.owner_.emplace(name, 0);
    return set;
  }

  set.path_ = index_path.string();
  set.indexed_ = true;
  const std::string text = read_regular_file(set.path_, "safetensors index", kMaxIndexBytes);
  json index;
  try {
    index = parse_untrusted_json(text, fmt::format("safetensors index '{}'", set.path_));
  } catch (const json::exception& e) {
    OASES_FAIL("safetensors index '{}' is not valid JSON: {}", set.path_, e.what());
  }
  OASES_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              "safetensors index '{}' must be a JSON object with a \"weight_map\" object "
              "(tensor name -> shard file)",
              set.path_);
  const fs::path folder = index_path.parent_path();
  std::map<std::string, std::size_t> shard_index;  // file name -> index into files_
  std::map<std::string, std::string> listed;       // tensor -> file name, as the index says
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    OASES_CHECK(file.is_string() && plain_file_name(file.get<std::string>()),
                "safetensors index '{}': tensor '{}' maps to {}, which is not a file name of "
                "the index's folder",
                set.path_, tensor, file.dump());
    const std::string name = file.get<std::string>();
    listed.emplace(tensor, name);
    if (shard_index.count(name)) continue;
    const fs::path shard = folder / name;
    OASES_CHECK(is_file(shard),
                "safetensors index '{}' puts tensor '{}' in shard '{}', which is missing from "
                "'{}'; the folder is incomplete (copy every shard the index names)",
                set.path_, tensor, name, folder.string());
    shard_index.emplace(name, set.files_.size());
    set.files_.push_back(SafetensorsFile::open(shard.string()));
  }
  OASES_CHECK(!listed.empty(), "safetensors index '{}' lists no tensor", set.path_);

  std::uint64_t total = 0;
  for (const auto& [file_name, at] : shard_index) {
    for (const std::string& tensor : set.files_[at].names()) {
      const auto it = listed.find(tensor);
      OASES_CHECK(it != listed.end(),
                  "shard '{}' holds tensor '{}', which the index '{}' does not list; the index "
                  "and its shards do not belong together",
                  set.files_[at].path(), tensor, set.path_);
      if (it->second != file_name) {
        const bool in_both = set.files_[shard_index.at(it->second)].has(tensor);
        OASES_FAIL("tensor '{}' is in shard '{}'{}, but the index '{}' puts it in '{}'; {}", tensor,
                   file_name, in_both ? " and in that one too" : "", set.path_, it->second,
                   in_both ? "a tensor must be in exactly one shard"
                           : "the index and its shards do not belong together");
      }
      const auto [owner, inserted] = set.owner_.emplace(tensor, at);
      OASES_ASSERT(inserted, "tensor {} owned twice", tensor);
      (void)owner;
      total += set.files_[at].info(tensor).nbytes();
    }
  }
  for (const auto& [tensor, file_name] : listed)
    OASES_CHECK(set.owner_.count(tensor),
                "safetensors index '{}' puts tensor '{}' in shard '{}', which does not hold it",
                set.path_, tensor, file_name);
  if (index.contains("metadata") && index["metadata"].is_object() &&
      index["metadata"].contains("total_size")) {
    const auto stated = json_integer<std::uint64_t>(index["metadata"]["total_size"]);
    // transformers writes total_size as a float in some versions; an integer value is fine.
    const json& value = index["metadata"]["total_size"];
    const bool whole_float = value.is_number_float() && value.get<double>() >= 0 &&
                             static_cast<double>(total) == value.get<double>();
    OASES_CHECK(whole_float || (stated && *stated == total),
                "safetensors index '{}' says total_size = {}, but its shards hold {} bytes of "
                "tensors; the index and its shards do not belong together",
                set.path_, value.dump(), total);
  }
  return set;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(owner_.size());
  for (const auto& [name, at] : owner_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsSet::file_of(std::string_view name) const {
  const auto it = owner_.find(name);
  if (it != owner_.end()) return files_[it->second];
  // A single file's own messages name the tensor and the closest names it holds.
  if (!indexed_) return files_.front();
  const std::string_view last = name.substr(name.rfind('.') + 1);
  std::string similar;
  for (const auto& [candidate, at] : owner_)
    if (candidate.ends_with(last) && similar.size() < 300)
      similar += (similar.empty() ? "" : ", ") + candidate;
  OASES_FAIL("the weights at '{}' have no tensor '{}'{}", path_, name,
             similar.empty() ? std::string() : "; similar names: " + similar);
}

const SafetensorsTensorInfo& SafetensorsSet::info(std::string_view name) const {
  return file_of(name).info(name);
}

void SafetensorsSet::read_f32(std::string_view name,
                              const std::vector<std::int64_t>& expected_shape, float* out) const {
  file_of(name).read_f32(name, expected_shape, out);
}

void SafetensorsSet::read_f64(std::string_view name,
                              const std::vector<std::int64_t>& expected_shape, double* out) const {
  file_of(name).read_f64(name, expected_shape, out);
}

std::vector<std::byte> SafetensorsSet::read_raw(std::string_view name) const {
  return file_of(name).read_raw(name);
}

WrittenSafetensorsSet write_safetensors_set(const std::string& dir,
                                            const std::vector<TensorToWrite>& tensors,
                                            std::uint64_t max_shard_bytes,
                                            const std::map<std::string, std::string>& metadata,
                                            const TensorBytes& bytes_of) {
  OASES_CHECK(max_shard_bytes > 0, "--shard-size must be positive, got 0 bytes");
  std::set<std::string> seen;
  std::vector<std::vector<std::size_t>> shards(1);  // indices into tensors
  std::uint64_t shard_bytes = 0, total = 0;
  for (const TensorToWrite& t : tensors) {
    OASES_ASSERT(seen.insert(t.name).second, "tensor {} written twice", t.name);
    std::uint64_t bytes = dtype_size(t.dtype);
    for (std::int64_t d : t.shape) bytes *= static_cast<std::uint64_t>(d);
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(static_cast<std::size_t>(&t - tensors.data()));
    shard_bytes += bytes;
    total += bytes;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  OASES_CHECK(!ec && fs::is_directory(dir, ec), "cannot create the output folder '{}': {}", dir,
              ec ? ec.message() : "a file of that name exists");

  WrittenSafetensorsSet written;
  written.tensor_bytes = total;
  const std::size_t n = shards.size();
  json weight_map = json::object();
  for (std::size_t k = 0; k < n; ++k) {
    const std::string name = n == 1 ? std::string(kSingleFile)
                                    : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
    SafetensorsWriter writer;
    std::vector<std::vector<std::byte>> produced;  // this shard's bytes from bytes_of
    produced.reserve(shards[k].size());
    for (const std::size_t i : shards[k]) {
      const TensorToWrite& t = tensors[i];
      const void* data = t.data;
      if (bytes_of) {
        produced.push_back(bytes_of(i));
        std::uint64_t expected = dtype_size(t.dtype);
        for (std::int64_t d : t.shape) expected *= static_cast<std::uint64_t>(d);
        OASES_ASSERT(produced.back().size() == expected, "tensor {}: {} bytes for {}", t.name,
                     produced.back().size(), expected);
        data = produced.back().data();
      }
      writer.add(t.name, t.dtype, t.shape, data);
      weight_map[t.name] = name;
    }
    for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
    writer.write((fs::path(dir) / name).string());
    written.files.push_back(name);
  }
  // A stale form of the other kind would be read instead of (index) or beside (single file)
  // what was just written.
  if (n == 1) {
    fs::remove(fs::path(dir) / kSafetensorsIndexFile, ec);
  } else {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    AtomicFileWriter file((fs::path(dir) / kSafetensorsIndexFile).string());
    file.write(index.dump(2) + "\n");
    file.commit();
    written.files.push_back(kSafetensorsIndexFile);
    fs::remove(fs::path(dir) / kSingleFile, ec);
  }
  return written;
}

std::uint64_t parse_byte_size(std::string_view text, std::string_view setting) {
  const auto fail = [&] {
    OASES_FAIL(
        "{} = \"{}\" is not a size; give bytes as a number with an optional unit: KB, "
        "MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), for "
        "example 5GB or 500MiB",
        setting, text);
  };
  std::size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  if (digits == 0) fail();
  double number = 0;
  try {
    std::size_t used = 0;
    number = std::stod(std::string(text.substr(0, digits)), &used);
    if (used != digits) fail();
  } catch (const std::logic_error&) {
    fail();
  }
  std::string unit;
  for (char c : text.substr(digits))
    if (c != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"b", 1},
                                                       {"kb", 1e3},
                                                       {"mb", 1e6},
                                                       {"gb", 1e9},
                                                       {"tb", 1e12},
                                                       {"kib", 1024.0},
                                                       {"mib", 1048576.0},
                                                       {"gib", 1073741824.0},
                                                       {"tib", 1099511627776.0}};
  const auto it = kUnits.find(unit);
  if (it == kUnits.end()) fail();
  const double bytes = number * it->second;
  OASES_CHECK(bytes >= 1 && bytes < 1.8e19, "{} = \"{}\" must be at least 1 byte", setting, text);
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace oases::io
