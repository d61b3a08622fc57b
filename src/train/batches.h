// The token batches a training run feeds its engine, from the data loader (data/loader.h):
// for causal language models (gpt, llama) each row is a window's first seq_len tokens and the
// targets its next tokens; for masked-language models (bert) each row is [CLS] + the window's
// first seq_len - 2 tokens + [SEP], with 15% of its text positions masked (data/mlm.h) and
// targets only there (-1 elsewhere). Training batch s draws its masks from stream s,
// validation batch i from stream 2^62 + i, so evaluation is the same every time.
#pragma once

#include "data/loader.h"
#include "plan/run_config.h"

#include <cstdint>
#include <vector>

namespace oases::train {

struct Batch {
  std::vector<std::int32_t> inputs, targets;  // [rows, seq_len]
};

class BatchMaker {
 public:
  // `loader` must outlive the maker. UserError when a masked model's vocabulary cannot hold
  // the tokenizer's tokens and the four special tokens.
  BatchMaker(const plan::RunConfig& config, const data::DataLoader& loader, std::int64_t data_vocab);

  // Rows [first_sample, first_sample + rows) of training step `step`.
  void training(std::int64_t step, std::int64_t first_sample, std::int64_t rows, Batch& out) const;
  // Rows of validation batch `index`.
  void validation(std::int64_t index, std::int64_t first_sample, std::int64_t rows,
                  Batch& out) const;

 private:
  void fill(std::int64_t batch, std::uint64_t mask_stream, std::int64_t first_sample,
            std::int64_t rows, Batch& out) const;

  const data::DataLoader& loader_;
  std::int64_t seq_len_;
  bool masked_;
  std::int64_t data_vocab_;
  std::uint64_t seed_;
};

}  // namespace oases::train
