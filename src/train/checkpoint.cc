#include "train/checkpoint.h"

#include "core/error.h"
#include "data/sentencepiece_tokenizer.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"

#include <toml++/toml.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>
#include <vector>

namespace oases::train {
namespace fs = std::filesystem;

namespace {

// Calls body(T{}) with T the element type of `dtype` (f32 or f64).
template <class Body>
void by_dtype(DType dtype, Body&& body) {
  if (dtype == DType::f64) body(double{});
  else if (dtype == DType::f32) body(float{});
  else OASES_ASSERT(false, "checkpoints hold f32 or f64 tensors, not {}", dtype_name(dtype));
}

// The whole tensor of `spec` assembled from the shards of the tensor-parallel group.
template <class T>
std::vector<T> whole_tensor(const model::ParamLayout& layout, const model::ParamSpec& spec,
                            const T* local, comm::Communicator& tp) {
  std::vector<T> whole(static_cast<std::size_t>(spec.full_shape.numel()), T(0));
  if (spec.parts == 1) {  // replicated, or a layer at degree 1: one whole copy on every rank
    std::copy(local, local + spec.numel(), whole.begin());
    if (tp.size() > 1) {
      // Every rank of the group updates its copy from the same gradient; checking it here,
      // where the copies are read anyway, catches any divergence before it is saved.
      std::vector<T> low = whole, high = whole;
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

template <class T>
std::int64_t count_non_finite(const T* values, std::size_t n) {
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !std::isfinite(values[i]);
  return bad;
}

// Adds the whole tensor of `spec` whose local shard is `local` to `writer` as `name`. A tensor
// holding a NaN or an infinity is never written: every rank of the group sees the same whole
// tensor, so every rank stops with the same error.
void add_whole(io::SafetensorsWriter& writer, const std::string& name,
               const model::ParamLayout& layout, const model::ParamSpec& spec,
               const Tensor& local, comm::Communicator& tp, bool write) {
  by_dtype(local.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::vector<T> whole = whole_tensor(layout, spec, local.data<T>(), tp);
    const std::int64_t bad = count_non_finite(whole.data(), whole.size());
    OASES_CHECK(bad == 0,
                "refusing to checkpoint '{}': {} of its {} values are NaN or infinite; training "
                "diverged (lower train.lr or raise train.warmup_steps)",
                name, bad, whole.size());
    if (write) writer.add_copy(name, local.dtype(), spec.full_shape.to_vector(), whole.data());
  });
}

// Adds every parameter's whole tensor (to `model_file`) and its optimizer state (to
// `optimizer_file`) of every pipeline stage: stage s assembles its tensors over its
// tensor-parallel group and broadcasts them over the pipeline group `pp`; each name is taken
// from the first stage that holds it.
void add_whole_tensors_of_stages(io::SafetensorsWriter& model_file,
                                 io::SafetensorsWriter& optimizer_file, const RunConfig& config,
                                 const model::Model& model, optim::Optimizer& optimizer,
                                 comm::Communicator& tp, comm::Communicator& pp, bool write,
                                 const Tensor* stashed_weights) {
  const model::ParamLayout& mine = model.layout();
  // The state tensors of a parameter are named <prefix><parameter name> (AdamW: "exp_avg.",
  // "exp_avg_sq."); every stage's optimizer has the same prefixes.
  std::vector<std::string> prefixes;
  std::map<std::string, Tensor> states;
  for (const optim::StateTensor& st : optimizer.state_tensors()) {
    OASES_ASSERT(st.elementwise, "state tensor {} is not shaped like its parameter", st.name);
    OASES_ASSERT(st.name.ends_with(st.param), "state tensor {} does not end with {}", st.name,
                 st.param);
    const std::string prefix = st.name.substr(0, st.name.size() - st.param.size());
    if (std::ranges::find(prefixes, prefix) == prefixes.end()) prefixes.push_back(prefix);
    states.emplace(st.name, st.view);
  }
  std::set<std::string> done;
  for (int stage = 0; stage < pp.size(); ++stage) {
    // The stage's layers: one range, or several chunks with gaps between them.
    std::vector<model::LayerRange> ranges;
    for (const auto& [begin, end] : stage_layer_ranges(config, stage))
      ranges.push_back({begin, end});
    const model::ParamLayout layout = model::model_param_layout(config.model, tp.rank(), tp.size(),
                                                                layer_degrees(config), ranges);
    for (const model::ParamSpec& p : layout.params()) {
      if (!done.insert(p.name).second) continue;
      const auto share = [&](io::SafetensorsWriter& writer, const std::string& name,
                             const std::function<Tensor()>& local) {
        by_dtype(model.dtype(), [&](auto zero) {
          using T = decltype(zero);
          std::vector<T> whole(static_cast<std::size_t>(p.full_shape.numel()), T(0));
          if (pp.rank() == stage) whole = whole_tensor(mine, mine.find(p.name), local().template data<T>(), tp);
          pp.broadcast(Tensor::of(whole.data(), {static_cast<std::int64_t>(whole.size())}), stage);
          const std::int64_t bad = count_non_finite(whole.data(), whole.size());
          OASES_CHECK(bad == 0,
                      "refusing to checkpoint '{}': {} of its {} values are NaN or infinite; "
                      "training diverged (lower train.lr or raise train.warmup_steps)",
                      name, bad, whole.size());
          if (write) writer.add_copy(name, model.dtype(), p.full_shape.to_vector(), whole.data());
        });
      };
      share(model_file, p.name, [&] { return mine.view(model.params(), mine.find(p.name)); });
      for (const std::string& prefix : prefixes)
        share(optimizer_file, prefix + p.name, [&] { return states.at(prefix + p.name); });
      if (stashed_weights)
        share(optimizer_file, kStashedWeightsPrefix + p.name,
              [&] { return mine.view(*stashed_weights, mine.find(p.name)); });
    }
  }
}

// Reads tensor `name` (whole shape spec.full_shape) and keeps this rank's shard of it.
void read_shard(const io::SafetensorsFile& file, const std::string& name,
                const model::ParamLayout& layout, const model::ParamSpec& spec,
                const Tensor& local) {
  by_dtype(local.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto read = [&](const std::vector<std::int64_t>& shape, T* out) {
      if constexpr (std::is_same_v<T, double>) file.read_f64(name, shape, out);
      else file.read_f32(name, shape, out);
    };
    T* out = local.data<T>();
    std::vector<T> whole(static_cast<std::size_t>(spec.full_shape.numel()));
    read(spec.full_shape.to_vector(), whole.data());
    const std::int64_t bad = count_non_finite(whole.data(), whole.size());
    OASES_CHECK(bad == 0,
                "'{}': tensor '{}' holds {} NaN or infinite values; a model cannot start from it",
                file.path(), name, bad);
    if (spec.sharding == model::Sharding::replicated) {
      std::copy(whole.begin(), whole.end(), out);
      return;
    }
    for (std::int64_t i = 0; i < spec.numel(); ++i) {
      const std::int64_t g = layout.global_index(spec, i);
      out[i] = g >= 0 ? whole[static_cast<std::size_t>(g)] : T(0);
    }
  });
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const RunConfig& config,
                            const model::Model& model, optim::Optimizer& optimizer,
                            const TrainingState& state, const std::string& tokenizer_model,
                            std::int64_t keep, comm::Communicator& tp, comm::Communicator& pp,
                            bool write_files,
                            const std::function<void(const std::string&)>& log,
                            const Tensor* stashed_weights) {
  const model::ParamLayout& layout = model.layout();
  io::SafetensorsWriter model_file, optimizer_file;
  try {
    if (pp.size() > 1) {
      add_whole_tensors_of_stages(model_file, optimizer_file, config, model, optimizer, tp, pp,
                                  write_files, stashed_weights);
    } else {
      add_whole_tensors(model_file, "", layout, model.params(), tp, write_files);
      for (const optim::StateTensor& s : optimizer.state_tensors()) {
        OASES_ASSERT(s.elementwise, "state tensor {} is not shaped like its parameter", s.name);
        add_whole(optimizer_file, s.name, layout, layout.find(s.param), s.view, tp, write_files);
      }
      if (stashed_weights)
        add_whole_tensors(optimizer_file, kStashedWeightsPrefix, layout, *stashed_weights, tp,
                          write_files);
    }
  } catch (const UserError& e) {
    throw UserError(fmt::format("after step {}: {}; every checkpoint already written stays "
                                "as it was",
                                state.step, e.what()));
  }
  const fs::path target = fs::path(dir) / ("step_" + std::to_string(state.step));
  if (!write_files) return target.string();

  const std::string config_toml = to_toml(config);
  model_file.set_metadata("format", "pt");
  model_file.set_metadata("oases_config", config_toml);
  optimizer_file.set_metadata("format_version", std::to_string(kCheckpointFormatVersion));
  optimizer_file.set_metadata("optimizer", std::string(optimizer.name()));
  optimizer_file.set_metadata("step", std::to_string(state.step));
  optimizer_file.set_metadata("data_position", std::to_string(state.data_position));
  optimizer_file.set_metadata("seed", std::to_string(state.seed));
  optimizer_file.set_metadata("data_tokens", std::to_string(state.data_tokens));
  optimizer_file.set_metadata("oases_config", config_toml);
  std::vector<io::CheckpointFile> extra_files;
  if (!tokenizer_model.empty()) extra_files.push_back({kTokenizerModelFile, tokenizer_model});
  return io::write_checkpoint(dir, state.step, model_file, optimizer_file, keep, log,
                              extra_files);
}

void add_whole_tensors(io::SafetensorsWriter& writer, const std::string& prefix,
                       const model::ParamLayout& layout, const Tensor& flat,
                       comm::Communicator& tp, bool write) {
  for (const auto& p : layout.params())
    add_whole(writer, prefix + p.name, layout, p, layout.view(flat, p), tp, write);
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  return io::latest_checkpoint(dir);
}

void load_model_weights(const std::string& path, const model::ParamLayout& layout,
                        const Tensor& params) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  for (const auto& p : layout.params()) read_shard(file, p.name, layout, p, layout.view(params, p));
}

namespace {

// The training state in an optimizer file's metadata, checked against its folder and itself.
TrainingState read_training_state(const io::SafetensorsFile& file,
                                  const std::string& checkpoint_dir) {
  const std::int64_t version = io::metadata_int(file, "format_version");
  OASES_CHECK(version == kCheckpointFormatVersion,
              "checkpoint '{}' has format version {}; this build reads version {}",
              checkpoint_dir, version, kCheckpointFormatVersion);
  TrainingState state;
  state.step = io::metadata_int(file, "step");
  state.data_position = io::metadata_int(file, "data_position");
  state.seed = static_cast<std::uint64_t>(io::metadata_int(file, "seed"));
  if (file.metadata().count("data_tokens")) {
    state.data_tokens = io::metadata_int(file, "data_tokens");
    OASES_CHECK(state.data_tokens >= 0, "checkpoint '{}': data_tokens = {} is negative; the "
                "checkpoint is damaged", checkpoint_dir, state.data_tokens);
  }
  // The state must agree with the folder it sits in and with itself: the data position is the
  // next batch, one per completed step.
  const std::int64_t folder_step = io::checkpoint_step(checkpoint_dir);
  OASES_CHECK(state.step == folder_step,
              "checkpoint '{}': its optimizer state says step {}, the folder step {}; the "
              "checkpoint is damaged or was renamed",
              checkpoint_dir, state.step, folder_step);
  OASES_CHECK(state.data_position == state.step,
              "checkpoint '{}': data position {} does not follow step {} (one batch per step); "
              "the checkpoint is damaged",
              checkpoint_dir, state.data_position, state.step);
  return state;
}

}  // namespace

TrainingState load_optimizer_state(const std::string& checkpoint_dir,
                                   const model::ParamLayout& layout, optim::Optimizer& optimizer) {
  const io::SafetensorsFile file =
      io::SafetensorsFile::open((fs::path(checkpoint_dir) / io::kOptimizerFile).string());
  const TrainingState state = read_training_state(file, checkpoint_dir);
  if (const auto stored = file.metadata().find("optimizer"); stored != file.metadata().end())
    OASES_CHECK(stored->second == optimizer.name(),
                "checkpoint '{}' holds the state of train.optimizer = \"{}\" but the run uses "
                "\"{}\"; resume with the same optimizer",
                checkpoint_dir, stored->second, optimizer.name());
  for (const optim::StateTensor& s : optimizer.state_tensors())
    read_shard(file, s.name, layout, layout.find(s.param), s.view);
  return state;
}

bool load_stashed_weights(const std::string& checkpoint_dir, const model::ParamLayout& layout,
                          const Tensor& params) {
  const io::SafetensorsFile file =
      io::SafetensorsFile::open((fs::path(checkpoint_dir) / io::kOptimizerFile).string());
  if (layout.params().empty() ||
      !file.has(kStashedWeightsPrefix + layout.params().front().name))
    return false;
  for (const auto& p : layout.params())
    read_shard(file, kStashedWeightsPrefix + p.name, layout, p, layout.view(params, p));
  return true;
}

CheckpointSummary verify_checkpoint(const std::string& checkpoint_dir) {
  CheckpointSummary summary;
  const io::CheckpointFiles files = io::verify_checkpoint_files(checkpoint_dir);
  const io::SafetensorsFile model_file =
      io::SafetensorsFile::open((fs::path(checkpoint_dir) / io::kModelFile).string());
  const io::SafetensorsFile optimizer_file =
      io::SafetensorsFile::open((fs::path(checkpoint_dir) / io::kOptimizerFile).string());
  const TrainingState state = read_training_state(optimizer_file, checkpoint_dir);
  OASES_ASSERT(state.step == files.step, "the folder step was checked against both");
  summary.step = state.step;
  summary.checksummed = files.checksummed;
  // The stored configuration parses and validates, and a carried tokenizer loads.
  if (config_from_checkpoint(checkpoint_dir).data.tokenizer == data::kSentencePieceName)
    checkpoint_tokenizer(checkpoint_dir);

  for (const io::SafetensorsFile* file : {&model_file, &optimizer_file}) {
    for (const std::string& name : file->names()) {
      const io::SafetensorsTensorInfo& info = file->info(name);
      std::vector<double> values(static_cast<std::size_t>(info.numel()));
      file->read_f64(name, info.shape, values.data());
      const std::int64_t bad = count_non_finite(values.data(), values.size());
      OASES_CHECK(bad == 0, "'{}': tensor '{}' holds {} NaN or infinite values of {}",
                  file->path(), name, bad, values.size());
      ++summary.tensors;
      summary.values += info.numel();
    }
    summary.bytes += static_cast<std::int64_t>(fs::file_size(file->path()));
  }
  // Optimizer state is named "<state>.<parameter>" and shaped like its parameter.
  for (const std::string& name : optimizer_file.names()) {
    const auto dot = name.find('.');
    OASES_CHECK(dot != std::string::npos && model_file.has(name.substr(dot + 1)),
                "'{}': optimizer state '{}' belongs to no parameter of '{}'",
                optimizer_file.path(), name, model_file.path());
    OASES_CHECK(optimizer_file.info(name).shape == model_file.info(name.substr(dot + 1)).shape,
                "'{}': optimizer state '{}' has shape {} but its parameter has shape {}",
                optimizer_file.path(), name,
                io::shape_string(optimizer_file.info(name).shape),
                io::shape_string(model_file.info(name.substr(dot + 1)).shape));
  }
  return summary;
}

RunConfig config_from_checkpoint(const std::string& path) {
  const std::string model_file = io::resolve_model_file(path);
  const io::SafetensorsFile file = io::SafetensorsFile::open(model_file);
  // The model is what a reader of the checkpoint needs; how the run was parallelised and
  // scheduled is not, and settings of older releases may no longer combine.
  toml::table stored;
  try {
    stored = toml::parse(io::metadata_value(file, "oases_config"));
  } catch (const toml::parse_error& e) {
    OASES_FAIL("{}: the stored run configuration is not valid TOML: {}", model_file,
               std::string(e.description()));
  }
  stored.erase("parallel");
  // Printed as to_toml prints (strings quoted and escaped), so every stored string reads back.
  std::ostringstream text;
  text << toml::toml_formatter(stored, toml::toml_formatter::default_flags &
                                           ~(toml::format_flags::allow_literal_strings |
                                             toml::format_flags::allow_multi_line_strings));
  return parse_run_config(text.str(), model_file + " (oases_config)");
}

std::unique_ptr<data::Tokenizer> checkpoint_tokenizer(const std::string& checkpoint,
                                                      const std::string& gpt2_files) {
  const RunConfig config = config_from_checkpoint(checkpoint);
  const std::string& name = config.data.tokenizer;
  if (name != data::kSentencePieceName) {
    OASES_CHECK(gpt2_files.empty() || name == "gpt2",
                "checkpoint '{}' was trained with the {} tokenizer, which reads no files, but "
                "gpt2 tokenizer files '{}' were given; leave them out",
                checkpoint, name, gpt2_files);
    return data::make_tokenizer(name, gpt2_files);
  }
  OASES_CHECK(gpt2_files.empty(),
              "checkpoint '{}' was trained with the sentencepiece tokenizer, whose model it "
              "carries ({}); the gpt2 tokenizer files '{}' do not apply: leave them out",
              checkpoint, kTokenizerModelFile, gpt2_files);
  const fs::path folder = fs::path(io::resolve_model_file(checkpoint)).parent_path();
  const std::string path = (folder / kTokenizerModelFile).string();
  std::error_code ec;
  OASES_CHECK(fs::is_regular_file(path, ec),
              "checkpoint '{}' was trained with the sentencepiece tokenizer but holds no {} (its "
              "model file, which every checkpoint of such a run carries); it was removed, or the "
              "checkpoint was copied without it",
              folder.string(), kTokenizerModelFile);
  std::unique_ptr<data::Tokenizer> tokenizer = data::load_sentencepiece_tokenizer(path);
  OASES_CHECK(tokenizer->vocab_size() <= config.model.vocab_size,
              "checkpoint '{}': its tokenizer {} has {} tokens, more than its model.vocab_size = "
              "{}; the checkpoint's files do not belong together",
              folder.string(), kTokenizerModelFile, tokenizer->vocab_size(),
              config.model.vocab_size);
  return tokenizer;
}

}  // namespace oases::train
