// The token batches a training run feeds its engine, from the data loader (data/loader.h):
// for causal language models (gpt, llama) each row is a window's first seq_len tokens and the
// targets its next tokens, -1 (not counted) where the shard's loss mask leaves a token out
// (data/token_shard.h); for masked-language models (bert) each row is [CLS] + the window's
// first seq_len - 2 tokens + [SEP], with 15% of its text positions masked (data/mlm.h) and
// targets only there (-1 elsewhere). Training batch s draws its masks from stream s,
// validation batch i from stream 2^62 + i, so evaluation is the same every time.
//
// One loss rule for both (train/engine.h): a batch's loss is the mean cross-entropy over its
// counted targets (those >= 0) of the whole global batch, whatever micro-batches and data-
// parallel ranks it is split over; its gradient is that mean's. A global batch with no counted
// target has loss 0 and a zero gradient (the optimizer still steps: its moments decay and
// weight decay applies). Tokens per second and the `tokens` of the metrics count every token
// the model reads, counted as a target or not. A validation pass over several batches is the
// mean over all their counted targets (validation_targets weighs each batch's mean).
#pragma once

#include "data/loader.h"
#include "data/mlm.h"
#include "plan/run_config.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace oases::train {

struct Batch {
  std::vector<std::int32_t> inputs, targets;  // [rows, seq_len]
};

class BatchMaker {
 public:
  // `loader` must outlive the maker. UserError when a masked model's vocabulary cannot hold
  // the tokenizer's tokens and the four special tokens, or when a masked model is given a
  // shard with a loss mask: masked-language modelling chooses its own targets, and a mask
  // meant for next-token prediction (say, the assistant's turns) has no meaning there.
  // `special`: the masked-language model's special tokens in the tokenizer's own vocabulary
  // (data::tokenizer_mlm_special_tokens); unset, they follow the data's vocabulary.
  BatchMaker(const plan::RunConfig& config, const data::DataLoader& loader, std::int64_t data_vocab,
             std::optional<data::MlmSpecialTokens> special = std::nullopt);

  // Rows [first_sample, first_sample + rows) of training step `step`.
  void training(std::int64_t step, std::int64_t first_sample, std::int64_t rows, Batch& out) const;
  // Rows of validation batch `index`.
  void validation(std::int64_t index, std::int64_t first_sample, std::int64_t rows,
                  Batch& out) const;
  // Counted targets (>= 0) of the whole global validation batch `index`: the weight of its
  // mean loss in a validation pass.
  std::int64_t validation_targets(std::int64_t index) const;

 private:
  void fill(std::int64_t batch, std::uint64_t mask_stream, std::int64_t first_sample,
            std::int64_t rows, Batch& out) const;

  const data::DataLoader& loader_;
  std::int64_t seq_len_;
  bool masked_;
  std::int64_t data_vocab_;
  data::MlmSpecialTokens special_;
  std::uint64_t seed_;
};

}  // namespace oases::train
