// LayerSegment: what the segments of a transformer layer (attention, MLP, MoE) share: the
// epilogue into their checkpoint, the optional pre-norm, the collectives over the layer's
// group, the pipeline input and the stage-1 backward. Internal to ops/ (layer_segments.cc,
// moe_segment.cc).
#pragma once

#include "core/error.h"
#include "kernels/kernels.h"
#include "ops/layer_segments.h"

#include <utility>

namespace oases::ops::detail {

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
    OASES_ASSERT(!spec.sequence_parallel || (spec.epilogue.spec().copies_input &&
                                             !spec.pre_norm.present() && !spec.input_from_peer),
                 "{}: under sequence parallelism the shard segment runs the epilogue and norm",
                 spec.name);
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
    return {reduction(), comm::ReduceOp::sum, layer_.at.group, rows_of(Slot::output, mb, sb), {}};
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return {
        reduction(), comm::ReduceOp::sum, layer_.at.group, rows_of(Slot::input_grad, mb, sb), {}};
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

  // How the group completes the output's and the input gradient's partial sums: whole on every
  // rank, or (sequence parallelism) each rank's block of the tokens.
  CollectiveKind reduction() const { return partial_sum_collective(layer_.sequence_parallel); }
  void run_backward(const StepContext& ctx, int mb, int sb, int stage, bool defer) {
    if (stage == 0) return backward_body(ctx, mb, sb, defer);
    // Under sequence parallelism the shard segment before runs the pre-norm and epilogue back.
    if (layer_.sequence_parallel) return;
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

  // An attention block's q|k|v projections (one fused or three), column blocks of
  // qkv [tokens, their widths]: forward from x, and backward from d_qkv into d_x (whole,
  // input) and the parameters' gradients (whole, weight). The key bias's gradient stays
  // exactly zero (AttentionSpec::key_bias_grad).
  void project_qkv(const AttentionSpec& spec, const Tensor& x, const Tensor& qkv) const {
    std::int64_t column = 0;
    for (const ColumnParallelLinear& projection : spec.qkv) {
      projection.forward(
          x, spec.qkv.size() == 1 ? qkv : qkv.columns(column, column + projection.local_out()),
          m_.gemm16);
      column += projection.local_out();
    }
  }
  void project_qkv_back(const AttentionSpec& spec, const Tensor& d_qkv, const Tensor& x,
                        const Tensor& d_x, Part part) const {
    std::int64_t column = 0;
    for (std::size_t i = 0; i < spec.qkv.size(); ++i) {
      const ColumnParallelLinear& projection = spec.qkv[i];
      const std::int64_t width = projection.local_out();
      const Tensor dy = spec.qkv.size() == 1 ? d_qkv : d_qkv.columns(column, column + width);
      switch (part) {
        case Part::whole:
          projection.backward(dy, x, d_x, i > 0, m_.gemm16);
          break;
        case Part::input:
          projection.backward_input(dy, x, d_x, i > 0, m_.gemm16);
          break;
        case Part::weight:
          projection.backward_weight(dy, x, m_.gemm16);
          break;
      }
      column += width;
    }
    if (part != Part::input && !spec.key_bias_grad.empty()) kernels::zero(spec.key_bias_grad);
  }

  // The q|k|v projections' products over this segment's tokens: forward into `forward`, the
  // input gradient into `input`, the weight gradient into `weight`.
  void add_qkv_work(const AttentionSpec& spec, Work& forward, Work& input, Work& weight) const {
    const std::int64_t n = tokens_, C = m_.hidden;
    for (const ColumnParallelLinear& projection : spec.qkv) {
      forward.matmuls.push_back({n, projection.local_out(), C});
      input.matmuls.push_back({n, C, projection.local_out()});
      weight.matmuls.push_back({C, projection.local_out(), n});
    }
  }
  // The weight part of the q|k|v projections of a context-parallel layer, whose input-only
  // backward stashed their output gradient [tokens, width] at `offset`; releases the stash.
  void qkv_weight_part(const AttentionSpec& spec, int mb, int sb, std::int64_t offset,
                       std::int64_t width) {
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const Tensor stash = store().get(key(mb, sb, kDeferredGradients));
    project_qkv_back(spec, matrix(stash, offset, width), body_input(checkpoint, internals),
                     Tensor(), Part::weight);
    store().release(key(mb, sb, kDeferredGradients));
  }

  SegmentShape layer_shape(TensorSets sets) const {
    SegmentShape shape;
    shape.has_weight_part = true;
    shape.deferred_gradient_bytes = deferred_.bytes();
    shape.name = layer_.name;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.forward_kind = shape.backward_kind = reduction();
    shape.sequence_sharded = layer_.sequence_parallel;
    shape.collective_ranks = layer_.at.degree;
    shape.degree = layer_.at.degree;
    shape.layer = layer_.layer;
    shape.recomputable = true;
    shape.checkpoint_replicated = layer_.at.degree > 1;
    if (const int residual = layer_.epilogue.spec().residual_segment;
        residual >= 0 && residual != id() - 1)
      shape.residual_of = residual;
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

  // Work shared by the layer segments (SegmentWork), per instance of tokens_ rows: the
  // epilogue reads the output's partial sums and the residual and writes the checkpoint (a
  // post-norm reads and writes it once more); the pre-norm reads the checkpoint and writes its
  // output; backward stage 1 runs both backward (each reads its input and the gradient and
  // writes a gradient).
  double row_bytes() const {
    return static_cast<double>(tokens_ * m_.hidden) * static_cast<double>(dtype_size(m_.dtype));
  }
  Work epilogue_work() const {
    Work w;
    w.bytes = (layer_.epilogue.spec().post_norm.present() ? 5 : 3) * row_bytes();
    return w;
  }
  Work pre_norm_work() const {
    Work w;
    w.bytes = layer_.pre_norm.present() ? 2 * row_bytes() : 0;
    return w;
  }
  Work stage_one_work() const {
    Work w;
    if (layer_.sequence_parallel) return w;
    w.bytes = (3 + (layer_.pre_norm.present() ? 3 : 0) +
               (layer_.epilogue.spec().post_norm.present() ? 3 : 0)) *
              row_bytes();
    return w;
  }

  Tensor rows_of(Slot slot, int mb, int sb) const {
    return m_.slot_rows(slot, mb, sb, layer_.at.rows);
  }
  Tensor matrix(const Tensor& block, std::int64_t offset, std::int64_t cols) const {
    return block.view(offset, {tokens_, cols});
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
    else if (layer_.sequence_parallel)
      input = rows_of(Slot::output, mb, sb);  // all-gathered
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

}  // namespace oases::ops::detail
