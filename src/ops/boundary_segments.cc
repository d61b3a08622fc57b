#include "ops/boundary_segments.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <utility>

namespace oases::ops {
namespace {

Tensor previous_checkpoint(ActivationStore& store, const ResidualEpilogue& epilogue, int mb,
                           int sb, std::int64_t tokens, std::int64_t hidden) {
  if (epilogue.spec().residual_segment < 0) return {};
  return store.get({epilogue.spec().residual_segment, mb, sb, kCheckpoint}).view(0, {tokens, hidden});
}

class ReshardSegment final : public Segment {
 public:
  ReshardSegment(int id, const ModelContext& model, ReshardSpec spec)
      : Segment(id, *model.store),
        m_(model),
        spec_(std::move(spec)),
        rises_(spec_.from.degree < spec_.to.degree),
        kept_(model.dtype) {
    OASES_ASSERT(spec_.from.degree != spec_.to.degree, "{}: no degree change", spec_.name);
    kept_pieces_ = spec_.epilogue.add_kept(kept_, epilogue_tokens(), model.hidden);
  }
  const std::string& name() const override { return spec_.name; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = spec_.name;
    shape.has_forward_collective = rises_;
    shape.has_backward_collective = !rises_;
    shape.backward_stages = rises_ ? 1 : 2;
    shape.forward_kind = shape.backward_kind = CollectiveKind::all_gather;
    shape.collective_ranks = spec_.gather_group->size();
    shape.degree = spec_.from.degree;
    if (has_kept()) {
      // A post-norm epilogue keeps its sum and statistics for the backward pass.
      shape.sets = kCheckpoint;
      shape.checkpoint_bytes = kept_.bytes();
      shape.checkpoint_statistics_bytes = kept_.statistics_bytes();
    }
    (rises_ ? shape.forward_collective_elements : shape.backward_collective_elements) =
        large().rows * m_.seq_len * m_.hidden;
    // The epilogue on the previous layer's rows, forward and back (the gathers are collectives).
    const double rows = static_cast<double>(epilogue_tokens() * m_.hidden) *
                        static_cast<double>(dtype_size(m_.dtype));
    const double post_norm = spec_.epilogue.spec().post_norm.present() ? 1 : 0;
    shape.work.known = true;
    shape.work.checkpoint.bytes = (3 + 2 * post_norm) * rows;
    shape.work.backward_input.assign(static_cast<std::size_t>(shape.backward_stages), Work{});
    shape.work.backward_input.back().bytes = (3 + 3 * post_norm) * rows;
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    const Tensor input = m_.slot(Slot::output, mb, sb);
    const Tensor reshard = m_.slot(Slot::reshard, mb, sb);
    const std::int64_t C = m_.hidden;
    if (rises_) {
      const std::int64_t n = spec_.from.rows * m_.seq_len;
      spec_.epilogue.forward(m_, ctx, mb, sb, spec_.from.rows, spec_.from.first_row,
                             input.rows(0, n), previous_checkpoint(store(), spec_.epilogue, mb, sb, n, C),
                             own_block(reshard), acquire_kept(mb, sb));
      return;
    }
    // The epilogue runs on every row of the previous group (its backward needs them all, and
    // a post-norm keeps its sums for them); this group's block then moves to the front.
    const std::int64_t n = spec_.from.rows * m_.seq_len;
    spec_.epilogue.forward(m_, ctx, mb, sb, spec_.from.rows, spec_.from.first_row,
                           input.rows(0, n), previous_checkpoint(store(), spec_.epilogue, mb, sb, n, C),
                           reshard.rows(0, n), acquire_kept(mb, sb));
    const std::int64_t skip = (spec_.to.first_row - spec_.from.first_row) * m_.seq_len;
    if (skip > 0) kernels::copy(reshard.rows(skip, skip + spec_.to.rows * m_.seq_len),
                                reshard.rows(0, spec_.to.rows * m_.seq_len));
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    const Tensor residual_grad = m_.slot(Slot::residual_grad, mb, sb);
    // Gradients are gathered in a gradient slot, never in the forward reshard slot, which the
    // next micro-batch's forward may be filling meanwhile (oases-interleaved).
    const Tensor gathered = m_.slot(kBackwardGatherSlot, mb, sb);
    const std::int64_t from_tokens = spec_.from.rows * m_.seq_len;
    const Tensor from_grad = residual_grad.rows(0, from_tokens);
    if (rises_) {
      // residual_grad holds the gradient of every row of the larger group; keep this group's
      // (a move to an earlier address: kernels::copy handles the overlap).
      const std::int64_t offset = own_offset();
      if (offset > 0) kernels::copy(residual_grad.rows(offset, offset + from_tokens), from_grad);
      run_epilogue_backward(ctx, mb, sb, from_grad);
      return;
    }
    if (stage == 0) {
      const std::int64_t to_tokens = spec_.to.rows * m_.seq_len;
      kernels::copy(residual_grad.rows(0, to_tokens), own_block(gathered));
      return;
    }
    kernels::copy(gathered.rows(0, from_tokens), from_grad);
    run_epilogue_backward(ctx, mb, sb, from_grad);
  }
  CollectiveCall forward_collective(int mb, int sb) override { return gather(Slot::reshard, mb, sb); }
  CollectiveCall backward_collective(int mb, int sb) override {
    return gather(kBackwardGatherSlot, mb, sb);
  }

 private:
  // Free between this segment's backward stages: the following segment's backward has consumed
  // it and the preceding one's has not started.
  static constexpr Slot kBackwardGatherSlot = Slot::input_grad;

  const Placement& small() const { return rises_ ? spec_.from : spec_.to; }
  const Placement& large() const { return rises_ ? spec_.to : spec_.from; }
  // Token offset of this rank's block (the smaller group's rows) within the larger group's.
  std::int64_t own_offset() const { return (small().first_row - large().first_row) * m_.seq_len; }
  Tensor own_block(const Tensor& slot) const {
    return slot.rows(own_offset(), own_offset() + small().rows * m_.seq_len);
  }
  CollectiveCall gather(Slot slot, int mb, int sb) const {
    const Tensor reshard = m_.slot(slot, mb, sb);
    const Tensor whole = reshard.rows(0, large().rows * m_.seq_len);
    return {CollectiveKind::all_gather, comm::ReduceOp::sum, spec_.gather_group,
            whole.reshaped({whole.numel()}), own_block(reshard).reshaped({small().rows * m_.seq_len * m_.hidden})};
  }
  void run_epilogue_backward(const StepContext& ctx, int mb, int sb, const Tensor& from_grad) {
    const std::int64_t n = spec_.from.rows * m_.seq_len;
    spec_.epilogue.backward(m_, ctx, mb, sb, spec_.from.rows, spec_.from.first_row, from_grad,
                            m_.slot(Slot::output_grad, mb, sb).rows(0, n),
                            has_kept() ? kept(store().get(key(mb, sb, kCheckpoint)))
                                       : ResidualEpilogue::Kept{},
                            m_.scratch_narrow.rows(0, n));
  }
  // The epilogue runs on layer l-1's rows.
  std::int64_t epilogue_tokens() const { return spec_.from.rows * m_.seq_len; }
  bool has_kept() const { return spec_.epilogue.keeps(); }
  ResidualEpilogue::Kept kept(const Tensor& block) const {
    return spec_.epilogue.kept(block, kept_, kept_pieces_, epilogue_tokens(), m_.hidden);
  }
  ResidualEpilogue::Kept acquire_kept(int mb, int sb) {
    if (!has_kept()) return {};
    return kept(store().acquire(key(mb, sb, kCheckpoint), m_.dtype, kept_.elements(),
                                kept_.encodable_elements()));
  }

  const ModelContext& m_;
  ReshardSpec spec_;
  bool rises_;
  SetLayout kept_;
  ResidualEpilogue::KeptPieces kept_pieces_;
};

class StageOutputSegment final : public Segment {
 public:
  StageOutputSegment(int id, const ModelContext& model, StageOutputSpec spec)
      : Segment(id, *model.store), m_(model), spec_(std::move(spec)), checkpoint_(model.dtype) {
    tokens_ = spec_.at.rows * model.seq_len;
    if (spec_.sequence_parallel) {
      tokens_ /= spec_.at.degree;
      first_token_ = tokens_ * spec_.at.shard;
    }
    output_ = checkpoint_.add(tokens_ * model.hidden);
    kept_ = spec_.epilogue.add_kept(checkpoint_, tokens_, model.hidden);
  }
  const std::string& name() const override { return spec_.name; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = spec_.name;
    shape.degree = spec_.at.degree;
    shape.collective_ranks = spec_.at.degree;
    shape.sets = kCheckpoint;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.checkpoint_statistics_bytes = checkpoint_.statistics_bytes();
    shape.output_to_peer = true;
    shape.received_bytes = static_cast<std::size_t>(tokens_ * m_.hidden) * dtype_size(m_.dtype);
    if (spec_.sequence_parallel) {
      shape.has_backward_collective = true;
      shape.backward_stages = 2;
      shape.backward_kind = CollectiveKind::all_gather;
      shape.sequence_sharded = true;
      shape.backward_collective_elements = spec_.at.rows * m_.seq_len * m_.hidden;
      if (const int residual = spec_.epilogue.spec().residual_segment;
          residual >= 0 && residual != id() - 1)
        shape.residual_of = residual;
    }
    const double rows = static_cast<double>(tokens_ * m_.hidden) * static_cast<double>(dtype_size(m_.dtype));
    const double post_norm = spec_.epilogue.spec().post_norm.present() ? 1 : 0;
    shape.work.known = true;
    shape.work.checkpoint.bytes = (3 + 2 * post_norm) * rows;
    shape.work.backward_input = {Work{{}, (4 + 3 * post_norm) * rows}};
    return shape;
  }
  void forward(const StepContext& ctx, int mb, int sb) override {
    const Tensor block = store().acquire(key(mb, sb, kCheckpoint), m_.dtype, checkpoint_.elements(),
                                         checkpoint_.encodable_elements());
    const Slot input = spec_.epilogue.spec().copies_input && !spec_.sequence_parallel
                           ? Slot::reshard
                           : Slot::output;
    spec_.epilogue.forward(m_, ctx, mb, sb, spec_.at.rows, spec_.at.first_row, rows(input, mb, sb),
                           previous_checkpoint(store(), spec_.epilogue, mb, sb, tokens_, m_.hidden),
                           output(block), kept(block), first_token_);
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    if (stage > 0) return;  // after the all-gather of the output gradient (sequence parallel)
    const Tensor block = store().get(key(mb, sb, kCheckpoint));
    const ActivationKey received = key(mb, sb, kReceivedGradient);
    kernels::copy(store().get(received).reshaped({tokens_, m_.hidden}),
                  rows(Slot::residual_grad, mb, sb));
    store().release(received);
    spec_.epilogue.backward(m_, ctx, mb, sb, spec_.at.rows, spec_.at.first_row,
                            rows(Slot::residual_grad, mb, sb), rows(Slot::output_grad, mb, sb),
                            kept(block), m_.scratch_narrow.rows(0, tokens_), first_token_);
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    OASES_ASSERT(spec_.sequence_parallel, "{} has no backward collective", name());
    return {CollectiveKind::all_gather, comm::ReduceOp::sum, spec_.at.group,
            m_.slot_rows(Slot::output_grad, mb, sb, spec_.at.rows),
            rows(Slot::output_grad, mb, sb)};
  }
  Tensor send_buffer(Payload payload, int mb, int sb) override {
    OASES_ASSERT(payload == Payload::activation, "{} sends activations only", name());
    return output(store().get(key(mb, sb, kCheckpoint)));
  }
  Tensor recv_buffer(Payload payload, int mb, int sb) override {
    OASES_ASSERT(payload == Payload::gradient, "{} receives gradients only", name());
    return store()
        .acquire(key(mb, sb, kReceivedGradient), m_.dtype, tokens_ * m_.hidden)
        .reshaped({tokens_, m_.hidden});
  }

 private:
  Tensor output(const Tensor& block) const { return block.view(output_, {tokens_, m_.hidden}); }
  // The rows of a slot this segment works on: the placement's, or this rank's block of them.
  Tensor rows(Slot slot, int mb, int sb) const {
    return m_.slot_rows(slot, mb, sb, spec_.at.rows).rows(first_token_, first_token_ + tokens_);
  }
  ResidualEpilogue::Kept kept(const Tensor& block) const {
    return spec_.epilogue.kept(block, checkpoint_, kept_, tokens_, m_.hidden);
  }

  const ModelContext& m_;
  StageOutputSpec spec_;
  SetLayout checkpoint_;
  std::int64_t tokens_ = 0, output_ = 0;
  std::int64_t first_token_ = 0;  // of this rank's block (sequence parallelism)
  ResidualEpilogue::KeptPieces kept_;
};

}  // namespace

std::unique_ptr<Segment> make_reshard_segment(int id, const ModelContext& model, ReshardSpec spec) {
  return std::make_unique<ReshardSegment>(id, model, std::move(spec));
}

std::unique_ptr<Segment> make_stage_output_segment(int id, const ModelContext& model,
                                                   StageOutputSpec spec) {
  return std::make_unique<StageOutputSegment>(id, model, std::move(spec));
}

}  // namespace oases::ops
