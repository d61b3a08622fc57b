#include "train/checkpoint.h"

#include "core/error.h"
#include "core/atomic_file.h"
#include "io/safetensors.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>
#include <vector>

namespace oases::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kMarkerFile = "COMPLETE";

// Complete checkpoints in dir, sorted by step.
std::vector<std::pair<std::int64_t, fs::path>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  static const std::regex pattern("step_([0-9]+)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, pattern) &&
        fs::exists(entry.path() / kMarkerFile))
      found.emplace_back(std::stoll(m[1].str()), entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string metadata_value(const io::SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  OASES_CHECK(it != file.metadata().end(),
              "checkpoint file '{}' has no metadata entry '{}'; it was not written by oases "
              "train (or by an incompatible version)",
              file.path(), key);
  return it->second;
}

std::int64_t metadata_int(const io::SafetensorsFile& file, const std::string& key) {
  const std::string text = metadata_value(file, key);
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    OASES_FAIL("checkpoint file '{}': metadata '{}' = \"{}\" is not an integer", file.path(), key,
               text);
  }
}

// The whole tensor of `spec` assembled from the shards of the tensor-parallel group.
std::vector<float> whole_tensor(const model::ParamLayout& layout, const model::ParamSpec& spec,
                                const float* local, comm::Communicator& tp) {
  std::vector<float> whole(static_cast<std::size_t>(spec.full_shape.numel()), 0.0f);
  if (spec.parts == 1) {  // replicated, or a layer at degree 1: one whole copy on every rank
    std::copy(local, local + spec.numel(), whole.begin());
    if (tp.size() > 1) {
      // Every rank of the group updates its copy from the same gradient; checking it here,
      // where the copies are read anyway, catches any divergence before it is saved.
      std::vector<float> low = whole, high = whole;
      tp.all_reduce(Tensor::of(low.data(), {spec.numel()}), comm::ReduceOp::min);
      tp.all_reduce(Tensor::of(high.data(), {spec.numel()}), comm::ReduceOp::max);
      OASES_ASSERT(low == whole && high == whole,
                   "replicated parameter '{}' differs across the tensor-parallel group",
                   spec.name);
    }
    return whole;
  }
  // Ranks below `parts` hold one copy of each shard (the others hold replicas of them).
  if (tp.rank() < spec.parts) {
    for (std::int64_t i = 0; i < spec.numel(); ++i) {
      const std::int64_t g = layout.global_index(spec, i);
      if (g >= 0) whole[static_cast<std::size_t>(g)] = local[i];
    }
  }
  // Those shards are disjoint, so a sum over the group places every element exactly.
  tp.all_reduce(Tensor::of(whole.data(), {static_cast<std::int64_t>(whole.size())}));
  return whole;
}

// Reads tensor `name` (whole shape spec.full_shape) and keeps this rank's shard of it.
void read_shard(const io::SafetensorsFile& file, const std::string& name,
                const model::ParamLayout& layout, const model::ParamSpec& spec, float* local) {
  if (spec.sharding == model::Sharding::replicated) {
    file.read_f32(name, spec.full_shape.to_vector(), local);
    return;
  }
  std::vector<float> whole(static_cast<std::size_t>(spec.full_shape.numel()));
  file.read_f32(name, spec.full_shape.to_vector(), whole.data());
  for (std::int64_t i = 0; i < spec.numel(); ++i) {
    const std::int64_t g = layout.global_index(spec, i);
    local[i] = g >= 0 ? whole[static_cast<std::size_t>(g)] : 0.0f;
  }
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const RunConfig& config,
                            const model::ParamLayout& layout, const float* params,
                            const float* exp_avg, const float* exp_avg_sq,
                            const TrainingState& state, std::int64_t keep,
                            comm::Communicator& tp, bool write_files) {
  const fs::path target = fs::path(dir) / ("step_" + std::to_string(state.step));
  // Whole tensors, kept alive until the files are written (the writer references them).
  std::vector<std::vector<float>> tensors;
  tensors.reserve(3 * layout.params().size());
  for (const auto& p : layout.params()) {
    tensors.push_back(whole_tensor(layout, p, params + p.offset, tp));
    tensors.push_back(whole_tensor(layout, p, exp_avg + p.offset, tp));
    tensors.push_back(whole_tensor(layout, p, exp_avg_sq + p.offset, tp));
  }
  if (!write_files) return target.string();

  std::error_code ec;
  fs::create_directories(target, ec);
  OASES_CHECK(!ec, "checkpoint.dir: cannot create '{}': {}", target.string(), ec.message());
  fs::remove(target / kMarkerFile, ec);  // re-saving a step: incomplete until the end

  const std::string config_toml = to_toml(config);
  io::SafetensorsWriter model_file;
  model_file.set_metadata("format", "pt");
  model_file.set_metadata("oases_config", config_toml);
  io::SafetensorsWriter optimizer_file;
  optimizer_file.set_metadata("format_version", std::to_string(kCheckpointFormatVersion));
  optimizer_file.set_metadata("step", std::to_string(state.step));
  optimizer_file.set_metadata("data_position", std::to_string(state.data_position));
  optimizer_file.set_metadata("seed", std::to_string(state.seed));
  optimizer_file.set_metadata("oases_config", config_toml);
  for (std::size_t i = 0; i < layout.params().size(); ++i) {
    const auto& p = layout.params()[i];
    const auto shape = p.full_shape.to_vector();
    model_file.add(p.name, DType::f32, shape, tensors[3 * i].data());
    optimizer_file.add("exp_avg." + p.name, DType::f32, shape, tensors[3 * i + 1].data());
    optimizer_file.add("exp_avg_sq." + p.name, DType::f32, shape, tensors[3 * i + 2].data());
  }
  model_file.write((target / kModelFile).string());
  optimizer_file.write((target / kOptimizerFile).string());
  write_file_atomically((target / kMarkerFile).string(),
                        "step " + std::to_string(state.step) + "\n");

  if (keep > 0) {
    auto all = complete_checkpoints(dir);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i)
      fs::remove_all(all[i].second, ec);
  }
  return target.string();
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto all = complete_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

void load_model_weights(const std::string& path, const model::ParamLayout& layout,
                        float* params) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  for (const auto& p : layout.params()) read_shard(file, p.name, layout, p, params + p.offset);
}

TrainingState load_optimizer_state(const std::string& checkpoint_dir,
                                   const model::ParamLayout& layout, float* exp_avg,
                                   float* exp_avg_sq) {
  const io::SafetensorsFile file =
      io::SafetensorsFile::open((fs::path(checkpoint_dir) / kOptimizerFile).string());
  const std::int64_t version = metadata_int(file, "format_version");
  OASES_CHECK(version == kCheckpointFormatVersion,
              "checkpoint '{}' has format version {}; this build reads version {}",
              checkpoint_dir, version, kCheckpointFormatVersion);
  for (const auto& p : layout.params()) {
    read_shard(file, "exp_avg." + p.name, layout, p, exp_avg + p.offset);
    read_shard(file, "exp_avg_sq." + p.name, layout, p, exp_avg_sq + p.offset);
  }
  TrainingState state;
  state.step = metadata_int(file, "step");
  state.data_position = metadata_int(file, "data_position");
  state.seed = static_cast<std::uint64_t>(metadata_int(file, "seed"));
  return state;
}

std::string resolve_model_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  OASES_CHECK(fs::is_directory(path, ec),
              "checkpoint '{}' does not exist; pass a step_N checkpoint directory, a run's "
              "checkpoint.dir or a model.safetensors file",
              path);
  if (fs::exists(fs::path(path) / kModelFile)) {
    OASES_CHECK(fs::exists(fs::path(path) / kMarkerFile),
                "checkpoint '{}' is incomplete (no {} marker): it was interrupted while being "
                "written; use an earlier step",
                path, kMarkerFile);
    return (fs::path(path) / kModelFile).string();
  }
  auto latest = latest_checkpoint(path);
  OASES_CHECK(latest.has_value(), "'{}' holds no complete checkpoint (step_N/{} with {})", path,
              kModelFile, kMarkerFile);
  return (fs::path(*latest) / kModelFile).string();
}

RunConfig config_from_checkpoint(const std::string& path) {
  const std::string model_file = resolve_model_file(path);
  const io::SafetensorsFile file = io::SafetensorsFile::open(model_file);
  // The model is what a reader of the checkpoint needs; how the run was parallelised and
  // scheduled is not, and settings of older releases may no longer combine.
  toml::table stored;
  try {
    stored = toml::parse(metadata_value(file, "oases_config"));
  } catch (const toml::parse_error& e) {
    OASES_FAIL("{}: the stored run configuration is not valid TOML: {}", model_file,
               std::string(e.description()));
  }
  stored.erase("parallel");
  std::ostringstream text;
  text << stored;
  return parse_run_config(text.str(), model_file + " (oases_config)");
}

}  // namespace oases::train
