#include "train/batches.h"

#include "core/error.h"
#include "data/mlm.h"

#include <algorithm>

namespace oases::train {

namespace {
constexpr std::uint64_t kValidationStreams = std::uint64_t{1} << 62;
}

BatchMaker::BatchMaker(const plan::RunConfig& config, const data::DataLoader& loader,
                       std::int64_t data_vocab, std::optional<data::MlmSpecialTokens> special)
    : loader_(loader),
      seq_len_(config.model.seq_len),
      masked_(config.model.masked_lm()),
      data_vocab_(data_vocab),
      special_(special.value_or(data::MlmSpecialTokens{})),
      seed_(static_cast<std::uint64_t>(config.train.seed)) {
  if (!masked_) return;
  OASES_CHECK(!loader.shard().has_loss_mask(),
              "data shard '{}' carries a loss mask (format version {}), but model.arch = \"bert\" "
              "chooses its own targets by masked-language modelling and cannot honour it; train "
              "a \"gpt\" or \"llama\" model on it, or give bert a shard prepared without a mask",
              loader.shard().path, loader.shard().version);
  if (special) {
    OASES_CHECK(config.model.vocab_size >= data_vocab,
                "model.vocab_size = {} is smaller than the data's vocabulary of {} tokens",
                config.model.vocab_size, data_vocab);
    return;
  }
  special_ = data::mlm_special_tokens(data_vocab);
  OASES_CHECK(config.model.vocab_size >= data_vocab + 4,
              "model.vocab_size = {} is too small for masked-language modelling on data with a "
              "vocabulary of {}: the special tokens [MASK], [CLS], [SEP] and [PAD] follow the "
              "tokenizer's tokens; set model.vocab_size to at least {}",
              config.model.vocab_size, data_vocab, data_vocab + 4);
}

void BatchMaker::training(std::int64_t step, std::int64_t first_sample, std::int64_t rows,
                          Batch& out) const {
  fill(step, static_cast<std::uint64_t>(step), first_sample, rows, out);
}

void BatchMaker::validation(std::int64_t index, std::int64_t first_sample, std::int64_t rows,
                            Batch& out) const {
  fill(index, kValidationStreams + static_cast<std::uint64_t>(index), first_sample, rows, out);
}

std::int64_t BatchMaker::validation_targets(std::int64_t index) const {
  const std::int64_t rows = loader_.global_batch();
  if (!masked_) return loader_.counted_targets(index, 0, rows);
  // The masked positions are drawn per row: make the whole batch and count them.
  Batch whole;
  validation(index, 0, rows, whole);
  return std::count_if(whole.targets.begin(), whole.targets.end(),
                       [](std::int32_t t) { return t >= 0; });
}

void BatchMaker::fill(std::int64_t batch, std::uint64_t mask_stream, std::int64_t first_sample,
                      std::int64_t rows, Batch& out) const {
  const auto size = static_cast<std::size_t>(rows * seq_len_);
  out.inputs.resize(size);
  out.targets.resize(size);
  loader_.fill(batch, first_sample, rows, out.inputs.data(), out.targets.data());
  if (!masked_) return;
  // The window's first seq_len - 2 tokens become the text between [CLS] and [SEP].
  std::vector<std::int32_t> text(static_cast<std::size_t>(rows * (seq_len_ - 2)));
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy_n(out.inputs.begin() + r * seq_len_, seq_len_ - 2, text.begin() + r * (seq_len_ - 2));
  data::mlm_mask(text.data(), rows, seq_len_, data_vocab_, special_, seed_, mask_stream,
                 first_sample, out.inputs.data(), out.targets.data());
}

}  // namespace oases::train
