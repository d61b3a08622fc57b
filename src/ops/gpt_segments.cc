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

// The dropout slice of the rows starting at `first_row` of sub-batch sb of micro-batch mb.
k::DropoutSlice slice_of(const GptState& s, const StepContext& ctx, int mb, int sb,
                         std::int64_t first_row) {
  return {sub_batch(s, ctx, mb, sb).first_sample + first_row, 0};
}

// The bias + dropout + residual add that follows a reduced partial sum:
//   out = residual + dropout(partial + bias)     (no residual: out = dropout(partial + bias))
// and its backward: d_partial = dropout(d_out), d_bias += sum(d_partial); the residual's
// gradient is d_out itself, which stays in d_residual. It runs on `rows` sequences starting at
// row `first_row` of the sub-batch (the dropout mask is keyed by their global sample index).
struct Epilogue {
  int residual_segment = -1;  // whose checkpoint is the residual (-1: none, after the embedding)
  std::string bias_name;      // empty: no bias (the embedding)
  std::int64_t dropout_layer = 0;
  std::uint32_t dropout_site_id = 0;
  // The input is a reshard's output, already the residual-stream value: the epilogue is a copy
  // (the reshard segment ran the real one on the previous layer's rows).
  bool copies_reshard = false;

  // `partial` and `residual` point at the first of the rows; `residual` is ignored without a
  // residual segment.
  void forward(const GptState& s, const StepContext& ctx, int mb, int sb, std::int64_t rows,
               std::int64_t first_row, const float* partial, const float* residual,
               float* out) const {
    const auto& c = s.config;
    const std::int64_t tokens = rows * c.seq_len;
    if (copies_reshard) {
      std::copy(partial, partial + tokens * c.hidden, out);
      return;
    }
    const float* bias = bias_name.empty() ? nullptr : s.param(bias_name);
    const k::DropoutSite site = dropout_site(s, ctx, dropout_layer, dropout_site_id);
    if (residual_segment < 0) {
      OASES_ASSERT(bias == nullptr, "embedding epilogue has no bias");
      k::dropout_apply(partial, out, rows, c.seq_len, c.hidden, dropout_p(s, ctx), site,
                       slice_of(s, ctx, mb, sb, first_row));
      return;
    }
    k::bias_dropout_add_forward(partial, bias, residual, out, rows, c.seq_len, c.hidden,
                                dropout_p(s, ctx), site, slice_of(s, ctx, mb, sb, first_row));
  }
  // The usual case: the rows of `at`, reading the port and the residual segment's checkpoint.
  void forward(const GptState& s, const StepContext& ctx, int mb, int sb, const Placement& at,
               float* out) const {
    const GptState::Ports& port = s.ports[static_cast<std::size_t>(sb)];
    const float* residual =
        residual_segment < 0 ? nullptr : s.store->get({residual_segment, mb, sb, kCheckpoint});
    forward(s, ctx, mb, sb, at.rows, at.first_row, copies_reshard ? port.reshard : port.partial,
            residual, out);
  }

  void backward(const GptState& s, const StepContext& ctx, int mb, int sb,
                const Placement& at) const {
    if (copies_reshard) return;  // d(input) is d_residual itself, which the reshard reads
    const auto& c = s.config;
    const GptState::Ports& port = s.ports[static_cast<std::size_t>(sb)];
    float* dbias = bias_name.empty() ? nullptr : s.grad(bias_name);
    k::bias_dropout_add_backward(port.d_residual, port.d_partial, dbias, at.rows, c.seq_len,
                                 c.hidden, dropout_p(s, ctx),
                                 dropout_site(s, ctx, dropout_layer, dropout_site_id),
                                 slice_of(s, ctx, mb, sb, at.first_row));
  }
};

// The epilogue that turns the output of the segment before `next_layer`'s first segment (layer
// `next_layer` - 1's MLP, or the embedding) into r_{next_layer}.
Epilogue epilogue_into(const GptState& s, std::int64_t next_layer, int previous_segment) {
  if (next_layer == 0) return {-1, "", s.config.layers, kDropoutSiteEmbedding, false};
  return {previous_segment, layer_prefix(next_layer - 1) + "mlp.c_proj.bias", next_layer - 1,
          kDropoutSiteMlp, false};
}

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
    shape.collective_ranks = s_.tp_size();
    shape.degree = s_.tp_size();
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
  CollectiveCall forward_collective(int sb) override {
    return {CollectiveKind::all_reduce, s_.tp,
            Tensor::of(port(sb).partial, {s_.tokens(), s_.config.hidden}), {}};
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
  LayerSegment(int id, GptState& s, std::int64_t layer, std::string name, Epilogue epilogue)
      : Segment(id, *s.store),
        s_(s),
        layer_(layer),
        name_(std::move(name)),
        at_(s.placement(layer)),
        epilogue_(std::move(epilogue)) {}
  const std::string& name() const override { return name_; }

  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kInternals | kCore | kOutput);
  }
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets);
  }
  CollectiveCall forward_collective(int sb) override {
    return {CollectiveKind::all_reduce, at_.group,
            Tensor::of(port(sb).partial, {tokens(), s_.config.hidden}), {}};
  }
  CollectiveCall backward_collective(int sb) override {
    return {CollectiveKind::all_reduce, at_.group,
            Tensor::of(port(sb).d_ln, {tokens(), s_.config.hidden}), {}};
  }

 protected:
  // Every layer segment shares this part of its shape.
  SegmentShape layer_shape() const {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.collective_ranks = at_.degree;
    shape.degree = at_.degree;
    shape.layer = static_cast<int>(layer_);
    shape.recomputable = true;
    return shape;
  }
  std::int64_t tokens() const { return at_.rows * s_.config.seq_len; }
  std::int64_t local_heads() const { return s_.config.heads / at_.degree; }
  std::int64_t local_attention_width() const { return local_heads() * s_.config.head_dim(); }
  std::int64_t local_ffn() const { return s_.config.ffn_hidden / at_.degree; }

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
  Placement at_;
  Epilogue epilogue_;
};

class AttentionSegment final : public LayerSegment {
 public:
  AttentionSegment(int id, GptState& s, std::int64_t layer, Epilogue epilogue)
      : LayerSegment(id, s, layer, "attention." + std::to_string(layer), std::move(epilogue)) {
    const std::int64_t n = tokens(), C = s.config.hidden, A = local_attention_width();
    checkpoint_.add(n * C);
    ln_out_ = internals_.add(n * C);
    ln_mean_ = internals_.add(n);
    ln_rstd_ = internals_.add(n);
    qkv_ = internals_.add(n * 3 * A);
    attn_out_ = core_.add(n * A);
    lse_ = core_.add(n * local_heads());
  }
  SegmentShape shape() const override {
    SegmentShape shape = layer_shape();
    shape.sets = kCheckpoint | kInternals | kCore;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.internals_bytes = internals_.bytes();
    shape.core_bytes = core_.bytes();
    return shape;
  }

  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    const auto& c = s_.config;
    const std::int64_t n = tokens(), C = c.hidden, A = local_attention_width();
    const std::string p = layer_prefix(layer_);
    const View v = view(mb, sb);
    if (stage == 0) {
      // d_partial holds d(P_l), whole on every rank.
      float* d_attn = s_.scratch_narrow;
      k::linear_backward(port(sb).d_partial, v.attn_out, s_.param(p + "attn.c_proj.weight"),
                         d_attn, s_.grad(p + "attn.c_proj.weight"), nullptr, n, A, C);
      float* d_qkv = s_.scratch_wide;
      k::attention_backward(d_attn, v.qkv, v.attn_out, v.lse, d_qkv, at_.rows, c.seq_len,
                            local_heads(), c.head_dim());
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
    epilogue_.backward(s_, ctx, mb, sb, at_);
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
    const std::int64_t n = tokens(), C = c.hidden, A = local_attention_width();
    const std::string p = layer_prefix(layer_);
    const View v = make_view(acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_),
                             acquire_or_get(mb, sb, kInternals, parts, internals_),
                             acquire_or_get(mb, sb, kCore, parts, core_));
    if (parts & kCheckpoint) epilogue_.forward(s_, ctx, mb, sb, at_, v.residual);
    if (parts & kInternals) {
      k::layernorm_forward(v.residual, s_.param(p + "ln_1.weight"), s_.param(p + "ln_1.bias"),
                           v.ln_out, v.ln_mean, v.ln_rstd, n, C, c.layernorm_eps);
      // Column-parallel QKV: this rank's heads only.
      k::linear_forward(v.ln_out, s_.param(p + "attn.c_attn.weight"),
                        s_.param(p + "attn.c_attn.bias"), v.qkv, n, C, 3 * A);
    }
    if (parts & kCore)
      k::attention_forward(v.qkv, v.attn_out, v.lse, at_.rows, c.seq_len, local_heads(),
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
      : LayerSegment(id, s, layer, "mlp." + std::to_string(layer),
                     {id - 1, layer_prefix(layer) + "attn.c_proj.bias", layer,
                      kDropoutSiteAttention, false}) {
    const std::int64_t n = tokens(), C = s.config.hidden, F = local_ffn();
    checkpoint_.add(n * C);
    ln_out_ = internals_.add(n * C);
    ln_mean_ = internals_.add(n);
    ln_rstd_ = internals_.add(n);
    fc_pre_ = internals_.add(n * F);
    fc_act_ = internals_.add(n * F);
  }
  SegmentShape shape() const override {
    SegmentShape shape = layer_shape();
    shape.sets = kCheckpoint | kInternals;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.internals_bytes = internals_.bytes();
    return shape;
  }

  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    const auto& c = s_.config;
    const std::int64_t n = tokens(), C = c.hidden, F = local_ffn();
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
    epilogue_.backward(s_, ctx, mb, sb, at_);
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
    const std::int64_t n = tokens(), C = c.hidden, F = local_ffn();
    const std::string p = layer_prefix(layer_);
    const View v = make_view(acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_),
                             acquire_or_get(mb, sb, kInternals, parts, internals_));
    if (parts & kCheckpoint) epilogue_.forward(s_, ctx, mb, sb, at_, v.residual);
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

  HeadSegment(int id, GptState& s, Arena& arena, LossAccumulator& loss, Epilogue epilogue)
      : Segment(id, *s.store),
        s_(s),
        loss_(loss),
        at_(s.placement(s.config.layers)),
        epilogue_(std::move(epilogue)) {
    const std::int64_t n = s.tokens(), C = s.config.hidden, V = s.local_vocab_rows();
    residual_ = internals_.add(n * C);
    ln_out_ = internals_.add(n * C);
    ln_mean_ = internals_.add(n);
    ln_rstd_ = internals_.add(n);
    const std::int64_t chunk = std::min(kRowsPerChunk, n);
    logits_ = arena.allocate<float>(static_cast<std::size_t>(chunk * V));
    row_losses_ = arena.allocate<float>(static_cast<std::size_t>(chunk));
    row_max_ = arena.allocate<float>(static_cast<std::size_t>(chunk));
    row_sums_ = arena.allocate<float>(static_cast<std::size_t>(2 * chunk));
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.collective_ranks = s_.tp_size();
    shape.degree = s_.tp_size();
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
    epilogue_.forward(s_, ctx, mb, sb, at_, residual);
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
    epilogue_.backward(s_, ctx, mb, sb, at_);
  }
  CollectiveCall backward_collective(int sb) override {
    return {CollectiveKind::all_reduce, s_.tp,
            Tensor::of(s_.ports[static_cast<std::size_t>(sb)].d_ln,
                       {s_.tokens(), s_.config.hidden}),
            {}};
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
  Placement at_;
  Epilogue epilogue_;
  SetLayout internals_;
  std::size_t residual_ = 0, ln_out_ = 0, ln_mean_ = 0, ln_rstd_ = 0;  // r_L, LN_f
  float* logits_ = nullptr;    // [chunk, V_local] scratch
  float* row_losses_ = nullptr;
  float* row_max_ = nullptr;   // [chunk]
  float* row_sums_ = nullptr;  // [2, chunk]: sums of exponentials, target logits
  std::vector<BlockingCollective> blocking_;
};

// Moves r_l between the rows of layer l - 1's placement (`from`) and layer l's (`to`) and runs
// the epilogue that forms r_l, on the rows of `from` (see gpt_segments.h). When the degree
// rises, the groups of `from` inside one group of `to` gather their rows (forward collective);
// when it falls, this rank keeps its group's rows of `from`, and in backward the groups of
// `to` inside one group of `from` gather the gradient (backward collective).
class ReshardSegment final : public Segment {
 public:
  ReshardSegment(int id, GptState& s, std::int64_t to_layer, Epilogue epilogue)
      : Segment(id, *s.store),
        s_(s),
        from_(s.placement(to_layer - 1)),
        to_(s.placement(to_layer)),
        rises_(from_.degree < to_.degree),
        gather_group_(rises_ ? &s.tp_subgroup(to_.degree, from_.degree)
                             : &s.tp_subgroup(from_.degree, to_.degree)),
        name_("reshard." + std::to_string(to_layer)),
        epilogue_(std::move(epilogue)) {
    OASES_ASSERT(from_.degree != to_.degree, "{}: no degree change", name_);
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = rises_;
    shape.has_backward_collective = !rises_;
    shape.backward_stages = rises_ ? 1 : 2;
    shape.forward_kind = shape.backward_kind = CollectiveKind::all_gather;
    shape.collective_ranks = gather_group_->size();
    shape.degree = from_.degree;
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    const GptState::Ports& port = ports(sb);
    const float* residual =
        epilogue_.residual_segment < 0
            ? nullptr
            : store().get({epilogue_.residual_segment, mb, sb, kCheckpoint});
    if (rises_) {
      epilogue_.forward(s_, ctx, mb, sb, from_.rows, from_.first_row, port.partial, residual,
                        port.reshard + own_block_offset());
      return;
    }
    // This group's rows are a block of the previous group's: only they are computed.
    const std::int64_t skip = (to_.first_row - from_.first_row) * row_floats();
    epilogue_.forward(s_, ctx, mb, sb, to_.rows, to_.first_row, port.partial + skip,
                      residual ? residual + skip : nullptr, port.reshard);
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    const GptState::Ports& port = ports(sb);
    if (rises_) {
      // d_residual holds the gradient of every row of the larger group; keep this group's.
      if (const std::int64_t offset = own_block_offset(); offset > 0)
        std::copy(port.d_residual + offset, port.d_residual + offset + from_.rows * row_floats(),
                  port.d_residual);  // to an earlier address: safe for overlapping ranges
      epilogue_.backward(s_, ctx, mb, sb, from_);
      return;
    }
    if (stage == 0) {
      std::copy(port.d_residual, port.d_residual + to_.rows * row_floats(),
                port.reshard + own_block_offset());
      return;
    }
    std::copy(port.reshard, port.reshard + from_.rows * row_floats(), port.d_residual);
    epilogue_.backward(s_, ctx, mb, sb, from_);
  }
  CollectiveCall forward_collective(int sb) override { return gather(sb); }
  CollectiveCall backward_collective(int sb) override { return gather(sb); }

 private:
  const GptState::Ports& ports(int sb) const { return s_.ports[static_cast<std::size_t>(sb)]; }
  std::int64_t row_floats() const { return s_.config.seq_len * s_.config.hidden; }
  const Placement& small() const { return rises_ ? from_ : to_; }
  const Placement& large() const { return rises_ ? to_ : from_; }
  // Offset of this rank's block (the smaller group's rows) within the larger group's rows.
  std::int64_t own_block_offset() const {
    return (small().first_row - large().first_row) * row_floats();
  }
  CollectiveCall gather(int sb) const {
    float* rows = ports(sb).reshard;
    return {CollectiveKind::all_gather, gather_group_,
            Tensor::of(rows, {large().rows * row_floats()}),
            Tensor::of(rows + own_block_offset(), {small().rows * row_floats()})};
  }

  GptState& s_;
  Placement from_, to_;
  bool rises_;
  comm::Communicator* gather_group_;
  std::string name_;
  Epilogue epilogue_;
};

}  // namespace

int GptState::degree_of(std::int64_t layer) const {
  if (layer < 0 || layer >= config.layers || layer_degrees.empty()) return tp_size();
  return layer_degrees[static_cast<std::size_t>(layer)];
}

Placement GptState::placement(std::int64_t layer) const {
  Placement at;
  at.degree = degree_of(layer);
  at.shard = tp_rank() % at.degree;
  at.rows = rows * at.degree / tp_size();
  at.first_row = tp_rank() / at.degree * at.rows;
  at.group = at.degree == tp_size() ? tp : &tp_subgroup(at.degree, 1);
  return at;
}

Segment::CollectiveCall Segment::forward_collective(int) {
  OASES_ASSERT(false, "segment {} has no forward collective", name());
  __builtin_unreachable();
}
Segment::CollectiveCall Segment::backward_collective(int) {
  OASES_ASSERT(false, "segment {} has no backward collective", name());
  __builtin_unreachable();
}

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
  const std::int64_t L = s.config.layers;
  const int T = s.tp_size();
  OASES_ASSERT(s.layer_degrees.empty() || static_cast<std::int64_t>(s.layer_degrees.size()) == L,
               "{} layer degrees for {} layers", s.layer_degrees.size(), L);
  bool reshards = false;
  for (std::int64_t l = 0; l < L; ++l) {
    const int k = s.degree_of(l);
    OASES_ASSERT(k >= 1 && T % k == 0, "layer {} degree {} does not divide {}", l, k, T);
    OASES_CHECK(s.rows % (T / k) == 0,
                "parallel.plan gives layer {} degree {}: its {} replicas split every sub-batch "
                "of {} sequences (train.micro_batch / parallel.sub_batches), which they cannot "
                "divide; use a micro-batch whose sub-batches are a multiple of {}",
                l, k, T / k, s.rows, T / k);
    if (k < T) s.config.validate_tensor_parallel(k);
    reshards = reshards || k != s.degree_of(l - 1);
  }
  reshards = reshards || s.degree_of(L - 1) != T;
  OASES_ASSERT(!reshards || s.tp_subgroup, "per-layer degrees need the tensor-parallel sub-groups");

  const std::int64_t n = s.tokens(), C = s.config.hidden;
  const auto nC = static_cast<std::size_t>(n * C);
  s.ports.resize(static_cast<std::size_t>(s.sub_batches));
  for (GptState::Ports& port : s.ports) {
    port.partial = arena.allocate<float>(nC);
    port.d_partial = arena.allocate<float>(nC);
    port.d_residual = arena.allocate<float>(nC);
    port.d_ln = arena.allocate<float>(nC);
    if (reshards) port.reshard = arena.allocate<float>(nC);
  }
  s.scratch_narrow = arena.allocate<float>(nC);
  std::int64_t wide = 0;
  for (std::int64_t l = 0; l < L; ++l) {
    const int k = s.degree_of(l);
    const std::int64_t tokens = s.tokens() * k / T;
    wide = std::max(wide, tokens * std::max(3 * s.config.heads / k * s.config.head_dim(),
                                            s.config.ffn_hidden / k));
  }
  s.scratch_wide = arena.allocate<float>(static_cast<std::size_t>(wide));

  std::vector<std::unique_ptr<Segment>> segments;
  const auto next_id = [&] { return static_cast<int>(segments.size()); };
  // The epilogue that forms r_l (l = L: the head's input) goes to a reshard segment where the
  // degree changes, and the segment of layer l copies the reshard's output.
  const auto epilogue_for = [&](std::int64_t l) -> Epilogue {
    const Epilogue real = epilogue_into(s, l, next_id() - 1);
    if (s.degree_of(l - 1) == s.degree_of(l)) return real;
    segments.push_back(std::make_unique<ReshardSegment>(next_id(), s, l, real));
    Epilogue copy;
    copy.copies_reshard = true;
    return copy;
  };
  segments.push_back(std::make_unique<EmbeddingSegment>(next_id(), s));
  for (std::int64_t l = 0; l < L; ++l) {
    Epilogue epilogue = epilogue_for(l);
    segments.push_back(std::make_unique<AttentionSegment>(next_id(), s, l, std::move(epilogue)));
    segments.push_back(std::make_unique<MlpSegment>(next_id(), s, l));
  }
  Epilogue head_epilogue = epilogue_for(L);
  segments.push_back(
      std::make_unique<HeadSegment>(next_id(), s, arena, loss, std::move(head_epilogue)));
  return segments;
}

}  // namespace oases::ops
