#include "generate/generate.h"

#include "core/buffer.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/timer.h"
#include "io/checkpoint_dir.h"
#include "model/incremental_decoder.h"
#include "train/checkpoint.h"
#include "train/host_memory.h"

#include <algorithm>
#include <optional>
#include <span>
#include <string_view>

namespace oases::generate {
namespace {

void check_generative(const plan::RunConfig& config, std::string_view source) {
  OASES_CHECK(!config.model.masked_lm(),
              "{} holds a model.arch = \"bert\" model, which predicts masked tokens from both "
              "sides and cannot continue a prompt; generate with a \"gpt\" or \"llama\" model",
              source);
}

// Next-token logits of a context, by one of the two paths. The context is tokens[begin, end)
// of the sample's sequence; `row` receives the logits of its last position.
class NextTokenLogits {
 public:
  NextTokenLogits(train::TrainingEngine& engine, bool kv_cache)
      : engine_(engine),
        dtype_(engine.model().dtype()),
        seq_(engine.config().model.seq_len),
        vocab_(engine.config().model.vocab_size) {
    if (kv_cache) {
      decoder_.emplace(engine.config().model, engine.model().layout(), engine.model().params());
      logits_buffer_ = Buffer(static_cast<std::size_t>(vocab_) * dtype_size(dtype_));
      logits_ = logits_buffer_.tensor(dtype_, {1, vocab_});
    } else {
      logits_buffer_ = Buffer(static_cast<std::size_t>(seq_ * vocab_) * dtype_size(dtype_));
      logits_ = logits_buffer_.tensor(dtype_, {seq_, vocab_});
      window_.assign(static_cast<std::size_t>(seq_), 0);
    }
  }

  // The context restarted at a new first token: cached positions no longer apply.
  void restart() {
    if (decoder_) decoder_->clear();
  }

  // REQUIRES: 0 < end - begin <= seq_len; the tokens before `end` unchanged since restart().
  void compute(std::span<const std::int32_t> context, std::span<double> row) {
    const auto length = static_cast<std::int64_t>(context.size());
    std::int64_t last = 0;  // row of logits_ holding the last position
    if (decoder_) {
      decoder_->append(context.subspan(static_cast<std::size_t>(decoder_->length())), logits_);
    } else {
      // Positions past the context are padding that causal attention keeps from influencing it.
      std::copy(context.begin(), context.end(), window_.begin());
      engine_.logits(window_.data(), logits_);
      last = length - 1;
    }
    for (std::size_t v = 0; v < row.size(); ++v) {
      const auto at = last * vocab_ + static_cast<std::int64_t>(v);
      row[v] = dtype_ == DType::f64 ? logits_.data<double>()[at]
                                    : static_cast<double>(logits_.data<float>()[at]);
    }
  }

 private:
  train::TrainingEngine& engine_;
  DType dtype_;
  std::int64_t seq_, vocab_;
  std::optional<model::IncrementalDecoder> decoder_;
  Buffer logits_buffer_;
  Tensor logits_;
  std::vector<std::int32_t> window_;
};

// Where the first stop string begins in `text`, looking only at occurrences that end past
// `checked` (the length already searched); npos if none.
std::size_t find_stop(const std::string& text, std::size_t checked,
                      const std::vector<std::string>& stops) {
  std::size_t first = std::string::npos;
  for (const std::string& stop : stops) {
    const std::size_t from = checked >= stop.size() ? checked - stop.size() + 1 : 0;
    first = std::min(first, text.find(stop, from));
  }
  return first;
}

}  // namespace

void validate(const GenerateOptions& o) {
  OASES_CHECK(o.max_new_tokens >= 0, "--max-new-tokens = {} must be >= 0", o.max_new_tokens);
  validate(o.sampling);
  OASES_CHECK(o.num_samples >= 1, "--num-samples = {} must be >= 1", o.num_samples);
  for (const std::string& stop : o.stops)
    OASES_CHECK(!stop.empty(), "--stop is an empty string; give the text that ends a sample");
  OASES_CHECK(o.slide_keep >= 0,
              "--slide-keep = {} must be >= 0 (0: half of model.seq_len; at most model.seq_len)",
              o.slide_keep);
}

Generation generate(train::TrainingEngine& engine, const data::Tokenizer& tokenizer,
                    const GenerateOptions& o) {
  validate(o);
  const plan::RunConfig& config = engine.config();
  check_generative(config, "the engine");
  OASES_ASSERT(engine.model().micro_batch() == 1 && engine.tp().size() == 1,
               "generation runs one sequence on one rank");
  const std::int64_t seq = config.model.seq_len;
  OASES_CHECK(o.slide_keep <= seq,
              "--slide-keep = {} must be at most model.seq_len = {} (the positions the model "
              "sees; 0: half of them)",
              o.slide_keep, seq);
  const std::int64_t keep = o.slide_keep > 0 ? o.slide_keep : std::max<std::int64_t>(1, seq / 2);
  // Tokens the tokenizer can decode and the model can predict.
  const std::int64_t vocab = std::min(tokenizer.vocab_size(), config.model.vocab_size);

  std::vector<std::int32_t> prompt = tokenizer.encode(o.prompt);
  if (prompt.empty()) prompt.push_back(tokenizer.end_of_document());
  for (const std::int32_t token : prompt)
    OASES_CHECK(token < config.model.vocab_size,
                "--prompt holds token {}, outside the model's vocabulary of {} "
                "(model.vocab_size); give text the model was trained on",
                token, config.model.vocab_size);
  NextTokenLogits next_token_logits(engine, o.kv_cache);
  TokenSampler sampler(o.sampling, vocab);
  std::vector<double> row(static_cast<std::size_t>(vocab));
  const PhiloxKey key = philox_key(o.seed, fnv1a64("generate"));

  Generation result;
  const Stopwatch timer;
  for (std::int64_t sample = 0; sample < o.num_samples; ++sample) {
    std::vector<std::int32_t> tokens = prompt;
    std::size_t begin = 0;  // the context's first token
    next_token_logits.restart();
    std::string continuation;
    for (std::int64_t i = 0; i < o.max_new_tokens; ++i) {
      const std::size_t length = tokens.size();
      if (static_cast<std::int64_t>(length - begin) > seq) {
        begin = length - static_cast<std::size_t>(keep);
        next_token_logits.restart();
      }
      next_token_logits.compute(std::span(tokens).subspan(begin), row);
      const PhiloxCounter r =
          philox4x32({static_cast<std::uint32_t>(length), static_cast<std::uint32_t>(length >> 32),
                      static_cast<std::uint32_t>(sample), 0},
                     key);
      tokens.push_back(sampler.sample(row, uniform_open0_f64(r[0], r[1])));
      ++result.new_tokens;
      if (o.stops.empty()) continue;
      const std::size_t checked = continuation.size();
      continuation = tokenizer.decode(std::span(tokens).subspan(prompt.size()));
      const std::size_t stop = find_stop(continuation, checked, o.stops);
      if (stop != std::string::npos) {
        continuation.resize(stop);
        break;
      }
    }
    if (o.stops.empty()) continuation = tokenizer.decode(std::span(tokens).subspan(prompt.size()));
    result.samples.push_back(o.prompt + continuation);
  }
  result.seconds = timer.seconds();
  return result;
}

Generation generate_text(const GenerateOptions& o) {
  validate(o);
  plan::RunConfig config = train::config_from_checkpoint(o.checkpoint);
  check_generative(config, fmt::format("checkpoint '{}'", o.checkpoint));
  config.train.micro_batch = 1;
  config.train.global_batch = 1;
  config.checkpoint = {};
  const auto tokenizer = train::checkpoint_tokenizer(o.checkpoint, o.tokenizer_dir);
  train::check_host_memory(plan::make_run_plan(config, 0));
  train::TrainingEngine engine(config);
  train::load_model_weights(o.checkpoint, config.model, engine.model().layout(),
                            engine.model().params());
  return generate(engine, *tokenizer, o);
}

}  // namespace oases::generate
