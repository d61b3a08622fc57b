#include "ops/gpt_segments.h"

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace oases::ops {
namespace k = oases::kernels::cpu;

namespace {

std::string layer_prefix(std::int64_t layer) { return "h." + std::to_string(layer) + "."; }

k::DropoutSite dropout_site(const GptState& s, const StepContext& ctx, std::int64_t layer,
                            std::uint32_t site) {
  return {s.seed, static_cast<std::uint32_t>(ctx.step), static_cast<std::uint32_t>(layer), site};
}

double dropout_p(const GptState& s, const StepContext& ctx) {
  return ctx.dropout_enabled ? s.config.dropout : 0.0;
}

k::DropoutSlice slice_of(const StepContext& ctx, int micro_batch) {
  return {ctx.micro_batches[static_cast<std::size_t>(micro_batch)].global_sample_offset, 0};
}

// The bias + dropout + residual add that follows a reduced partial sum:
//   out = residual + dropout(partial + bias)     (residual null: out = dropout(partial + bias))
// and its backward: d_partial = dropout(d_out), d_bias += sum(d_partial); the residual's
// gradient is d_out itself, which stays in d_residual.
struct Epilogue {
  const float* residual = nullptr;  // null for the first layer (embedding output has no residual)
  std::string bias_name;            // empty: no bias (the embedding)
  std::int64_t dropout_layer = 0;
  std::uint32_t dropout_site_id = 0;

  void forward(const GptState& s, const StepContext& ctx, int mb, float* out) const {
    const auto& c = s.config;
    const float* bias = bias_name.empty() ? nullptr : s.param(bias_name);
    if (residual == nullptr) {
      // out = dropout(partial + bias); a zero residual keeps one kernel for both cases.
      k::dropout_apply(s.partial, out, s.micro_batch, c.seq_len, c.hidden, dropout_p(s, ctx),
                       dropout_site(s, ctx, dropout_layer, dropout_site_id), slice_of(ctx, mb));
      OASES_ASSERT(bias == nullptr, "embedding epilogue has no bias");
      return;
    }
    k::bias_dropout_add_forward(s.partial, bias, residual, out, s.micro_batch, c.seq_len,
                                c.hidden, dropout_p(s, ctx),
                                dropout_site(s, ctx, dropout_layer, dropout_site_id),
                                slice_of(ctx, mb));
  }

  void backward(const GptState& s, const StepContext& ctx, int mb) const {
    const auto& c = s.config;
    float* dbias = bias_name.empty() ? nullptr : s.grad(bias_name);
    k::bias_dropout_add_backward(s.d_residual, s.d_partial, dbias, s.micro_batch, c.seq_len,
                                 c.hidden, dropout_p(s, ctx),
                                 dropout_site(s, ctx, dropout_layer, dropout_site_id),
                                 slice_of(ctx, mb));
  }
};

class EmbeddingSegment final : public Segment {
 public:
  explicit EmbeddingSegment(GptState& s) : s_(s) {}
  const std::string& name() const override { return name_; }

  void forward(const StepContext& ctx, int mb) override {
    const auto& c = s_.config;
    // Vocab-parallel: each rank looks up the tokens of its slice; positions are added once
    // (by rank 0) so that the reduction over the group sums to wte[token] + wpe[t].
    k::embedding_forward(ctx.micro_batches[static_cast<std::size_t>(mb)].inputs,
                         s_.param("wte.weight"), s_.tp_rank() == 0 ? s_.param("wpe.weight") : nullptr,
                         s_.partial, s_.micro_batch, c.seq_len, c.hidden, vocab_range());
  }
  int backward_stages() const override { return 1; }
  void backward(const StepContext& ctx, int mb, int /*stage*/) override {
    const auto& c = s_.config;
    // d_partial is whole on every rank, so every rank forms the same wpe gradient.
    k::embedding_backward(s_.d_partial, ctx.micro_batches[static_cast<std::size_t>(mb)].inputs,
                          s_.grad("wte.weight"), s_.grad("wpe.weight"), s_.micro_batch,
                          c.seq_len, c.hidden, vocab_range());
  }
  Tensor forward_collective_buffer() override {
    return Tensor::of(s_.partial, {s_.tokens(), s_.config.hidden});
  }

 private:
  k::VocabRange vocab_range() const {
    return {s_.vocab_begin(), s_.vocab_begin() + s_.local_vocab_valid()};
  }

  GptState& s_;
  std::string name_ = "embedding";
};

class AttentionSegment final : public Segment {
 public:
  AttentionSegment(GptState& s, Arena& arena, std::int64_t layer, const float* prev_residual)
      : s_(s), layer_(layer), name_("attention." + std::to_string(layer)) {
    const std::int64_t n = s.tokens(), C = s.config.hidden;
    residual_ = arena.allocate<float>(static_cast<std::size_t>(n * C));
    ln_out_ = arena.allocate<float>(static_cast<std::size_t>(n * C));
    ln_mean_ = arena.allocate<float>(static_cast<std::size_t>(n));
    ln_rstd_ = arena.allocate<float>(static_cast<std::size_t>(n));
    qkv_ = arena.allocate<float>(static_cast<std::size_t>(n * 3 * s.local_attention_width()));
    attn_out_ = arena.allocate<float>(static_cast<std::size_t>(n * s.local_attention_width()));
    lse_ = arena.allocate<float>(static_cast<std::size_t>(n * s.local_heads()));
    const std::string p = layer_prefix(layer);
    if (layer == 0) {
      epilogue_ = {nullptr, "", s.config.layers, kDropoutSiteEmbedding};
    } else {
      epilogue_ = {prev_residual, layer_prefix(layer - 1) + "mlp.c_proj.bias", layer - 1,
                   kDropoutSiteMlp};
    }
  }
  const float* residual_out() const { return residual_; }
  const std::string& name() const override { return name_; }

  void forward(const StepContext& ctx, int mb) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, A = s_.local_attention_width();
    const std::string p = layer_prefix(layer_);
    epilogue_.forward(s_, ctx, mb, residual_);
    k::layernorm_forward(residual_, s_.param(p + "ln_1.weight"), s_.param(p + "ln_1.bias"),
                         ln_out_, ln_mean_, ln_rstd_, n, C, c.layernorm_eps);
    // Column-parallel QKV: this rank's heads only.
    k::linear_forward(ln_out_, s_.param(p + "attn.c_attn.weight"),
                      s_.param(p + "attn.c_attn.bias"), qkv_, n, C, 3 * A);
    k::attention_forward(qkv_, attn_out_, lse_, s_.micro_batch, c.seq_len, s_.local_heads(),
                         c.head_dim());
    // Row-parallel projection: partial sums; the bias is added after the reduction.
    k::linear_forward(attn_out_, s_.param(p + "attn.c_proj.weight"), nullptr, s_.partial, n, A,
                      C);
  }

  int backward_stages() const override { return 2; }
  void backward(const StepContext& ctx, int mb, int stage) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, A = s_.local_attention_width();
    const std::string p = layer_prefix(layer_);
    if (stage == 0) {
      // d_partial holds d(P_l), whole on every rank.
      float* d_attn = scratch_attn();
      k::linear_backward(s_.d_partial, attn_out_, s_.param(p + "attn.c_proj.weight"), d_attn,
                         s_.grad(p + "attn.c_proj.weight"), nullptr, n, A, C);
      float* d_qkv = scratch_qkv();
      k::attention_backward(d_attn, qkv_, attn_out_, lse_, d_qkv, s_.micro_batch, c.seq_len,
                            s_.local_heads(), c.head_dim());
      // This rank's heads contribute a partial gradient of LN1's output; the group sums it.
      k::linear_backward(d_qkv, ln_out_, s_.param(p + "attn.c_attn.weight"), d_ln_out(),
                         s_.grad(p + "attn.c_attn.weight"), s_.grad(p + "attn.c_attn.bias"), n,
                         C, 3 * A);
      // The key bias adds the same q.b_k to every score of a row, which softmax ignores: its
      // gradient is exactly zero. The sum computed above is rounding noise, different under
      // every layout, that AdamW would turn into lr-sized steps; the exact value is kept.
      float* key_bias_grad = s_.grad(p + "attn.c_attn.bias") + A;
      std::fill(key_bias_grad, key_bias_grad + A, 0.0f);
      return;
    }
    // stage 1: LN1 backward onto the residual gradient, then the epilogue that produced r_l.
    float* d_ln_in = scratch_attn();
    k::layernorm_backward(d_ln_out(), residual_, s_.param(p + "ln_1.weight"), ln_mean_,
                          ln_rstd_, d_ln_in, s_.grad(p + "ln_1.weight"),
                          s_.grad(p + "ln_1.bias"), n, C);
    k::add(s_.d_residual, d_ln_in, s_.d_residual, n * C);
    epilogue_.backward(s_, ctx, mb);
  }

  Tensor forward_collective_buffer() override {
    return Tensor::of(s_.partial, {s_.tokens(), s_.config.hidden});
  }
  Tensor backward_collective_buffer() override {
    return Tensor::of(d_ln_out(), {s_.tokens(), s_.config.hidden});
  }

  // Gradient scratch shared by all layers (one segment runs backward at a time).
  float* scratch_d_attn = nullptr;  // [n, C]
  float* scratch_d_qkv = nullptr;   // [n, 3C]
  float* scratch_d_ln = nullptr;    // [n, C]

 private:
  float* scratch_attn() const { return scratch_d_attn; }
  float* scratch_qkv() const { return scratch_d_qkv; }
  float* d_ln_out() const { return scratch_d_ln; }

  GptState& s_;
  std::int64_t layer_;
  std::string name_;
  Epilogue epilogue_;
  float* residual_ = nullptr;  // r_l [n, C]
  float* ln_out_ = nullptr;
  float* ln_mean_ = nullptr;
  float* ln_rstd_ = nullptr;
  float* qkv_ = nullptr;       // [n, 3C]
  float* attn_out_ = nullptr;  // [n, C]
  float* lse_ = nullptr;       // [B, heads, seq]
};

class MlpSegment final : public Segment {
 public:
  MlpSegment(GptState& s, Arena& arena, std::int64_t layer, const float* attn_residual)
      : s_(s), layer_(layer), name_("mlp." + std::to_string(layer)) {
    const std::int64_t n = s.tokens(), C = s.config.hidden, F = s.local_ffn();
    residual_ = arena.allocate<float>(static_cast<std::size_t>(n * C));
    ln_out_ = arena.allocate<float>(static_cast<std::size_t>(n * C));
    ln_mean_ = arena.allocate<float>(static_cast<std::size_t>(n));
    ln_rstd_ = arena.allocate<float>(static_cast<std::size_t>(n));
    fc_pre_ = arena.allocate<float>(static_cast<std::size_t>(n * F));
    fc_act_ = arena.allocate<float>(static_cast<std::size_t>(n * F));
    epilogue_ = {attn_residual, layer_prefix(layer) + "attn.c_proj.bias", layer,
                 kDropoutSiteAttention};
  }
  const float* residual_out() const { return residual_; }
  const std::string& name() const override { return name_; }

  void forward(const StepContext& ctx, int mb) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, F = s_.local_ffn();
    const std::string p = layer_prefix(layer_);
    epilogue_.forward(s_, ctx, mb, residual_);
    k::layernorm_forward(residual_, s_.param(p + "ln_2.weight"), s_.param(p + "ln_2.bias"),
                         ln_out_, ln_mean_, ln_rstd_, n, C, c.layernorm_eps);
    k::linear_forward(ln_out_, s_.param(p + "mlp.c_fc.weight"), s_.param(p + "mlp.c_fc.bias"),
                      fc_pre_, n, C, F);
    k::gelu_forward(fc_pre_, fc_act_, n * F);
    k::linear_forward(fc_act_, s_.param(p + "mlp.c_proj.weight"), nullptr, s_.partial, n, F, C);
  }

  int backward_stages() const override { return 2; }
  void backward(const StepContext& ctx, int mb, int stage) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, F = s_.local_ffn();
    const std::string p = layer_prefix(layer_);
    if (stage == 0) {
      float* d_act = scratch_d_ffn;
      k::linear_backward(s_.d_partial, fc_act_, s_.param(p + "mlp.c_proj.weight"), d_act,
                         s_.grad(p + "mlp.c_proj.weight"), nullptr, n, F, C);
      k::gelu_backward(fc_pre_, d_act, d_act, n * F);
      k::linear_backward(d_act, ln_out_, s_.param(p + "mlp.c_fc.weight"), scratch_d_ln,
                         s_.grad(p + "mlp.c_fc.weight"), s_.grad(p + "mlp.c_fc.bias"), n, C, F);
      return;
    }
    float* d_ln_in = scratch_d_attn;
    k::layernorm_backward(scratch_d_ln, residual_, s_.param(p + "ln_2.weight"), ln_mean_,
                          ln_rstd_, d_ln_in, s_.grad(p + "ln_2.weight"),
                          s_.grad(p + "ln_2.bias"), n, C);
    k::add(s_.d_residual, d_ln_in, s_.d_residual, n * C);
    epilogue_.backward(s_, ctx, mb);
  }

  Tensor forward_collective_buffer() override {
    return Tensor::of(s_.partial, {s_.tokens(), s_.config.hidden});
  }
  Tensor backward_collective_buffer() override {
    return Tensor::of(scratch_d_ln, {s_.tokens(), s_.config.hidden});
  }

  float* scratch_d_ffn = nullptr;   // [n, F]
  float* scratch_d_ln = nullptr;    // [n, C]
  float* scratch_d_attn = nullptr;  // [n, C]

 private:
  GptState& s_;
  std::int64_t layer_;
  std::string name_;
  Epilogue epilogue_;
  float* residual_ = nullptr;  // h_l [n, C]
  float* ln_out_ = nullptr;
  float* ln_mean_ = nullptr;
  float* ln_rstd_ = nullptr;
  float* fc_pre_ = nullptr;    // [n, F]
  float* fc_act_ = nullptr;    // [n, F]
};

// LN_f, the tied LM head and the loss. In training the logits are processed in row chunks:
// each chunk's logits are formed, turned into their gradient in place, and immediately used
// for d(LN_f out) and d(wte), so the full [n, V] logits never exist at once.
//
// Under tensor parallelism each rank holds a slice of the vocabulary (vocab-parallel
// cross-entropy): per chunk, the row maxima and then the sums of exponentials and the target
// logits are reduced over the group (blocking, inside the segment), and d(LN_f out) is a
// partial sum reduced by the segment's backward collective.
class HeadSegment final : public Segment {
 public:
  static constexpr std::int64_t kRowsPerChunk = 256;

  HeadSegment(GptState& s, Arena& arena, LossAccumulator& loss, const float* last_residual)
      : s_(s), loss_(loss) {
    const std::int64_t n = s.tokens(), C = s.config.hidden, V = s.local_vocab_rows();
    const std::int64_t L = s.config.layers;
    residual_ = arena.allocate<float>(static_cast<std::size_t>(n * C));
    ln_out_ = arena.allocate<float>(static_cast<std::size_t>(n * C));
    ln_mean_ = arena.allocate<float>(static_cast<std::size_t>(n));
    ln_rstd_ = arena.allocate<float>(static_cast<std::size_t>(n));
    d_ln_out_ = arena.allocate<float>(static_cast<std::size_t>(n * C));
    const std::int64_t chunk = std::min(kRowsPerChunk, n);
    logits_ = arena.allocate<float>(static_cast<std::size_t>(chunk * V));
    row_losses_ = arena.allocate<float>(static_cast<std::size_t>(chunk));
    row_max_ = arena.allocate<float>(static_cast<std::size_t>(chunk));
    row_sums_ = arena.allocate<float>(static_cast<std::size_t>(2 * chunk));
    epilogue_ = {last_residual, layer_prefix(L - 1) + "mlp.c_proj.bias", L - 1, kDropoutSiteMlp};
  }
  const std::string& name() const override { return name_; }

  void forward(const StepContext& ctx, int mb) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, V = s_.local_vocab_rows();
    OASES_ASSERT(ctx.head_mode != HeadMode::logits || s_.tp_size() == 1,
                 "whole logits are produced by a single rank only");
    epilogue_.forward(s_, ctx, mb, residual_);
    k::layernorm_forward(residual_, s_.param("ln_f.weight"), s_.param("ln_f.bias"), ln_out_,
                         ln_mean_, ln_rstd_, n, C, c.layernorm_eps);
    const float* wte = s_.param("wte.weight");
    const auto& data = ctx.micro_batches[static_cast<std::size_t>(mb)];
    const std::int64_t chunk = std::min(kRowsPerChunk, n);
    const bool train = ctx.head_mode == HeadMode::train;
    for (std::int64_t row = 0; row < n; row += chunk) {
      const std::int64_t rows = std::min(chunk, n - row);
      const float* x = ln_out_ + row * C;
      float* logits = ctx.head_mode == HeadMode::logits ? ctx.logits_out + row * V : logits_;
      // logits[rows, V] = x[rows, C] @ wte^T  (this rank's vocabulary rows)
      k::gemm(k::Trans::no, k::Trans::yes, rows, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V);
      if (ctx.head_mode == HeadMode::logits) continue;
      const std::int32_t* targets = data.targets + row;
      if (s_.tp_size() == 1) {
        if (train)
          k::cross_entropy_forward_backward(logits, targets, row_losses_, rows, V, V,
                                            ctx.loss_gradient_scale);
        else
          k::cross_entropy_forward(logits, targets, row_losses_, rows, V, V);
      } else {
        vocab_parallel_cross_entropy(logits, targets, rows, ctx.loss_gradient_scale, train);
      }
      if (train) {
        // d(ln_out)[rows, C] = dlogits @ wte;  d(wte) += dlogits^T @ x
        k::gemm(k::Trans::no, k::Trans::no, rows, C, V, 1.0f, logits, V, wte, C, 0.0f,
                d_ln_out_ + row * C, C);
        k::gemm(k::Trans::yes, k::Trans::no, V, C, rows, 1.0f, logits, V, x, C, 1.0f,
                s_.grad("wte.weight"), C);
      }
      double chunk_sum = 0;
      for (std::int64_t i = 0; i < rows; ++i) chunk_sum += row_losses_[i];
      loss_.sum += chunk_sum;
      loss_.count += rows;
    }
  }

  // Stage 0 has nothing left to do (the logits' gradient was formed in forward); between the
  // stages the group sums d(LN_f out); stage 1 is LN_f's backward and the epilogue's.
  int backward_stages() const override { return 2; }
  void backward(const StepContext& ctx, int mb, int stage) override {
    OASES_ASSERT(ctx.head_mode == HeadMode::train, "backward needs HeadMode::train");
    if (stage == 0) return;
    const std::int64_t n = s_.tokens(), C = s_.config.hidden;
    k::layernorm_backward(d_ln_out_, residual_, s_.param("ln_f.weight"), ln_mean_, ln_rstd_,
                          s_.d_residual, s_.grad("ln_f.weight"), s_.grad("ln_f.bias"), n, C);
    epilogue_.backward(s_, ctx, mb);
  }
  Tensor backward_collective_buffer() override {
    return Tensor::of(d_ln_out_, {s_.tokens(), s_.config.hidden});
  }

 private:
  void vocab_parallel_cross_entropy(float* logits, const std::int32_t* targets,
                                    std::int64_t rows, float grad_scale, bool gradient) {
    const std::int64_t V = s_.local_vocab_rows(), valid = s_.local_vocab_valid();
    const std::int64_t begin = s_.vocab_begin();
    float* sum_exp = row_sums_;
    float* target_logit = row_sums_ + rows;
    if (valid > 0) {
      k::cross_entropy_shard_max(logits, rows, valid, V, row_max_);
    } else {
      std::fill(row_max_, row_max_ + rows, -std::numeric_limits<float>::infinity());
    }
    s_.tp->all_reduce(Tensor::of(row_max_, {rows}), comm::ReduceOp::max);
    if (valid > 0) {
      k::cross_entropy_shard_sums(logits, targets, begin, row_max_, rows, valid, V, sum_exp,
                                  target_logit);
    } else {
      std::fill(row_sums_, row_sums_ + 2 * rows, 0.0f);
    }
    s_.tp->all_reduce(Tensor::of(row_sums_, {2 * rows}), comm::ReduceOp::sum);
    if (valid > 0) {
      k::cross_entropy_shard_finish(logits, targets, begin, row_max_, sum_exp, target_logit, rows,
                                    valid, V, grad_scale, row_losses_, gradient);
    } else {
      for (std::int64_t i = 0; i < rows; ++i)
        row_losses_[i] = std::log(sum_exp[i]) + row_max_[i] - target_logit[i];
      if (gradient) std::fill(logits, logits + rows * V, 0.0f);
    }
  }

  GptState& s_;
  LossAccumulator& loss_;
  std::string name_ = "head";
  Epilogue epilogue_;
  float* residual_ = nullptr;  // r_L [n, C]
  float* ln_out_ = nullptr;
  float* ln_mean_ = nullptr;
  float* ln_rstd_ = nullptr;
  float* d_ln_out_ = nullptr;
  float* logits_ = nullptr;    // [chunk, V_local] scratch
  float* row_losses_ = nullptr;
  float* row_max_ = nullptr;   // [chunk]
  float* row_sums_ = nullptr;  // [2, chunk]: sums of exponentials, target logits
};

}  // namespace

std::vector<std::unique_ptr<Segment>> build_gpt_segments(GptState& s, LossAccumulator& loss,
                                                         Arena& arena) {
  s.config.validate();
  OASES_ASSERT(s.micro_batch >= 1 && s.layout && s.params && s.grads && s.tp, "incomplete GptState");
  s.config.validate_tensor_parallel(s.tp_size());
  const std::int64_t n = s.tokens(), C = s.config.hidden, F = s.config.ffn_hidden;
  s.partial = arena.allocate<float>(static_cast<std::size_t>(n * C));
  s.d_partial = arena.allocate<float>(static_cast<std::size_t>(n * C));
  s.d_residual = arena.allocate<float>(static_cast<std::size_t>(n * C));
  // Gradient scratch shared by every layer: backward runs one segment at a time per instance.
  float* d_ln = arena.allocate<float>(static_cast<std::size_t>(n * C));
  float* d_attn = arena.allocate<float>(static_cast<std::size_t>(n * C));
  float* d_wide = arena.allocate<float>(static_cast<std::size_t>(n * std::max(3 * C, F)));

  std::vector<std::unique_ptr<Segment>> segments;
  segments.push_back(std::make_unique<EmbeddingSegment>(s));
  const float* residual = nullptr;
  for (std::int64_t l = 0; l < s.config.layers; ++l) {
    auto attention = std::make_unique<AttentionSegment>(s, arena, l, residual);
    attention->scratch_d_attn = d_attn;
    attention->scratch_d_qkv = d_wide;
    attention->scratch_d_ln = d_ln;
    auto mlp = std::make_unique<MlpSegment>(s, arena, l, attention->residual_out());
    mlp->scratch_d_ffn = d_wide;
    mlp->scratch_d_ln = d_ln;
    mlp->scratch_d_attn = d_attn;
    residual = mlp->residual_out();
    segments.push_back(std::move(attention));
    segments.push_back(std::move(mlp));
  }
  segments.push_back(std::make_unique<HeadSegment>(s, arena, loss, residual));
  return segments;
}

}  // namespace oases::ops
