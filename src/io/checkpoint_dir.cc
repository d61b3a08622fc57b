#include "io/checkpoint_dir.h"

#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/regular_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace oases::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kMarkerHeader = "oases-checkpoint 1";

const std::regex& step_pattern() {
  static const std::regex pattern("step_([0-9]{1,18})");
  return pattern;
}

std::string marker_text(std::int64_t step, const fs::path& folder,
                        const std::vector<std::string>& files) {
  std::string text = fmt::format("{}\nstep {}\n", kMarkerHeader, step);
  for (const std::string& name : files) {
    const FileChecksum sum = file_checksum((folder / name).string());
    text += fmt::format("file {} {} {:08x}\n", name, sum.bytes, sum.crc32);
  }
  return text;
}

// Removes a folder so that it never looks complete on the way: renamed away, then deleted.
void remove_folder(const fs::path& folder) {
  std::error_code ec;
  fs::path doomed = folder;
  doomed += ".deleting";
  fs::remove_all(doomed, ec);
  fs::rename(folder, doomed, ec);
  if (ec) doomed = folder;  // already gone, or a leftover whose name cannot change
  fs::remove_all(doomed, ec);
}

// Renames `from` to `to` (replacing a folder at `to` through remove_folder first) and makes
// the renames durable.
void publish_folder(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (fs::exists(to, ec)) remove_folder(to);  // re-saving a step
  fs::rename(from, to, ec);
  OASES_CHECK(!ec, "checkpoint.dir: cannot rename '{}' to '{}': {}", from.string(), to.string(),
              ec.message());
  fsync_directory(to.parent_path().string());
}

std::uint64_t available_bytes(const fs::path& dir) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  return ec ? UINT64_MAX : space.available;
}

}  // namespace

std::int64_t checkpoint_step(const std::string& folder) {
  std::smatch m;
  const std::string name = fs::path(folder).filename().string();
  OASES_CHECK(std::regex_match(name, m, step_pattern()),
              "'{}' is not a checkpoint folder: expected a name step_<N>", folder);
  return std::stoll(m[1].str());
}

std::vector<std::string> checkpoint_leftovers(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  static const std::regex leftover("step_[0-9]+\\.(partial|deleting)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, leftover))
      found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> unmarked_step_folders(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, step_pattern()) &&
        !fs::exists(entry.path() / kCompleteMarker))
      found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

void refuse_unmarked_step_folders(const std::string& dir) {
  const std::vector<std::string> unmarked = unmarked_step_folders(dir);
  if (unmarked.empty()) return;
  const std::string& folder = unmarked.front();
  OASES_FAIL("checkpoint.dir '{}' holds '{}'{}, a step folder without a {} marker; a save never "
             "leaves one (it writes step_N.partial and renames it once complete), so it was "
             "copied, moved or edited by hand, and this run will not delete it. Move it out of "
             "checkpoint.dir (for example `mv {} {}.kept`), or, if it is a checkpoint you trust, "
             "restore its {} marker from the copy it came from",
             dir, folder,
             unmarked.size() > 1 ? fmt::format(" (and {} more)", unmarked.size() - 1) : "",
             kCompleteMarker, folder, folder, kCompleteMarker);
}

std::vector<std::string> clean_checkpoint_dir(const std::string& dir) {
  std::vector<std::string> removed = checkpoint_leftovers(dir);
  for (const std::string& folder : removed) remove_folder(folder);
  return removed;
}

std::string write_checkpoint(const std::string& dir, std::int64_t step,
                             const SafetensorsWriter& model, const SafetensorsWriter& optimizer,
                             std::int64_t keep, const CheckpointLog& log,
                             const std::vector<CheckpointFile>& extra_files) {
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  OASES_CHECK(!ec, "checkpoint.dir: cannot create '{}': {}", dir, ec.message());
  refuse_unmarked_step_folders(dir);
  for (const std::string& folder : clean_checkpoint_dir(dir))
    if (log) log(fmt::format("removed {}, left by an interrupted save or prune", folder));

  // Room for this checkpoint: prune before writing when the disk would not hold it.
  std::uint64_t needed = model.file_bytes() + optimizer.file_bytes();
  for (const CheckpointFile& file : extra_files) needed += file.contents.size();
  auto complete = complete_checkpoints(dir);
  while (keep > 0 && !complete.empty() &&
         static_cast<std::int64_t>(complete.size()) >= keep && available_bytes(root) < needed &&
         complete.front().first != step) {
    if (log)
      log(fmt::format("pruned {} before writing step_{}: {} bytes are free, the checkpoint needs "
                      "{}",
                      complete.front().second, step, available_bytes(root), needed));
    remove_folder(complete.front().second);
    complete.erase(complete.begin());
  }

  const fs::path target = root / ("step_" + std::to_string(step));
  fs::path partial = target;
  partial += ".partial";
  remove_folder(partial);
  fs::create_directories(partial, ec);
  OASES_CHECK(!ec, "checkpoint.dir: cannot create '{}': {}", partial.string(), ec.message());
  try {
    model.write((partial / kModelFile).string());
    optimizer.write((partial / kOptimizerFile).string());
    std::vector<std::string> listed = {kModelFile, kOptimizerFile};
    for (const CheckpointFile& file : extra_files) {
      OASES_ASSERT(fs::path(file.name).filename() == fs::path(file.name) &&
                       std::find(listed.begin(), listed.end(), file.name) == listed.end() &&
                       file.name != kCompleteMarker,
                   "checkpoint file name '{}' is not a plain file name of its own", file.name);
      write_file_atomically((partial / file.name).string(), file.contents);
      listed.push_back(file.name);
    }
    write_file_atomically((partial / kCompleteMarker).string(), marker_text(step, partial, listed));
    publish_folder(partial, target);
  } catch (const UserError& e) {
    remove_folder(partial);  // what a failed save wrote must not keep its space
    throw UserError(fmt::format("checkpoint step_{} was not saved, and the checkpoints already "
                                "in '{}' are untouched: {}",
                                step, dir, e.what()));
  } catch (...) {
    remove_folder(partial);
    throw;
  }

  if (keep > 0) {
    complete = complete_checkpoints(dir);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < complete.size(); ++i)
      remove_folder(complete[i].second);
  }
  return target.string();
}

std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, step_pattern()) &&
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

CheckpointFiles verify_checkpoint_files(const std::string& folder) {
  const std::int64_t step = checkpoint_step(folder);
  const fs::path marker = fs::path(folder) / kCompleteMarker;
  OASES_CHECK(fs::exists(marker), "checkpoint '{}' has no {} marker: it is incomplete", folder,
              kCompleteMarker);
  std::istringstream in(
      read_regular_file(marker.string(), "checkpoint marker", kMaxTextFileBytes));
  std::string first;
  std::getline(in, first);
  if (first.rfind("step ", 0) == 0) {
    // Written before markers held checksums: the step is all there is to check.
    OASES_CHECK(first == "step " + std::to_string(step),
                "checkpoint '{}': its marker says '{}', the folder step {}", folder, first, step);
    return {step, false};
  }
  OASES_CHECK(first == kMarkerHeader,
              "checkpoint '{}': its {} marker starts with '{}', expected '{}'; the marker is "
              "damaged",
              folder, kCompleteMarker, first, kMarkerHeader);
  std::string line;
  std::getline(in, line);
  OASES_CHECK(line == "step " + std::to_string(step),
              "checkpoint '{}': its marker says '{}', the folder is step {}; the folder was "
              "renamed or the marker damaged",
              folder, line, step);
  std::vector<std::string> listed;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string word, name, crc_text;
    std::uint64_t bytes = 0;
    const bool parsed = static_cast<bool>(fields >> word >> name >> bytes >> crc_text);
    std::string rest;
    const bool trailing = static_cast<bool>(fields >> rest);
    OASES_CHECK(parsed && !trailing && word == "file" && crc_text.size() == 8 &&
                    crc_text.find_first_not_of("0123456789abcdef") == std::string::npos &&
                    name.find('/') == std::string::npos && name != ".." && name != ".",
                "checkpoint '{}': marker line '{}' is not 'file <name> <bytes> <crc32>'", folder,
                line);
    const std::string path = (fs::path(folder) / name).string();
    OASES_CHECK(fs::exists(path), "checkpoint '{}' vouches for {}, which is missing", folder, name);
    const FileChecksum sum = file_checksum(path);
    OASES_CHECK(sum.bytes == bytes,
                "checkpoint '{}': {} holds {} bytes, its marker says {}; the file was truncated "
                "or altered",
                folder, name, sum.bytes, bytes);
    const std::uint32_t crc = static_cast<std::uint32_t>(std::stoul(crc_text, nullptr, 16));
    OASES_CHECK(sum.crc32 == crc,
                "checkpoint '{}': {} has CRC-32 {:08x}, its marker says {:08x}; the file is "
                "damaged",
                folder, name, sum.crc32, crc);
    listed.push_back(name);
  }
  for (const char* required : {kModelFile, kOptimizerFile})
    OASES_CHECK(std::find(listed.begin(), listed.end(), required) != listed.end(),
                "checkpoint '{}': its marker does not list {}; the marker is damaged", folder,
                required);
  return {step, true};
}

std::string resolve_model_file(const std::string& path) {
  std::error_code ec;
  const std::optional<std::string> kind = file_kind(path);
  OASES_CHECK(kind.has_value(),
              "checkpoint '{}' does not exist; pass a step_N checkpoint directory, a run's "
              "checkpoint.dir or a model.safetensors file",
              path);
  if (fs::is_regular_file(path, ec)) {
    // The model file of a complete checkpoint (step_N/model.safetensors beside a marker) is
    // vouched for by the marker: checked as the folder would be, so naming the file instead
    // of the folder skips no check.
    const fs::path folder = fs::absolute(path, ec).parent_path();
    const std::string folder_name = folder.filename().string();
    if (fs::path(path).filename() == kModelFile && std::regex_match(folder_name, step_pattern()) &&
        fs::exists(folder / kCompleteMarker, ec))
      verify_checkpoint_files(folder.string());
    return path;
  }
  OASES_CHECK(fs::is_directory(path, ec),
              "checkpoint '{}' is {}; pass a step_N checkpoint directory, a run's "
              "checkpoint.dir or a model.safetensors file",
              path, *kind);
  if (fs::exists(fs::path(path) / kModelFile)) {
    OASES_CHECK(fs::exists(fs::path(path) / kCompleteMarker),
                "checkpoint '{}' is incomplete (no {} marker): it was interrupted while being "
                "written; use an earlier step",
                path, kCompleteMarker);
    verify_checkpoint_files(path);
    return (fs::path(path) / kModelFile).string();
  }
  auto latest = latest_checkpoint(path);
  OASES_CHECK(latest.has_value(), "'{}' holds no complete checkpoint (step_N/{} with {})", path,
              kModelFile, kCompleteMarker);
  verify_checkpoint_files(*latest);
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
  std::size_t used = 0;
  std::int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  OASES_CHECK(used == text.size() && !text.empty(),
              "checkpoint file '{}': metadata '{}' = \"{}\" is not an integer", file.path(), key,
              text);
  return value;
}

}  // namespace oases::io
