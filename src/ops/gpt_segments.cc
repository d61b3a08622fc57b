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
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

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

// The sequences of sub-batch sb of micro-batch mb.
struct SubBatch {
  const std::int32_t* inputs = nullptr;
  const std::int32_t* targets = nullptr;
  std::int64_t first_sample = 0;  // global index of its first sequence
  std::int64_t first_token = 0;   // index of its first token within the micro-batch
};

SubBatch sub_batch(const GptState& s, const StepContext& ctx, int mb, int sb) {
  const MicroBatchData& data = ctx.micro_batches[static_cast<std::size_t>(mb)];
  const std::int64_t first_token = sb * s.tokens();
  return {data.inputs + first_token, data.targets ? data.targets + first_token : nullptr,
          data.global_sample_offset + sb * s.rows, first_token};
}

k::DropoutSlice slice_of(const GptState& s, const StepContext& ctx, int mb, int sb) {
  return {sub_batch(s, ctx, mb, sb).first_sample, 0};
}

// The bias + dropout + residual add that follows a reduced partial sum:
//   out = residual + dropout(partial + bias)     (no residual: out = dropout(partial + bias))
// and its backward: d_partial = dropout(d_out), d_bias += sum(d_partial); the residual's
// gradient is d_out itself, which stays in d_residual.
struct Epilogue {
  int residual_segment = -1;        // whose checkpoint is the residual (-1: none, after the embedding)
  std::string bias_name;            // empty: no bias (the embedding)
  std::int64_t dropout_layer = 0;
  std::uint32_t dropout_site_id = 0;

  void forward(const GptState& s, const StepContext& ctx, int mb, int sb, float* out) const {
    const auto& c = s.config;
    const GptState::Ports& port = s.ports[static_cast<std::size_t>(sb)];
    const float* bias = bias_name.empty() ? nullptr : s.param(bias_name);
    const k::DropoutSite site = dropout_site(s, ctx, dropout_layer, dropout_site_id);
    if (residual_segment < 0) {
      OASES_ASSERT(bias == nullptr, "embedding epilogue has no bias");
      k::dropout_apply(port.partial, out, s.rows, c.seq_len, c.hidden, dropout_p(s, ctx), site,
                       slice_of(s, ctx, mb, sb));
      return;
    }
    const float* residual = s.store->get({residual_segment, mb, sb, kCheckpoint});
    k::bias_dropout_add_forward(port.partial, bias, residual, out, s.rows, c.seq_len, c.hidden,
                                dropout_p(s, ctx), site, slice_of(s, ctx, mb, sb));
  }

  void backward(const GptState& s, const StepContext& ctx, int mb, int sb) const {
    const auto& c = s.config;
    const GptState::Ports& port = s.ports[static_cast<std::size_t>(sb)];
    float* dbias = bias_name.empty() ? nullptr : s.grad(bias_name);
    k::bias_dropout_add_backward(port.d_residual, port.d_partial, dbias, s.rows, c.seq_len,
                                 c.hidden, dropout_p(s, ctx),
                                 dropout_site(s, ctx, dropout_layer, dropout_site_id),
                                 slice_of(s, ctx, mb, sb));
  }
};

// A tensor set laid out as consecutive pieces of one block, so that one acquisition keeps
// all of it.
class SetLayout {
 public:
  // Adds a piece of `floats` floats and returns its offset in the block.
  std::size_t add(std::int64_t floats) {
    const std::size_t offset = total_;
    // 16 floats: keeps every piece 64-byte aligned for the vector kernels.
    total_ += (static_cast<std::size_t>(floats) + 15) / 16 * 16;
    return offset;
  }
  std::size_t floats() const { return total_; }
  // What ActivationStore::acquire takes for it.
  std::size_t bytes() const { return std::max<std::size_t>(total_, 1) * sizeof(float); }

 private:
  std::size_t total_ = 0;
};

class EmbeddingSegment final : public Segment {
 public:
  EmbeddingSegment(int id, GptState& s) : Segment(id, *s.store), s_(s) {}
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = true;
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    const auto& c = s_.config;
    // Vocab-parallel: each rank looks up the tokens of its slice; positions are added once
    // (by rank 0) so that the reduction over the group sums to wte[token] + wpe[t].
    k::embedding_forward(sub_batch(s_, ctx, mb, sb).inputs, s_.param("wte.weight"),
                         s_.tp_rank() == 0 ? s_.param("wpe.weight") : nullptr, port(sb).partial,
                         s_.rows, c.seq_len, c.hidden, vocab_range());
  }
  void backward(const StepContext& ctx, int mb, int sb, int /*stage*/) override {
    const auto& c = s_.config;
    // d_partial is whole on every rank, so every rank forms the same wpe gradient.
    k::embedding_backward(port(sb).d_partial, sub_batch(s_, ctx, mb, sb).inputs,
                          s_.grad("wte.weight"), s_.grad("wpe.weight"), s_.rows, c.seq_len,
                          c.hidden, vocab_range());
  }
  Tensor forward_collective_buffer(int sb) override {
    return Tensor::of(port(sb).partial, {s_.tokens(), s_.config.hidden});
  }

 private:
  const GptState::Ports& port(int sb) const { return s_.ports[static_cast<std::size_t>(sb)]; }
  k::VocabRange vocab_range() const {
    return {s_.vocab_begin(), s_.vocab_begin() + s_.local_vocab_valid()};
  }

  GptState& s_;
  std::string name_ = "embedding";
};

// The transformer half-layers: epilogue -> LayerNorm -> ... -> row-parallel GEMM.
class LayerSegment : public Segment {
 public:
  LayerSegment(int id, GptState& s, std::int64_t layer, std::string name)
      : Segment(id, *s.store), s_(s), layer_(layer), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }

  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kInternals | kCore | kOutput);
  }
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets);
  }
  Tensor forward_collective_buffer(int sb) override {
    return Tensor::of(port(sb).partial, {s_.tokens(), s_.config.hidden});
  }
  Tensor backward_collective_buffer(int sb) override {
    return Tensor::of(port(sb).d_ln, {s_.tokens(), s_.config.hidden});
  }

 protected:
  // Computes the parts of the forward pass named by `parts`; kCheckpoint, kInternals and kCore
  // sets are acquired here, and anything they read must be live.
  virtual void run(const StepContext& ctx, int mb, int sb, TensorSets parts) = 0;

  const GptState::Ports& port(int sb) const { return s_.ports[static_cast<std::size_t>(sb)]; }
  float* acquire_or_get(int mb, int sb, TensorSet set, TensorSets parts, const SetLayout& layout) {
    return (parts & set) ? store().acquire(key(mb, sb, set), layout.floats())
                         : store().get(key(mb, sb, set));
  }

  GptState& s_;
  std::int64_t layer_;
  std::string name_;
  Epilogue epilogue_;
};

class AttentionSegment final : public LayerSegment {
 public:
  AttentionSegment(int id, GptState& s, std::int64_t layer)
      : LayerSegment(id, s, layer, "attention." + std::to_string(layer)) {
    const std::int64_t n = s.tokens(), C = s.config.hidden, A = s.local_attention_width();
    checkpoint_.add(n * C);
    ln_out_ = internals_.add(n * C);
    ln_mean_ = internals_.add(n);
    ln_rstd_ = internals_.add(n);
    qkv_ = internals_.add(n * 3 * A);
    attn_out_ = core_.add(n * A);
    lse_ = core_.add(n * s.local_heads());
    if (layer == 0) {
      epilogue_ = {-1, "", s.config.layers, kDropoutSiteEmbedding};
    } else {
      epilogue_ = {id - 1, layer_prefix(layer - 1) + "mlp.c_proj.bias", layer - 1,
                   kDropoutSiteMlp};
    }
  }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.sets = kCheckpoint | kInternals | kCore;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.internals_bytes = internals_.bytes();
    shape.core_bytes = core_.bytes();
    shape.layer = static_cast<int>(layer_);
    shape.recomputable = true;
    return shape;
  }

  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, A = s_.local_attention_width();
    const std::string p = layer_prefix(layer_);
    const View v = view(mb, sb);
    if (stage == 0) {
      // d_partial holds d(P_l), whole on every rank.
      float* d_attn = s_.scratch_narrow;
      k::linear_backward(port(sb).d_partial, v.attn_out, s_.param(p + "attn.c_proj.weight"),
                         d_attn, s_.grad(p + "attn.c_proj.weight"), nullptr, n, A, C);
      float* d_qkv = s_.scratch_wide;
      k::attention_backward(d_attn, v.qkv, v.attn_out, v.lse, d_qkv, s_.rows, c.seq_len,
                            s_.local_heads(), c.head_dim());
      // This rank's heads contribute a partial gradient of LN1's output; the group sums it.
      k::linear_backward(d_qkv, v.ln_out, s_.param(p + "attn.c_attn.weight"), port(sb).d_ln,
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
    float* d_ln_in = s_.scratch_narrow;
    k::layernorm_backward(port(sb).d_ln, v.residual, s_.param(p + "ln_1.weight"), v.ln_mean,
                          v.ln_rstd, d_ln_in, s_.grad(p + "ln_1.weight"),
                          s_.grad(p + "ln_1.bias"), n, C);
    k::add(port(sb).d_residual, d_ln_in, port(sb).d_residual, n * C);
    epilogue_.backward(s_, ctx, mb, sb);
  }

 private:
  struct View {
    float *residual, *ln_out, *ln_mean, *ln_rstd, *qkv, *attn_out, *lse;
  };
  View make_view(float* checkpoint, float* internals, float* core) const {
    return {checkpoint,           internals + ln_out_, internals + ln_mean_, internals + ln_rstd_,
            internals + qkv_,     core + attn_out_,    core + lse_};
  }
  View view(int mb, int sb) const {
    return make_view(store().get(key(mb, sb, kCheckpoint)), store().get(key(mb, sb, kInternals)),
                     store().get(key(mb, sb, kCore)));
  }

  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, A = s_.local_attention_width();
    const std::string p = layer_prefix(layer_);
    const View v = make_view(acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_),
                             acquire_or_get(mb, sb, kInternals, parts, internals_),
                             acquire_or_get(mb, sb, kCore, parts, core_));
    if (parts & kCheckpoint) epilogue_.forward(s_, ctx, mb, sb, v.residual);
    if (parts & kInternals) {
      k::layernorm_forward(v.residual, s_.param(p + "ln_1.weight"), s_.param(p + "ln_1.bias"),
                           v.ln_out, v.ln_mean, v.ln_rstd, n, C, c.layernorm_eps);
      // Column-parallel QKV: this rank's heads only.
      k::linear_forward(v.ln_out, s_.param(p + "attn.c_attn.weight"),
                        s_.param(p + "attn.c_attn.bias"), v.qkv, n, C, 3 * A);
    }
    if (parts & kCore)
      k::attention_forward(v.qkv, v.attn_out, v.lse, s_.rows, c.seq_len, s_.local_heads(),
                           c.head_dim());
    // Row-parallel projection: partial sums; the bias is added after the reduction.
    if (parts & kOutput)
      k::linear_forward(v.attn_out, s_.param(p + "attn.c_proj.weight"), nullptr,
                        port(sb).partial, n, A, C);
  }

  SetLayout checkpoint_, internals_, core_;
  std::size_t ln_out_ = 0, ln_mean_ = 0, ln_rstd_ = 0, qkv_ = 0;  // in internals
  std::size_t attn_out_ = 0, lse_ = 0;                             // in core
};

class MlpSegment final : public LayerSegment {
 public:
  MlpSegment(int id, GptState& s, std::int64_t layer)
      : LayerSegment(id, s, layer, "mlp." + std::to_string(layer)) {
    const std::int64_t n = s.tokens(), C = s.config.hidden, F = s.local_ffn();
    checkpoint_.add(n * C);
    ln_out_ = internals_.add(n * C);
    ln_mean_ = internals_.add(n);
    ln_rstd_ = internals_.add(n);
    fc_pre_ = internals_.add(n * F);
    fc_act_ = internals_.add(n * F);
    epilogue_ = {id - 1, layer_prefix(layer) + "attn.c_proj.bias", layer, kDropoutSiteAttention};
  }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.sets = kCheckpoint | kInternals;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.internals_bytes = internals_.bytes();
    shape.layer = static_cast<int>(layer_);
    shape.recomputable = true;
    return shape;
  }

  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, F = s_.local_ffn();
    const std::string p = layer_prefix(layer_);
    const View v = make_view(store().get(key(mb, sb, kCheckpoint)),
                             store().get(key(mb, sb, kInternals)));
    if (stage == 0) {
      float* d_act = s_.scratch_wide;
      k::linear_backward(port(sb).d_partial, v.fc_act, s_.param(p + "mlp.c_proj.weight"), d_act,
                         s_.grad(p + "mlp.c_proj.weight"), nullptr, n, F, C);
      k::gelu_backward(v.fc_pre, d_act, d_act, n * F);
      k::linear_backward(d_act, v.ln_out, s_.param(p + "mlp.c_fc.weight"), port(sb).d_ln,
                         s_.grad(p + "mlp.c_fc.weight"), s_.grad(p + "mlp.c_fc.bias"), n, C, F);
      return;
    }
    float* d_ln_in = s_.scratch_narrow;
    k::layernorm_backward(port(sb).d_ln, v.residual, s_.param(p + "ln_2.weight"), v.ln_mean,
                          v.ln_rstd, d_ln_in, s_.grad(p + "ln_2.weight"),
                          s_.grad(p + "ln_2.bias"), n, C);
    k::add(port(sb).d_residual, d_ln_in, port(sb).d_residual, n * C);
    epilogue_.backward(s_, ctx, mb, sb);
  }

 private:
  struct View {
    float *residual, *ln_out, *ln_mean, *ln_rstd, *fc_pre, *fc_act;
  };
  View make_view(float* checkpoint, float* internals) const {
    return {checkpoint,           internals + ln_out_, internals + ln_mean_,
            internals + ln_rstd_, internals + fc_pre_, internals + fc_act_};
  }

  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, F = s_.local_ffn();
    const std::string p = layer_prefix(layer_);
    const View v = make_view(acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_),
                             acquire_or_get(mb, sb, kInternals, parts, internals_));
    if (parts & kCheckpoint) epilogue_.forward(s_, ctx, mb, sb, v.residual);
    if (parts & kInternals) {
      k::layernorm_forward(v.residual, s_.param(p + "ln_2.weight"), s_.param(p + "ln_2.bias"),
                           v.ln_out, v.ln_mean, v.ln_rstd, n, C, c.layernorm_eps);
      k::linear_forward(v.ln_out, s_.param(p + "mlp.c_fc.weight"),
                        s_.param(p + "mlp.c_fc.bias"), v.fc_pre, n, C, F);
      k::gelu_forward(v.fc_pre, v.fc_act, n * F);
    }
    if (parts & kOutput)
      k::linear_forward(v.fc_act, s_.param(p + "mlp.c_proj.weight"), nullptr, port(sb).partial,
                        n, F, C);
  }

  SetLayout checkpoint_, internals_;
  std::size_t ln_out_ = 0, ln_mean_ = 0, ln_rstd_ = 0, fc_pre_ = 0, fc_act_ = 0;
};

// LN_f, the tied LM head and the loss. In training the logits are processed in row chunks:
// each chunk's logits are formed, turned into their gradient in place, and immediately used
// for d(LN_f out) and d(wte), so the full [n, V] logits never exist at once.
//
// Under tensor parallelism each rank holds a slice of the vocabulary (vocab-parallel
// cross-entropy): per chunk, the row maxima and then the sums of exponentials and the target
// logits are reduced over the group (blocking, inside the segment), and d(LN_f out) is a
// partial sum reduced by the segment's backward collective. The head is never recomputed:
// its backward follows its forward in every schedule.
class HeadSegment final : public Segment {
 public:
  static constexpr std::int64_t kRowsPerChunk = 256;

  HeadSegment(int id, GptState& s, Arena& arena, LossAccumulator& loss)
      : Segment(id, *s.store), s_(s), loss_(loss) {
    const std::int64_t n = s.tokens(), C = s.config.hidden, V = s.local_vocab_rows();
    const std::int64_t L = s.config.layers;
    residual_ = internals_.add(n * C);
    ln_out_ = internals_.add(n * C);
    ln_mean_ = internals_.add(n);
    ln_rstd_ = internals_.add(n);
    const std::int64_t chunk = std::min(kRowsPerChunk, n);
    logits_ = arena.allocate<float>(static_cast<std::size_t>(chunk * V));
    row_losses_ = arena.allocate<float>(static_cast<std::size_t>(chunk));
    row_max_ = arena.allocate<float>(static_cast<std::size_t>(chunk));
    row_sums_ = arena.allocate<float>(static_cast<std::size_t>(2 * chunk));
    epilogue_ = {id - 1, layer_prefix(L - 1) + "mlp.c_proj.bias", L - 1, kDropoutSiteMlp};
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.sets = kInternals;
    shape.internals_bytes = internals_.bytes();
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    const auto& c = s_.config;
    const std::int64_t n = s_.tokens(), C = c.hidden, V = s_.local_vocab_rows();
    OASES_ASSERT(ctx.head_mode != HeadMode::logits || s_.tp_size() == 1,
                 "whole logits are produced by a single rank only");
    float* internals = store().acquire(key(mb, sb, kInternals), internals_.floats());
    float* residual = internals + residual_;
    float* ln_out = internals + ln_out_;
    epilogue_.forward(s_, ctx, mb, sb, residual);
    k::layernorm_forward(residual, s_.param("ln_f.weight"), s_.param("ln_f.bias"), ln_out,
                         internals + ln_mean_, internals + ln_rstd_, n, C, c.layernorm_eps);
    const float* wte = s_.param("wte.weight");
    const SubBatch data = sub_batch(s_, ctx, mb, sb);
    const std::int64_t chunk = std::min(kRowsPerChunk, n);
    const bool train = ctx.head_mode == HeadMode::train;
    float* d_ln_out = s_.ports[static_cast<std::size_t>(sb)].d_ln;
    for (std::int64_t row = 0; row < n; row += chunk) {
      const std::int64_t rows = std::min(chunk, n - row);
      const float* x = ln_out + row * C;
      float* logits = ctx.head_mode == HeadMode::logits
                          ? ctx.logits_out + (data.first_token + row) * V
                          : logits_;
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
                d_ln_out + row * C, C);
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
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    OASES_ASSERT(ctx.head_mode == HeadMode::train, "backward needs HeadMode::train");
    float* internals = store().get(key(mb, sb, kInternals));
    if (stage == 0) return;
    const std::int64_t n = s_.tokens(), C = s_.config.hidden;
    const GptState::Ports& port = s_.ports[static_cast<std::size_t>(sb)];
    k::layernorm_backward(port.d_ln, internals + residual_, s_.param("ln_f.weight"),
                          internals + ln_mean_, internals + ln_rstd_, port.d_residual,
                          s_.grad("ln_f.weight"), s_.grad("ln_f.bias"), n, C);
    epilogue_.backward(s_, ctx, mb, sb);
  }
  Tensor backward_collective_buffer(int sb) override {
    return Tensor::of(s_.ports[static_cast<std::size_t>(sb)].d_ln,
                      {s_.tokens(), s_.config.hidden});
  }
  std::vector<BlockingCollective> take_blocking_collectives() override {
    return std::exchange(blocking_, {});
  }

 private:
  void reduce_blocking(const char* what, Tensor buffer, comm::ReduceOp op) {
    const auto began = std::chrono::steady_clock::now();
    s_.tp->all_reduce(buffer, op);
    blocking_.push_back({what, began, std::chrono::steady_clock::now()});
  }

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
    reduce_blocking("loss-max", Tensor::of(row_max_, {rows}), comm::ReduceOp::max);
    if (valid > 0) {
      k::cross_entropy_shard_sums(logits, targets, begin, row_max_, rows, valid, V, sum_exp,
                                  target_logit);
    } else {
      std::fill(row_sums_, row_sums_ + 2 * rows, 0.0f);
    }
    reduce_blocking("loss-sums", Tensor::of(row_sums_, {2 * rows}), comm::ReduceOp::sum);
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
  SetLayout internals_;
  std::size_t residual_ = 0, ln_out_ = 0, ln_mean_ = 0, ln_rstd_ = 0;  // r_L, LN_f
  float* logits_ = nullptr;    // [chunk, V_local] scratch
  float* row_losses_ = nullptr;
  float* row_max_ = nullptr;   // [chunk]
  float* row_sums_ = nullptr;  // [2, chunk]: sums of exponentials, target logits
  std::vector<BlockingCollective> blocking_;
};

}  // namespace

void Segment::recompute(const StepContext&, int, int, TensorSets sets) {
  OASES_ASSERT(sets == 0, "segment {} has nothing to recompute ({} asked)", name(),
               tensor_sets_name(sets));
}

void Segment::release(int mb, int sb, TensorSets sets) {
  for (TensorSet set : {kCheckpoint, kInternals, kCore})
    if (sets & set) store_.release(key(mb, sb, set));
}

std::vector<std::unique_ptr<Segment>> build_gpt_segments(GptState& s, LossAccumulator& loss,
                                                         Arena& arena) {
  s.config.validate();
  OASES_ASSERT(s.rows >= 1 && s.sub_batches >= 1 && s.layout && s.params && s.grads && s.tp &&
                   s.store,
               "incomplete GptState");
  s.config.validate_tensor_parallel(s.tp_size());
  const std::int64_t n = s.tokens(), C = s.config.hidden;
  const auto nC = static_cast<std::size_t>(n * C);
  s.ports.resize(static_cast<std::size_t>(s.sub_batches));
  for (GptState::Ports& port : s.ports) {
    port.partial = arena.allocate<float>(nC);
    port.d_partial = arena.allocate<float>(nC);
    port.d_residual = arena.allocate<float>(nC);
    port.d_ln = arena.allocate<float>(nC);
  }
  s.scratch_narrow = arena.allocate<float>(nC);
  s.scratch_wide = arena.allocate<float>(
      static_cast<std::size_t>(n * std::max(3 * s.local_attention_width(), s.local_ffn())));

  std::vector<std::unique_ptr<Segment>> segments;
  const auto next_id = [&] { return static_cast<int>(segments.size()); };
  segments.push_back(std::make_unique<EmbeddingSegment>(next_id(), s));
  for (std::int64_t l = 0; l < s.config.layers; ++l) {
    segments.push_back(std::make_unique<AttentionSegment>(next_id(), s, l));
    segments.push_back(std::make_unique<MlpSegment>(next_id(), s, l));
  }
  segments.push_back(std::make_unique<HeadSegment>(next_id(), s, arena, loss));
  return segments;
}

}  // namespace oases::ops
