// IncrementalDecoder: the forward pass of a causal language model (GPT, LLaMA) one position
// at a time, with a key/value cache, for generation. It reads the parameters of a whole model
// (one rank, no tensor parallelism: model_param_layout(config)) and builds its blocks from the
// same architecture description the training model uses (model/architecture.h), so both
// compute the same function: the logits of position t after appending tokens 0..t equal row t
// of the full forward pass over those tokens, up to rounding (checked in fp64 at relative
// 1e-10 by tests/model/incremental_decoder_test.cc).
//
// For every appended position and layer it computes q, k and v of that position only, appends
// k and v to the layer's cache ([kv_heads, seq_len, head_dim] each), attends over the cached
// positions (causal; grouped-query attention where kv_heads < heads; rotary embeddings at the
// position's absolute index) and runs the MLP on that row. A prompt is appended in one call
// (prefill); each further token costs one position.
//
// Positions are absolute: the cache holds at most model.seq_len positions, the number of
// learned positions (GPT) and rotary table rows (LLaMA). A caller that continues past that
// clears the cache and appends a later window of its tokens again (generate/generate.cc says
// which).
//
// Mixture-of-experts layers (token-choice gates) route each appended position on its own, as a
// group of one token with no capacity limit and no noise: a token's experts never depend on
// the tokens after it. Training and evaluation enforce capacities over whole groups, so where
// those drop tokens the decoder's logits differ from theirs. Expert-choice routing cannot run
// one position at a time (an expert picks among the whole group): an error.
//
// Without dropout; not thread-safe (one decoder per generating thread).
#pragma once

#include <optional>

#include "core/buffer.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "ops/attention.h"
#include "ops/embedding_segment.h"
#include "ops/head_segments.h"
#include "ops/layer_segments.h"

#include <cstdint>
#include <span>
#include <vector>

namespace oases::model {

class IncrementalDecoder {
 public:
  // REQUIRES: config.arch "gpt" or "llama" (UserError otherwise); `params` laid out by
  // `layout` == model_param_layout(config) (a tensor-parallel group of one), of element type
  // f32 or f64. Both must outlive the decoder; the decoder only reads them, so parameters
  // changed in place are used from the next append on (the cache is then stale: clear it).
  IncrementalDecoder(const ModelConfig& config, const ParamLayout& layout, const Tensor& params);
  IncrementalDecoder(const IncrementalDecoder&) = delete;
  IncrementalDecoder& operator=(const IncrementalDecoder&) = delete;

  DType dtype() const { return dtype_; }
  std::int64_t capacity() const { return config_.seq_len; }  // positions the cache holds
  std::int64_t length() const { return length_; }            // positions cached now

  // Forgets every cached position: the next append starts at position 0.
  void clear() { length_ = 0; }

  // Appends `tokens` at positions length() .. length() + n - 1 (n = tokens.size()) and writes
  // into logits [k, vocab_size] the logits of the last k of them (1 <= k <= n; k = 1 is the
  // next-token distribution, k = n every position's).
  // REQUIRES: n >= 1, length() + n <= capacity(), tokens in [0, vocab_size), logits of the
  // decoder's dtype.
  void append(std::span<const std::int32_t> tokens, const Tensor& logits);

 private:
  struct Layer {
    ops::AttentionSpec attention;
    ops::MlpSpec mlp;
    std::optional<ops::MoeSpec> moe;  // instead of mlp in an MoE layer
    Tensor attention_bias, mlp_bias;  // added after each block's output projection (or empty)
    Tensor keys, values;              // [kv_heads, capacity, head_dim]
  };

  void run_attention(Layer& layer, std::int64_t n);
  void run_mlp(const Layer& layer, std::int64_t n);
  template <class T>
  void run_moe(const Layer& layer, std::int64_t n);

  ModelConfig config_;
  DType dtype_;
  Arena arena_;
  ops::EmbeddingSpec embedding_;
  std::vector<Layer> layers_;
  ops::HeadSpec head_;
  Tensor rope_cos_, rope_sin_;  // [seq_len, head_dim / 2], or empty without rotary embeddings
  // Activations of up to capacity() rows: the residual stream, a norm's output and statistics,
  // q|k|v, attention output, a block's output projection, the MLP's input and activation.
  Tensor residual_, normed_, stats_, qkv_, attended_, projected_, mlp_in_, mlp_act_;
  // One position's router logits and expert activations (MoE layers only).
  Tensor router_logits_, expert_in_, expert_act_, expert_out_;
  std::int64_t length_ = 0;
};

}  // namespace oases::model
