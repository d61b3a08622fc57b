// The run configuration's word-valued settings, parsed.
//
// A RunConfig keeps what the user wrote; Settings holds the same settings as enums, parsed once
// (parse_settings, which RunConfig::validate runs first, so a word that is not known fails when
// the config is read). Each enum's words are in one table beside its declaration
// (core/named_values.h): the parser, the printer, every message listing valid values and the
// tests all read that table. The model section's words (model.arch, model.moe_gate) are parsed
// straight into model::ModelConfig, whose consumers lie below this layer.
#pragma once

#include "core/named_values.h"
#include "data/tokenizer.h"
#include "kernels/gemm16_paths.h"
#include "ops/context.h"
#include "ops/program.h"
#include "optim/optimizer.h"
#include "plan/run_config.h"
#include "schedule/pipeline.h"
#include "schedule/schedule.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::plan {

// train.precision: the element type of the compute.
enum class Precision : std::uint8_t {
  fp32,  // everything in f32
  fp64,  // everything in f64: the verification precision
  bf16,  // mixed: bf16 activations, working weights and tensor-parallel collectives over f32
  fp16,  //        master weights, gradients and optimizer state; fp16 with loss scaling
  // "auto": bf16 where this machine's bf16 products are measured well faster than its fp32
  // ones, fp32 elsewhere. Resolved into one of the above on the machine that runs
  // (train/peaks.h) before a plan is made; a resolved config (run.json, checkpoints) never
  // holds it.
  automatic,
};
inline constexpr std::array<NamedValue<Precision>, 5> kPrecisionNames{{
    {Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"},
    {Precision::fp64, "fp64"}, {Precision::automatic, "auto"}}};

// train.grad_reduce_dtype: the type data-parallel gradient sums travel in (bf16 only under
// mixed precision).
enum class GradReduceType : std::uint8_t { fp32, bf16 };
inline constexpr std::array<NamedValue<GradReduceType>, 2> kGradReduceTypeNames{{
    {GradReduceType::fp32, "fp32"}, {GradReduceType::bf16, "bf16"}}};

// parallel.offload: what lives in a scratch file between optimizer steps.
enum class Offload : std::uint8_t {
  none,
  optimizer,             // the optimizer state
  optimizer_and_params,  // and the fp32 master weights (mixed precision only)
};
inline constexpr std::array<NamedValue<Offload>, 3> kOffloadNames{{
    {Offload::none, "none"}, {Offload::optimizer, "optimizer"},
    {Offload::optimizer_and_params, "optimizer+params"}}};

// parallel.plan: where each layer's tensor-parallel degree comes from. Words other than the
// keywords are degree lists ("1,1,2,2") or a plan file's path.
enum class LayerPlanSource : std::uint8_t {
  uniform,    // "uniform": every layer at parallel.tp (MoE layers at 1 with expert_tp = 1)
  automatic,  // "auto": profiled and planned at start-up (resolved before a run's plan is made)
  listed,     // "1,1,2,2": one degree per layer
  file,       // a plan file written by `oases plan`
};
inline constexpr std::array<NamedValue<LayerPlanSource>, 2> kLayerPlanKeywords{{
    {LayerPlanSource::uniform, "uniform"}, {LayerPlanSource::automatic, "auto"}}};

// parallel.pipeline_layers: how the transformer layers are cut into pipeline chunks.
enum class PipelineLayersSource : std::uint8_t {
  uniform,    // "uniform": as evenly as possible (schedule::uniform_pipeline_layers)
  automatic,  // "auto": balanced from measured layer costs at start-up
  listed,     // "3,4,4,5": one count per chunk
};
inline constexpr std::array<NamedValue<PipelineLayersSource>, 2> kPipelineLayersKeywords{{
    {PipelineLayersSource::uniform, "uniform"}, {PipelineLayersSource::automatic, "auto"}}};

// The word of settings that may be left to the engine ("auto").
inline constexpr std::string_view kAutomatic = "auto";

// parallel.activation_compression: how kept activations are held between the passes, one
// encoding for the whole model or one per transformer layer.
struct ActivationCompression {
  // One word: the encoding of every kept set (schedule::compress_kept_sets); "none": empty.
  std::optional<ops::ActivationEncoding> whole;
  // A list ("none,bf16,none,fp8"): one entry per transformer layer, std::nullopt for "none"
  // (the embedding's and the head's sets stay as they are); empty for one word.
  std::vector<std::optional<ops::ActivationEncoding>> layers;

  // Whether some kept set is held encoded.
  bool any() const;
  // The first layer held in `encoding` (0 for one word naming it), or -1 when none is.
  std::int64_t first_layer_in(ops::ActivationEncoding encoding) const;
  // For the start-up log and the report: "bf16", or per layer how many layers each encoding
  // holds, "bf16 (1 layer), fp8 (2 layers)"; "none" when nothing is encoded.
  std::string describe() const;
};

struct Settings {
  std::optional<schedule::ScheduleKind> schedule;  // parallel.schedule; "auto": empty
  std::optional<schedule::Recompute> recompute;    // parallel.recompute; "auto" or a list: empty
  // parallel.recompute as a list ("full,none,selective,none"): one policy per transformer
  // layer, never sqrt (schedule::ScheduleSpec::layer_recompute); empty for one word.
  std::vector<schedule::Recompute> layer_recompute;
  schedule::PipelineKind pipeline = schedule::PipelineKind::one_f_one_b;  // parallel.pipeline
  PipelineLayersSource pipeline_layers = PipelineLayersSource::uniform;
  LayerPlanSource plan = LayerPlanSource::uniform;
  ActivationCompression activation_compression;  // parallel.activation_compression
  Offload offload = Offload::none;
  ops::ContextParallelKind context_parallel = ops::ContextParallelKind::all_to_all;  // cp_kind
  optim::OptimizerKind optimizer = optim::OptimizerKind::adamw;  // train.optimizer
  Precision precision = Precision::fp32;
  GradReduceType grad_reduce = GradReduceType::fp32;
  std::optional<kernels::Gemm16Path> gemm16_path;  // train.gemm16_path; "auto": empty
  data::TokenizerKind tokenizer = data::TokenizerKind::byte;  // data.tokenizer
  // train.save_signals as signal numbers, each once, in the order written; empty when
  // train.save_on_signal is false.
  std::vector<int> save_signals;
  // log.flight_dir resolved (flight_directory); empty when log.flight_records is 0.
  std::string flight_dir;
};

// Where flight records go: log.flight_dir; else "flight" in log.metrics's folder; else beside
// checkpoint.dir (in its parent); else "flight" in the working directory.
std::string flight_directory(const RunConfig& config);

// UserError naming the key, the word found and the valid words, for the first word that is
// not known. parallel.recompute and parallel.activation_compression are one word, or a list
// of one word per layer of model.layers separated by commas (spaces around a word are
// ignored): UserError naming the setting, the value, the layer and the valid words for a
// wrong count, an empty or unknown word, or a word that is whole-model only ("auto" and
// "sqrt").
Settings parse_settings(const RunConfig& config);

// Where parallel.plan's and parallel.pipeline_layers's words point. No error for any text: one
// that is neither keyword nor list is a plan file's path (parallel.plan) or a malformed list
// (parallel.pipeline_layers, rejected when the counts are read).
LayerPlanSource layer_plan_source(const std::string& plan);
PipelineLayersSource pipeline_layers_source(const std::string& pipeline_layers);

// Every word-valued key ("section.key") with its valid words, in the order messages list them:
// what a user may type after --set key= (the tests type each one).
struct WordSetting {
  std::string key;
  std::vector<std::string> words;
};
std::vector<WordSetting> word_settings();

}  // namespace oases::plan
