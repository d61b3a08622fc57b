#include "train/run_outputs.h"

#include "core/error.h"
#include "io/checkpoint_dir.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <regex>

namespace oases::train {
namespace fs = std::filesystem;
namespace {

// A path as the file system resolves it (symbolic links and "..", as far as they exist), so
// that two spellings of one file compare equal.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::path(path).lexically_normal() : out;
}

bool is_device_or_pipe(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec) && !fs::is_regular_file(path, ec) && !fs::is_directory(path, ec);
}

// The file outputs of the run: (setting, path).
struct Output {
  std::string setting;
  std::string path;
};

std::vector<Output> file_outputs(const plan::RunConfig& config) {
  std::vector<Output> outputs;
  if (!config.log.metrics.empty()) {
    outputs.push_back({"log.metrics", config.log.metrics});
    if (!is_device_or_pipe(config.log.metrics))
      outputs.push_back({"run.json (beside log.metrics)",
                         (fs::path(config.log.metrics).parent_path() / "run.json").string()});
  }
  if (!config.log.trace.empty()) outputs.push_back({"log.trace", config.log.trace});
  return outputs;
}

void check_output_paths(const plan::RunConfig& config) {
  const std::vector<Output> outputs = file_outputs(config);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Output& o = outputs[i];
    for (std::size_t j = 0; j < i; ++j)
      OASES_CHECK(is_device_or_pipe(o.path) || resolved(o.path) != resolved(outputs[j].path),
                  "{} = '{}' is the same file as {} ('{}'): one would overwrite the other; "
                  "give each its own path",
                  o.setting, o.path, outputs[j].setting, outputs[j].path);
    if (config.checkpoint.dir.empty()) continue;
    // Inside checkpoint.dir, a file of the run's own may sit beside the checkpoints, never in
    // one of them: the protocol renames and deletes those folders whole.
    const fs::path dir = resolved(config.checkpoint.dir);
    const fs::path relative = resolved(o.path).lexically_relative(dir);
    static const std::regex checkpoint_folder("step_[0-9]+(\\.partial|\\.deleting)?");
    const bool inside_checkpoint =
        !relative.empty() && relative.begin() != relative.end() &&
        *relative.begin() != ".." &&
        (std::regex_match(relative.begin()->string(), checkpoint_folder) ||
         relative.filename() == kCheckpointDirLock);
    OASES_CHECK(!inside_checkpoint,
                "{} = '{}' lies in checkpoint.dir '{}' where the checkpoints' own files live; "
                "saves replace and prune those, so put it beside the folder instead",
                o.setting, o.path, config.checkpoint.dir);
  }
}

// Creates dir if needed and checks that a file can be made in it.
void check_checkpoint_dir_writable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  OASES_CHECK(!ec && fs::is_directory(dir),
              "checkpoint.dir = '{}' cannot be made a folder{}{}; name a writable folder, or "
              "leave checkpoint.dir empty to train without checkpoints",
              dir, ec ? ": " : " (a file of that name exists)", ec ? ec.message() : "");
  // An unnamed file (O_TMPFILE) leaves nothing behind even if the run is killed right here;
  // where the file system has none, a named one is made and removed.
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  int err = errno;
  if (fd < 0 && (err == EOPNOTSUPP || err == EISDIR || err == EINVAL)) {
    const std::string probe =
        (fs::path(dir) / fmt::format(".write-test.{}", ::getpid())).string();
    fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    err = errno;
    if (fd >= 0) ::unlink(probe.c_str());
  }
  OASES_CHECK(fd >= 0,
              "checkpoint.dir = '{}' is not writable ({}): the first save would fail; name a "
              "writable folder",
              dir, std::strerror(err));
  ::close(fd);
}

// The lock at `path`, or UserError naming whoever holds it.
FileLock take_lock(const std::string& path, const std::string& setting,
                   const std::string& folder_or_file) {
  std::string holder;
  std::optional<FileLock> lock = FileLock::try_take(path, setting, &holder);
  OASES_CHECK(lock.has_value(),
              "{} = '{}' is in use by another run ({}; lock file '{}'): two runs writing one "
              "{} would delete or overwrite each other's files. Wait for that run to end or stop "
              "it, or give this run a {} of its own",
              setting, folder_or_file,
              holder.empty() ? "it has not yet said which" : holder, path,
              setting == "checkpoint.dir" ? "folder" : "file", setting);
  return std::move(*lock);
}

}  // namespace

RunOutputs claim_run_outputs(const plan::RunConfig& config) {
  check_output_paths(config);
  std::vector<FileLock> locks;
  if (!config.checkpoint.dir.empty()) {
    const std::string& dir = config.checkpoint.dir;
    check_checkpoint_dir_writable(dir);
    locks.push_back(
        take_lock((fs::path(dir) / kCheckpointDirLock).string(), "checkpoint.dir", dir));
    io::refuse_unmarked_step_folders(dir);
  }
  const std::string& metrics = config.log.metrics;
  if (!metrics.empty() && !is_device_or_pipe(metrics)) {
    const fs::path parent = fs::path(metrics).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    locks.push_back(take_lock(metrics + ".lock", "log.metrics", metrics));
  }
  return RunOutputs(std::move(locks));
}

}  // namespace oases::train
