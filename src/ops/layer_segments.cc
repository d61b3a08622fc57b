#include "ops/layer_segments.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <utility>

namespace oases::ops {
namespace {

// What the attention and MLP segments share: the epilogue into their checkpoint, the optional
// pre-norm, the collectives, the pipeline input and the stage-1 backward.
class LayerSegment : public Segment {
 public:
  LayerSegment(int id, const ModelContext& model, const LayerSpec& spec)
      : Segment(id, *model.store),
        m_(model),
        layer_(spec),
        tokens_(spec.at.rows * model.seq_len),
        checkpoint_(model.dtype),
        internals_(model.dtype),
        core_(model.dtype),
        deferred_(model.dtype) {
    const std::int64_t C = model.hidden;
    stash_output_grad_ = deferred_.add(tokens_ * C);
    residual_ = checkpoint_.add(tokens_ * C);
    epilogue_kept_ = spec.epilogue.add_kept(checkpoint_, tokens_, C);
    if (spec.pre_norm.present()) {
      norm_out_ = internals_.add(tokens_ * C);
      norm_stats_ = internals_.add_statistics(spec.pre_norm.stats_per_row() * tokens_);
    }
  }
  const std::string& name() const override { return layer_.name; }

  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kInternals | kCore | kOutput);
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    run_backward(ctx, mb, sb, stage, false);
  }
  void backward_input(const StepContext& ctx, int mb, int sb, int stage) override {
    run_backward(ctx, mb, sb, stage, true);
  }
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets);
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return {CollectiveKind::all_reduce, comm::ReduceOp::sum, layer_.at.group, rows_of(Slot::output, mb, sb), {}};
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return {CollectiveKind::all_reduce, comm::ReduceOp::sum, layer_.at.group,
            rows_of(Slot::input_grad, mb, sb), {}};
  }
  comm::Communicator* replica_group() const override {
    return layer_.at.degree > 1 ? layer_.at.group : nullptr;
  }
  Tensor recv_buffer(Payload payload, int mb, int sb) override {
    OASES_ASSERT(layer_.input_from_peer && payload == Payload::activation,
                 "{} receives no {}", name(), payload == Payload::activation ? "activation" : "gradient");
    return store().acquire(key(mb, sb, kReceivedInput), m_.dtype, tokens_ * m_.hidden)
        .reshaped({tokens_, m_.hidden});
  }
  Tensor send_buffer(Payload payload, int mb, int sb) override {
    OASES_ASSERT(layer_.input_from_peer && payload == Payload::gradient, "{} sends no {}", name(),
                 payload == Payload::activation ? "activation" : "gradient");
    return rows_of(Slot::residual_grad, mb, sb);  // the epilogue's copy leaves d(input) there
  }

 protected:
  // Which gradients of a GEMM a backward forms: both, the input's, or the weight's.
  enum class Part { whole, input, weight };

  virtual void run(const StepContext& ctx, int mb, int sb, TensorSets parts) = 0;
  // Stage 0 of the body's backward; with `defer`, without the GEMMs' weight gradients, whose
  // output gradients go to the stash instead.
  virtual void backward_body(const StepContext& ctx, int mb, int sb, bool defer) = 0;

  void run_backward(const StepContext& ctx, int mb, int sb, int stage, bool defer) {
    if (stage == 0) return backward_body(ctx, mb, sb, defer);
    backward_to_previous(ctx, mb, sb, store().get(key(mb, sb, kCheckpoint)),
                         store().get(key(mb, sb, kInternals)));
  }
  // The stash of an input-only backward: acquired by stage 0, released by the weight part.
  Tensor acquire_stash(int mb, int sb) {
    return store().acquire(key(mb, sb, kDeferredGradients), deferred_.dtype(), deferred_.elements());
  }
  // The output's gradient, where stage 0 reads it: its slot, or (deferring) its copy in the
  // stash, which the weight part reads later.
  Tensor output_grad(int mb, int sb, const Tensor& stash) const {
    const Tensor slot = rows_of(Slot::output_grad, mb, sb);
    if (stash.empty()) return slot;
    const Tensor copy = matrix(stash, stash_output_grad_, m_.hidden);
    kernels::copy(slot, copy);
    return copy;
  }

  SegmentShape layer_shape(TensorSets sets) const {
    SegmentShape shape;
    shape.has_weight_part = true;
    shape.deferred_gradient_bytes = deferred_.bytes();
    shape.name = layer_.name;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.collective_ranks = layer_.at.degree;
    shape.degree = layer_.at.degree;
    shape.layer = layer_.layer;
    shape.recomputable = true;
    shape.checkpoint_replicated = layer_.at.degree > 1;
    shape.input_from_peer = layer_.input_from_peer;
    if (layer_.input_from_peer)
      shape.received_bytes = static_cast<std::size_t>(tokens_ * m_.hidden) * dtype_size(m_.dtype);
    shape.sets = sets;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.internals_bytes = internals_.bytes();
    shape.core_bytes = (sets & kCore) ? core_.bytes() : 0;
    shape.checkpoint_statistics_bytes = checkpoint_.statistics_bytes();
    shape.internals_statistics_bytes = internals_.statistics_bytes();
    shape.core_statistics_bytes = (sets & kCore) ? core_.statistics_bytes() : 0;
    shape.forward_collective_elements = shape.backward_collective_elements = tokens_ * m_.hidden;
    return shape;
  }

  Tensor rows_of(Slot slot, int mb, int sb) const {
    return m_.slot_rows(slot, mb, sb, layer_.at.rows);
  }
  Tensor matrix(const Tensor& block, std::int64_t offset, std::int64_t cols) const {
    return block.view(offset, {tokens_, cols});
  }
  Tensor acquire_or_get(int mb, int sb, TensorSet set, TensorSets parts, const SetLayout& layout) {
    return (parts & set) ? store().acquire(key(mb, sb, set), layout.dtype(), layout.elements(),
                                           layout.encodable_elements())
                         : store().get(key(mb, sb, set));
  }
  Tensor residual(const Tensor& checkpoint) const { return matrix(checkpoint, residual_, m_.hidden); }
  ResidualEpilogue::Kept epilogue_kept(const Tensor& checkpoint) const {
    return layer_.epilogue.kept(checkpoint, checkpoint_, epilogue_kept_, tokens_, m_.hidden);
  }
  Tensor norm_stats(const Tensor& internals) const {
    return statistics_view(internals, internals_.statistics_offset(norm_stats_),
                           layer_.pre_norm.stats_per_row() * tokens_);
  }
  // What the body computes from: the pre-norm's output, or the residual-stream value itself.
  Tensor body_input(const Tensor& checkpoint, const Tensor& internals) const {
    return layer_.pre_norm.present() ? matrix(internals, norm_out_, m_.hidden) : residual(checkpoint);
  }

  // Forms the checkpoint from the previous segment's reduced output (or a reshard's rows, or
  // the activation received from the previous stage).
  void run_epilogue(const StepContext& ctx, int mb, int sb, const Tensor& checkpoint) {
    const ResidualEpilogue& epilogue = layer_.epilogue;
    Tensor input;
    if (layer_.input_from_peer) input = store().get(key(mb, sb, kReceivedInput)).reshaped({tokens_, m_.hidden});
    else input = rows_of(epilogue.spec().copies_input ? Slot::reshard : Slot::output, mb, sb);
    Tensor residual_in;
    if (epilogue.spec().residual_segment >= 0)
      residual_in = store()
                        .get({epilogue.spec().residual_segment, mb, sb, kCheckpoint})
                        .view(0, {tokens_, m_.hidden});
    epilogue.forward(m_, ctx, mb, sb, layer_.at.rows, layer_.at.first_row, input, residual_in,
                     residual(checkpoint), epilogue_kept(checkpoint));
    if (layer_.input_from_peer) store().release(key(mb, sb, kReceivedInput));
  }
  void run_pre_norm(const Tensor& checkpoint, const Tensor& internals) const {
    if (!layer_.pre_norm.present()) return;
    layer_.pre_norm.forward(residual(checkpoint), matrix(internals, norm_out_, m_.hidden),
                            norm_stats(internals));
  }

  // Stage 1: the reduced input gradient joins the residual gradient (through the pre-norm),
  // then the epilogue's backward hands d(previous output) to the previous segment.
  void backward_to_previous(const StepContext& ctx, int mb, int sb, const Tensor& checkpoint,
                            const Tensor& internals) {
    const Tensor input_grad = rows_of(Slot::input_grad, mb, sb);
    const Tensor residual_grad = rows_of(Slot::residual_grad, mb, sb);
    const Tensor scratch = m_.scratch_narrow.rows(0, tokens_);
    if (layer_.pre_norm.present()) {
      layer_.pre_norm.backward(input_grad, residual(checkpoint), norm_stats(internals), scratch);
      kernels::add(residual_grad, scratch, residual_grad);
    } else {
      kernels::add(residual_grad, input_grad, residual_grad);
    }
    layer_.epilogue.backward(m_, ctx, mb, sb, layer_.at.rows, layer_.at.first_row, residual_grad,
                             rows_of(Slot::output_grad, mb, sb), epilogue_kept(checkpoint), scratch);
  }

  const ModelContext& m_;
  LayerSpec layer_;
  std::int64_t tokens_;
  // deferred_: the stash of an input-only backward (the output gradient, then what the
  // segment adds).
  SetLayout checkpoint_, internals_, core_, deferred_;
  std::int64_t stash_output_grad_ = 0;             // in deferred_
  std::int64_t residual_ = 0;                // in checkpoint_
  ResidualEpilogue::KeptPieces epilogue_kept_;  // in checkpoint_
  std::int64_t norm_out_ = 0;                 // in internals_
  int norm_stats_ = -1;                       // in internals_
};

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
  SegmentShape shape() const override { return layer_shape(kCheckpoint | kInternals | kCore); }

  void backward_weight(const StepContext&, int mb, int sb) override {
    const CoreAttention& a = spec_.attention;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const Tensor core = store().get(key(mb, sb, kCore));
    const Tensor stash = store().get(key(mb, sb, kDeferredGradients));
    spec_.out_proj.backward_weight(matrix(stash, stash_output_grad_, m_.hidden),
                                   matrix(core, attn_out_, a.out_width()), m_.gemm16);
    project_qkv_back(matrix(stash, stash_d_qkv_, a.qkv_width()), body_input(checkpoint, internals),
                     Tensor(), Part::weight);
    store().release(key(mb, sb, kDeferredGradients));
  }

 private:
  void backward_body(const StepContext&, int mb, int sb, bool defer) override {
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
    a.backward(d_attn, qkv, attn_out, statistics_view(core, core_.statistics_offset(lse_), a.lse_elements()), d_qkv);
    // This rank's heads contribute a partial gradient of the input; the group sums it.
    project_qkv_back(d_qkv, body_input(checkpoint, internals), rows_of(Slot::input_grad, mb, sb),
                     defer ? Part::input : Part::whole);
  }
  // The QKV projections' backward from d_qkv [tokens, qkv width] and their input x: d_x (whole,
  // input), the parameters' gradients (whole, weight).
  void project_qkv_back(const Tensor& d_qkv, const Tensor& x, const Tensor& d_x, Part part) const {
    std::int64_t column = 0;
    for (std::size_t i = 0; i < spec_.qkv.size(); ++i) {
      const ColumnParallelLinear& projection = spec_.qkv[i];
      const std::int64_t width = projection.local_out();
      const Tensor dy = spec_.qkv.size() == 1 ? d_qkv : d_qkv.columns(column, column + width);
      switch (part) {
        case Part::whole: projection.backward(dy, x, d_x, i > 0, m_.gemm16); break;
        case Part::input: projection.backward_input(dy, x, d_x, i > 0, m_.gemm16); break;
        case Part::weight: projection.backward_weight(dy, x, m_.gemm16); break;
      }
      column += width;
    }
    if (part != Part::input && !spec_.key_bias_grad.empty()) kernels::zero(spec_.key_bias_grad);
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
      // Column-parallel: this rank's heads only.
      if (spec_.qkv.size() == 1) {
        spec_.qkv[0].forward(x, qkv, m_.gemm16);
      } else {
        std::int64_t column = 0;
        for (const ColumnParallelLinear& projection : spec_.qkv) {
          projection.forward(x, qkv.columns(column, column + projection.local_out()), m_.gemm16);
          column += projection.local_out();
        }
      }
      a.rotate(qkv);
    }
    if (parts & kCore) a.forward(qkv, attn_out, statistics_view(core, core_.statistics_offset(lse_), a.lse_elements()));
    // Row-parallel projection: partial sums; its bias is added after the reduction.
    if (parts & kOutput) spec_.out_proj.forward(attn_out, rows_of(Slot::output, mb, sb), m_.gemm16);
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
  SegmentShape shape() const override { return layer_shape(kCheckpoint | kInternals); }

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
