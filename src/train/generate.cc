#include "train/generate.h"

#include "core/error.h"
#include "core/philox.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "core/buffer.h"
#include "data/tokenizer.h"
#include "io/checkpoint_dir.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace oases::train {

std::string generate_text(const GenerateOptions& o) {
  OASES_CHECK(o.max_new_tokens >= 0, "--max-new-tokens = {} must be >= 0", o.max_new_tokens);
  OASES_CHECK(o.temperature >= 0, "--temperature = {} must be >= 0 (0: greedy)", o.temperature);
  OASES_CHECK(o.top_k >= 0, "--top-k = {} must be >= 0 (0: no limit)", o.top_k);
  RunConfig config = config_from_checkpoint(o.checkpoint);
  OASES_CHECK(config.model.arch != "bert",
              "checkpoint '{}' holds a model.arch = \"bert\" model, which predicts masked tokens "
              "from both sides and cannot continue a prompt; generate with a \"gpt\" or \"llama\" "
              "checkpoint",
              o.checkpoint);
  config.train.micro_batch = 1;
  config.train.global_batch = 1;
  config.checkpoint = {};
  const auto tokenizer = data::make_tokenizer(config.data.tokenizer, o.tokenizer_dir);
  TrainingEngine engine(config);
  load_model_weights(io::resolve_model_file(o.checkpoint), engine.model().layout(),
                     engine.model().params());

  std::vector<std::int32_t> tokens = tokenizer->encode(o.prompt);
  OASES_CHECK(!tokens.empty(), "--prompt is empty; give at least one character to continue");
  const std::int64_t seq = config.model.seq_len, vocab = config.model.vocab_size;
  std::vector<std::int32_t> window(static_cast<std::size_t>(seq), 0);
  const DType dtype = engine.model().dtype();
  const Buffer logits_buffer(static_cast<std::size_t>(seq * vocab) * dtype_size(dtype));
  const Tensor logits = logits_buffer.tensor(dtype, {seq, vocab});
  std::vector<double> row(static_cast<std::size_t>(vocab));
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::vector<double> probs(static_cast<std::size_t>(vocab));
  const PhiloxKey key = philox_key(o.seed, fnv1a64("generate"));
  const std::int64_t sampled_vocab = std::min<std::int64_t>(vocab, tokenizer->vocab_size());

  for (std::int64_t i = 0; i < o.max_new_tokens; ++i) {
    // The model sees the last `seq` tokens at positions 0..len-1; later positions are padding
    // that causal attention keeps from influencing them.
    const auto len = std::min<std::int64_t>(seq, static_cast<std::int64_t>(tokens.size()));
    std::copy(tokens.end() - len, tokens.end(), window.begin());
    engine.logits(window.data(), logits);
    for (std::int64_t v = 0; v < vocab; ++v)
      row[static_cast<std::size_t>(v)] =
          dtype == DType::f64 ? logits.data<double>()[(len - 1) * vocab + v]
                              : static_cast<double>(logits.data<float>()[(len - 1) * vocab + v]);

    std::iota(order.begin(), order.begin() + sampled_vocab, 0);
    std::int64_t candidates = o.top_k > 0 ? std::min(o.top_k, sampled_vocab) : sampled_vocab;
    if (o.temperature == 0) candidates = 1;
    std::partial_sort(order.begin(), order.begin() + candidates, order.begin() + sampled_vocab,
                      [&](std::int32_t a, std::int32_t b) { return row[a] > row[b]; });
    std::int32_t next = order[0];
    if (candidates > 1) {
      const double top = row[order[0]];
      double total = 0;
      for (std::int64_t c = 0; c < candidates; ++c) {
        probs[static_cast<std::size_t>(c)] = std::exp((row[order[static_cast<std::size_t>(c)]] - top) / o.temperature);
        total += probs[static_cast<std::size_t>(c)];
      }
      const auto u = static_cast<std::uint64_t>(tokens.size());
      const PhiloxCounter r = philox4x32({static_cast<std::uint32_t>(u), static_cast<std::uint32_t>(u >> 32), 0, 0}, key);
      double target = uniform_open0_f64(r[0], r[1]) * total;
      for (std::int64_t c = 0; c < candidates; ++c) {
        next = order[static_cast<std::size_t>(c)];
        target -= probs[static_cast<std::size_t>(c)];
        if (target <= 0) break;
      }
    }
    tokens.push_back(next);
  }
  return tokenizer->decode(tokens);
}

}  // namespace oases::train
