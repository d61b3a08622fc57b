#include "train/trainer.h"

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "kernels/cpu/peak_flops.h"
#include "train/checkpoint.h"
#include "runtime/trace.h"
#include "train/engine.h"
#include "data/loader.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

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

struct Batch {
  std::vector<std::int32_t> inputs, targets;
};

// Validation loss over eval_steps global batches of the validation shard; each data-parallel
// rank evaluates its share of every batch.
double validation_loss(TrainingEngine& engine, const data::DataLoader& loader, std::int64_t batches) {
  Batch b;
  const std::int64_t rows = engine.local_batch(), seq = engine.config().model.seq_len;
  b.inputs.resize(static_cast<std::size_t>(rows * seq));
  b.targets.resize(b.inputs.size());
  double total = 0;
  for (std::int64_t i = 0; i < batches; ++i) {
    loader.fill(i, engine.first_local_sample(), rows, b.inputs.data(), b.targets.data());
    total += engine.evaluate(b.inputs.data(), b.targets.data(), rows);
  }
  return total / static_cast<double>(batches);
}

data::TokenShard load_shard_for(const RunConfig& config, const std::string& split) {
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
  return shard;
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

}  // namespace

TrainSummary run_training(const RunConfig& config, const TrainOptions& options) {
  comm::Mesh mesh = comm::Mesh::single_process();
  return run_training(config, options, mesh);
}

TrainSummary run_training(const RunConfig& config, const TrainOptions& run_options,
                          comm::Mesh& mesh) {
  config.validate();
  OASES_CHECK(mesh.tp_size() == config.parallel.tp && mesh.dp_size() == config.parallel.dp &&
                  mesh.pp_size() == config.parallel.pp,
              "the process mesh (tp={}, dp={}, pp={}) does not match parallel.tp={}, dp={}, pp={}",
              mesh.tp_size(), mesh.dp_size(), mesh.pp_size(), config.parallel.tp,
              config.parallel.dp, config.parallel.pp);
  const bool leader = mesh.world_rank() == 0;
  TrainOptions options = run_options;
  options.progress = options.progress && leader;
  if (config.train.threads > 0) omp_set_num_threads(static_cast<int>(config.train.threads));
  const auto& t = config.train;
  const std::int64_t seq = config.model.seq_len;

  const data::TokenShard train_shard = load_shard_for(config, "train");
  const data::DataLoader train_loader(train_shard, seq, t.global_batch, config.data.shuffle,
                                static_cast<std::uint64_t>(t.seed));
  std::optional<data::TokenShard> val_shard;
  std::optional<data::DataLoader> val_loader;
  if (t.eval_every > 0) {
    val_shard = load_shard_for(config, "val");
    val_loader.emplace(*val_shard, seq, t.global_batch, false, static_cast<std::uint64_t>(t.seed));
  }

  TrainingEngine engine(
      config, ParallelGroups{&mesh.tp_group(), &mesh.dp_group(),
                             [&mesh](int span, int stride) -> comm::Communicator& {
                               return mesh.tp_subgroup(span, stride);
                             },
                             [&mesh](int degree) -> comm::Communicator& {
                               return mesh.tp_replica_group(degree);
                             }});
  if (config.parallel.memory_limit > 0) {
    const auto needed = static_cast<std::int64_t>(engine.memory_bytes());
    OASES_CHECK(needed <= config.parallel.memory_limit,
                "parallel.memory_limit = {} bytes is too small: this model needs {} bytes "
                "(parameters, gradients, AdamW moments and activations for micro_batch = {}); "
                "raise the limit or lower train.micro_batch or the model size",
                config.parallel.memory_limit, needed, t.micro_batch);
  }
  TrainSummary summary;
  std::int64_t start_step = 0;
  if (config.checkpoint.resume) {
    if (auto latest = latest_checkpoint(config.checkpoint.dir)) {
      load_model_weights((std::filesystem::path(*latest) / "model.safetensors").string(),
                         engine.model().layout(), engine.model().params());
      const TrainingState state = load_optimizer_state(*latest, engine.model().layout(),
                                                       engine.exp_avg(), engine.exp_avg_sq());
      OASES_CHECK(state.seed == static_cast<std::uint64_t>(t.seed),
                  "checkpoint '{}' was trained with train.seed = {} but the config says {}; "
                  "resume with the same seed",
                  *latest, state.seed, t.seed);
      start_step = state.data_position;
      if (options.progress) log_info("resumed from {} (step {})", *latest, start_step);
    } else {
      if (options.progress)
        log_info("checkpoint.resume: no complete checkpoint in '{}', starting from step 0",
                 config.checkpoint.dir);
    }
  }
  if (start_step == 0 && !options.init_from.empty()) {
    load_model_weights(options.init_from, engine.model().layout(), engine.model().params());
    if (options.progress) log_info("initialised weights from {}", options.init_from);
  }
  summary.start_step = start_step;

  const double flops_per_token = config.model.training_flops_per_token();
  // MFU divides by the peak of every device of the run (one device per rank).
  const double peak_flops = static_cast<double>(mesh.world_size()) *
                            (config.log.peak_tflops > 0 ? config.log.peak_tflops * 1e12
                             : leader ? kernels::cpu::measure_sgemm_flops(1024, 0.3)
                                      : 1.0);
  std::ofstream metrics;
  if (leader && !config.log.metrics.empty()) {
    const auto parent = std::filesystem::path(config.log.metrics).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    metrics.open(config.log.metrics, start_step > 0 ? std::ios::app : std::ios::trunc);
    OASES_CHECK(metrics.good(), "log.metrics: cannot open '{}' for writing", config.log.metrics);
  }
  if (options.progress) {
    log_info("model: {} layers, hidden {}, heads {}, seq {}, vocab {}: {:.2f}M parameters",
             config.model.layers, config.model.hidden, config.model.heads, seq,
             config.model.vocab_size, static_cast<double>(config.model.parameter_count()) / 1e6);
    log_info("data: {} training tokens, global batch {} x {} tokens, {} steps, {} threads",
             train_shard.size(), t.global_batch, seq, t.steps, omp_get_max_threads());
    if (mesh.world_size() > 1)
      log_info("parallel: {} ranks = tp {} x dp {} x pp {}", mesh.world_size(), mesh.tp_size(),
               mesh.dp_size(), mesh.pp_size());
    if (config.parallel.plan != "uniform") {
      std::string degrees;
      for (std::int64_t l = 0; l < config.model.layers; ++l)
        degrees += fmt::format("{}{}", l ? " " : "", engine.model().layer_degree(l));
      log_info("plan: tensor-parallel degree per layer {} (parallel.plan = \"{}\"); memory {:.1f} "
               "MiB per rank",
               degrees, config.parallel.plan,
               static_cast<double>(engine.memory_bytes()) / (1 << 20));
    }
    const schedule::ScheduleSpec& spec = engine.schedule_spec();
    log_info("schedule: {}, recompute {}, {} sub-batch(es) of {} sequences, {} micro-batch(es) "
             "per step; activations {:.1f} MiB",
             schedule::name(spec.kind), schedule::name(spec.recompute), spec.sub_batches,
             t.micro_batch / spec.sub_batches, spec.micro_batches,
             static_cast<double>(engine.activation_bytes()) / (1 << 20));
  }
  if (val_loader && start_step == 0) {
    summary.initial_val_loss = validation_loss(engine, *val_loader, t.eval_steps);
    if (options.progress) log_info("step {:>5} | val_loss {:.4f}", 0, *summary.initial_val_loss);
  }

  std::optional<runtime::TraceRecorder> trace;
  if (!config.log.trace.empty()) {
    // Every rank records; rank 0's clock origin is everyone's, so the lanes line up.
    std::int64_t origin_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    mesh.world().broadcast(Tensor::of(&origin_ns, {1}), 0);
    trace.emplace(std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(origin_ns)));
    engine.set_trace(&*trace);
  }

  const std::int64_t tokens_per_step = t.global_batch * seq;
  Batch batch;
  batch.inputs.resize(static_cast<std::size_t>(tokens_per_step));
  batch.targets.resize(batch.inputs.size());
  const Stopwatch run_clock;
  for (std::int64_t step = start_step; step < t.steps; ++step) {
    const Stopwatch step_clock;
    train_loader.fill(step, engine.first_local_sample(), engine.local_batch(), batch.inputs.data(),
                      batch.targets.data());
    const StepResult r = engine.train_step(step, batch.inputs.data(), batch.targets.data());
    OASES_CHECK(std::isfinite(r.loss),
                "training diverged: loss is {} at step {}; lower train.lr (now {}) or enable "
                "train.grad_clip",
                r.loss, step + 1, t.lr);
    StepRecord record{step + 1, r.loss, engine.learning_rate(step), r.grad_norm,
                      step_clock.seconds(), std::nullopt};
    const bool last = step + 1 == t.steps;
    if (val_loader && ((step + 1) % t.eval_every == 0 || last)) {
      record.val_loss = validation_loss(engine, *val_loader, t.eval_steps);
      summary.final_val_loss = record.val_loss;
    }
    const double tokens_per_s = static_cast<double>(tokens_per_step) / record.step_time_s;
    const double achieved = tokens_per_s * flops_per_token;
    if (metrics.is_open()) {
      nlohmann::json line = {{"step", record.step},
                             {"loss", record.loss},
                             {"lr", record.lr},
                             {"grad_norm", record.grad_norm},
                             {"step_time_s", record.step_time_s},
                             {"tokens_per_s", tokens_per_s},
                             {"model_tflops", achieved / 1e12},
                             {"mfu", achieved / peak_flops},
                             {"compute_s", r.compute_seconds},
                             {"exposed_comm_s", r.exposed_comm_seconds},
                             {"comm_s", r.comm_seconds},
                             {"peak_activation_bytes", r.peak_activation_bytes},
                             {"peak_mem_bytes", peak_resident_bytes()}};
      if (record.val_loss) line["val_loss"] = *record.val_loss;
      metrics << line.dump() << '\n';
      metrics.flush();
    }
    if (options.progress && ((step + 1) % config.log.every == 0 || last || record.val_loss)) {
      const double elapsed = run_clock.seconds();
      const double done = static_cast<double>(step + 1 - start_step);
      const double eta = elapsed / done * static_cast<double>(t.steps - step - 1);
      std::string line = fmt::format(
          "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {} tok/s | mfu {:.0f}% | ETA {}",
          step + 1, t.steps, record.loss, record.lr, record.grad_norm, format_rate(tokens_per_s),
          100.0 * achieved / peak_flops, format_duration(eta));
      if (mesh.world_size() > 1)
        line += fmt::format(" | waited on comm {:.0f}%", 100.0 * r.exposed_comm_seconds / record.step_time_s);
      if (record.val_loss) line += fmt::format(" | val_loss {:.4f}", *record.val_loss);
      log_info("{}", line);
    }
    summary.steps.push_back(record);
    if (trace && (step + 1 - start_step == config.log.trace_steps || last)) {
      engine.set_trace(nullptr);
      write_trace(*trace, mesh, config.log.trace);
      if (options.progress) log_info("wrote trace of {} step(s) to {}", step + 1 - start_step, config.log.trace);
      trace.reset();
    }

    const bool checkpoint_now =
        !config.checkpoint.dir.empty() &&
        (last || (config.checkpoint.every > 0 && (step + 1) % config.checkpoint.every == 0));
    if (checkpoint_now) {
      const TrainingState state{step + 1, step + 1, static_cast<std::uint64_t>(t.seed)};
      summary.last_checkpoint = save_checkpoint(
          config.checkpoint.dir, config, engine.model().layout(), engine.model().params(),
          engine.exp_avg(), engine.exp_avg_sq(), state, config.checkpoint.keep, mesh.tp_group(),
          leader);
      mesh.world().barrier();  // the checkpoint exists for every rank once this returns
      if (options.progress) log_info("saved checkpoint {}", summary.last_checkpoint);
    }
  }
  return summary;
}

}  // namespace oases::train
