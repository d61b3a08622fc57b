// `oases eval`: how well a checkpoint's model predicts a token shard.
//
// The shard's tokens are cut into non-overlapping windows of model.seq_len + 1 tokens: window w
// covers tokens [w * seq_len, w * seq_len + seq_len], its first seq_len tokens are the inputs
// and its last seq_len the targets, so every token after the first is predicted exactly once,
// from the tokens of its own window before it. There are floor((tokens - 1) / seq_len) windows;
// the tokens after the last whole window are not evaluated. Windows go to the model in batches
// of batch_size (split over the data-parallel ranks); a last, partial batch is filled with rows
// whose targets are not counted. Where the shard has a loss mask (data/token_shard.h), only the
// target tokens it counts are evaluated (the others are still read as context).
//
// Results: loss = the mean cross-entropy (nats) over the evaluated target tokens; perplexity =
// exp(loss); bits per byte = loss x tokens / (bytes x ln 2), where bytes is the length of the
// UTF-8 text the evaluated target tokens decode to (each window's run of consecutive evaluated
// targets decoded together) with the checkpoint's tokenizer. Bits per byte compares models with
// different tokenizers; for the byte tokenizer it is loss / ln 2.
#pragma once

#include "comm/mesh.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "train/engine.h"

#include <cstdint>
#include <optional>
#include <string>

namespace oases::train {

struct EvalOptions {
  std::string checkpoint;     // step_N folder, or a checkpoint.dir (its newest checkpoint)
  std::string data;           // shard prefix: reads <data>_<split>.bin
  std::string split = "val";  // "val" or "train"
  std::int64_t batches = 0;   // batches to evaluate from the start of the shard; 0: all
  // Windows per batch over all data-parallel ranks (a multiple of dp, at least 1); unset: the
  // checkpoint's train.micro_batch x dp, times pp under pipeline stages (one micro-batch in
  // flight per stage).
  std::optional<std::int64_t> batch_size;
  std::string tokenizer_dir;  // where the gpt2 tokenizer's files are; empty: its default
};

struct EvalResult {
  std::string checkpoint;  // the step_N folder evaluated
  std::string shard;       // path of the shard
  std::int64_t seq_len = 0;
  std::int64_t windows = 0;  // evaluated
  // Target tokens evaluated: windows x seq_len, less those a loss mask leaves out.
  std::int64_t tokens = 0;
  std::int64_t bytes = 0;  // UTF-8 bytes those tokens decode to
  double loss = 0;         // nats per token
  double perplexity = 0;
  double bits_per_byte = 0;
};

// Evaluates `engine`'s model on `shard` (results above; checkpoint and shard paths left empty).
// Every rank of the engine's groups calls it with the same arguments. The engine's global batch
// is the batch size; `max_batches` = 0 evaluates every window. REQUIRES: model.arch gpt or
// llama; UserError when the shard holds fewer than seq_len + 1 tokens, or its loss mask counts
// no target of the windows evaluated.
EvalResult evaluate_shard(TrainingEngine& engine, const data::TokenShard& shard,
                          const data::Tokenizer& tokenizer, std::int64_t max_batches);

// The process grid of an evaluation: tp x dp x pp ranks.
struct EvalLayout {
  int tp = 1, dp = 1, pp = 1;
};

// The layout `oases eval` runs on `world_size` ranks. `tp` and `pp` are the ones asked for (0:
// not given). A degree not given is the one the checkpoint was trained with (its stored
// parallel.tp or parallel.pp) when the job's ranks are a multiple of it times the other
// degree, else 1; the remaining ranks are data-parallel. UserError when the degrees asked for
// do not divide world_size, or pp exceeds the checkpoint's model.layers.
EvalLayout eval_layout(const std::string& checkpoint, int world_size, int tp, int pp);

// Loads the checkpoint (its model and tokenizer) on the ranks of `mesh` (tp, dp and pp from
// the mesh, layers split uniformly over the stages; any layout, whatever trained the
// checkpoint) and evaluates it on the shard. Under pipeline stages each batch runs as
// forward-only pipeline steps and every rank gets the last stage's result.
// UserError for a bad option (naming it, the value and what is valid), a shard made with
// another tokenizer than the checkpoint's, or a shard shorter than one window.
EvalResult evaluate_checkpoint(const EvalOptions& options, comm::Mesh& mesh);

}  // namespace oases::train
