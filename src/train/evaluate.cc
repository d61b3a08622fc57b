#include "train/evaluate.h"

#include "model/hf_config.h"

#include "core/error.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/host_memory.h"
#include "train/trainer.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <span>
#include <vector>

namespace oases::train {
namespace {

// The step_N folder `path` names: itself, or the newest complete checkpoint of a
// checkpoint.dir.
std::string checkpoint_folder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  OASES_CHECK(fs::is_directory(path, ec),
              "--checkpoint '{}' is not a directory; pass a step_N checkpoint folder or a run's "
              "checkpoint.dir",
              path);
  if (fs::exists(fs::path(path) / io::kModelFile, ec) || model::is_hf_model_folder(path))
    return path;
  const auto latest = latest_checkpoint(path);
  OASES_CHECK(latest.has_value(),
              "--checkpoint '{}' holds no complete checkpoint (a step_N folder with {} and {}); "
              "pass a step_N folder or a run's checkpoint.dir",
              path, io::kModelFile, io::kCompleteMarker);
  return *latest;
}

// parallel.<key> of the run that wrote the checkpoint in `folder` (1 where not recorded).
std::int64_t stored_degree(const std::string& folder, const char* key) {
  if (model::is_hf_model_folder(folder)) return 1;  // a model folder records no layout
  const std::string model_file = io::resolve_model_file(folder);
  const io::SafetensorsFile file = io::SafetensorsFile::open(model_file);
  toml::table stored;
  try {
    stored = toml::parse(io::metadata_value(file, "oases_config"));
  } catch (const toml::parse_error& e) {
    OASES_FAIL("{}: the stored run configuration is not valid TOML: {}", model_file,
               std::string(e.description()));
  }
  return stored["parallel"][key].value_or<std::int64_t>(1);
}

}  // namespace

EvalLayout eval_layout(const std::string& checkpoint, int world_size, int tp, int pp) {
  OASES_CHECK(tp >= 0, "--tp = {} must be >= 1", tp);
  OASES_CHECK(pp >= 0, "--pp = {} must be >= 1", pp);
  const std::string folder = checkpoint_folder(checkpoint);
  // A stored degree is a default only where the job's ranks can hold it.
  const auto stored_or_one = [&](const char* key, int other) {
    const std::int64_t degree = stored_degree(folder, key);
    return degree >= 1 && world_size % (degree * std::max(other, 1)) == 0
               ? static_cast<int>(degree)
               : 1;
  };
  EvalLayout layout;
  layout.tp = tp > 0 ? tp : stored_or_one("tp", pp);
  layout.pp = pp > 0 ? pp : stored_or_one("pp", layout.tp);
  const int grid = layout.tp * layout.pp;
  OASES_CHECK(world_size % grid == 0,
              "--tp = {} x --pp = {} = {} ranks per model replica must divide the {} ranks of "
              "the job (the rest are data-parallel); launch a multiple of {} processes "
              "(mpirun -np {} oases eval ...)",
              layout.tp, layout.pp, grid, world_size, grid, grid);
  const std::int64_t layers = config_from_checkpoint(folder).model.layers;
  OASES_CHECK(layout.pp <= layers,
              "--pp = {} is more than the checkpoint's model.layers = {}: each pipeline stage "
              "needs at least one layer; valid: 1 to {}",
              layout.pp, layers, layers);
  layout.dp = world_size / grid;
  return layout;
}

EvalResult evaluate_shard(TrainingEngine& engine, const data::TokenShard& shard,
                          const data::Tokenizer& tokenizer, std::int64_t max_batches) {
  const plan::RunConfig& config = engine.config();
  OASES_CHECK(!config.model.masked_lm(),
              "model.arch = \"bert\" predicts masked tokens from both sides; evaluation by next-"
              "token loss needs a \"gpt\" or \"llama\" model");
  const std::int64_t seq = config.model.seq_len;
  OASES_CHECK(shard.size() >= seq + 1,
              "data shard '{}' holds {} tokens, fewer than one window of model.seq_len + 1 = {} "
              "tokens; evaluate on a longer shard",
              shard.path, shard.size(), seq + 1);
  OASES_CHECK(max_batches >= 0, "--batches = {} must be >= 1 (or \"all\")", max_batches);
  const std::int64_t batch = config.train.global_batch;
  const std::int64_t all_windows = (shard.size() - 1) / seq;
  const std::int64_t windows =
      max_batches == 0 ? all_windows : std::min(all_windows, max_batches * batch);

  // The counted targets of windows [begin, end): all their seq_len targets without a mask.
  const auto counted_targets = [&](std::int64_t begin, std::int64_t end) {
    std::int64_t counted = 0;
    for (std::int64_t position = begin * seq + 1; position <= end * seq; ++position)
      counted += shard.counts_in_loss(position) ? 1 : 0;
    return counted;
  };
  const std::int64_t total_targets = counted_targets(0, windows);
  OASES_CHECK(total_targets > 0,
              "data shard '{}' has a loss mask that counts none of the {} target tokens of the "
              "{} windows evaluated, so there is no loss to report; evaluate more batches "
              "(--batches) or a shard with targets",
              shard.path, windows * seq, windows);

  const std::int64_t local = engine.local_batch();
  const std::int64_t first_row = engine.first_local_sample();
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(local * seq));
  std::vector<std::int32_t> targets(inputs.size());
  double loss_sum = 0;  // nats over every evaluated target
  for (std::int64_t start = 0; start < windows; start += batch) {
    for (std::int64_t row = 0; row < local; ++row) {
      const std::int64_t window = start + first_row + row;
      const auto at = static_cast<std::size_t>(row * seq);
      if (window < windows) {
        const auto begin = shard.tokens.begin() + window * seq;
        std::copy(begin, begin + seq, inputs.begin() + static_cast<std::ptrdiff_t>(at));
        for (std::int64_t t = 0; t < seq; ++t) {
          // A token the loss mask leaves out is read but not predicted.
          const std::int64_t position = window * seq + 1 + t;
          targets[at + static_cast<std::size_t>(t)] =
              shard.counts_in_loss(position) ? shard.tokens[static_cast<std::size_t>(position)]
                                             : -1;
        }
      } else {
        // Filling of the last batch: any valid input, and a target that is not counted.
        std::fill_n(inputs.begin() + static_cast<std::ptrdiff_t>(at), seq, 0);
        std::fill_n(targets.begin() + static_cast<std::ptrdiff_t>(at), seq, -1);
      }
    }
    // engine.evaluate is the mean over the batch's counted targets (0 where it has none).
    const std::int64_t counted = counted_targets(start, std::min(start + batch, windows));
    loss_sum +=
        engine.evaluate(inputs.data(), targets.data(), local) * static_cast<double>(counted);
  }

  EvalResult result;
  result.seq_len = seq;
  result.windows = windows;
  result.tokens = total_targets;
  // Each run of consecutive counted targets of a window is decoded on its own.
  for (std::int64_t w = 0; w < windows; ++w) {
    std::int64_t position = w * seq + 1;
    const std::int64_t window_end = w * seq + seq + 1;
    while (position < window_end) {
      if (!shard.counts_in_loss(position)) {
        ++position;
        continue;
      }
      const std::int64_t run_begin = position;
      while (position < window_end && shard.counts_in_loss(position)) ++position;
      result.bytes += static_cast<std::int64_t>(
          tokenizer
              .decode(std::span(shard.tokens)
                          .subspan(static_cast<std::size_t>(run_begin),
                                   static_cast<std::size_t>(position - run_begin)))
              .size());
    }
  }
  result.loss = loss_sum / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.loss);
  // Tokens over bytes first: exactly 1 for the byte tokenizer, whose bits per byte is then
  // exactly loss / ln 2.
  result.bits_per_byte =
      result.bytes > 0
          ? result.loss * (static_cast<double>(result.tokens) / static_cast<double>(result.bytes)) /
                std::log(2.0)
          : 0.0;
  return result;
}

EvalResult evaluate_checkpoint(const EvalOptions& o, comm::Mesh& mesh) {
  OASES_CHECK(o.split == "val" || o.split == "train",
              "--split = \"{}\" is not a split; valid: val (<data>_val.bin), train "
              "(<data>_train.bin)",
              o.split);
  OASES_CHECK(o.batches >= 0, "--batches = {} must be >= 1, or \"all\"", o.batches);
  OASES_CHECK(!o.batch_size || *o.batch_size >= 1,
              "--batch-size = {} must be at least 1 (leave it out for the checkpoint's "
              "train.micro_batch x data-parallel ranks)",
              o.batch_size.value_or(0));
  const std::string folder = checkpoint_folder(o.checkpoint);
  plan::RunConfig config = config_from_checkpoint(folder);
  const std::int64_t dp = mesh.dp_size(), pp = mesh.pp_size();
  const std::int64_t trained_micro_batch = config.train.micro_batch;
  const std::int64_t batch =
      o.batch_size.value_or(trained_micro_batch * dp * (pp > 1 ? pp : 1));
  OASES_CHECK(batch % dp == 0,
              "--batch-size = {} must be a multiple of the {} data-parallel ranks (each "
              "evaluates as many windows)",
              batch, dp);
  const std::int64_t local = batch / dp;
  config.parallel = plan::ParallelConfig{};
  config.parallel.tp = mesh.tp_size();
  config.parallel.dp = dp;
  config.parallel.pp = pp;
  // Stages pass micro-batches along: several per batch keep more than one stage busy. In one
  // stage a batch is one micro-batch.
  config.train.micro_batch =
      pp > 1 && local % trained_micro_batch == 0 ? trained_micro_batch : local;
  config.train.global_batch = batch;
  config.train.eval_every = 0;
  config.checkpoint = {};
  config.log = {};
  config.validate();

  const data::TokenShard shard = data::load_token_shard(o.data + "_" + o.split + ".bin");
  OASES_CHECK(shard.tokenizer == config.data.tokenizer,
              "data shard '{}' was made with tokenizer \"{}\" but checkpoint '{}' was trained with "
              "\"{}\"; evaluate on data prepared with `oases prepare-data --tokenizer {}`",
              shard.path, shard.tokenizer, folder, config.data.tokenizer, config.data.tokenizer);
  OASES_CHECK(shard.vocab_size <= config.model.vocab_size,
              "data shard '{}' has a vocabulary of {} tokens but the checkpoint's model.vocab_size "
              "is {}",
              shard.path, shard.vocab_size, config.model.vocab_size);
  // The checkpoint's own tokenizer (sentencepiece: the model file it carries), so that bytes
  // are counted as the model's tokens decode.
  const auto tokenizer = checkpoint_tokenizer(folder, o.tokenizer_dir);
  OASES_CHECK(shard.vocab_size == tokenizer->vocab_size(),
              "data shard '{}' has a vocabulary of {} tokens but the tokenizer of checkpoint '{}' "
              "has {}: the shard was made with another {} model; evaluate on data prepared with "
              "the checkpoint's tokenizer",
              shard.path, shard.vocab_size, folder, tokenizer->vocab_size(), shard.tokenizer);

  check_host_memory(plan::make_run_plan(config, mesh.world_rank()), 1, "--batch-size per rank");
  TrainingEngine engine(config, parallel_groups(mesh));
  load_model_weights(folder, config.model, engine.model().layout(), engine.model().params());
  engine.model().refresh_compute_params();
  engine.shard_params();
  EvalResult result = evaluate_shard(engine, shard, *tokenizer, o.batches);
  result.checkpoint = folder;
  result.shard = shard.path;
  return result;
}

}  // namespace oases::train
