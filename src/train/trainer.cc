#include "train/trainer.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/line_file.h"
#include "core/log.h"
#include "core/stop_signals.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/mlm.h"
#include "data/token_shard.h"
#include "io/checkpoint_dir.h"
#include "kernels/kernels.h"
#include "optim/lr_schedule.h"
#include "planner/stage_partition.h"
#include "runtime/trace.h"
#include "train/batches.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/engine.h"
#include "train/host_memory.h"
#include "train/peaks.h"
#include "train/run_outputs.h"
#include "train/stragglers.h"
#include "train/threads.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <deque>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

namespace oases::train {
namespace {

std::int64_t peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<std::int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_rate(double per_second) {
  if (per_second >= 1e6) return fmt::format("{:.2f}M", per_second / 1e6);
  if (per_second >= 1e3) return fmt::format("{:.1f}k", per_second / 1e3);
  return fmt::format("{:.0f}", per_second);
}

// `tokenizer`: the run's (load_run_tokenizer), when it was loaded.
data::TokenShard load_shard_for(const plan::RunConfig& config, const std::string& split,
                                const data::Tokenizer* tokenizer) {
  OASES_CHECK(!config.data.path.empty(),
              "data.path is not set; run `oases prepare-data --input FILE --output PREFIX` and "
              "pass --set data.path=PREFIX");
  data::TokenShard shard = data::load_token_shard(config.data.path + "_" + split + ".bin");
  OASES_CHECK(shard.vocab_size <= config.model.vocab_size,
              "data shard '{}' was tokenized with vocabulary {} ({} tokens) but model.vocab_size "
              "= {}; set model.vocab_size to at least {}",
              shard.path, shard.tokenizer, shard.vocab_size, config.model.vocab_size,
              shard.vocab_size);
  OASES_CHECK(shard.tokenizer == config.data.tokenizer,
              "data shard '{}' was made with tokenizer \"{}\" but data.tokenizer = \"{}\"",
              shard.path, shard.tokenizer, config.data.tokenizer);
  OASES_CHECK(!tokenizer || shard.vocab_size == tokenizer->vocab_size(),
              "data shard '{}' has a vocabulary of {} tokens, but the tokenizer model '{}' has "
              "{}: the shards were made with another model; set data.tokenizer_model to that one, "
              "or run prepare-data again with this one",
              shard.path, shard.vocab_size, tokenizer_model_path(config),
              tokenizer ? tokenizer->vocab_size() : 0);
  return shard;
}

// The training and (when evaluation is on) validation data, and their batch makers.
struct RunData {
  std::unique_ptr<data::Tokenizer> tokenizer;  // see load_run_tokenizer; may be null
  data::TokenShard train_shard;
  std::optional<data::DataLoader> train_loader;
  std::optional<BatchMaker> train_batches;
  std::optional<data::TokenShard> val_shard;
  std::optional<data::DataLoader> val_loader;
  std::optional<BatchMaker> val_batches;
};

std::unique_ptr<RunData> load_data(const plan::RunConfig& config) {
  const auto& t = config.train;
  const std::int64_t seq = config.model.seq_len;
  const auto seed = static_cast<std::uint64_t>(t.seed);
  auto d = std::make_unique<RunData>();
  d->tokenizer = load_run_tokenizer(config);
  d->train_shard = load_shard_for(config, "train", d->tokenizer.get());
  d->train_loader.emplace(d->train_shard, seq, t.global_batch, config.data.shuffle, seed);
  // A tokenizer with BERT's special tokens in its vocabulary gives their ids.
  const std::optional<data::MlmSpecialTokens> special =
      d->tokenizer ? data::tokenizer_mlm_special_tokens(*d->tokenizer) : std::nullopt;
  d->train_batches.emplace(config, *d->train_loader, d->train_shard.vocab_size, special);
  if (t.eval_every > 0) {
    d->val_shard = load_shard_for(config, "val", d->tokenizer.get());
    d->val_loader.emplace(*d->val_shard, seq, t.global_batch, false, seed);
    d->val_batches.emplace(config, *d->val_loader, d->val_shard->vocab_size, special);
  }
  return d;
}

// Validation loss over eval_steps global batches of the validation shard: the mean over all
// their counted targets (train/batches.h), so a batch with few counted targets (a loss mask,
// masked-language modelling) weighs little and one with none not at all; 0 when no batch has
// any. Each data-parallel rank evaluates its share of every batch.
double validation_loss(TrainingEngine& engine, const BatchMaker& batches, std::int64_t count) {
  Batch b;
  double loss_sum = 0, targets = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    batches.validation(i, engine.first_local_sample(), engine.local_batch(), b);
    const auto batch_targets = static_cast<double>(batches.validation_targets(i));
    loss_sum +=
        engine.evaluate(b.inputs.data(), b.targets.data(), engine.local_batch()) * batch_targets;
    targets += batch_targets;
  }
  return targets > 0 ? loss_sum / targets : 0.0;
}

// Gathers every rank's trace events on rank 0, which writes one file with a process per rank.
void write_trace(const runtime::TraceRecorder& trace, comm::Mesh& mesh, const std::string& path) {
  comm::Communicator& world = mesh.world();
  const std::string mine = trace.events_json(world.rank());
  if (world.rank() != 0) {
    // Bytes travel as int32 words (the communicators move numbers, not chars).
    std::int64_t length = static_cast<std::int64_t>(mine.size());
    std::vector<std::int32_t> words(static_cast<std::size_t>((length + 3) / 4), 0);
    std::memcpy(words.data(), mine.data(), mine.size());
    world.send(Tensor::of(&length, {1}), 0, 1);
    world.send(Tensor::of(words.data(), {static_cast<std::int64_t>(words.size())}), 0, 2);
    return;
  }
  std::vector<std::string> arrays{mine};
  for (int rank = 1; rank < world.size(); ++rank) {
    std::int64_t length = 0;
    world.recv(Tensor::of(&length, {1}), rank, 1);
    std::vector<std::int32_t> words(static_cast<std::size_t>((length + 3) / 4), 0);
    world.recv(Tensor::of(words.data(), {static_cast<std::int64_t>(words.size())}), rank, 2);
    arrays.emplace_back(reinterpret_cast<const char*>(words.data()), static_cast<std::size_t>(length));
  }
  runtime::TraceRecorder::write_merged(path, arrays);
}

void check_memory_limit(const plan::RunConfig& config, TrainingEngine& engine) {
  if (config.parallel.memory_limit <= 0) return;
  const auto needed = static_cast<std::int64_t>(engine.memory_bytes());
  OASES_CHECK(needed <= config.parallel.memory_limit,
              "parallel.memory_limit = {} bytes is too small: this model needs {} bytes "
              "(parameters, gradients, optimizer state and activations for micro_batch = {}); "
              "raise the limit, lower train.micro_batch or the model size, partition the "
              "optimizer state, gradients and parameters over the data-parallel group with "
              "parallel.zero = 1, 2 or 3 (now {}), or split every sequence over more ranks with "
              "parallel.cp (now {})",
              config.parallel.memory_limit, needed, config.train.micro_batch, config.parallel.zero,
              config.parallel.cp);
}

// Resumes from `resume_from` (the newest checkpoint, when checkpoint.resume found one) or
// initialises from --init-from; returns the first step to run.
std::int64_t restore(const plan::RunConfig& config, const TrainOptions& options,
                     const std::optional<std::string>& resume_from,
                     const data::TokenShard& train_shard, TrainingEngine& engine,
                     ProgressLine* progress) {
  std::int64_t start_step = 0;
  if (config.checkpoint.resume) {
    if (const auto& latest = resume_from) {
      load_model_weights((std::filesystem::path(*latest) / io::kModelFile).string(),
                         engine.model().layout(), engine.model().params());
      TrainingState state;
      engine.load_whole_optimizer_state([&](optim::Optimizer& whole) {
        state = load_optimizer_state(*latest, engine.model().layout(), whole);
      });
      OASES_CHECK(state.seed == static_cast<std::uint64_t>(config.train.seed),
                  "checkpoint '{}' was trained with train.seed = {} but the config says {}; "
                  "resume with the same seed",
                  *latest, state.seed, config.train.seed);
      OASES_CHECK(state.step <= config.train.steps,
                  "checkpoint '{}' is at step {}, beyond train.steps = {}; raise train.steps to "
                  "continue it",
                  *latest, state.step, config.train.steps);
      // The data position names batches of one particular shard; on another, resuming would
      // silently continue a different data order.
      OASES_CHECK(state.data_tokens == 0 || state.data_tokens == train_shard.size(),
                  "checkpoint '{}' was trained on a training shard of {} tokens but '{}' holds "
                  "{}; its data position would not continue the same data. Resume with the "
                  "original shard, or start a new run from its weights with --init-from {}",
                  *latest, state.data_tokens, train_shard.path, train_shard.size(), *latest);
      start_step = state.data_position;
      engine.model().refresh_compute_params();
      // fp16's scale continues where it was; a checkpoint of another precision starts it anew.
      if (state.loss_scale && engine.plan().loss_scaling.kind != plan::LossScalingPlan::Kind::none)
        engine.loss_scaler().restore(*state.loss_scale, *latest);
      if (engine.stashed_weights_needed()) {
        // 2bw: the next batch computes on the stashed W(step - 1); a checkpoint of another
        // pipeline has none, and the delay restarts there as at step 0 (W(step - 1) = W(step)).
        Buffer stashed(engine.model().params().nbytes());
        const Tensor values = stashed.tensor(engine.model().params().dtype(),
                                             engine.model().params().shape());
        if (load_stashed_weights(*latest, engine.model().layout(), values))
          engine.set_stashed_weights(values, state.step);
      }
      if (progress)
        progress->log(LogLevel::info,
                      fmt::format("resumed from {} (step {})", *latest, start_step));
    } else if (progress) {
      progress->log(LogLevel::info,
                    fmt::format("checkpoint.resume: no complete checkpoint in '{}', starting "
                                "from step 0",
                                config.checkpoint.dir));
    }
  }
  if (start_step == 0 && !options.init_from.empty()) {
    load_model_weights(options.init_from, config.model, engine.model().layout(),
                       engine.model().params());
    engine.model().refresh_compute_params();
    if (progress)
      progress->log(LogLevel::info, fmt::format("initialised weights from {}", options.init_from));
  }
  // ZeRO-3: whole parameters were written above; each rank keeps its own blocks.
  engine.shard_params();
  return start_step;
}

// The learning-rate schedule the engine derives from `t` (train/engine.h).
optim::LrSchedule lr_schedule_of(const plan::OptimConfig& t) {
  return {t.lr, t.min_lr, t.warmup_steps, t.lr_decay_steps, t.steps};
}

// "train.steps changed from 1000 to 2000 and train.lr changed from 0.0003 to 0.0001": the
// schedule's settings that differ between the checkpoint's config and this run's; empty when
// none does.
std::string schedule_changes(const plan::OptimConfig& was, const plan::OptimConfig& now) {
  std::vector<std::string> changes;
  const auto add = [&](const char* key, auto a, auto b) {
    if (a != b) changes.push_back(fmt::format("train.{} changed from {} to {}", key, a, b));
  };
  add("steps", was.steps, now.steps);
  add("lr", was.lr, now.lr);
  add("min_lr", was.min_lr, now.min_lr);
  add("warmup_steps", was.warmup_steps, now.warmup_steps);
  add("lr_decay_steps", was.lr_decay_steps, now.lr_decay_steps);
  std::string text;
  for (std::size_t i = 0; i < changes.size(); ++i)
    text += (i == 0 ? "" : i + 1 == changes.size() ? " and " : ", ") + changes[i];
  return text;
}

// The config a resumed run trains with, given the config `stored` in the checkpoint it resumes
// from (at `start_step` completed steps): see LrScheduleOnResume.
plan::RunConfig resolve_lr_schedule(const plan::RunConfig& config, const plan::RunConfig& stored,
                              const std::string& checkpoint, std::int64_t start_step,
                              LrScheduleOnResume policy, bool leader) {
  const optim::LrSchedule was = lr_schedule_of(stored.train);
  const optim::LrSchedule now = lr_schedule_of(config.train);
  if (schedule_changes(stored.train, config.train).empty()) return config;
  std::int64_t first_change = -1;  // 0-based step
  for (std::int64_t s = start_step; s < config.train.steps && first_change < 0; ++s)
    if (was.at(s) != now.at(s)) first_change = s;
  if (first_change < 0) return config;

  const std::int64_t next = start_step;  // 0-based index of the next step to run
  const std::string what = fmt::format(
      "{} since the checkpoint '{}' at step {}", schedule_changes(stored.train, config.train),
      checkpoint, start_step);
  std::string rates = fmt::format("the lr at step {} becomes {:.6g} (it would have been {:.6g})",
                                  next + 1, now.at(next), was.at(next));
  if (first_change != next)
    rates = fmt::format("the lr at step {} stays {:.6g}, but at step {} it becomes {:.6g} (it "
                        "would have been {:.6g})",
                        next + 1, now.at(next), first_change + 1, now.at(first_change),
                        was.at(first_change));
  const std::int64_t old_decay_end =
      stored.train.lr_decay_steps > 0 ? stored.train.lr_decay_steps : stored.train.steps;
  switch (policy) {
    case LrScheduleOnResume::refuse:
      OASES_FAIL(
          "{}: the learning-rate schedule would be recomputed for {} steps, so {}. Resume with "
          "`--lr-schedule config` to train with the recomputed schedule, or `--lr-schedule "
          "checkpoint` to keep the checkpoint's (lr {}, min_lr {}, warmup {} steps, decay "
          "ending at step {}, then min_lr), or restore the checkpoint's settings",
          what, config.train.steps, rates, stored.train.lr, stored.train.min_lr,
          stored.train.warmup_steps, old_decay_end);
    case LrScheduleOnResume::config:
      if (leader)
        log_warning("{}: the learning-rate schedule is recomputed for {} steps "
                    "(--lr-schedule config), so {}",
                    what, config.train.steps, rates);
      return config;
    case LrScheduleOnResume::checkpoint: {
      plan::RunConfig kept = config;
      kept.train.lr = stored.train.lr;
      kept.train.min_lr = stored.train.min_lr;
      kept.train.warmup_steps = stored.train.warmup_steps;
      kept.train.lr_decay_steps = old_decay_end;
      if (leader)
        log_warning("{}: the checkpoint's learning-rate schedule is kept (--lr-schedule "
                    "checkpoint: lr {}, min_lr {}, warmup {} steps, decay ending at step {}{}), "
                    "so the lr at step {} is {:.6g}",
                    what, kept.train.lr, kept.train.min_lr, kept.train.warmup_steps, old_decay_end,
                    config.train.steps > old_decay_end
                        ? fmt::format(", then min_lr up to step {}", config.train.steps)
                        : "",
                    next + 1, lr_schedule_of(kept.train).at(next));
      return kept;
    }
  }
  return config;
}

// The checkpoint a resumed run starts from (its files verified), and the config stored in it.
struct ResumePoint {
  std::string folder;
  plan::RunConfig stored;
  std::int64_t step = 0;
};

std::optional<ResumePoint> find_resume_point(const plan::RunConfig& config) {
  if (!config.checkpoint.resume) return std::nullopt;
  const auto latest = latest_checkpoint(config.checkpoint.dir);
  if (!latest) return std::nullopt;
  io::verify_checkpoint_files(*latest);
  return ResumePoint{*latest, config_from_checkpoint(*latest), io::checkpoint_step(*latest)};
}

// The metrics file of the run: a fresh run starts it empty; a resumed run keeps the records of
// the steps up to the one it resumes from (a run that went further before stopping wrote records
// the resumed run will write again).
std::optional<LineFile> open_metrics(const plan::RunConfig& config, bool leader,
                                     std::int64_t start_step) {
  if (!leader || config.log.metrics.empty()) return std::nullopt;
  const std::string& path = config.log.metrics;
  if (start_step == 0) return std::optional<LineFile>(std::in_place, path, LineFile::Start::truncate);
  std::error_code ec;
  // A device or pipe (/dev/stdout) keeps its stream: there is nothing to rewrite, and a
  // rename would replace the device.
  if (!std::filesystem::is_regular_file(path, ec))
    return std::optional<LineFile>(std::in_place, path);
  std::string kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
        record["step"].get<std::int64_t>() <= start_step)
      kept += line + "\n";
  }
  write_file_atomically(path, kept);
  return std::optional<LineFile>(std::in_place, path);
}

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string this_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}


// The schedule as run.json records it, "auto" settings resolved: kind, recompute policy (with
// sqrt's layers per group), sub-batches and micro-batches per step.
nlohmann::json schedule_description(const schedule::ScheduleSpec& spec) {
  nlohmann::json out = {{"kind", schedule::name(spec.kind)},
                        {"recompute", schedule::recompute_words(spec)},
                        {"sub_batches", spec.sub_batches},
                        {"micro_batches", spec.micro_batches}};
  if (spec.recompute == schedule::Recompute::sqrt) out["recompute_every"] = spec.recompute_every;
  return out;
}

// run.json's "plan": the plan file parallel.plan names and the settings it gave the run; null
// where the run took none from a plan file.
nlohmann::json plan_file_description(const plan::RunPlan& plan) {
  if (!plan.plan_file || plan.plan_file->settings.empty()) return nullptr;
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& [key, value] : plan.plan_file->settings) settings[key] = value;
  nlohmann::json out = {{"file", plan.plan_file->path}, {"settings", settings}};
  if (plan.plan_file->predicted_step_seconds > 0)
    out["predicted_step_s"] = plan.plan_file->predicted_step_seconds;
  return out;
}

// Writes run.json beside the metrics file (see trainer.h). Leader only.
void write_run_description(TrainingEngine& engine, comm::Mesh& mesh,
                           std::int64_t start_step, int threads, const nlohmann::json& peak) {
  // The config as checkpoints store it (measured settings resolved).
  const plan::RunConfig& config = engine.config();
  if (config.log.metrics.empty()) return;
  const std::filesystem::path metrics(config.log.metrics);
  std::error_code ec;
  // A device or pipe has no folder of its own to describe.
  if (std::filesystem::exists(metrics, ec) && !std::filesystem::is_regular_file(metrics, ec))
    return;
  std::vector<int> degrees;
  for (std::int64_t l = 0; l < config.model.layers; ++l)
    degrees.push_back(engine.model().layer_degree(l));
  const planner::MemoryFigures memory = engine.memory_figures();
  nlohmann::json run = {{"format", 1},
                        {"config", to_toml(config)},
                        {"layer_degrees", degrees},
                        {"world_size", mesh.world_size()},
                        {"tp", mesh.tp_size()},
                        {"cp", mesh.cp_size()},
                        {"dp", mesh.dp_size()},
                        {"pp", mesh.pp_size()},
                        {"threads", threads},
                        {"started", iso8601_utc_now()},
                        {"host", this_host_name()},
                        {"cpu", cpu_model_name()},
                        {"parameters", config.model.parameter_count()},
                        {"start_step", start_step},
                        {"schedule", schedule_description(engine.plan().schedule)},
                        {"activation_compression", config.parallel.activation_compression},
                        {"partition_activations", config.parallel.partition_activations},
                        {"sequence_parallel", engine.plan().sequence_parallel},
                        {"cp_kind", config.parallel.cp_kind},
                        {"bucket_bytes", config.parallel.bucket_bytes},
                        {"zero", engine.zero_stage()},
                        {"offload", config.parallel.offload},
                        {"memory_bytes",
                         {{"parameters", memory.params - memory.working_copy},
                          {"gradients", memory.grads},
                          {"optimizer", memory.optimizer},
                          {"activations", memory.activations},
                          {"offloaded", memory.offloaded}}}};
  if (!peak.is_null()) run["peak"] = peak;
  if (nlohmann::json file = plan_file_description(engine.plan()); !file.is_null())
    run["plan"] = std::move(file);
  if (memory.working_copy > 0) {
    run["memory_bytes"]["working_copy"] = memory.working_copy;
    run["gemm16_path"] = engine.gemm16().description;
  }
  write_file_atomically((metrics.parent_path() / "run.json").string(), run.dump(2) + "\n");
}

// Each pipeline stage's predicted peak activation bytes (engine.activation_bytes(): the
// static buffers plus the peak of its lowered schedule), gathered over this rank's pipeline
// group; empty without a pipeline. Collective over the pipeline group.
std::vector<double> stage_activation_bytes(TrainingEngine& engine, comm::Mesh& mesh) {
  if (mesh.pp_size() == 1) return {};
  std::vector<double> bytes(static_cast<std::size_t>(mesh.pp_size()), 0.0);
  bytes[static_cast<std::size_t>(mesh.pp_rank())] = static_cast<double>(engine.activation_bytes());
  engine.pp().all_reduce(Tensor::of(bytes.data(), {static_cast<std::int64_t>(bytes.size())}));
  return bytes;
}

// "stage 0: layers 0-1 + embedding, peak activations 3.2 MiB | stage 1: layers 2-3 + head, ...";
// with several chunks per rank (interleaved) a stage lists its chunks' layers, "layers 0, 4-5".
std::string describe_stages(const plan::RunPlan& plan, const std::vector<double>& activation_bytes) {
  const std::vector<int>& counts = plan.pipeline.counts();
  const std::size_t stages = activation_bytes.size();
  std::vector<std::string> layers(stages);
  int first = 0;
  for (std::size_t c = 0; c < counts.size(); ++c) {
    const int last = first + counts[c] - 1;
    std::string& text = layers[c % stages];
    text += fmt::format("{}{}", text.empty() ? "" : ", ",
                        counts[c] > 1 ? fmt::format("{}-{}", first, last) : std::to_string(first));
    first = last + 1;
  }
  std::string text;
  for (std::size_t s = 0; s < stages; ++s) {
    const bool several = counts.size() > stages || counts[s] > 1;
    text += fmt::format("{}stage {}: layer{} {}{}{}, peak activations {:.1f} MiB", s ? " | " : "",
                        s, several ? "s" : "", layers[s], s == 0 ? " + embedding" : "",
                        s + 1 == stages ? " + head" : "", activation_bytes[s] / (1 << 20));
  }
  return text;
}

// The start-up lines on the model, the data and the precision.
void log_model_and_precision(TrainingEngine& engine, std::int64_t train_tokens,
                             const ThreadChoice& threads) {
  const plan::RunPlan& plan = engine.plan();
  const auto& t = plan.config.train;
  const auto& m = plan.config.model;
  log_info("model: {} {} layers, hidden {}, heads {}, seq {}, vocab {}: {:.2f}M parameters, {}",
           model::name(m.arch), m.layers, m.hidden, m.heads, m.seq_len, m.vocab_size,
           static_cast<double>(m.parameter_count()) / 1e6, t.precision);
  if (plan.dtypes.mixed()) {
    std::string scaling = "no loss scaling";
    switch (plan.loss_scaling.kind) {
      case plan::LossScalingPlan::Kind::none: break;
      case plan::LossScalingPlan::Kind::constant:
        scaling = fmt::format("constant loss scale {}", plan.loss_scaling.constant);
        break;
      case plan::LossScalingPlan::Kind::dynamic:
        scaling = fmt::format("dynamic loss scale from {} (x2 after {} clean steps, x0.5 after {} "
                              "overflows)",
                              engine.loss_scaler().scale(), plan.loss_scaling.window,
                              plan.loss_scaling.hysteresis);
        break;
    }
    log_info("precision: {} activations, weight copy and tensor-parallel collectives; fp32 master "
             "weights, gradients and optimizer state; gradients reduced in {}; {}; 16-bit "
             "products by {}",
             t.precision, t.grad_reduce_dtype, scaling, engine.gemm16().description);
  }
  log_info("data: {} training tokens, global batch {} x {} tokens, {} steps",
           train_tokens, t.global_batch, m.seq_len, t.steps);
  log_info("threads: {} per rank ({})", threads.threads, threads.reason);
}

// The start-up lines on how the ranks split the run: the mesh, the experts, the pipeline and
// the layers' degrees.
void log_layout(TrainingEngine& engine, comm::Mesh& mesh,
                const std::vector<double>& stage_activations) {
  const plan::RunPlan& plan = engine.plan();
  const plan::RunConfig& config = plan.config;
  const auto& m = config.model;
  // The layout may be the plan file's rather than the config file's: say which settings it gave.
  if (plan.plan_file && !plan.plan_file->settings.empty()) {
    std::vector<std::string> settings;
    for (const auto& [key, value] : plan.plan_file->settings)
      settings.push_back(fmt::format("{}={}", key, value));
    const double predicted = plan.plan_file->predicted_step_seconds;
    log_info("plan {}: {}{}", plan.plan_file->path, fmt::join(settings, ", "),
             predicted > 0 ? fmt::format(" (predicted step {:.3g} s)", predicted) : std::string());
  }
  if (mesh.world_size() > 1 && mesh.cp_size() > 1)
    log_info(
        "parallel: {} ranks = tp {} x cp {} x dp {} x pp {} (context parallelism: {}, "
        "{} tokens of every sequence per rank, in chunks of {})",
        mesh.world_size(), mesh.tp_size(), mesh.cp_size(), mesh.dp_size(), mesh.pp_size(),
        config.parallel.cp_kind, m.seq_len / mesh.cp_size(), m.seq_len / (2 * mesh.cp_size()));
  else if (mesh.world_size() > 1)
    log_info("parallel: {} ranks = tp {} x dp {} x pp {}", mesh.world_size(), mesh.tp_size(),
             mesh.dp_size(), mesh.pp_size());
  if (m.has_moe())
    log_info("experts: {} MoE layers of {} experts ({} gate, {} per token, capacity factor {}), "
             "{} per rank{}",
             m.moe_layer_count(), m.experts, ops::moe_gate_name(m.moe_gate),
             m.moe_gate == ops::MoeGate::expert_choice ? std::string("capacity")
                                                       : std::to_string(m.moe_choices()),
             m.capacity_factor, m.experts / mesh.ep_size(),
             (mesh.ep_size() > 1 ? fmt::format(" (ep {}: all-to-all over {} data-parallel ranks)",
                                               mesh.ep_size(), mesh.ep_size())
                                 : std::string()) +
                 (mesh.tp_size() == 1 ? std::string()
                  : config.parallel.expert_tp == 1
                      ? std::string(", whole (expert_tp 1: MoE layers at degree 1)")
                      : fmt::format(", split over each layer's tensor-parallel ranks (expert_tp {})",
                                    mesh.tp_size())));
  if (plan.pipeline.two_bw())
    log_info("pipeline: 2bw (no flush between steps; batch t computes on the weights one update "
             "older than those its update is applied to, so results differ from 1f1b by design)");
  if (plan.pipeline.enabled()) {
    const std::string counts = planner::format_pipeline_layers(plan.pipeline.counts());
    if (plan.pipeline.virtual_stages > 1)
      log_info("pipeline: {} over {} stages x {} chunks each, transformer layers per chunk {}",
               config.parallel.pipeline, mesh.pp_size(), plan.pipeline.virtual_stages, counts);
    else
      log_info("pipeline: {} over {} stages, transformer layers per stage {}",
               config.parallel.pipeline, mesh.pp_size(), counts);
    log_info("pipeline stages: {}", describe_stages(plan, stage_activations));
  }
  if (plan.settings.plan != plan::LayerPlanSource::uniform) {
    std::string degrees;
    for (std::int64_t l = 0; l < m.layers; ++l)
      degrees += fmt::format("{}{}", l ? " " : "", engine.model().layer_degree(l));
    log_info("plan: tensor-parallel degree per layer {} (parallel.plan = \"{}\"); memory {:.1f} "
             "MiB per rank",
             degrees, config.parallel.plan,
             static_cast<double>(engine.memory_bytes()) / (1 << 20));
  }
}

// The start-up line on the memory a rank holds.
void log_memory(TrainingEngine& engine) {
  const plan::RunPlan& plan = engine.plan();
  const double mib = 1 << 20;
  const planner::MemoryFigures memory = engine.memory_figures();
  const std::string working_copy =
      memory.working_copy > 0
          ? fmt::format(" (+ {:.1f} MiB {} copy)", static_cast<double>(memory.working_copy) / mib,
                        plan.config.train.precision)
          : std::string();
  const int stage = plan.zero.effective_stage();
  const std::string zero =
      stage > 0
          ? fmt::format("; ZeRO-{}: the state{} of this rank's blocks only{}", stage,
                        stage == 2   ? " and gradients"
                        : stage == 3 ? ", gradients and parameters"
                                     : "",
                        plan.schedule.sharded_params
                            ? fmt::format(", parameters with {:.1f} MiB gathered at most",
                                          static_cast<double>(engine.peak_gathered_param_bytes()) /
                                              (1 << 20))
                            : std::string())
          : std::string();
  const std::string offload =
      memory.offloaded > 0
          ? fmt::format("; {:.1f} MiB of it ({}) offloaded to a scratch file in {}",
                        static_cast<double>(memory.offloaded) / mib, plan.config.parallel.offload,
                        plan.zero.offload_dir)
          : std::string();
  log_info("memory per rank: parameters {:.1f} MiB{}, gradients {:.1f} MiB, optimizer state "
           "{:.1f} MiB ({}, {} bytes, {:.3g} bytes per parameter{}), activations {:.1f} MiB; "
           "{:.1f} MiB in memory{}",
           static_cast<double>(memory.params - memory.working_copy) / mib, working_copy,
           static_cast<double>(memory.grads) / mib, static_cast<double>(memory.optimizer) / mib,
           engine.optimizer().name(), memory.optimizer,
           static_cast<double>(memory.optimizer) /
               static_cast<double>(std::max<std::int64_t>(1, engine.model().param_count())),
           zero, static_cast<double>(memory.activations) / mib,
           static_cast<double>(memory.total()) / mib, offload);
}

// The start-up lines on the schedule and what it keeps between the passes.
void log_schedule(TrainingEngine& engine) {
  const plan::RunPlan& plan = engine.plan();
  const plan::ParallelConfig& p = plan.config.parallel;
  const schedule::ScheduleSpec& spec = plan.schedule;
  log_info(
      "schedule: {}, recompute {}, {} sub-batch(es) of {} sequences, {} micro-batch(es) "
      "per step; activations {:.1f} MiB{}",
      schedule::name(spec.kind), schedule::describe_recompute(spec), spec.sub_batches,
      plan.micro_batch() / spec.sub_batches, spec.micro_batches,
      static_cast<double>(engine.activation_bytes()) / (1 << 20),
      plan.settings.activation_compression.any()
          ? fmt::format(", kept in {} between the passes",
                        plan.settings.activation_compression.describe())
          : std::string());
  if (spec.partitioned_checkpoints) {
    std::size_t partitioned = 0;
    for (const schedule::Instruction& ins : engine.schedule_for(engine.local_batch(), true))
      partitioned += ins.op == schedule::Op::partition;
    log_info("partitioned activation checkpoints: {}",
             partitioned > 0
                 ? fmt::format("{} per step held as 1/degree slices between the passes and "
                               "gathered before their backward",
                               partitioned)
                 : std::string("none (no layer of this rank runs above degree 1, or no "
                               "checkpoint waits between the passes)"));
  }
  if (p.bucket_bytes > 0)
    log_info("communication: at most {} bytes per transport call (parallel.bucket_bytes)",
             p.bucket_bytes);
}

void log_start(TrainingEngine& engine, comm::Mesh& mesh, std::int64_t train_tokens,
               const ThreadChoice& threads, const std::vector<double>& stage_activations) {
  log_model_and_precision(engine, train_tokens, threads);
  log_layout(engine, mesh, stage_activations);
  log_memory(engine);
  log_schedule(engine);
}

// The figures of one step that go to the metrics file and the progress line.
struct StepFigures {
  StepRecord record;
  StepResult result;
  // With a pipeline: how long the first stage (world rank 0, which writes the metrics) waited
  // on Recvs this step (StepResult::bubble_seconds). The first stage starts each step at once,
  // its first action needing no message, so all of its waits fall inside its step time: the
  // pipeline's fill and drain as the first stage sees them, (P - 1)(F + B) for balanced 1F1B
  // stages. A later stage also waits for the first stage's pre-step work (data, metrics), which
  // is not a pipeline bubble; each rank's own waits are in the trace.
  std::optional<double> bubble_seconds;
  double tokens_per_s = 0;
  double model_flops = 0;  // per second
  // Model FLOPs over the peak of the precision in use (rank 0 only; unset where no peak is
  // known or the figure would exceed 1, which only a stale peak gives).
  std::optional<double> mfu;
  bool loss_scaling = false;  // fp16: the scale and skipped steps are reported
  bool context_parallel = false;  // cp > 1: the cp transfers' times are reported
  planner::MemoryFigures memory;  // this rank's, as the start-up line gives them
  // The step ended in a state a checkpoint holds whole (not so for a step of 2bw or of local
  // SGD that did not drain or average).
  bool checkpointable = true;
  // A checkpoint saved right before this step held the loop up this long (seconds), of which
  // `checkpoint_wait_s` waiting for the asynchronous save before it.
  std::optional<double> checkpoint_s, checkpoint_wait_s;
  // At the end of each window of log.every steps of a multi-rank run: every rank's compute.
  std::optional<StragglerWindow> stragglers;
};

void write_metrics(std::optional<LineFile>& metrics, const StepFigures& f, std::int64_t tokens) {
  if (!metrics) return;
  nlohmann::json line = {{"step", f.record.step},
                         {"loss", f.record.loss},
                         {"lr", f.record.lr},
                         {"grad_norm", f.record.grad_norm},
                         {"step_time_s", f.record.step_time_s},
                         {"tokens_per_s", f.tokens_per_s},
                         {"model_tflops", f.model_flops / 1e12},
                         {"compute_s", f.result.compute_seconds},
                         {"exposed_comm_s", f.result.exposed_comm_seconds},
                         {"comm_s", f.result.comm_seconds},
                         {"param_bytes", f.memory.params},
                         {"grad_bytes", f.memory.grads},
                         {"optimizer_bytes", f.memory.optimizer},
                         {"peak_activation_bytes", f.result.peak_activation_bytes},
                         {"peak_mem_bytes", peak_resident_bytes()},
                         {"time", unix_time_now()},
                         {"tokens", tokens}};
  if (f.mfu) line["mfu"] = *f.mfu;
  if (f.bubble_seconds) line["bubble_s"] = *f.bubble_seconds;
  if (f.checkpoint_s) line["checkpoint_s"] = *f.checkpoint_s;
  if (f.checkpoint_wait_s) line["checkpoint_wait_s"] = *f.checkpoint_wait_s;
  if (f.stragglers) {
    line["slowest_rank"] = f.stragglers->slowest_rank;
    line["straggler_ratio"] = f.stragglers->straggler_ratio;
    line["rank_compute_s"] = f.stragglers->compute_s;
    line["rank_exposed_comm_s"] = f.stragglers->exposed_comm_s;
  }
  if (f.result.replica_divergence) line["replica_divergence"] = *f.result.replica_divergence;
  if (f.loss_scaling) {
    line["loss_scale"] = f.record.loss_scale;
    line["skipped_steps"] = f.record.skipped_steps;
  }
  if (f.record.val_loss) line["val_loss"] = *f.record.val_loss;
  if (f.context_parallel) {
    line["exposed_cp_s"] = f.result.exposed_cp_seconds;
    line["cp_s"] = f.result.cp_seconds;
  }
  if (!f.result.moe.layers.empty()) {
    line["moe_loss"] = f.result.moe.loss;
    line["exposed_a2a_s"] = f.result.exposed_all_to_all_seconds;
    line["a2a_s"] = f.result.all_to_all_seconds;
    line["moe_dropped_fraction"] = f.result.moe.dropped_fraction;
    nlohmann::json layers = nlohmann::json::array();
    for (const MoeLayerReport& r : f.result.moe.layers)
      layers.push_back({{"layer", r.layer},
                        {"tokens_per_expert_min", r.tokens_per_expert_min},
                        {"tokens_per_expert_max", r.tokens_per_expert_max},
                        {"dropped_fraction", r.dropped_fraction},
                        {"aux_loss", r.aux_loss},
                        {"z_loss", r.z_loss}});
    line["moe"] = std::move(layers);
  }
  metrics->append(line.dump());
}

// The record of a fresh run before its first step.
void write_start_metrics(std::optional<LineFile>& metrics, std::optional<double> val_loss) {
  if (!metrics) return;
  nlohmann::json line = {{"step", 0}, {"tokens", 0}, {"time", unix_time_now()}};
  if (val_loss) line["val_loss"] = *val_loss;
  metrics->append(line.dump());
}

std::string progress_text(const StepFigures& f, std::int64_t steps, double eta_seconds,
                          bool distributed) {
  std::string line = fmt::format(
      "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {} tok/s{} | ETA {}",
      f.record.step, steps, f.record.loss, f.record.lr, f.record.grad_norm,
      format_rate(f.tokens_per_s),
      f.mfu ? fmt::format(" | mfu {:.0f}%", 100.0 * *f.mfu) : std::string(),
      format_duration(eta_seconds));
  if (distributed)
    line += fmt::format(" | waited on comm {:.0f}%",
                        100.0 * f.result.exposed_comm_seconds / f.record.step_time_s);
  if (f.bubble_seconds)
    line += fmt::format(" | bubble {:.0f}%", 100.0 * *f.bubble_seconds / f.record.step_time_s);
  if (f.loss_scaling)
    line += fmt::format(" | scale {:g} | skipped {}{}", f.record.loss_scale,
                        f.record.skipped_steps, f.record.skipped ? " (this step)" : "");
  if (!f.result.moe.layers.empty())
    line += fmt::format(" | dropped {:.1f}%", 100.0 * f.result.moe.dropped_fraction);
  if (f.record.val_loss) line += fmt::format(" | val_loss {:.4f}", *f.record.val_loss);
  return line;
}

// Records the instructions of the first log.trace_steps steps and writes them, every rank's,
// into one Chrome trace.
class TraceSession {
 public:
  TraceSession(const plan::RunConfig& config, comm::Mesh& mesh, TrainingEngine& engine)
      : config_(config), mesh_(mesh), engine_(engine) {
    if (config.log.trace.empty()) return;
    // Every rank records; rank 0's clock origin is everyone's, so the lanes line up.
    std::int64_t origin_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    mesh.world().broadcast(Tensor::of(&origin_ns, {1}), 0);
    trace_.emplace(std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(origin_ns)));
    if (mesh.pp_size() > 1) trace_->set_pipeline_stage(mesh.pp_rank());
    engine.set_listener(&*trace_);
  }
  // After `done` steps of this run (`last`: the run's last step).
  void after_step(std::int64_t done, bool last, ProgressLine* progress) {
    if (!trace_ || (done != config_.log.trace_steps && !last)) return;
    engine_.set_listener(nullptr);
    write_trace(*trace_, mesh_, config_.log.trace);
    if (progress)
      progress->log(LogLevel::info,
                    fmt::format("wrote trace of {} step(s) to {}", done, config_.log.trace));
    trace_.reset();
  }

 private:
  const plan::RunConfig& config_;
  comm::Mesh& mesh_;
  TrainingEngine& engine_;
  std::optional<runtime::TraceRecorder> trace_;
};

void check_mesh(const plan::RunConfig& config, const comm::Mesh& mesh) {
  OASES_CHECK(mesh.tp_size() == config.parallel.tp && mesh.dp_size() == config.parallel.dp &&
                  mesh.pp_size() == config.parallel.pp,
              "the process mesh (tp={}, dp={}, pp={}) does not match parallel.tp={}, dp={}, pp={}",
              mesh.tp_size(), mesh.dp_size(), mesh.pp_size(), config.parallel.tp,
              config.parallel.dp, config.parallel.pp);
}

// The rate the ETA extrapolates: wall time per step over the last kWindow steps, so that a
// slow start (caches, a busy moment) stops weighing on it once the run has moved past it.
class RecentStepRate {
 public:
  static constexpr std::size_t kWindow = 10;
  // `at`: seconds since the loop started.
  void step_ended(double at) {
    ends_.push_back(at);
    if (ends_.size() > kWindow + 1) ends_.pop_front();
  }
  double seconds_per_step() const {
    if (ends_.size() < 2) return ends_.empty() ? 0 : ends_.front();
    return (ends_.back() - ends_.front()) / static_cast<double>(ends_.size() - 1);
  }

 private:
  std::deque<double> ends_{0.0};  // the loop's start, then each step's end
};

// The training loop and what each step reports; one object per run.
class Run {
 public:
  // `peaks`: rank 0's (the others report no MFU); `precision_choice`: how train.precision =
  // "auto" was resolved, for the start-up lines (empty when it was not "auto").
  Run(const plan::RunPlan& plan, const TrainOptions& options, comm::Mesh& mesh,
      std::optional<std::string> resume_from, ThreadChoice threads,
      std::optional<HostPeaks> peaks, std::string precision_choice)
      : stop_signals_(plan.settings.save_signals.empty()
                          ? nullptr
                          : std::make_unique<StopSignals>(plan.settings.save_signals)),
        config_(plan.config),
        options_(options),
        mesh_(mesh),
        resume_from_(std::move(resume_from)),
        threads_(std::move(threads)),
        data_(load_data(plan.config)),
        engine_(plan, parallel_groups(mesh)),
        peaks_(std::move(peaks)),
        precision_choice_(std::move(precision_choice)) {
    if (options.progress) progress_.emplace(ProgressLine::mode_for_stderr());
  }

  TrainSummary run() {
    const auto& t = config_.train;
    check_memory_limit(config_, engine_);
    memory_ = engine_.memory_figures();
    TrainSummary summary;
    ProgressLine* progress = progress_ ? &*progress_ : nullptr;
    summary.start_step =
        restore(config_, options_, resume_from_, data_->train_shard, engine_, progress);
    const bool leader = mesh_.world_rank() == 0;
    if (leader) find_peak();
    std::optional<LineFile> metrics = open_metrics(config_, leader, summary.start_step);
    if (leader)
      write_run_description(engine_, mesh_, summary.start_step, threads_.threads, peak_json());
    const std::vector<double> stage_activations = stage_activation_bytes(engine_, mesh_);
    if (options_.progress) {
      if (!precision_choice_.empty()) log_info("{}", precision_choice_);
      log_start(engine_, mesh_, data_->train_shard.size(), threads_, stage_activations);
      log_peak();
    }
    if (summary.start_step == 0) {
      if (data_->val_batches) {
        summary.initial_val_loss = validation_loss(engine_, *data_->val_batches, t.eval_steps);
        if (progress)
          progress->keep(fmt::format("step {:>5} | val_loss {:.4f}", 0, *summary.initial_val_loss));
      }
      write_start_metrics(metrics, summary.initial_val_loss);
    }
    TraceSession trace(config_, mesh_, engine_);
    if (mesh_.world_size() > 1)
      stragglers_.emplace(mesh_.world(), this_host_name(), t.straggler_warn_ratio);
    const Stopwatch run_clock;
    RecentStepRate recent;
    const std::int64_t tokens_per_step = t.global_batch * config_.model.seq_len;
    bool stop_after_this_step = false;
    for (std::int64_t step = summary.start_step; step < t.steps; ++step) {
      StepFigures f = train_one(step, stop_after_this_step);
      const bool last = step + 1 == t.steps;
      f.checkpoint_s = std::exchange(checkpoint_stall_s_, std::nullopt);
      f.checkpoint_wait_s = std::exchange(checkpoint_wait_s_, std::nullopt);
      if (stragglers_) {
        f.stragglers = stragglers_->after_step(f.result.compute_seconds,
                                               f.result.exposed_comm_seconds,
                                               (step + 1) % config_.log.every == 0 || last);
        if (f.stragglers && leader)
          for (const std::string& warning : f.stragglers->warnings) {
            if (progress)
              progress->log(LogLevel::warning, warning);
            else
              log_warning("{}", warning);  // said even with --quiet
          }
      }
      if (f.record.val_loss) summary.final_val_loss = f.record.val_loss;
      write_metrics(metrics, f, (step + 1) * tokens_per_step);
      recent.step_ended(run_clock.seconds());
      if (progress && ((step + 1) % config_.log.every == 0 || last || f.record.val_loss)) {
        const std::string line = progress_text(
            f, t.steps, recent.seconds_per_step() * static_cast<double>(t.steps - step - 1),
            mesh_.world_size() > 1);
        // Validation results and the last step stay on screen; other steps are redrawn.
        if (last || f.record.val_loss)
          progress->keep(line);
        else
          progress->update(line);
      }
      summary.steps.push_back(f.record);
      trace.after_step(step + 1 - summary.start_step, last, progress);
      poll_saving();
      std::optional<std::string> saved = checkpoint_after(step + 1, last);
      if (saved) summary.last_checkpoint = *saved;
      if (!last && !stop_after_this_step) summary.stopped_by_signal = agree_on_stop();
      if (summary.stopped_by_signal == 0) continue;
      // A stop: once this step's state is whole, save it (unless just saved) and end.
      if (!f.checkpointable) {
        stop_after_this_step = true;
        continue;
      }
      if (!saved && !config_.checkpoint.dir.empty()) summary.last_checkpoint = save(step + 1);
      say_stopped(summary, step + 1);
      break;
    }
    finish_saving();
    if (stop_signals_ && summary.stopped_by_signal == 0 && stop_signals_->received() != 0 && leader)
      log_warning("received {} during the last step; the run completed",
                  signal_name(stop_signals_->received()));
    return summary;
  }

 private:
  // The first stop signal any rank received, agreed by every rank (0: none). One 8-byte
  // all-reduce over the world per step.
  int agree_on_stop() {
    if (!stop_signals_) return 0;
    std::int64_t received = stop_signals_->received();
    if (mesh_.world_size() > 1) {
      const comm::IssuerLabel label(mesh_.world(), "stop agreement (end of step)");
      mesh_.world().all_reduce(Tensor::of(&received, {1}), comm::ReduceOp::max);
    }
    return static_cast<int>(received);
  }

  // The line that says why the run ended early and where it saved; said even with --quiet.
  void say_stopped(const TrainSummary& summary, std::int64_t done) const {
    if (mesh_.world_rank() != 0) return;
    const std::string signal = signal_name(summary.stopped_by_signal);
    const int status = 128 + summary.stopped_by_signal;
    if (config_.checkpoint.dir.empty()) {
      log_warning("stopped by {} after step {} of {}; checkpoint.dir is not set, so nothing was "
                  "saved (exit status {})",
                  signal, done, config_.train.steps, status);
      return;
    }
    log_warning("stopped by {} after step {} of {}: saved checkpoint {}; {} (exit status {})",
                signal, done, config_.train.steps, summary.last_checkpoint,
                config_.checkpoint.resume
                    ? "the same command resumes from it"
                    : "run again with --set checkpoint.resume=true to resume from it",
                status);
  }

  StepFigures train_one(std::int64_t step, bool force_drain) {
    const auto& t = config_.train;
    const Stopwatch clock;
    data_->train_batches->training(step, engine_.first_local_sample(), engine_.local_batch(), batch_);
    StepFigures f;
    // 2bw: the pipeline drains only where something else needs the weights or the pipeline
    // group next (evaluation, a checkpoint, the end of the run); results are the same either way.
    const bool last_step = step + 1 == t.steps;
    const auto& c = config_.checkpoint;
    const bool drain = force_drain || last_step ||
                       (data_->val_batches && (step + 1) % t.eval_every == 0) ||
                       (!c.dir.empty() && c.every > 0 && (step + 1) % c.every == 0);
    f.result = engine_.train_step(step, batch_.inputs.data(), batch_.targets.data(), drain);
    const plan::RunPlan& plan = engine_.plan();
    f.checkpointable = drain || !(plan.pipeline.two_bw() || plan.local_sgd);
    OASES_CHECK(std::isfinite(f.result.loss),
                "training diverged: the loss is {} at step {}; lower train.lr (now {}); the "
                "step's checkpoint is not written",
                f.result.loss, step + 1, t.lr);
    OASES_CHECK(t.max_loss == 0 || f.result.loss <= t.max_loss,
                "the loss {} at step {} exceeds train.max_loss = {}: the run stops before "
                "writing this step's checkpoint; lower train.lr (now {}) or raise the limit",
                f.result.loss, step + 1, t.max_loss, t.lr);
    if (mesh_.pp_size() > 1) f.bubble_seconds = f.result.bubble_seconds;
    f.record = {step + 1, f.result.loss, engine_.learning_rate(step), f.result.grad_norm,
                clock.seconds(), f.result.loss_scale, f.result.skipped,
                engine_.loss_scaler().skipped_steps(), std::nullopt};
    f.loss_scaling = engine_.plan().loss_scaling.kind != plan::LossScalingPlan::Kind::none;
    f.context_parallel = mesh_.cp_size() > 1;
    f.memory = memory_;
    const bool last = step + 1 == t.steps;
    if (data_->val_batches && ((step + 1) % t.eval_every == 0 || last))
      f.record.val_loss = validation_loss(engine_, *data_->val_batches, t.eval_steps);
    const double tokens = static_cast<double>(t.global_batch * config_.model.seq_len);
    f.tokens_per_s = tokens / f.record.step_time_s;
    f.model_flops = f.tokens_per_s * config_.model.training_flops_per_token();
    f.mfu = mfu_of(f.model_flops);
    return f;
  }

  // rank 0: the peak MFU divides by, per rank: log.peak_tflops when given, else this host's
  // measured peak of the products' precision and path (train/peaks.h).
  void find_peak() {
    if (config_.log.peak_tflops > 0) {
      peak_per_rank_ = config_.log.peak_tflops * 1e12;
      return;
    }
    if (!peaks_) return;
    const DType compute = engine_.plan().dtypes.compute;
    host_peak_ = peaks_->get(compute, engine_.gemm16().paths.for_dtype(compute));
    peak_per_rank_ = host_peak_->record.peak.flops_per_s;
  }

  nlohmann::json peak_json() const {
    if (config_.log.peak_tflops > 0)
      return {{"flops_per_s", peak_per_rank_}, {"source", "log.peak_tflops"}};
    if (!host_peak_) return nullptr;
    const PeakRecord& r = host_peak_->record;
    return {{"flops_per_s", r.peak.flops_per_s}, {"precision", r.key.precision},
            {"path", r.key.path},               {"threads", r.key.threads},
            {"measured_at", r.measured_at},     {"loaded", r.peak.loaded},
            {"source", peaks_->file().path().string()}};
  }

  // The start-up lines on the peak, and, for an fp32 run on a CPU whose bf16 products are
  // well faster, the setting that would use them.
  void log_peak() {
    const int ranks = mesh_.world_size();
    const std::string per = ranks > 1 ? fmt::format("; MFU = model FLOPs / ({} ranks x this)", ranks)
                                      : std::string("; MFU = model FLOPs / this");
    if (config_.log.peak_tflops > 0)
      log_info("peak: {:.1f} GFLOP/s per rank (log.peak_tflops){}", peak_per_rank_ / 1e9, per);
    else if (host_peak_)
      log_info("peak: {}{}", describe_peak(*host_peak_, peaks_->file().path()), per);
    if (!peaks_ || engine_.plan().dtypes.compute != DType::f32) return;
    const std::optional<kernels::Gemm16Path> pinned = engine_.plan().settings.gemm16_path;
    const Bf16Comparison c = compare_bf16_with_fp32(*peaks_, pinned);
    if (c.bf16_pays())
      log_info("bf16: this CPU's bf16 products are {:.2f}x as fast as its fp32 ones ({:.1f} "
               "against {:.1f} GFLOP/s, by {}): train.precision = \"bf16\" (or \"auto\") "
               "would train faster",
               c.speedup, c.bf16->record.peak.flops_per_s / 1e9,
               c.fp32->record.peak.flops_per_s / 1e9, c.bf16->record.key.path);
  }

  void warn(const std::string& text) {
    if (progress_)
      progress_->log(LogLevel::warning, text);
    else
      log_warning("{}", text);
  }

  // Model FLOPs per second over the run's peak; nullopt where no peak is known (ranks other
  // than 0) or the ratio exceeds 1. A ratio above 1 means the peak is stale (measured while
  // the machine was busy, or under other BLAS kernels): the first time, it is measured again
  // and the record replaced.
  std::optional<double> mfu_of(double model_flops) {
    if (peak_per_rank_ <= 0) return std::nullopt;
    const double ranks = static_cast<double>(mesh_.world_size());
    double mfu = model_flops / (ranks * peak_per_rank_);
    if (mfu <= 1) return mfu;
    if (!host_peak_) {
      if (!peak_warned_)
        warn(fmt::format("log.peak_tflops = {} is below what the run achieves ({:.2f} TFLOP/s "
                         "per rank): MFU is not reported; raise it or set 0 to measure",
                         config_.log.peak_tflops, model_flops / ranks / 1e12));
      peak_warned_ = true;
      return std::nullopt;
    }
    if (peak_remeasured_) return std::nullopt;
    peak_remeasured_ = true;
    warn(fmt::format("MFU came out at {:.0f}%: the peak of {} is stale; measuring it again",
                     100 * mfu, describe_peak(*host_peak_, peaks_->file().path())));
    const PeakKey& key = host_peak_->record.key;
    const DType compute = engine_.plan().dtypes.compute;
    host_peak_ = peaks_->get(compute, engine_.gemm16().paths.for_dtype(compute), true);
    OASES_ASSERT(host_peak_->record.key == key, "the peak's key changed within a run");
    peak_per_rank_ = host_peak_->record.peak.flops_per_s;
    warn(fmt::format("peak: {}", describe_peak(*host_peak_, peaks_->file().path())));
    mfu = model_flops / (ranks * peak_per_rank_);
    return mfu <= 1 ? std::optional(mfu) : std::nullopt;
  }

  std::optional<std::string> checkpoint_after(std::int64_t done, bool last) {
    const auto& c = config_.checkpoint;
    if (c.dir.empty() || !(last || (c.every > 0 && done % c.every == 0))) return std::nullopt;
    return save(done);
  }

  // What a save says about cleaning and early pruning: rare, and it changes what is on disk,
  // so said even with --quiet.
  void say_about_checkpoint(const std::string& what) {
    if (progress_)
      progress_->log(LogLevel::warning, "checkpoint: " + what);
    else
      log_warning("checkpoint: {}", what);
  }

  void say_saved(const FinishedSave& finished, bool in_background) {
    for (const std::string& message : finished.messages) say_about_checkpoint(message);
    if (progress_)
      progress_->log(LogLevel::info,
                     in_background ? fmt::format("saved checkpoint {} (written in {:.2f} s in "
                                                 "the background)",
                                                 finished.folder, finished.seconds)
                                   : fmt::format("saved checkpoint {}", finished.folder));
  }

  // Saves step `done` (every rank calls); returns the checkpoint's folder. With
  // checkpoint.async the writer rank hands the staged files to the writer thread and the
  // folder is complete once that save is reported.
  std::string save(std::int64_t done) {
    const auto& c = config_.checkpoint;
    TrainingState state;
    state.step = done;
    state.data_position = done;
    state.seed = static_cast<std::uint64_t>(config_.train.seed);
    state.data_tokens = data_->train_shard.size();
    if (engine_.plan().loss_scaling.kind != plan::LossScalingPlan::Kind::none)
      state.loss_scale = engine_.loss_scaler().state();
    const bool leader = mesh_.world_rank() == 0;
    const Stopwatch stall;
    StagingMemory* staging = nullptr;
    if (c.async && leader) {
      // One save in flight: the previous one ends before its staging memory is reused.
      const Stopwatch wait;
      const std::optional<FinishedSave> before = writer_.finish();
      const double waited = wait.seconds();
      if (before) say_saved(*before, true);
      if (before && waited > 0.001) {
        checkpoint_wait_s_ = waited;
        if (progress_)
          progress_->log(LogLevel::info,
                         fmt::format("checkpoint: waited {:.2f} s for the save of {} before "
                                     "staging step_{}",
                                     waited, before->folder, done));
      }
      staging = &writer_.staging();
      staging->rewind();
    }
    std::optional<StagedCheckpoint> staged;
    engine_.save_whole_optimizer_state([&](optim::Optimizer& whole) {
      staged = stage_checkpoint(
          c.dir, engine_.plan(), engine_.model(), whole, state,
          data_->tokenizer ? data_->tokenizer->files() : std::vector<data::TokenizerFile>(), c.keep,
          mesh_.tp_group(), mesh_.pp_group(), leader, engine_.stashed_weights(),
          mesh_.ep_size() > 1 ? &mesh_.ep_group() : nullptr, staging);
    });
    const std::string folder =
        (std::filesystem::path(c.dir) / ("step_" + std::to_string(done))).string();
    if (c.async) {
      if (staged) writer_.start(std::move(*staged));
    } else {
      if (staged) {
        FinishedSave finished;
        finished.folder = staged->write([&](const std::string& what) {
          finished.messages.push_back(what);
        });
        say_saved(finished, false);
      }
      mesh_.world().barrier();  // the checkpoint exists for every rank once this returns
    }
    checkpoint_stall_s_ = stall.seconds();
    return folder;
  }

  // Reports an asynchronous save that has ended, without waiting for one that has not.
  void poll_saving() {
    if (auto finished = writer_.poll()) say_saved(*finished, true);
  }

  // Waits for the asynchronous save in flight; every rank returns once it is complete.
  void finish_saving() {
    if (!config_.checkpoint.async || config_.checkpoint.dir.empty()) return;
    if (auto finished = writer_.finish()) say_saved(*finished, true);
    mesh_.world().barrier();
  }

  std::unique_ptr<StopSignals> stop_signals_;  // first: caught from the start of the run
  const plan::RunConfig& config_;
  const TrainOptions& options_;
  comm::Mesh& mesh_;
  std::optional<std::string> resume_from_;
  ThreadChoice threads_;
  std::optional<ProgressLine> progress_;
  std::unique_ptr<RunData> data_;
  TrainingEngine engine_;
  planner::MemoryFigures memory_;  // the engine's, once its training schedule exists
  Batch batch_;
  std::optional<HostPeaks> peaks_;       // rank 0's
  std::string precision_choice_;
  std::optional<HostPeak> host_peak_;    // the peak in use, when measured (not log.peak_tflops)
  double peak_per_rank_ = 0;             // FLOP/s; 0: no MFU (ranks other than 0)
  bool peak_remeasured_ = false, peak_warned_ = false;
  CheckpointWriter writer_;  // checkpoint.async: the writer rank's save in flight
  std::optional<StragglerMonitor> stragglers_;  // runs of more than one rank
  std::optional<double> checkpoint_stall_s_, checkpoint_wait_s_;  // of the latest save
};

}  // namespace

ParallelGroups parallel_groups(comm::Mesh& mesh) {
  return ParallelGroups{
      &mesh.tp_group(),
      &mesh.dp_group(),
      [&mesh](int span, int stride) -> comm::Communicator& {
        return mesh.tp_subgroup(span, stride);
      },
      [&mesh](int degree) -> comm::Communicator& { return mesh.tp_replica_group(degree); },
      &mesh.pp_group(),
      mesh.ep_size() > 1 ? &mesh.ep_group() : nullptr,
      [&mesh](int degree) -> comm::Communicator& { return mesh.expert_replica_group(degree); },
      mesh.cp_size() > 1 ? &mesh.cp_group() : nullptr};
}

TrainSummary run_training(const plan::RunConfig& config, const TrainOptions& options) {
  comm::Mesh mesh = comm::Mesh::single_process();
  return run_training(config, options, mesh);
}

TrainSummary run_training(const plan::RunConfig& requested_config, const TrainOptions& run_options,
                          comm::Mesh& mesh) {
  requested_config.validate();
  check_mesh(requested_config, mesh);
  TrainOptions options = run_options;
  const bool leader = mesh.world_rank() == 0;
  options.progress = options.progress && leader;

  const comm::HostPlacement mine = options.placement.value_or(comm::this_process_placement());
  const ThreadChoice threads = use_threads(requested_config.train.threads, mine,
                                           options.most_crowded_placement.value_or(mine));
  // Said even with --quiet: a run this slow should never go unexplained.
  if (leader && !threads.warning.empty()) log_warning("{}", threads.warning);

  // Before anything is read from or written to the run's folders.
  const RunOutputs outputs = leader ? claim_run_outputs(requested_config) : RunOutputs{};
  const std::optional<ResumePoint> resume = find_resume_point(requested_config);
  plan::RunConfig config =
      resume ? resolve_lr_schedule(requested_config, resume->stored, resume->folder, resume->step,
                                   options.lr_schedule, leader)
             : requested_config;
  std::optional<HostPeaks> peaks;
  if (leader) peaks.emplace(host_peaks_from_environment());
  // train.precision = "auto": a resumed run keeps the choice of the run it continues.
  std::string precision_choice;
  if (plan::parse_settings(config).precision == plan::Precision::automatic) {
    if (resume && plan::parse_settings(resume->stored).precision != plan::Precision::automatic) {
      config.train.precision = resume->stored.train.precision;
      precision_choice = fmt::format("train.precision = \"auto\": {}, as the run it resumes "
                                     "chose (checkpoint {})",
                                     config.train.precision, resume->folder);
    } else {
      config = resolve_auto_precision(config, peaks ? &*peaks : nullptr, mesh.world(),
                                      &precision_choice);
    }
    config.validate();  // the settings that depend on the precision, now that it is known
  }
  // A resumed mixed-precision run multiplies as the run it continues did, so that its results
  // repeat bit for bit (unless the config pins a path).
  if (resume && !plan::parse_settings(config).gemm16_path &&
      plan::parse_settings(resume->stored).precision == plan::parse_settings(config).precision)
    config.train.gemm16_path = resume->stored.train.gemm16_path;
  return Run(check_host_memory(plan::make_run_plan(config, mesh.world_rank()),
                               mine.ranks_on_host),
             options, mesh, resume ? std::optional(resume->folder) : std::nullopt, threads,
             std::move(peaks), std::move(precision_choice))
      .run();
}

}  // namespace oases::train
