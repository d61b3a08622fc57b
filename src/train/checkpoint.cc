#include "train/checkpoint.h"

#include "io/safetensors_set.h"
#include "model/hf_config.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "data/sentencepiece_tokenizer.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "train/engine.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
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

// The dimension along which the tensor-parallel group splits `spec` (-1: every rank holds it
// whole or a replica of it).
int split_dim(const model::ParamSpec& spec) {
  if (spec.parts == 1 || spec.sharding == model::Sharding::replicated) return -1;
  return spec.sharding == model::Sharding::rows ? 0 : static_cast<int>(spec.shape.ndim()) - 1;
}

// `shape` without dimension `dim` (all of it when dim < 0).
std::vector<std::int64_t> without_dim(const Shape& shape, int dim) {
  std::vector<std::int64_t> out = shape.to_vector();
  if (dim >= 0) out.erase(out.begin() + dim);
  return out;
}

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

// The whole shape of a state tensor of `spec` that reduces dimension `reduced` (-1: shaped like
// the parameter; optim::StateTensor::reduced_dim).
std::vector<std::int64_t> whole_state_shape(const model::ParamSpec& spec, int reduced) {
  return without_dim(spec.full_shape, reduced);
}

// True when every rank holds the whole of such a state: the parameter is whole on every rank,
// or split along the very dimension the state reduces (its shard group shares the statistic).
bool state_is_whole_everywhere(const model::ParamSpec& spec, int reduced) {
  return spec.parts == 1 || (reduced >= 0 && reduced == split_dim(spec));
}

// Index in the whole state tensor of element `local` of this rank's state of `spec` that
// reduces dimension `reduced` (>= 0), or -1 where that element belongs to padding rows.
std::int64_t state_global_index(const model::ParamLayout& layout, const model::ParamSpec& spec,
                                int reduced, std::int64_t local) {
  const std::vector<std::int64_t> shard = spec.shape.to_vector();
  const std::vector<std::int64_t> full = spec.full_shape.to_vector();
  const int dims = static_cast<int>(shard.size());
  // The state's coordinates, then the parameter element at coordinate 0 of the reduced
  // dimension: it maps through the parameter's sharding like every element of its line.
  std::vector<std::int64_t> index(shard.size(), 0);
  for (int d = dims - 1; d >= 0; --d) {
    if (d == reduced) continue;
    const auto u = static_cast<std::size_t>(d);
    index[u] = local % shard[u];
    local /= shard[u];
  }
  std::int64_t param_local = 0;
  for (int d = 0; d < dims; ++d)
    param_local =
        param_local * shard[static_cast<std::size_t>(d)] + index[static_cast<std::size_t>(d)];
  std::int64_t global = layout.global_index(spec, param_local);
  if (global < 0) return -1;
  for (int d = dims - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    index[u] = global % full[u];
    global /= full[u];
  }
  std::int64_t out = 0;
  for (int d = 0; d < dims; ++d)
    if (d != reduced)
      out = out * full[static_cast<std::size_t>(d)] + index[static_cast<std::size_t>(d)];
  return out;
}

// The whole tensor of a state of `spec` reducing dimension `reduced` (-1: shaped like the
// parameter, gathered as the parameter is), assembled from the ranks of `tp`.
template <class T>
std::vector<T> whole_state(const model::ParamLayout& layout, const model::ParamSpec& spec,
                           int reduced, const Tensor& local, comm::Communicator& tp) {
  if (reduced < 0) return whole_tensor(layout, spec, local.data<T>(), tp);
  const T* values = local.data<T>();
  std::vector<T> whole(static_cast<std::size_t>(product(whole_state_shape(spec, reduced))), T(0));
  if (state_is_whole_everywhere(spec, reduced)) {
    OASES_ASSERT(local.numel() == static_cast<std::int64_t>(whole.size()),
                 "state of {} has {} elements here, {} whole", spec.name, local.numel(),
                 whole.size());
    std::copy(values, values + local.numel(), whole.begin());
    return whole;
  }
  // As for parameters: the first copy of each part places its elements, and a sum over the
  // group assembles the disjoint parts.
  if (tp.rank() < spec.parts) {
    for (std::int64_t i = 0; i < local.numel(); ++i) {
      const std::int64_t g = state_global_index(layout, spec, reduced, i);
      if (g >= 0) whole[static_cast<std::size_t>(g)] = values[i];
    }
  }
  tp.all_reduce(Tensor::of(whole.data(), {static_cast<std::int64_t>(whole.size())}));
  return whole;
}

// Adds the whole tensor of `spec` whose local shard is `local` to `writer` as `name`. A tensor
// holding a NaN or an infinity is never written: every rank of the group sees the same whole
// tensor, so every rank stops with the same error.
void add_whole(io::SafetensorsWriter& writer, const std::string& name,
               const model::ParamLayout& layout, const model::ParamSpec& spec,
               const Tensor& local, comm::Communicator& tp, bool write) {
  by_dtype(local.dtype(), [&](auto zero) {
    using T = decltype(zero);
    // Alone and whole, the local tensor is the whole one: no assembly, one copy (the writer's).
    std::vector<T> assembled;
    const bool local_is_whole = spec.parts == 1 && tp.size() == 1;
    if (!local_is_whole) assembled = whole_tensor(layout, spec, local.data<T>(), tp);
    const T* whole = local_is_whole ? local.data<T>() : assembled.data();
    const auto count = static_cast<std::size_t>(spec.full_shape.numel());
    const std::int64_t bad = count_non_finite(whole, count);
    OASES_CHECK(bad == 0,
                "refusing to checkpoint '{}': {} of its {} values are NaN or infinite; training "
                "diverged (lower train.lr or raise train.warmup_steps)",
                name, bad, count);
    if (write) writer.add_copy(name, local.dtype(), spec.full_shape.to_vector(), whole);
  });
}

// Adds the whole tensor of optimizer state `state` to `writer` under its name (finite, as
// add_whole).
void add_whole_state(io::SafetensorsWriter& writer, const optim::StateTensor& state,
                     const model::ParamLayout& layout, comm::Communicator& tp, bool write) {
  const model::ParamSpec& spec = layout.find(state.param);
  const int reduced = state.elementwise ? -1 : state.reduced_dim;
  by_dtype(state.view.dtype(), [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> assembled;
    const bool local_is_whole = spec.parts == 1 && tp.size() == 1;
    if (!local_is_whole) assembled = whole_state<T>(layout, spec, reduced, state.view, tp);
    const T* whole = local_is_whole ? state.view.data<T>() : assembled.data();
    const std::vector<std::int64_t> shape = whole_state_shape(spec, reduced);
    const auto count = static_cast<std::size_t>(product(shape));
    OASES_ASSERT(!local_is_whole || state.view.numel() == static_cast<std::int64_t>(count),
                 "state {} has {} elements, {} whole", state.name, state.view.numel(), count);
    const std::int64_t bad = count_non_finite(whole, count);
    OASES_CHECK(bad == 0,
                "refusing to checkpoint '{}': {} of its {} values are NaN or infinite; training "
                "diverged (lower train.lr or raise train.warmup_steps)",
                state.name, bad, count);
    if (write) writer.add_copy(state.name, state.view.dtype(), shape, whole);
  });
}

// Adds every parameter's whole tensor (to `model_file`) and its optimizer state (to
// `optimizer_file`) of every pipeline stage: stage s assembles its tensors over its
// tensor-parallel group and broadcasts them over the pipeline group `pp`; each name is taken
// from the first stage that holds it.
void add_whole_tensors_of_stages(io::SafetensorsWriter& model_file,
                                 io::SafetensorsWriter& optimizer_file, const plan::RunPlan& plan,
                                 const model::Model& model, optim::Optimizer& optimizer,
                                 comm::Communicator& tp, comm::Communicator& pp, bool write,
                                 const Tensor* stashed_weights, comm::Communicator* ep) {
  const model::ParamLayout& mine = model.layout();
  // Under expert parallelism each expert lives on one rank of the expert-parallel group (on
  // each stage): the writer's group brings it over first.
  const int ep_size = ep ? ep->size() : 1, ep_rank = ep ? ep->rank() : 0;
  // This stage's state tensors by name; another stage's are known by their layout
  // (Optimizer::state_layout), which every rank can compute.
  std::map<std::string, Tensor> states;
  for (const optim::StateTensor& st : optimizer.state_tensors()) states.emplace(st.name, st.view);
  std::set<std::string> done;
  for (int stage = 0; stage < pp.size(); ++stage) {
   // The stage's layers: one range, or several chunks with gaps between them.
   const std::vector<model::LayerRange> ranges = plan.pipeline.stage_ranges(stage);
   for (int owner = 0; owner < ep_size; ++owner) {
    const model::ParamLayout layout =
        model::model_param_layout(plan.config.model, tp.rank(), tp.size(), plan.layer_degrees,
                                  ranges, owner, ep_size);
    for (const model::ParamSpec& p : layout.params()) {
      if (!done.insert(p.name).second) continue;
      const auto share = [&](io::SafetensorsWriter& writer, const std::string& name, int reduced,
                             const std::function<Tensor()>& local) {
        by_dtype(model.dtype(), [&](auto zero) {
          using T = decltype(zero);
          const std::vector<std::int64_t> shape = whole_state_shape(p, reduced);
          std::vector<T> whole(static_cast<std::size_t>(product(shape)), T(0));
          if (pp.rank() == stage && ep_rank == owner)
            whole = whole_state<T>(mine, mine.find(p.name), reduced, local(), tp);
          const Tensor all = Tensor::of(whole.data(), {static_cast<std::int64_t>(whole.size())});
          if (pp.rank() == stage && ep_size > 1) ep->broadcast(all, owner);
          pp.broadcast(all, stage);
          const std::int64_t bad = count_non_finite(whole.data(), whole.size());
          OASES_CHECK(bad == 0,
                      "refusing to checkpoint '{}': {} of its {} values are NaN or infinite; "
                      "training diverged (lower train.lr or raise train.warmup_steps)",
                      name, bad, whole.size());
          if (write) writer.add_copy(name, model.dtype(), shape, whole.data());
        });
      };
      share(model_file, p.name, -1, [&] { return mine.view(model.params(), mine.find(p.name)); });
      for (const optim::StateTensor& st : optimizer.state_layout(param_slot(p)))
        share(optimizer_file, st.name, st.reduced_dim, [&] { return states.at(st.name); });
      if (stashed_weights)
        share(optimizer_file, kStashedWeightsPrefix + p.name, -1,
              [&] { return mine.view(*stashed_weights, mine.find(p.name)); });
    }
   }
  }
}

// Reads tensor `name` (whole shape spec.full_shape) and keeps this rank's shard of it. `Source`
// is an io::SafetensorsFile or io::SafetensorsSet.
template <class Source>
void read_shard(const Source& file, const std::string& name, const model::ParamLayout& layout,
                const model::ParamSpec& spec, const Tensor& local) {
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

// Reads state tensor `name` of `spec` that reduces dimension `reduced` (-1: shaped like the
// parameter) and keeps this rank's part of it.
void read_state_shard(const io::SafetensorsFile& file, const std::string& name,
                      const model::ParamLayout& layout, const model::ParamSpec& spec, int reduced,
                      const Tensor& local) {
  if (reduced < 0) return read_shard(file, name, layout, spec, local);
  by_dtype(local.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::vector<std::int64_t> shape = whole_state_shape(spec, reduced);
    std::vector<T> whole(static_cast<std::size_t>(product(shape)));
    if constexpr (std::is_same_v<T, double>)
      file.read_f64(name, shape, whole.data());
    else
      file.read_f32(name, shape, whole.data());
    const std::int64_t bad = count_non_finite(whole.data(), whole.size());
    OASES_CHECK(bad == 0,
                "'{}': tensor '{}' holds {} NaN or infinite values; a run cannot "
                "resume from it",
                file.path(), name, bad);
    T* out = local.data<T>();
    if (state_is_whole_everywhere(spec, reduced)) {
      OASES_ASSERT(local.numel() == static_cast<std::int64_t>(whole.size()),
                   "state {} has {} elements here, {} whole", name, local.numel(), whole.size());
      std::copy(whole.begin(), whole.end(), out);
      return;
    }
    for (std::int64_t i = 0; i < local.numel(); ++i) {
      const std::int64_t g = state_global_index(layout, spec, reduced, i);
      out[i] = g >= 0 ? whole[static_cast<std::size_t>(g)] : T(0);
    }
  });
}

}  // namespace

std::optional<StagedCheckpoint> stage_checkpoint(
    const std::string& dir, const plan::RunPlan& plan, const model::Model& model,
    optim::Optimizer& optimizer, const TrainingState& state,
    const std::vector<data::TokenizerFile>& tokenizer_files, std::int64_t keep,
    comm::Communicator& tp, comm::Communicator& pp, bool write_files, const Tensor* stashed_weights,
    comm::Communicator* ep, StagingMemory* staging) {
  const model::ParamLayout& layout = model.layout();
  StagedCheckpoint staged;
  staged.model.set_staging(staging);
  staged.optimizer.set_staging(staging);
  staged.dir = dir;
  staged.step = state.step;
  staged.keep = keep;
  io::SafetensorsWriter& model_file = staged.model;
  io::SafetensorsWriter& optimizer_file = staged.optimizer;
  try {
    if (pp.size() > 1 || (ep && ep->size() > 1)) {
      add_whole_tensors_of_stages(model_file, optimizer_file, plan, model, optimizer, tp, pp,
                                  write_files, stashed_weights, ep);
    } else {
      add_whole_tensors(model_file, "", layout, model.params(), tp, write_files);
      for (const optim::StateTensor& s : optimizer.state_tensors())
        add_whole_state(optimizer_file, s, layout, tp, write_files);
      if (stashed_weights)
        add_whole_tensors(optimizer_file, kStashedWeightsPrefix, layout, *stashed_weights, tp,
                          write_files);
    }
  } catch (const UserError& e) {
    throw UserError(fmt::format("after step {}: {}; every checkpoint already written stays "
                                "as it was",
                                state.step, e.what()));
  }
  if (!write_files) return std::nullopt;

  const std::string config_toml = to_toml(plan.config);
  model_file.set_metadata("format", "pt");
  model_file.set_metadata("oases_config", config_toml);
  optimizer_file.set_metadata("format_version", std::to_string(kCheckpointFormatVersion));
  optimizer_file.set_metadata("optimizer", std::string(optimizer.name()));
  optimizer_file.set_metadata("step", std::to_string(state.step));
  optimizer_file.set_metadata("data_position", std::to_string(state.data_position));
  optimizer_file.set_metadata("seed", std::to_string(state.seed));
  optimizer_file.set_metadata("data_tokens", std::to_string(state.data_tokens));
  if (state.loss_scale) {
    // fmt's shortest form reads back as the same double.
    optimizer_file.set_metadata("loss_scale", fmt::format("{}", state.loss_scale->scale));
    optimizer_file.set_metadata("loss_scale_clean_steps",
                                std::to_string(state.loss_scale->clean_steps));
    optimizer_file.set_metadata("loss_scale_hysteresis_left",
                                std::to_string(state.loss_scale->hysteresis_left));
    optimizer_file.set_metadata("skipped_steps", std::to_string(state.loss_scale->skipped_steps));
  }
  optimizer_file.set_metadata("oases_config", config_toml);
  for (const data::TokenizerFile& file : tokenizer_files)
    staged.extra_files.push_back({file.name, file.contents});
  return staged;
}

std::string StagedCheckpoint::write(const io::CheckpointLog& log) const {
  return io::write_checkpoint(dir, step, model, optimizer, keep, log, extra_files);
}

std::string save_checkpoint(const std::string& dir, const plan::RunPlan& plan,
                            const model::Model& model, optim::Optimizer& optimizer,
                            const TrainingState& state,
                            const std::vector<data::TokenizerFile>& tokenizer_files,
                            std::int64_t keep, comm::Communicator& tp, comm::Communicator& pp,
                            bool write_files, const std::function<void(const std::string&)>& log,
                            const Tensor* stashed_weights, comm::Communicator* ep) {
  const std::optional<StagedCheckpoint> staged =
      stage_checkpoint(dir, plan, model, optimizer, state, tokenizer_files, keep, tp, pp,
                       write_files, stashed_weights, ep);
  if (!staged) return (fs::path(dir) / ("step_" + std::to_string(state.step))).string();
  return staged->write(log);
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
  const io::SafetensorsSet file = io::SafetensorsSet::open(path);
  for (const auto& p : layout.params()) read_shard(file, p.name, layout, p, layout.view(params, p));
}

namespace {

// The whole of tensor `name` of `set` in double (for comparing tied copies).
std::vector<double> whole_f64(const io::SafetensorsSet& set, const std::string& name) {
  const std::vector<std::int64_t> shape = set.info(name).shape;
  std::vector<double> values(static_cast<std::size_t>(product(shape)));
  set.read_f64(name, shape, values.data());
  return values;
}

// The parameter a folder tensor that hf_unused_tensor skips is a stored copy of, if any.
std::optional<std::string> tied_source(const model::ModelConfig& config, const std::string& name) {
  if (name == "lm_head.weight" && config.tied_embeddings())
    return config.arch == model::ArchitectureKind::gpt ? "wte.weight" : "model.embed_tokens.weight";
  if (name == "cls.predictions.decoder.weight") return "bert.embeddings.word_embeddings.weight";
  if (name == "cls.predictions.decoder.bias") return "cls.predictions.bias";
  return std::nullopt;
}

}  // namespace

void load_model_folder_weights(const std::string& folder, const model::ModelConfig& config,
                               const model::ParamLayout& layout, const Tensor& params) {
  const io::SafetensorsSet set = io::SafetensorsSet::open(folder);
  // Names are settled over the whole model, so every rank (whatever its stage and experts)
  // agrees on which tensors of the folder are used.
  const model::ParamLayout whole = model::model_param_layout(config);
  std::map<std::string, std::string> stored_name;  // parameter -> name in the folder
  std::set<std::string> used;
  for (const model::ParamSpec& p : whole.params()) {
    const std::vector<std::string> candidates = model::hf_tensor_name_candidates(config, p.name);
    const auto found = std::find_if(candidates.begin(), candidates.end(),
                                    [&](const std::string& c) { return set.has(c); });
    OASES_CHECK(found != candidates.end(),
                "the model folder '{}' has no tensor for parameter '{}' (looked for {}); its "
                "weights do not belong to the model its config.json describes",
                folder, p.name, fmt::join(candidates, ", "));
    stored_name.emplace(p.name, *found);
    used.insert(*found);
  }
  for (const std::string& name : set.names()) {
    if (used.count(name)) continue;
    OASES_CHECK(model::hf_unused_tensor(config, name),
                "the model folder '{}' holds tensor '{}', for which the model its config.json "
                "describes has no parameter; a folder whose weights oases would not all use is "
                "refused rather than read in part",
                folder, name);
    const std::optional<std::string> source = tied_source(config, name);
    if (!source) continue;
    OASES_CHECK(whole_f64(set, name) == whole_f64(set, stored_name.at(*source)),
                "the model folder '{}' holds '{}' and '{}', which the model ties together, with "
                "different values; oases computes the model with one tensor for both",
                folder, name, stored_name.at(*source));
  }
  for (const auto& p : layout.params())
    read_shard(set, stored_name.at(p.name), layout, p, layout.view(params, p));
}

void load_model_weights(const std::string& path, const model::ModelConfig& config,
                        const model::ParamLayout& layout, const Tensor& params) {
  if (model::is_hf_model_folder(path))
    return load_model_folder_weights(path, config, layout, params);
  load_model_weights(path.ends_with(".index.json") ? path : io::resolve_model_file(path), layout,
                     params);
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
  if (file.metadata().count("loss_scale")) {
    LossScaleState scale;
    const std::string& text = file.metadata().at("loss_scale");
    char* end = nullptr;
    scale.scale = std::strtod(text.c_str(), &end);
    OASES_CHECK(!text.empty() && end == text.c_str() + text.size(),
                "checkpoint '{}': loss_scale = \"{}\" is not a number; the checkpoint is damaged",
                checkpoint_dir, text);
    scale.clean_steps = io::metadata_int(file, "loss_scale_clean_steps");
    scale.hysteresis_left = io::metadata_int(file, "loss_scale_hysteresis_left");
    scale.skipped_steps = io::metadata_int(file, "skipped_steps");
    state.loss_scale = scale;
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
  // The same optimizer with other settings keeps other state (momentum or not): the file must
  // hold exactly the state this run keeps for its parameters.
  const std::vector<optim::StateTensor> tensors = optimizer.state_tensors();
  std::set<std::string> expected;
  for (const optim::StateTensor& s : tensors) expected.insert(s.name);
  const auto mismatch = [&](const std::string& name, const char* what) {
    return fmt::format(
        "checkpoint '{}' {} optimizer state '{}': it was saved with other "
        "settings of train.optimizer = \"{}\" (train.momentum, "
        "train.adafactor_beta1); resume with the settings it was trained with",
        checkpoint_dir, what, name, optimizer.name());
  };
  for (const std::string& name : expected)
    OASES_CHECK(file.has(name), "{}", mismatch(name, "holds no"));
  for (const std::string& name : file.names()) {
    const auto dot = name.find('.');
    if (name.starts_with(kStashedWeightsPrefix) || dot == std::string::npos ||
        !layout.has(name.substr(dot + 1)))
      continue;
    OASES_CHECK(expected.contains(name), "{}", mismatch(name, "holds"));
  }
  for (const optim::StateTensor& s : tensors)
    read_state_shard(file, s.name, layout, layout.find(s.param), s.elementwise ? -1 : s.reduced_dim,
                     s.view);
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
  if (plan::parse_settings(config_from_checkpoint(checkpoint_dir)).tokenizer ==
      data::TokenizerKind::sentencepiece)
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
  // Optimizer state is named "<state>.<parameter>" and shaped like its parameter, or, for
  // factored state (optim::StateTensor::reduced_dim), like it without its last dimension
  // ("<kind>_row") or the one before ("<kind>_col").
  for (const std::string& name : optimizer_file.names()) {
    const auto dot = name.find('.');
    OASES_CHECK(dot != std::string::npos && model_file.has(name.substr(dot + 1)),
                "'{}': optimizer state '{}' belongs to no parameter of '{}'",
                optimizer_file.path(), name, model_file.path());
    const std::string kind = name.substr(0, dot);
    std::vector<std::int64_t> expected = model_file.info(name.substr(dot + 1)).shape;
    const bool row = kind.ends_with("_row"), col = kind.ends_with("_col");
    OASES_CHECK(!(row || col) || expected.size() >= 2,
                "'{}': optimizer state '{}' is factored but its parameter has shape {}",
                optimizer_file.path(), name, io::shape_string(expected));
    if (row) expected.pop_back();
    if (col) expected.erase(expected.end() - 2);
    OASES_CHECK(
        optimizer_file.info(name).shape == expected,
        "'{}': optimizer state '{}' has shape {} but {} was expected from its parameter's {}",
        optimizer_file.path(), name, io::shape_string(optimizer_file.info(name).shape),
        io::shape_string(expected), io::shape_string(model_file.info(name.substr(dot + 1)).shape));
  }
  return summary;
}

plan::RunConfig config_from_checkpoint(const std::string& path) {
  if (model::is_hf_model_folder(path))
    return plan::parse_run_config_with_folder("", (fs::path(path) / model::kHfConfigFile).string(),
                                              {}, path);
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
  return plan::parse_run_config(text.str(), model_file + " (oases_config)");
}

namespace {

// The tokenizer files a checkpoint folder (or a model folder) holds, under their Hugging Face
// names.
std::vector<data::TokenizerFile> tokenizer_files_in(const fs::path& folder) {
  std::vector<data::TokenizerFile> files;
  for (const char* name : {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                           "vocab.txt", "vocab.json", "merges.txt"}) {
    std::error_code ec;
    if (!fs::is_regular_file(folder / name, ec)) continue;
    files.push_back({name, read_regular_file((folder / name).string(), "tokenizer file",
                                             std::uint64_t{1} << 32)});
  }
  return files;
}

}  // namespace

std::unique_ptr<data::Tokenizer> checkpoint_tokenizer(const std::string& checkpoint,
                                                      const std::string& gpt2_files) {
  if (model::is_hf_model_folder(checkpoint)) {
    if (data::folder_tokenizer_kind(checkpoint)) {
      OASES_CHECK(gpt2_files.empty(),
                  "model folder '{}' holds its tokenizer; the tokenizer files '{}' do not apply: "
                  "leave them out",
                  checkpoint, gpt2_files);
      return data::load_tokenizer_folder(checkpoint);
    }
    OASES_CHECK(!gpt2_files.empty(),
                "model folder '{}' holds no tokenizer (tokenizer.json, tokenizer.model, "
                "vocab.txt, or vocab.json and merges.txt); copy the model's tokenizer files into "
                "it, or give GPT-2's with --tokenizer-dir",
                checkpoint);
    return data::make_tokenizer(data::TokenizerKind::gpt2, gpt2_files);
  }
  const plan::RunConfig config = config_from_checkpoint(checkpoint);
  const data::TokenizerKind kind = plan::parse_settings(config).tokenizer;
  const fs::path folder = fs::path(io::resolve_model_file(checkpoint)).parent_path();
  const std::vector<data::TokenizerFile> files = tokenizer_files_in(folder);
  if (kind == data::TokenizerKind::byte || kind == data::TokenizerKind::gpt2) {
    OASES_CHECK(gpt2_files.empty() || kind == data::TokenizerKind::gpt2,
                "checkpoint '{}' was trained with the {} tokenizer, which reads no files, but "
                "gpt2 tokenizer files '{}' were given; leave them out",
                checkpoint, data::name(kind), gpt2_files);
    // GPT-2's files where the checkpoint carries them (a run given them as a folder).
    if (kind == data::TokenizerKind::gpt2 && gpt2_files.empty() && !files.empty())
      return data::tokenizer_from_files(kind, files,
                                        fmt::format("checkpoint '{}'", folder.string()));
    return data::make_tokenizer(kind, gpt2_files);
  }
  OASES_CHECK(gpt2_files.empty(),
              "checkpoint '{}' was trained with the {} tokenizer, whose files it carries ({}); "
              "the gpt2 tokenizer files '{}' do not apply: leave them out",
              checkpoint, data::name(kind),
              kind == data::TokenizerKind::sentencepiece ? kTokenizerModelFile : "vocab.txt",
              gpt2_files);
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (files.empty() && kind == data::TokenizerKind::bpe) {
    tokenizer = data::make_tokenizer(kind);  // the default files, as the run had them
  } else {
    OASES_CHECK(!files.empty(),
                "checkpoint '{}' was trained with the {} tokenizer but holds none of its files "
                "({} and the like, which every checkpoint of such a run carries); they were "
                "removed, or the checkpoint was copied without them",
                folder.string(), data::name(kind),
                kind == data::TokenizerKind::sentencepiece ? kTokenizerModelFile : "vocab.txt");
    tokenizer =
        data::tokenizer_from_files(kind, files, fmt::format("checkpoint '{}'", folder.string()));
  }
  OASES_CHECK(tokenizer->vocab_size() <= config.model.vocab_size,
              "checkpoint '{}': its tokenizer has {} tokens, more than its model.vocab_size = "
              "{}; the checkpoint's files do not belong together",
              folder.string(), tokenizer->vocab_size(), config.model.vocab_size);
  return tokenizer;
}

}  // namespace oases::train
