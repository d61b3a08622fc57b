#include "train/trainer.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/line_file.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/token_shard.h"
#include "io/checkpoint_dir.h"
#include "kernels/cpu/peak_flops.h"
#include "runtime/trace.h"
#include "train/batches.h"
#include "train/checkpoint.h"
#include "train/engine.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstring>
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
data::TokenShard load_shard_for(const RunConfig& config, const std::string& split,
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

std::unique_ptr<RunData> load_data(const RunConfig& config) {
  const auto& t = config.train;
  const std::int64_t seq = config.model.seq_len;
  const auto seed = static_cast<std::uint64_t>(t.seed);
  auto d = std::make_unique<RunData>();
  d->tokenizer = load_run_tokenizer(config);
  d->train_shard = load_shard_for(config, "train", d->tokenizer.get());
  d->train_loader.emplace(d->train_shard, seq, t.global_batch, config.data.shuffle, seed);
  d->train_batches.emplace(config, *d->train_loader, d->train_shard.vocab_size);
  if (t.eval_every > 0) {
    d->val_shard = load_shard_for(config, "val", d->tokenizer.get());
    d->val_loader.emplace(*d->val_shard, seq, t.global_batch, false, seed);
    d->val_batches.emplace(config, *d->val_loader, d->val_shard->vocab_size);
  }
  return d;
}

// Validation loss over eval_steps global batches of the validation shard; each data-parallel
// rank evaluates its share of every batch.
double validation_loss(TrainingEngine& engine, const BatchMaker& batches, std::int64_t count) {
  Batch b;
  double total = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    batches.validation(i, engine.first_local_sample(), engine.local_batch(), b);
    total += engine.evaluate(b.inputs.data(), b.targets.data(), engine.local_batch());
  }
  return total / static_cast<double>(count);
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

ParallelGroups groups_of(comm::Mesh& mesh) {
  return ParallelGroups{&mesh.tp_group(), &mesh.dp_group(),
                        [&mesh](int span, int stride) -> comm::Communicator& {
                          return mesh.tp_subgroup(span, stride);
                        },
                        [&mesh](int degree) -> comm::Communicator& {
                          return mesh.tp_replica_group(degree);
                        }};
}

void check_memory_limit(const RunConfig& config, TrainingEngine& engine) {
  if (config.parallel.memory_limit <= 0) return;
  const auto needed = static_cast<std::int64_t>(engine.memory_bytes());
  OASES_CHECK(needed <= config.parallel.memory_limit,
              "parallel.memory_limit = {} bytes is too small: this model needs {} bytes "
              "(parameters, gradients, optimizer state and activations for micro_batch = {}); "
              "raise the limit or lower train.micro_batch or the model size",
              config.parallel.memory_limit, needed, config.train.micro_batch);
}

// Resumes from the newest checkpoint (checkpoint.resume) or initialises from --init-from;
// returns the first step to run.
std::int64_t restore(const RunConfig& config, const TrainOptions& options,
                     const data::TokenShard& train_shard, TrainingEngine& engine) {
  std::int64_t start_step = 0;
  if (config.checkpoint.resume) {
    if (auto latest = latest_checkpoint(config.checkpoint.dir)) {
      io::verify_checkpoint_files(*latest);
      load_model_weights((std::filesystem::path(*latest) / io::kModelFile).string(),
                         engine.model().layout(), engine.model().params());
      const TrainingState state =
          load_optimizer_state(*latest, engine.model().layout(), engine.optimizer());
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
      if (options.progress) log_info("resumed from {} (step {})", *latest, start_step);
    } else if (options.progress) {
      log_info("checkpoint.resume: no complete checkpoint in '{}', starting from step 0",
               config.checkpoint.dir);
    }
  }
  if (start_step == 0 && !options.init_from.empty()) {
    load_model_weights(options.init_from, engine.model().layout(), engine.model().params());
    if (options.progress) log_info("initialised weights from {}", options.init_from);
  }
  return start_step;
}

// The metrics file of the run: a fresh run starts it empty; a resumed run keeps the records of
// the steps up to the one it resumes from (a run that went further before stopping wrote records
// the resumed run will write again).
std::optional<LineFile> open_metrics(const RunConfig& config, bool leader,
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

void log_start(const RunConfig& config, TrainingEngine& engine, comm::Mesh& mesh,
               std::int64_t train_tokens) {
  const auto& t = config.train;
  const auto& m = config.model;
  log_info("model: {} {} layers, hidden {}, heads {}, seq {}, vocab {}: {:.2f}M parameters, {}",
           m.arch, m.layers, m.hidden, m.heads, m.seq_len, m.vocab_size,
           static_cast<double>(m.parameter_count()) / 1e6, t.precision);
  log_info("data: {} training tokens, global batch {} x {} tokens, {} steps, {} threads",
           train_tokens, t.global_batch, m.seq_len, t.steps, omp_get_max_threads());
  if (mesh.world_size() > 1)
    log_info("parallel: {} ranks = tp {} x dp {} x pp {}", mesh.world_size(), mesh.tp_size(),
             mesh.dp_size(), mesh.pp_size());
  if (config.parallel.plan != "uniform") {
    std::string degrees;
    for (std::int64_t l = 0; l < m.layers; ++l)
      degrees += fmt::format("{}{}", l ? " " : "", engine.model().layer_degree(l));
    log_info("plan: tensor-parallel degree per layer {} (parallel.plan = \"{}\"); memory {:.1f} "
             "MiB per rank",
             degrees, config.parallel.plan,
             static_cast<double>(engine.memory_bytes()) / (1 << 20));
  }
  const double mib = 1 << 20;
  const double weights = static_cast<double>(engine.model().param_count()) *
                         static_cast<double>(dtype_size(engine.model().dtype())) / mib;
  log_info("memory per rank: parameters {:.1f} MiB, gradients {:.1f} MiB, optimizer state {:.1f} "
           "MiB ({}, {} bytes per parameter), activations {:.1f} MiB",
           weights, weights, static_cast<double>(engine.optimizer().state_bytes()) / mib,
           engine.optimizer().name(), engine.optimizer().state_bytes_per_element(),
           static_cast<double>(engine.activation_bytes()) / mib);
  const schedule::ScheduleSpec& spec = engine.schedule_spec();
  log_info("schedule: {}, recompute {}, {} sub-batch(es) of {} sequences, {} micro-batch(es) "
           "per step; activations {:.1f} MiB",
           schedule::name(spec.kind), schedule::name(spec.recompute), spec.sub_batches,
           t.micro_batch / spec.sub_batches, spec.micro_batches,
           static_cast<double>(engine.activation_bytes()) / (1 << 20));
}

// The figures of one step that go to the metrics file and the progress line.
struct StepFigures {
  StepRecord record;
  StepResult result;
  double tokens_per_s = 0;
  double model_flops = 0;  // per second
  double mfu = 0;
};

void write_metrics(std::optional<LineFile>& metrics, const StepFigures& f) {
  if (!metrics) return;
  nlohmann::json line = {{"step", f.record.step},
                         {"loss", f.record.loss},
                         {"lr", f.record.lr},
                         {"grad_norm", f.record.grad_norm},
                         {"step_time_s", f.record.step_time_s},
                         {"tokens_per_s", f.tokens_per_s},
                         {"model_tflops", f.model_flops / 1e12},
                         {"mfu", f.mfu},
                         {"compute_s", f.result.compute_seconds},
                         {"exposed_comm_s", f.result.exposed_comm_seconds},
                         {"comm_s", f.result.comm_seconds},
                         {"peak_activation_bytes", f.result.peak_activation_bytes},
                         {"peak_mem_bytes", peak_resident_bytes()}};
  if (f.record.val_loss) line["val_loss"] = *f.record.val_loss;
  metrics->append(line.dump());
}

void print_progress(const StepFigures& f, std::int64_t steps, double eta_seconds, bool distributed) {
  std::string line = fmt::format(
      "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {} tok/s | mfu {:.0f}% | ETA {}",
      f.record.step, steps, f.record.loss, f.record.lr, f.record.grad_norm,
      format_rate(f.tokens_per_s), 100.0 * f.mfu, format_duration(eta_seconds));
  if (distributed)
    line += fmt::format(" | waited on comm {:.0f}%",
                        100.0 * f.result.exposed_comm_seconds / f.record.step_time_s);
  if (f.record.val_loss) line += fmt::format(" | val_loss {:.4f}", *f.record.val_loss);
  log_info("{}", line);
}

// Records the instructions of the first log.trace_steps steps and writes them, every rank's,
// into one Chrome trace.
class TraceSession {
 public:
  TraceSession(const RunConfig& config, comm::Mesh& mesh, TrainingEngine& engine)
      : config_(config), mesh_(mesh), engine_(engine) {
    if (config.log.trace.empty()) return;
    // Every rank records; rank 0's clock origin is everyone's, so the lanes line up.
    std::int64_t origin_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    mesh.world().broadcast(Tensor::of(&origin_ns, {1}), 0);
    trace_.emplace(std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(origin_ns)));
    engine.set_listener(&*trace_);
  }
  // After `done` steps of this run (`last`: the run's last step).
  void after_step(std::int64_t done, bool last, bool progress) {
    if (!trace_ || (done != config_.log.trace_steps && !last)) return;
    engine_.set_listener(nullptr);
    write_trace(*trace_, mesh_, config_.log.trace);
    if (progress) log_info("wrote trace of {} step(s) to {}", done, config_.log.trace);
    trace_.reset();
  }

 private:
  const RunConfig& config_;
  comm::Mesh& mesh_;
  TrainingEngine& engine_;
  std::optional<runtime::TraceRecorder> trace_;
};

void check_mesh(const RunConfig& config, const comm::Mesh& mesh) {
  OASES_CHECK(mesh.tp_size() == config.parallel.tp && mesh.dp_size() == config.parallel.dp &&
                  mesh.pp_size() == config.parallel.pp,
              "the process mesh (tp={}, dp={}, pp={}) does not match parallel.tp={}, dp={}, pp={}",
              mesh.tp_size(), mesh.dp_size(), mesh.pp_size(), config.parallel.tp,
              config.parallel.dp, config.parallel.pp);
}

// The training loop and what each step reports; one object per run.
class Run {
 public:
  Run(const RunConfig& config, const TrainOptions& options, comm::Mesh& mesh)
      : config_(config),
        options_(options),
        mesh_(mesh),
        data_(load_data(config)),
        engine_(config, groups_of(mesh)) {}

  TrainSummary run() {
    const auto& t = config_.train;
    check_memory_limit(config_, engine_);
    TrainSummary summary;
    summary.start_step = restore(config_, options_, data_->train_shard, engine_);
    const bool leader = mesh_.world_rank() == 0;
    // MFU divides by the peak of every device of the run (one device per rank).
    peak_flops_ = static_cast<double>(mesh_.world_size()) *
                  (config_.log.peak_tflops > 0 ? config_.log.peak_tflops * 1e12
                   : leader ? kernels::cpu::measure_sgemm_flops(1024, 0.3)
                            : 1.0);
    std::optional<LineFile> metrics = open_metrics(config_, leader, summary.start_step);
    if (options_.progress) log_start(config_, engine_, mesh_, data_->train_shard.size());
    if (data_->val_batches && summary.start_step == 0) {
      summary.initial_val_loss = validation_loss(engine_, *data_->val_batches, t.eval_steps);
      if (options_.progress) log_info("step {:>5} | val_loss {:.4f}", 0, *summary.initial_val_loss);
    }
    TraceSession trace(config_, mesh_, engine_);
    const Stopwatch run_clock;
    for (std::int64_t step = summary.start_step; step < t.steps; ++step) {
      const StepFigures f = train_one(step);
      const bool last = step + 1 == t.steps;
      if (f.record.val_loss) summary.final_val_loss = f.record.val_loss;
      write_metrics(metrics, f);
      if (options_.progress && ((step + 1) % config_.log.every == 0 || last || f.record.val_loss)) {
        const double done = static_cast<double>(step + 1 - summary.start_step);
        print_progress(f, t.steps, run_clock.seconds() / done * static_cast<double>(t.steps - step - 1),
                       mesh_.world_size() > 1);
      }
      summary.steps.push_back(f.record);
      trace.after_step(step + 1 - summary.start_step, last, options_.progress);
      if (const auto saved = checkpoint_after(step + 1, last)) summary.last_checkpoint = *saved;
    }
    return summary;
  }

 private:
  StepFigures train_one(std::int64_t step) {
    const auto& t = config_.train;
    const Stopwatch clock;
    data_->train_batches->training(step, engine_.first_local_sample(), engine_.local_batch(), batch_);
    StepFigures f;
    f.result = engine_.train_step(step, batch_.inputs.data(), batch_.targets.data());
    OASES_CHECK(std::isfinite(f.result.loss),
                "training diverged: the loss is {} at step {}; lower train.lr (now {}); the "
                "step's checkpoint is not written",
                f.result.loss, step + 1, t.lr);
    OASES_CHECK(t.max_loss == 0 || f.result.loss <= t.max_loss,
                "the loss {} at step {} exceeds train.max_loss = {}: the run stops before "
                "writing this step's checkpoint; lower train.lr (now {}) or raise the limit",
                f.result.loss, step + 1, t.max_loss, t.lr);
    f.record = {step + 1, f.result.loss, engine_.learning_rate(step), f.result.grad_norm,
                clock.seconds(), std::nullopt};
    const bool last = step + 1 == t.steps;
    if (data_->val_batches && ((step + 1) % t.eval_every == 0 || last))
      f.record.val_loss = validation_loss(engine_, *data_->val_batches, t.eval_steps);
    const double tokens = static_cast<double>(t.global_batch * config_.model.seq_len);
    f.tokens_per_s = tokens / f.record.step_time_s;
    f.model_flops = f.tokens_per_s * config_.model.training_flops_per_token();
    f.mfu = f.model_flops / peak_flops_;
    return f;
  }

  std::optional<std::string> checkpoint_after(std::int64_t done, bool last) {
    const auto& c = config_.checkpoint;
    if (c.dir.empty() || !(last || (c.every > 0 && done % c.every == 0))) return std::nullopt;
    TrainingState state;
    state.step = done;
    state.data_position = done;
    state.seed = static_cast<std::uint64_t>(config_.train.seed);
    state.data_tokens = data_->train_shard.size();
    const bool leader = mesh_.world_rank() == 0;
    // Cleaning and early pruning are rare and change what is on disk: said even with --quiet.
    std::string saved = save_checkpoint(
        c.dir, config_, engine_.model(), engine_.optimizer(), state,
        data_->tokenizer ? data_->tokenizer->model_file_contents() : std::string(), c.keep,
        mesh_.tp_group(), leader,
        [](const std::string& what) { log_warning("checkpoint: {}", what); });
    mesh_.world().barrier();  // the checkpoint exists for every rank once this returns
    if (options_.progress) log_info("saved checkpoint {}", saved);
    return saved;
  }

  const RunConfig& config_;
  const TrainOptions& options_;
  comm::Mesh& mesh_;
  std::unique_ptr<RunData> data_;
  TrainingEngine engine_;
  Batch batch_;
  double peak_flops_ = 1;
};

}  // namespace

TrainSummary run_training(const RunConfig& config, const TrainOptions& options) {
  comm::Mesh mesh = comm::Mesh::single_process();
  return run_training(config, options, mesh);
}

TrainSummary run_training(const RunConfig& config, const TrainOptions& run_options,
                          comm::Mesh& mesh) {
  config.validate();
  check_mesh(config, mesh);
  TrainOptions options = run_options;
  options.progress = options.progress && mesh.world_rank() == 0;
  if (config.train.threads > 0) omp_set_num_threads(static_cast<int>(config.train.threads));
  return Run(config, options, mesh).run();
}

}  // namespace oases::train
