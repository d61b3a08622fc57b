#include "ops/layer_segments.h"

#include "ops/layer_segment_base.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <utility>

namespace oases::ops {
namespace {

using detail::LayerSegment;

class AttentionSegment final : public LayerSegment {
 public:
  AttentionSegment(int id, const ModelContext& model, AttentionSpec spec)
      : LayerSegment(id, model, spec), spec_(std::move(spec)) {
    const CoreAttention& a = spec_.attention;
    OASES_ASSERT(a.shape().batch == spec_.at.rows, "{}: attention over {} rows, placed on {}",
                 name(), a.shape().batch, spec_.at.rows);
    OASES_ASSERT(spec_.qkv.size() == 1 || spec_.qkv.size() == 3, "{}: {} QKV projections",
                 name(), spec_.qkv.size());
    qkv_ = internals_.add(tokens_ * a.qkv_width());
    attn_out_ = core_.add(tokens_ * a.out_width());
    lse_ = core_.add_statistics(a.lse_elements());
    stash_d_qkv_ = deferred_.add(tokens_ * a.qkv_width());
  }
  SegmentShape shape() const override {
    SegmentShape shape = layer_shape(kCheckpoint | kInternals | kCore);
    // The score and probability matrices are formed whole ([seq, seq] per row and head, the
    // causal mask applied to them), as Megatron-LM's fused softmax does.
    const CoreAttention& a = spec_.attention;
    const kernels::AttentionShape& h = a.shape();
    const std::int64_t n = tokens_, C = m_.hidden, O = a.out_width();
    const std::int64_t S = h.seq, d = h.head_dim, pairs = h.batch * h.heads;
    const double e = static_cast<double>(dtype_size(m_.dtype));
    const double scores = static_cast<double>(pairs * S * S) * e;
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint = epilogue_work();
    w.internals = pre_norm_work();
    for (const ColumnParallelLinear& projection : spec_.qkv)
      w.internals.matmuls.push_back({n, projection.local_out(), C});
    if (a.rotary()) w.internals.bytes += 2.0 * static_cast<double>(n * (h.heads + h.kv_heads) * d) * e;
    w.core.matmuls = {{S, S, d, pairs}, {S, d, S, pairs}};  // q k^T, then p v
    w.core.bytes = 2 * scores;                               // softmax reads and writes them
    // Dropout on the probabilities, a kernel of its own there: reads p, writes the dropped p
    // and a one-byte mask; its backward reads the gradient and the mask and writes.
    const double dropout_traffic = m_.attention_dropout > 0 ? 2 * scores + scores / e : 0.0;
    w.core.bytes += dropout_traffic;
    w.output.matmuls = {{n, C, O}};
    Work stage0;
    stage0.matmuls.push_back({n, O, C});  // the output projection's input gradient
    // d(p) = d(out) v^T, d(v) = p^T d(out), d(q) = d(s) k, d(k) = d(s)^T q.
    stage0.matmuls.insert(stage0.matmuls.end(),
                          {{S, S, d, pairs}, {S, d, S, pairs}, {S, d, S, pairs}, {S, d, S, pairs}});
    stage0.bytes = 3 * scores + dropout_traffic;  // the softmax's backward reads p and d(p), writes d(s)
    for (const ColumnParallelLinear& projection : spec_.qkv)
      stage0.matmuls.push_back({n, C, projection.local_out()});
    w.backward_input = {stage0, stage_one_work()};
    w.backward_weight.matmuls.push_back({O, C, n});
    for (const ColumnParallelLinear& projection : spec_.qkv)
      w.backward_weight.matmuls.push_back({C, projection.local_out(), n});
    return shape;
  }

  void backward_weight(const StepContext&, int mb, int sb) override {
    const CoreAttention& a = spec_.attention;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const Tensor core = store().get(key(mb, sb, kCore));
    const Tensor stash = store().get(key(mb, sb, kDeferredGradients));
    spec_.out_proj.backward_weight(matrix(stash, stash_output_grad_, m_.hidden),
                                   matrix(core, attn_out_, a.out_width()), m_.gemm16);
    project_qkv_back(spec_, matrix(stash, stash_d_qkv_, a.qkv_width()),
                     body_input(checkpoint, internals), Tensor(), Part::weight);
    store().release(key(mb, sb, kDeferredGradients));
  }

 private:
  void backward_body(const StepContext& ctx, int mb, int sb, bool defer) override {
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const CoreAttention& a = spec_.attention;
    const Tensor core = store().get(key(mb, sb, kCore));
    const Tensor qkv = matrix(internals, qkv_, a.qkv_width());
    const Tensor attn_out = matrix(core, attn_out_, a.out_width());
    const Tensor stash = defer ? acquire_stash(mb, sb) : Tensor();
    // The output's gradient is whole on every rank of the group.
    const Tensor d_output = output_grad(mb, sb, stash);
    const Tensor d_attn = m_.scratch_narrow.view(0, {tokens_, a.out_width()});
    if (defer) spec_.out_proj.backward_input(d_output, attn_out, d_attn, m_.gemm16);
    else spec_.out_proj.backward(d_output, attn_out, d_attn, m_.gemm16);
    const Tensor d_qkv = defer ? matrix(stash, stash_d_qkv_, a.qkv_width())
                               : m_.scratch_wide.view(0, {tokens_, a.qkv_width()});
    a.backward(d_attn, qkv, attn_out,
               statistics_view(core, core_.statistics_offset(lse_), a.lse_elements()), d_qkv,
               probability_dropout(ctx, mb, sb));
    // This rank's heads contribute a partial gradient of the input; the group sums it.
    project_qkv_back(spec_, d_qkv, body_input(checkpoint, internals),
                     rows_of(Slot::input_grad, mb, sb), defer ? Part::input : Part::whole);
  }
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    const CoreAttention& a = spec_.attention;
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
    const Tensor core = acquire_or_get(mb, sb, kCore, parts, core_);
    if (parts & kCheckpoint) run_epilogue(ctx, mb, sb, checkpoint);
    const Tensor qkv = matrix(internals, qkv_, a.qkv_width());
    const Tensor attn_out = matrix(core, attn_out_, a.out_width());
    if (parts & kInternals) {
      run_pre_norm(checkpoint, internals);
      const Tensor x = body_input(checkpoint, internals);
      project_qkv(spec_, x, qkv);  // column-parallel: this rank's heads only
      a.rotate(qkv);
    }
    if (parts & kCore)
      a.forward(qkv, attn_out,
                statistics_view(core, core_.statistics_offset(lse_), a.lse_elements()),
                probability_dropout(ctx, mb, sb));
    // Row-parallel projection: partial sums; its bias is added after the reduction.
    if (parts & kOutput) spec_.out_proj.forward(attn_out, rows_of(Slot::output, mb, sb), m_.gemm16);
  }

  // The attention-probability dropout of sub-batch sb of micro-batch mb: keyed by this layer,
  // the global indices of the group's sequences and of this shard's heads (a shard holds heads
  // [shard * local, (shard + 1) * local)), so every layout draws the same mask.
  kernels::AttentionDropout probability_dropout(const StepContext& ctx, int mb, int sb) const {
    if (!ctx.dropout_enabled || m_.attention_dropout == 0) return {};
    const kernels::DropoutSite site{m_.seed, static_cast<std::uint32_t>(ctx.step),
                                    static_cast<std::uint32_t>(spec_.layer),
                                    kDropoutSiteAttentionProbabilities};
    return {m_.attention_dropout, site, global_sample(m_, ctx, mb, sb, spec_.at.first_row),
            static_cast<std::int64_t>(spec_.at.shard) * spec_.attention.shape().heads};
  }

  AttentionSpec spec_;
  std::int64_t qkv_ = 0;                 // in internals
  std::int64_t attn_out_ = 0;            // in core_
  int lse_ = -1;                         // in core_
  std::int64_t stash_d_qkv_ = 0;         // in deferred_
};

class MlpSegment final : public LayerSegment {
 public:
  MlpSegment(int id, const ModelContext& model, MlpSpec spec)
      : LayerSegment(id, model, spec), spec_(std::move(spec)) {
    OASES_ASSERT(spec_.up.size() == 1 || spec_.up.size() == 2, "{}: {} input projections", name(),
                 spec_.up.size());
    pre_ = internals_.add(tokens_ * spec_.activation.input_width());
    act_ = internals_.add(tokens_ * spec_.activation.width());
    stash_d_pre_ = deferred_.add(tokens_ * spec_.activation.input_width());
  }
  SegmentShape shape() const override {
    SegmentShape shape = layer_shape(kCheckpoint | kInternals);
    const MlpActivation& act = spec_.activation;
    const std::int64_t n = tokens_, C = m_.hidden, F = act.width(), in = act.input_width();
    const double e = static_cast<double>(dtype_size(m_.dtype));
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint = epilogue_work();
    w.internals = pre_norm_work();
    for (std::size_t i = 0; i < spec_.up.size(); ++i) w.internals.matmuls.push_back({n, F, C});
    w.internals.bytes += static_cast<double>(n * (in + F)) * e;  // the activation
    w.output.matmuls = {{n, C, F}};
    Work stage0;
    stage0.matmuls.push_back({n, F, C});
    stage0.bytes = static_cast<double>(n * (2 * in + F)) * e;  // the activation's backward
    for (std::size_t i = 0; i < spec_.up.size(); ++i) stage0.matmuls.push_back({n, C, F});
    w.backward_input = {stage0, stage_one_work()};
    w.backward_weight.matmuls.push_back({F, C, n});
    for (std::size_t i = 0; i < spec_.up.size(); ++i) w.backward_weight.matmuls.push_back({C, F, n});
    return shape;
  }

  void backward_weight(const StepContext&, int mb, int sb) override {
    const MlpActivation& act = spec_.activation;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const Tensor stash = store().get(key(mb, sb, kDeferredGradients));
    spec_.down.backward_weight(matrix(stash, stash_output_grad_, m_.hidden),
                               matrix(internals, act_, act.width()), m_.gemm16);
    project_up_back(matrix(stash, stash_d_pre_, act.input_width()),
                    body_input(checkpoint, internals), Tensor(), Part::weight);
    store().release(key(mb, sb, kDeferredGradients));
  }

 private:
  void backward_body(const StepContext&, int mb, int sb, bool defer) override {
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const MlpActivation& act = spec_.activation;
    const std::int64_t F = act.width(), in_width = act.input_width();
    const Tensor pre = matrix(internals, pre_, in_width);
    const Tensor stash = defer ? acquire_stash(mb, sb) : Tensor();
    const Tensor d_output = output_grad(mb, sb, stash);
    const Tensor d_act = m_.scratch_wide.view(0, {tokens_, F});
    if (defer) spec_.down.backward_input(d_output, matrix(internals, act_, F), d_act, m_.gemm16);
    else spec_.down.backward(d_output, matrix(internals, act_, F), d_act, m_.gemm16);
    // The GeLU forms work in place; SwiGLU writes gate and up gradients beside d(act). The
    // stash keeps d(pre) for the weight part.
    const Tensor d_pre = defer ? matrix(stash, stash_d_pre_, in_width)
                         : act.kind() == Activation::swiglu
                             ? m_.scratch_wide.view(tokens_ * F, {tokens_, in_width})
                             : d_act;
    act.backward(pre, d_act, d_pre);
    project_up_back(d_pre, body_input(checkpoint, internals), rows_of(Slot::input_grad, mb, sb),
                    defer ? Part::input : Part::whole);
  }
  // FC1 (or gate and up) backward from d_pre [tokens, input width] and their input x.
  void project_up_back(const Tensor& d_pre, const Tensor& x, const Tensor& d_x, Part part) const {
    const std::int64_t F = spec_.activation.width();
    for (std::size_t i = 0; i < spec_.up.size(); ++i) {
      const ColumnParallelLinear& projection = spec_.up[i];
      const Tensor dy = spec_.up.size() == 1
                            ? d_pre
                            : d_pre.columns(static_cast<std::int64_t>(i) * F,
                                            static_cast<std::int64_t>(i + 1) * F);
      switch (part) {
        case Part::whole: projection.backward(dy, x, d_x, i > 0, m_.gemm16); break;
        case Part::input: projection.backward_input(dy, x, d_x, i > 0, m_.gemm16); break;
        case Part::weight: projection.backward_weight(dy, x, m_.gemm16); break;
      }
    }
  }

  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    const MlpActivation& act = spec_.activation;
    const std::int64_t F = act.width();
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
    if (parts & kCheckpoint) run_epilogue(ctx, mb, sb, checkpoint);
    const Tensor pre = matrix(internals, pre_, act.input_width());
    const Tensor activated = matrix(internals, act_, F);
    if (parts & kInternals) {
      run_pre_norm(checkpoint, internals);
      const Tensor x = body_input(checkpoint, internals);
      if (spec_.up.size() == 1) {
        spec_.up[0].forward(x, pre, m_.gemm16);
      } else {
        spec_.up[0].forward(x, pre.columns(0, F), m_.gemm16);
        spec_.up[1].forward(x, pre.columns(F, 2 * F), m_.gemm16);
      }
      act.forward(pre, activated);
    }
    if (parts & kOutput) spec_.down.forward(activated, rows_of(Slot::output, mb, sb), m_.gemm16);
  }

  MlpSpec spec_;
  std::int64_t pre_ = 0, act_ = 0;  // in internals
  std::int64_t stash_d_pre_ = 0;    // in deferred_
};

}  // namespace

std::int64_t scratch_wide_elements(const AttentionSpec& spec, std::int64_t seq_len) {
  return spec.at.rows * seq_len * spec.attention.qkv_width();
}

std::int64_t scratch_wide_elements(const MlpSpec& spec, std::int64_t seq_len) {
  const std::int64_t tokens = spec.at.rows * seq_len;
  const MlpActivation& act = spec.activation;
  return tokens * (act.width() + (act.kind() == Activation::swiglu ? act.input_width() : 0));
}

std::unique_ptr<Segment> make_attention_segment(int id, const ModelContext& model,
                                                AttentionSpec spec) {
  return std::make_unique<AttentionSegment>(id, model, std::move(spec));
}

std::unique_ptr<Segment> make_mlp_segment(int id, const ModelContext& model, MlpSpec spec) {
  return std::make_unique<MlpSegment>(id, model, std::move(spec));
}

}  // namespace oases::ops
