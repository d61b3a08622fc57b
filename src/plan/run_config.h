// The run configuration: one TOML file with sections [model], [parallel], [train], [data],
// [checkpoint], [log] (every key: docs/configuration.md), overridable by
// `--set section.key=value`.
// Unknown sections or keys, wrong types and out-of-range values are errors that name the key,
// the value found and what is valid.
#pragma once

#include "data/tokenizer.h"
#include "model/config.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace oases::plan {

struct ParallelConfig {
  std::int64_t tp = 1, dp = 1, pp = 1;
  // Expert parallelism: the experts of every MoE layer are split over groups of ep data-parallel
  // ranks (ep divides dp and model.experts), which exchange tokens by all-to-all.
  std::int64_t ep = 1;
  // Tensor parallelism inside the experts: 0 (the default) or parallel.tp splits each expert of
  // an MoE layer column/row-parallel over the layer's tensor-parallel ranks, as its attention and
  // MLP are; 1 keeps every expert whole on each rank, which runs the MoE layers (their
  // attention included) at tensor-parallel degree 1.
  std::int64_t expert_tp = 0;
  // Context parallelism: every sequence is split over cp ranks (each holds chunks i and
  // 2cp - 1 - i of 2cp equal chunks, so causal attention work is balanced); the mesh orders tp
  // fastest, then cp, then dp, then pp, and gradients are summed over cp x dp.
  std::int64_t cp = 1;
  // How attention sees the whole sequence under cp > 1: "all-to-all" (DeepSpeed-Ulysses: an
  // all-to-all trades sequence shards for head shards before core attention and back after it;
  // heads and kv heads per tensor-parallel rank must divide by cp) or "ring" (key/value blocks
  // passed around the cp group).
  std::string cp_kind = "all-to-all";
  // Pipeline schedule when pp > 1: "1f1b", "gpipe" or "interleaved" (schedule/pipeline.h;
  // "zero-bubble" and "2bw" are not available yet).
  std::string pipeline = "1f1b";
  // Model chunks per pipeline rank, v: 1, or v >= 2 with pipeline = "interleaved", which cuts
  // the model into C = pp x v chunks (chunk c on rank c % pp) and needs the micro-batches per
  // step (train.global_batch / (train.micro_batch x dp)) to be a multiple of pp.
  std::int64_t virtual_stages = 1;
  // Transformer layers per pipeline chunk: "uniform" (planner::uniform_pipeline_layers) or
  // one count per chunk, pp x virtual_stages of them ("3,4,4,5", summing to model.layers).
  std::string pipeline_layers = "uniform";
  // "auto": "oases" when tp > 1, else "megatron". See schedule/schedule.h for all of them.
  std::string schedule = "auto";
  // "auto": the schedule's own policy (megatron: none, fine-grained and oases: fine-grained,
  // cross-pass: full). "none", "full", "selective", "fine-grained", or "sqrt" (megatron and
  // cross-pass: schedule/schedule.h). Or one word per transformer layer separated by commas
  // ("full,full,none,selective"; model.layers words, none of them "auto" or "sqrt").
  std::string recompute = "auto";
  // recompute = "sqrt": layers per recomputation group, k in [1, model.layers]; only the input
  // of each group's first layer is kept between the passes. 0: round(sqrt(model.layers)).
  // Must stay 0 under the other policies.
  std::int64_t recompute_every = 0;
  // How kept activations are held between forward and backward in training:
  // "none", "bf16" or "fp8" (e4m3) (schedule::compress_kept_sets), or one of these per
  // transformer layer separated by commas ("none,bf16,none,fp8").
  std::string activation_compression = "none";
  // ZeRO-R's partitioned activation checkpoints: each layer's kept residual-stream input
  // (r_l, h_l), identical on the ranks of its tensor-parallel group, is held as a 1/degree
  // slice per rank between the passes and all-gathered before the backward pass reads it
  // (schedule::partition_kept_checkpoints). No effect on layers at degree 1.
  bool partition_activations = false;
  // Megatron-LM's sequence parallelism (needs tp > 1): between tensor-parallel regions each rank
  // holds 1/tp of the tokens; the regions' all-reduces become an all-gather at their entry and
  // a reduce-scatter at their exit (ops/layer_segments.h).
  bool sequence_parallel = false;
  // Bytes each collective moves per transport call (0: no bound): larger collectives run as
  // consecutive pieces of at most this many bytes, so the transport's own buffers stay within
  // it whatever the size of a bucket or a layer (ZeRO-R's constant buffer sizing).
  std::int64_t bucket_bytes = 0;
  // Parts each micro-batch is split into by the overlapped schedules; 0: 2 where it divides
  // the micro-batch (else 1) for cross-pass and oases, 1 for the others.
  std::int64_t sub_batches = 0;
  // Tensor-parallel degree per layer: "uniform" (every layer at tp), "auto" (profile, plan and
  // train), degrees per layer ("1,1,2,2"; each divides tp), or a plan file from `oases plan`.
  std::string plan = "uniform";
  std::int64_t memory_limit = 0;  // bytes per device; 0: no limit
  // Periodic synchronisation of data-parallel replicas (local SGD): 1 sums gradients over the
  // data-parallel group every step; x > 1 lets each replica step on its own gradients and
  // averages parameters and optimizer state over the group every x steps (and before every
  // evaluation, checkpoint and the run's end).
  std::int64_t dp_sync_every = 1;
  // ZeRO over the group that sums each gradient bucket (the data-parallel group; with a layer
  // below tp, its replica group): 0 none; 1 each rank keeps the optimizer state of its own
  // 1/n block of every bucket, receives only that block's gradient sum, updates it and gathers
  // the others' updated blocks (optim/zero_partition.h); 2 also keeps only its blocks of the
  // gradients once a bucket is reduced (model::ModelOptions::pageable_grads); 3 also keeps
  // only its blocks of the parameters between uses: the training schedule gathers each bucket
  // before the compute that reads it and releases it after (schedule::shard_parameters).
  std::int64_t zero = 0;
  // ZeRO-3: true releases a bucket's gathered parameters after a micro-batch's forward and
  // gathers them again for its backward; false keeps them from forward to backward (fewer
  // gathers, more memory).
  bool zero3_reshard_after_forward = true;
  // "none", "optimizer" (the optimizer state) or "optimizer+params" (and the fp32 master
  // weights; mixed precision only) kept in a scratch file under offload_dir between optimizer
  // steps and read back ahead of each bucket's update (core/offload_store.h).
  std::string offload = "none";
  std::string offload_dir;
  double comm_timeout_s = 300;    // a collective not done after this aborts the job; 0: never
  // Every rank must have started and met the others within this many seconds of starting,
  // else the job aborts naming the ranks that did not arrive; 0: wait forever.
  double startup_timeout_s = 120;
};

struct OptimConfig {
  std::int64_t micro_batch = 4;
  std::int64_t global_batch = 4;  // sequences per optimizer step
  std::int64_t steps = 100;
  double lr = 3e-4;
  double min_lr = 3e-5;
  std::int64_t warmup_steps = 0;
  std::int64_t lr_decay_steps = 0;  // 0: decay over `steps`
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // 0: no clipping
  double max_loss = 0;     // a step whose loss exceeds this stops the run; 0: no limit
  // "adamw", "adafactor", "sm3" or "sgd" (optim/optimizer.h). beta1, beta2 and eps are
  // AdamW's; momentum is SGD's and SM3's (0: none), nesterov SGD's; adafactor_beta1 is
  // Adafactor's first moment (0: none). lr = 0 selects Adafactor's relative step size.
  std::string optimizer = "adamw";
  double momentum = 0;
  bool nesterov = false;
  double adafactor_beta1 = 0;
  // "fp32", "fp64" (verification), or mixed precision "bf16" / "fp16": activations, the
  // parameters' working copy and tensor-parallel collectives in 16 bits, fp32 master weights,
  // gradients and optimizer state, products accumulated in fp32 (ops/context.h).
  std::string precision = "fp32";
  // The type data-parallel gradient reductions travel in under mixed precision: "fp32" or
  // "bf16" (rounded before the reduction, widened after; half the bytes).
  std::string grad_reduce_dtype = "fp32";
  // How 16-bit matrix products run (kernels/cpu/gemm16.h): "auto" measures the paths at
  // start-up (a resumed run keeps the checkpoint's), or "convert+sgemm" / "oneDNN" pins one.
  std::string gemm16_path = "auto";
  // fp16's loss scaling (train/loss_scaler.h), as Megatron-LM's options of the same names:
  // loss_scale > 0 is a constant scale; 0 selects the dynamic rule, starting from
  // initial_loss_scale, doubling after loss_scale_window clean steps, halving (not below
  // min_loss_scale) once `hysteresis` overflows have been seen since the last growth.
  double loss_scale = 0;
  double initial_loss_scale = 65536;
  double min_loss_scale = 1;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  std::int64_t seed = 1234;
  std::int64_t eval_every = 0;  // 0: never
  std::int64_t eval_steps = 4;  // validation batches (of global_batch sequences) per evaluation
  std::int64_t threads = 0;     // OpenMP threads per rank; 0: automatic (train/threads.h)
  // On one of save_signals (names of core/stop_signals.h, separated by commas or spaces),
  // every rank finishes its step, saves a checkpoint and exits with 128 + the signal's number
  // (train/trainer.h); false leaves the signals' default actions.
  bool save_on_signal = true;
  std::string save_signals = "TERM,USR1,INT,HUP";
  // A rank whose compute per step stays above this many times the median rank's for several
  // windows of log.every steps is named in a warning (train/stragglers.h).
  double straggler_warn_ratio = 1.2;

  std::int64_t accumulation_steps(std::int64_t dp) const { return global_batch / (micro_batch * dp); }
};

struct DataConfig {
  std::string path;  // shard prefix: reads <path>_train.bin and <path>_val.bin
  std::string tokenizer = "byte";  // "byte", "gpt2" or "sentencepiece" (data/tokenizer.h)
  // The tokenizer's model file: sentencepiece's .model; for gpt2 a tokenizer.json or a folder
  // (data/gpt2_tokenizer.h). Empty: for sentencepiece, prepare-data's copy beside the shards
  // (<path>_tokenizer.model); for gpt2, its default folder. Must be empty for byte.
  std::string tokenizer_model;
  bool shuffle = false;
};

struct CheckpointConfig {
  std::string dir;         // empty: no checkpoints
  std::int64_t every = 0;  // steps between checkpoints; 0: only at the end
  std::int64_t keep = 2;   // newest checkpoints kept; 0 keeps all
  bool resume = false;     // continue from the newest complete checkpoint in dir
  // Write checkpoints on a thread of their own: the step ends once the state is copied into
  // host memory (train/checkpoint_writer.h).
  bool async = false;
};

struct LogConfig {
  std::int64_t every = 1;  // progress line every N steps
  std::string metrics;     // JSONL path; empty: none
  std::string trace;       // Chrome trace path; empty: none
  std::int64_t trace_steps = 1;
  double peak_tflops = 0;  // device peak for MFU; 0: measured at start-up with sgemm
  // Operations each communicator remembers for its flight record (comm/flight_recorder.h);
  // 0: no recorder.
  std::int64_t flight_records = 2000;
  // Where each rank writes flight/rank_<R>.json's folder; empty: "flight" beside log.metrics,
  // else beside checkpoint.dir, else in the working directory (plan::flight_directory).
  std::string flight_dir;
};

struct RunConfig {
  model::ModelConfig model;
  ParallelConfig parallel;
  OptimConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;

  // Every setting's word and range, then the combinations that cannot run together (heads
  // divide hidden, batch arithmetic, schedules and recomputation, ...); UserError naming the
  // settings, the values found and what is valid. Reads no file but for checking that a plan
  // file named by parallel.plan exists (plan/validate.cc).
  void validate() const;
};

// Parses TOML text (`source` names it in messages) and applies `overrides` ("section.key=value",
// the value in TOML syntax; for a key whose value is text, anything that is not a quoted TOML
// string is taken as the text it is: parallel.pipeline=1f1b, parallel.plan=1,1,2,2). Then, when
// parallel.plan names a plan file with settings (planner::read_plan_settings), those are applied
// as overrides too, over the config's values; an override of a key the plan sets to another
// value is a UserError naming the key, both values and the plan file, and an error of
// validation then names the plan file. parallel.plan keeps naming the file.
RunConfig parse_run_config(const std::string& toml_text, const std::string& source,
                           const std::vector<std::string>& overrides = {});
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});

// As parse_run_config and load_run_config, for a run that starts from (or reads) the Hugging
// Face model folder `folder` (model/hf_config.h): its config.json gives [model] every setting
// it fixes (arch, layers, hidden, heads, ...) and defaults for seq_len (its position count),
// dropout and attention_dropout. The config and overrides may leave a fixed setting out or
// state the folder's value; any other value is a UserError naming the key, both values and
// the folder. The defaults they may change. When the folder holds a tokenizer and the run
// sets neither data.tokenizer nor data.tokenizer_model, they become the folder's kind and the
// folder.
RunConfig parse_run_config_with_folder(const std::string& toml_text, const std::string& source,
                                       const std::vector<std::string>& overrides,
                                       const std::string& folder);
RunConfig load_run_config_from_folder(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      const std::string& folder);

// The configuration as TOML (stored with checkpoints, printed by `oases train --print-config`).
std::string to_toml(const RunConfig& config);

// The tokenizer file or folder the run reads: data.tokenizer_model when set; else, for a
// tokenizer its name does not determine (sentencepiece, bpe, wordpiece), the folder of its
// files prepare-data wrote beside the shards (data/tokenizer.h's
// tokenizer_folder_beside_shards(data.path)) when it exists, or for sentencepiece
// tokenizer_model_beside_shards(data.path) when that file exists; else empty.
std::string tokenizer_model_path(const RunConfig& config);

// The run's tokenizer, when training has something to learn from it: for the kinds whose
// vocabulary only their files know (sentencepiece, bpe, wordpiece) and for any tokenizer given
// a file (which is then checked to load); nullptr for byte, and for gpt2 from its default
// files, whose names say all (known_vocab_size). UserError when sentencepiece or wordpiece has
// no files (naming data.tokenizer_model and the default it looked for), when they do not load,
// or when model.vocab_size is smaller than the tokenizer's vocabulary.
std::unique_ptr<data::Tokenizer> load_run_tokenizer(const RunConfig& config);

// Every key the parser accepts, as "section.key" ("model.arch", "parallel.tp", ...), sorted by
// section and then by key; old names still accepted (model.layernorm_eps) are included. The
// configuration reference, docs/configuration.md, must list exactly these (its test checks).
std::vector<std::string> config_key_names();

}  // namespace oases::plan
