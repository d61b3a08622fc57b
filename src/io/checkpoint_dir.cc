#include "io/checkpoint_dir.h"

#include "core/atomic_file.h"
#include "core/error.h"

#include <algorithm>
#include <filesystem>
#include <regex>

namespace oases::io {
namespace fs = std::filesystem;

std::string write_checkpoint(const std::string& dir, std::int64_t step,
                             const SafetensorsWriter& model, const SafetensorsWriter& optimizer,
                             std::int64_t keep) {
  const fs::path target = fs::path(dir) / ("step_" + std::to_string(step));
  std::error_code ec;
  fs::create_directories(target, ec);
  OASES_CHECK(!ec, "checkpoint.dir: cannot create '{}': {}", target.string(), ec.message());
  fs::remove(target / kCompleteMarker, ec);  // re-saving a step: incomplete until the end
  model.write((target / kModelFile).string());
  optimizer.write((target / kOptimizerFile).string());
  write_file_atomically((target / kCompleteMarker).string(), "step " + std::to_string(step) + "\n");
  if (keep > 0) {
    const auto all = complete_checkpoints(dir);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i)
      fs::remove_all(all[i].second, ec);
  }
  return target.string();
}

std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  static const std::regex pattern("step_([0-9]+)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, pattern) &&
        fs::exists(entry.path() / kCompleteMarker))
      found.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto all = complete_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

std::string resolve_model_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  OASES_CHECK(fs::is_directory(path, ec),
              "checkpoint '{}' does not exist; pass a step_N checkpoint directory, a run's "
              "checkpoint.dir or a model.safetensors file",
              path);
  if (fs::exists(fs::path(path) / kModelFile)) {
    OASES_CHECK(fs::exists(fs::path(path) / kCompleteMarker),
                "checkpoint '{}' is incomplete (no {} marker): it was interrupted while being "
                "written; use an earlier step",
                path, kCompleteMarker);
    return (fs::path(path) / kModelFile).string();
  }
  auto latest = latest_checkpoint(path);
  OASES_CHECK(latest.has_value(), "'{}' holds no complete checkpoint (step_N/{} with {})", path,
              kModelFile, kCompleteMarker);
  return (fs::path(*latest) / kModelFile).string();
}

std::string metadata_value(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  OASES_CHECK(it != file.metadata().end(),
              "checkpoint file '{}' has no metadata entry '{}'; it was not written by oases "
              "train (or by an incompatible version)",
              file.path(), key);
  return it->second;
}

std::int64_t metadata_int(const SafetensorsFile& file, const std::string& key) {
  const std::string text = metadata_value(file, key);
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    OASES_FAIL("checkpoint file '{}': metadata '{}' = \"{}\" is not an integer", file.path(), key,
               text);
  }
}

}  // namespace oases::io
