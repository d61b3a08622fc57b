// The sequence-parallel shard segment (ops/layer_segments.h, make_sequence_shard_segment).
#include "ops/layer_segments.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <string>
#include <utility>

namespace oases::ops {
namespace {

class SequenceShardSegment final : public Segment {
 public:
  SequenceShardSegment(int id, const ModelContext& model, LayerSpec spec)
      : Segment(id, *model.store),
        m_(model),
        spec_(std::move(spec)),
        layer_tokens_(spec_.at.rows * model.seq_len),
        tokens_(layer_tokens_ / spec_.at.degree),
        first_token_(tokens_ * spec_.at.shard),
        checkpoint_(model.dtype),
        internals_(model.dtype) {
    OASES_ASSERT(layer_tokens_ % spec_.at.degree == 0,
                 "{}: {} tokens do not split into {} sequence shards", spec_.name, layer_tokens_,
                 spec_.at.degree);
    if (spec_.before.group == nullptr || spec_.input_from_peer) spec_.before = spec_.at;
    OASES_ASSERT(spec_.before.rows * model.seq_len == tokens_ * spec_.before.degree,
                 "{}: the block before holds {} tokens per rank, this one {}", spec_.name,
                 spec_.before.rows * model.seq_len / spec_.before.degree, tokens_);
    before_first_token_ = tokens_ * spec_.before.shard;
    const std::int64_t C = model.hidden;
    residual_ = checkpoint_.add(tokens_ * C);
    epilogue_kept_ = spec_.epilogue.add_kept(checkpoint_, tokens_, C);
    if (spec_.pre_norm.present())
      norm_stats_ = internals_.add_statistics(spec_.pre_norm.stats_per_row() * tokens_);
  }
  const std::string& name() const override { return spec_.name; }

  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = spec_.name;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.forward_kind = shape.backward_kind = CollectiveKind::all_gather;
    shape.sequence_sharded = true;
    shape.collective_ranks = spec_.at.degree;
    shape.degree = spec_.at.degree;
    if (spec_.before.degree != spec_.at.degree) shape.backward_degree = spec_.before.degree;
    shape.layer = spec_.layer;
    shape.recomputable = true;
    if (const int residual = spec_.epilogue.spec().residual_segment;
        residual >= 0 && residual != id() - 1)
      shape.residual_of = residual;
    shape.input_from_peer = spec_.input_from_peer;
    if (spec_.input_from_peer) shape.received_bytes = checkpoint_bytes_of_residual();
    shape.sets = kCheckpoint | (spec_.pre_norm.present() ? kInternals : 0);
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.checkpoint_statistics_bytes = checkpoint_.statistics_bytes();
    if (spec_.pre_norm.present()) {
      shape.internals_bytes = internals_.bytes();
      shape.internals_statistics_bytes = internals_.statistics_bytes();
    }
    shape.forward_collective_elements = layer_tokens_ * m_.hidden;
    shape.backward_collective_elements = spec_.before.rows * m_.seq_len * m_.hidden;
    // On the shard: the epilogue reads the reduced block and the residual and writes the
    // checkpoint (a post-norm reads and writes it again); the pre-norm (or the copy of the
    // residual) writes the gather's block. Backward runs both back.
    const double row = static_cast<double>(checkpoint_bytes_of_residual());
    const bool post = spec_.epilogue.spec().post_norm.present();
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint.bytes = (post ? 5 : 3) * row;
    w.internals.bytes = 2 * row;
    w.backward_input = {Work{{}, (3 + (spec_.pre_norm.present() ? 3 : 0) + (post ? 3 : 0)) * row},
                        Work{}};
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kInternals | kOutput);
  }
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets);
  }
  // Stage 0: the block's reduced input gradient through the pre-norm, plus the residual
  // gradient, through the epilogue into this rank's block of output_grad in the rows of the
  // block before; the residual's gradient is left there too, for the shard segment before.
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    if (stage != 0) return;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor input_grad = block(Slot::input_grad, mb, sb);
    const Tensor residual_grad = block(Slot::residual_grad, mb, sb);
    const Tensor residual_grad_before = block_before(Slot::residual_grad, mb, sb);
    const Tensor scratch = m_.scratch_narrow.rows(0, tokens_);
    if (spec_.feeds_head) {
      // The head's d(r_L) already is this block's residual gradient.
    } else if (spec_.pre_norm.present()) {
      spec_.pre_norm.backward(input_grad, residual(checkpoint),
                              norm_stats(store().get(key(mb, sb, kInternals))), scratch);
      kernels::add(residual_grad, scratch, residual_grad);
    } else {
      kernels::add(residual_grad, input_grad, residual_grad);
    }
    if (before_first_token_ != first_token_) kernels::copy(residual_grad, residual_grad_before);
    spec_.epilogue.backward(m_, ctx, mb, sb, spec_.at.rows, spec_.at.first_row,
                            residual_grad_before, block_before(Slot::output_grad, mb, sb),
                            epilogue_kept(checkpoint), scratch, first_token_);
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return gather(Slot::output, mb, sb);
  }
  // The block before gets its whole output gradient back.
  CollectiveCall backward_collective(int mb, int sb) override {
    return {CollectiveKind::all_gather, comm::ReduceOp::sum, spec_.before.group,
            m_.slot_rows(Slot::output_grad, mb, sb, spec_.before.rows),
            block_before(Slot::output_grad, mb, sb)};
  }
  Tensor recv_buffer(Payload payload, int mb, int sb) override {
    OASES_ASSERT(spec_.input_from_peer && payload == Payload::activation, "{} receives no {}",
                 name(), payload == Payload::activation ? "activation" : "gradient");
    return store()
        .acquire(key(mb, sb, kReceivedInput), m_.dtype, tokens_ * m_.hidden)
        .reshaped({tokens_, m_.hidden});
  }
  Tensor send_buffer(Payload payload, int mb, int sb) override {
    OASES_ASSERT(spec_.input_from_peer && payload == Payload::gradient, "{} sends no {}", name(),
                 payload == Payload::activation ? "activation" : "gradient");
    return block(Slot::residual_grad, mb, sb);  // the epilogue's copy leaves d(input) there
  }

 private:
  std::size_t checkpoint_bytes_of_residual() const {
    return static_cast<std::size_t>(tokens_ * m_.hidden) * dtype_size(m_.dtype);
  }
  // This rank's block of the layer's rows of a slot: [tokens_, hidden].
  Tensor block(Slot slot, int mb, int sb) const {
    return m_.slot_rows(slot, mb, sb, spec_.at.rows).rows(first_token_, first_token_ + tokens_);
  }
  // The same tokens in the rows of the block before.
  Tensor block_before(Slot slot, int mb, int sb) const {
    return m_.slot_rows(slot, mb, sb, spec_.before.rows)
        .rows(before_first_token_, before_first_token_ + tokens_);
  }
  CollectiveCall gather(Slot slot, int mb, int sb) const {
    return {CollectiveKind::all_gather, comm::ReduceOp::sum, spec_.at.group,
            m_.slot_rows(slot, mb, sb, spec_.at.rows), block(slot, mb, sb)};
  }
  Tensor residual(const Tensor& checkpoint) const {
    return checkpoint.view(residual_, {tokens_, m_.hidden});
  }
  ResidualEpilogue::Kept epilogue_kept(const Tensor& checkpoint) const {
    return spec_.epilogue.kept(checkpoint, checkpoint_, epilogue_kept_, tokens_, m_.hidden);
  }
  Tensor norm_stats(const Tensor& internals) const {
    return statistics_view(internals, internals_.statistics_offset(norm_stats_),
                           spec_.pre_norm.stats_per_row() * tokens_);
  }

  // kCheckpoint: the epilogue; kInternals: the pre-norm's statistics; kOutput: the block the
  // all-gather sends (the pre-norm's output, or the residual itself without one). Without
  // kOutput the norm's output goes to scratch: the slot may be another instance's by then.
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) {
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    if (parts & kCheckpoint) {
      const ResidualEpilogue& epilogue = spec_.epilogue;
      Tensor input;
      if (spec_.input_from_peer)
        input = store().get(key(mb, sb, kReceivedInput)).reshaped({tokens_, m_.hidden});
      else
        input = block_before(Slot::output, mb, sb);
      Tensor residual_in;
      if (epilogue.spec().residual_segment >= 0)
        residual_in = store()
                          .get({epilogue.spec().residual_segment, mb, sb, kCheckpoint})
                          .view(0, {tokens_, m_.hidden});
      epilogue.forward(m_, ctx, mb, sb, spec_.at.rows, spec_.at.first_row, input, residual_in,
                       residual(checkpoint), epilogue_kept(checkpoint), first_token_);
      if (spec_.input_from_peer) store().release(key(mb, sb, kReceivedInput));
    }
    const bool norm = spec_.pre_norm.present();
    if (norm && (parts & (kInternals | kOutput))) {
      const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
      const Tensor out =
          (parts & kOutput) ? block(Slot::output, mb, sb) : m_.scratch_narrow.rows(0, tokens_);
      spec_.pre_norm.forward(residual(checkpoint), out, norm_stats(internals));
    } else if (parts & kOutput) {
      kernels::copy(residual(checkpoint), block(Slot::output, mb, sb));
    }
  }

  const ModelContext& m_;
  LayerSpec spec_;
  std::int64_t layer_tokens_;  // the layer's rows x seq
  std::int64_t tokens_;        // this rank's block of them
  std::int64_t first_token_;
  std::int64_t before_first_token_ = 0;  // of the same tokens in the rows of the block before
  SetLayout checkpoint_, internals_;
  std::int64_t residual_ = 0;                   // in checkpoint_
  ResidualEpilogue::KeptPieces epilogue_kept_;  // in checkpoint_
  int norm_stats_ = -1;                         // in internals_
};

}  // namespace

std::unique_ptr<Segment> make_sequence_shard_segment(int id, const ModelContext& model,
                                                     LayerSpec spec) {
  return std::make_unique<SequenceShardSegment>(id, model, std::move(spec));
}

}  // namespace oases::ops
