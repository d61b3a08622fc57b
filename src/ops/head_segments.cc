#include "ops/head_segments.h"

#include "core/error.h"
#include "core/time_breakdown.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <string>
#include <utility>

namespace oases::ops {
namespace {

// The part every head shares: r_L from the epilogue, the features, and their backward, laid
// out in the head's internals block.
class HeadBody {
 public:
  HeadBody(const ModelContext& model, const HeadSpec& spec, SetLayout& internals)
      : m_(model), spec_(spec), layout_(internals), tokens_(model.tokens()) {
    const std::int64_t n = tokens_, C = model.hidden;
    residual_ = internals.add(n * C);
    epilogue_kept_ = spec.epilogue.add_kept(internals, n, C);
    if (spec.has_transform) {
      transform_pre_ = internals.add(n * C);
      transform_act_ = internals.add(n * C);
      transform_out_ = internals.add(n * C);
      transform_stats_ = internals.add_statistics(spec.transform_norm.stats_per_row() * n);
    }
    if (spec.final_norm.present()) {
      final_out_ = internals.add(n * C);
      final_stats_ = internals.add_statistics(spec.final_norm.stats_per_row() * n);
    }
    OASES_ASSERT(spec.has_transform || spec.final_norm.present(), "a head without features");
  }

  // r_L and the features; returns the features [n, C].
  Tensor forward(const StepContext& ctx, int mb, int sb, int residual_of,
                 const Tensor& internals) const {
    const ResidualEpilogue& epilogue = spec_.epilogue;
    const Tensor input = m_.slot(
        epilogue.spec().copies_input && !spec_.gathered_input ? Slot::reshard : Slot::output, mb,
        sb);
    Tensor residual_in;
    if (epilogue.spec().residual_segment >= 0)
      residual_in = m_.store->get({residual_of, mb, sb, kCheckpoint}).view(0, {tokens_, m_.hidden});
    epilogue.forward(m_, ctx, mb, sb, m_.rows, 0, input, residual_in, residual(internals),
                     epilogue_kept(internals));
    Tensor x = residual(internals);
    if (spec_.has_transform) {
      const Tensor pre = matrix(internals, transform_pre_), act = matrix(internals, transform_act_);
      spec_.transform.forward(x, pre, m_.gemm16);
      kernels::gelu_forward(pre, act, kernels::GeluForm::erf);
      x = matrix(internals, transform_out_);
      spec_.transform_norm.forward(act, x, transform_stats(internals));
    }
    if (spec_.final_norm.present()) {
      const Tensor out = matrix(internals, final_out_);
      spec_.final_norm.forward(x, out, final_stats(internals));
      x = out;
    }
    return x;
  }
  Tensor features(const Tensor& internals) const {
    return matrix(internals, spec_.final_norm.present() ? final_out_ : transform_out_);
  }

  // The body's work (SegmentWork): forward runs the epilogue, the transform (GEMM, GeLU, norm)
  // and the final norm; backward runs them back, the transform's weight gradient apart.
  double row_bytes() const {
    return static_cast<double>(tokens_ * m_.hidden) * static_cast<double>(dtype_size(m_.dtype));
  }
  Work forward_work() const {
    Work w;
    w.bytes = (spec_.epilogue.spec().post_norm.present() ? 5 : 3) * row_bytes();
    if (spec_.has_transform) {
      w.matmuls.push_back({tokens_, m_.hidden, m_.hidden});
      w.bytes += 4 * row_bytes();
    }
    if (spec_.final_norm.present()) w.bytes += 2 * row_bytes();
    return w;
  }
  Work backward_work() const {
    Work w;
    w.bytes = (spec_.epilogue.spec().post_norm.present() ? 6 : 3) * row_bytes();
    if (spec_.has_transform) {
      w.matmuls.push_back({tokens_, m_.hidden, m_.hidden});
      w.bytes += 6 * row_bytes();
    }
    if (spec_.final_norm.present()) w.bytes += 3 * row_bytes();
    return w;
  }
  Work weight_work() const {
    Work w;
    if (spec_.has_transform) w.matmuls.push_back({m_.hidden, m_.hidden, tokens_});
    return w;
  }

  // From d(features) (reduced over the group) to d(previous output) in output_grad.
  void backward(const StepContext& ctx, int mb, int sb, const Tensor& internals,
                const Tensor& d_features) const {
    const Tensor residual_grad = m_.slot(Slot::residual_grad, mb, sb);
    const Tensor narrow = m_.scratch_narrow, wide = m_.scratch_wide.view(0, {tokens_, m_.hidden});
    Tensor d = d_features;
    if (spec_.final_norm.present()) {
      const Tensor x = spec_.has_transform ? matrix(internals, transform_out_) : residual(internals);
      const Tensor out = spec_.has_transform ? narrow : residual_grad;
      spec_.final_norm.backward(d, x, final_stats(internals), out);
      d = out;
    }
    if (spec_.has_transform) {
      spec_.transform_norm.backward(d, matrix(internals, transform_act_),
                                    transform_stats(internals), wide);
      kernels::gelu_backward(matrix(internals, transform_pre_), wide, wide, kernels::GeluForm::erf);
      spec_.transform.backward(wide, residual(internals), residual_grad, false, m_.gemm16);
    }
    spec_.epilogue.backward(m_, ctx, mb, sb, m_.rows, 0, residual_grad,
                            m_.slot(Slot::output_grad, mb, sb), epilogue_kept(internals), narrow);
  }

  // Sum of a sub-batch's per-token losses and the number of targets they count.
  static void accumulate_loss(const Tensor& losses, const std::int32_t* targets,
                              LossAccumulator& loss) {
    loss.sum += kernels::sum(losses);
    const std::int64_t n = losses.numel();
    loss.count += std::count_if(targets, targets + n, [](std::int32_t t) { return t >= 0; });
  }

 private:
  Tensor matrix(const Tensor& block, std::int64_t offset) const {
    return block.view(offset, {tokens_, m_.hidden});
  }
  Tensor residual(const Tensor& internals) const { return matrix(internals, residual_); }
  ResidualEpilogue::Kept epilogue_kept(const Tensor& internals) const {
    return spec_.epilogue.kept(internals, layout_, epilogue_kept_, tokens_, m_.hidden);
  }
  Tensor transform_stats(const Tensor& internals) const {
    return statistics_view(internals, layout_.statistics_offset(transform_stats_),
                           spec_.transform_norm.stats_per_row() * tokens_);
  }
  Tensor final_stats(const Tensor& internals) const {
    return statistics_view(internals, layout_.statistics_offset(final_stats_),
                           spec_.final_norm.stats_per_row() * tokens_);
  }

  const ModelContext& m_;
  const HeadSpec& spec_;
  const SetLayout& layout_;  // the internals' (the owning segment's)
  std::int64_t tokens_;
  std::int64_t residual_ = 0;
  ResidualEpilogue::KeptPieces epilogue_kept_;
  std::int64_t transform_pre_ = 0, transform_act_ = 0, transform_out_ = 0;
  std::int64_t final_out_ = 0;
  int transform_stats_ = -1, final_stats_ = -1;
};

const std::int32_t* targets_of(const ModelContext& m, const StepContext& ctx, int mb, int sb) {
  const std::int32_t* targets = ctx.micro_batches[static_cast<std::size_t>(mb)].targets;
  return targets ? targets + sb * m.tokens() : nullptr;
}

SegmentShape head_shape(const ModelContext& m, const std::string& name) {
  SegmentShape shape;
  shape.name = name;
  shape.collective_ranks = m.tp_size();
  shape.degree = m.tp_size();
  return shape;
}

// The head in a tensor-parallel group of one: everything in one segment, logits in chunks.
class FusedHeadSegment final : public Segment {
 public:
  static constexpr std::int64_t kRowsPerChunk = 256;

  FusedHeadSegment(int id, const ModelContext& model, HeadSpec spec, LossAccumulator& loss,
                   Arena& arena)
      : Segment(id, *model.store),
        m_(model),
        spec_(std::move(spec)),
        internals_(model.dtype),
        body_(model, spec_, internals_),
        loss_(loss) {
    const std::int64_t chunk = std::min(kRowsPerChunk, model.tokens());
    const std::int64_t V = spec_.vocab_weight.value.dim(0);
    // d(features) is formed during forward, so it is kept with the instance until its
    // backward (a schedule may run other instances' forwards in between).
    d_features_ = internals_.add(model.tokens() * model.hidden);
    logits_ = arena.allocate(model.dtype, {chunk, V});
    losses_ = arena.allocate(statistics_dtype(model.dtype), {chunk});
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape = head_shape(m_, name_);
    shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.sets = kInternals;
    shape.internals_bytes = internals_.bytes();
    shape.internals_statistics_bytes = internals_.statistics_bytes();
    shape.backward_collective_elements = m_.tokens() * m_.hidden;
    // Forward forms the logits, the loss and their gradients, d(features) and the vocabulary
    // weight's gradient (in training); backward runs the body back.
    const std::int64_t n = m_.tokens(), C = m_.hidden, V = spec_.vocab_weight.value.dim(0);
    const double logits = static_cast<double>(n * V) * static_cast<double>(dtype_size(m_.dtype));
    SegmentWork& w = shape.work;
    w.known = true;
    w.internals = body_.forward_work();
    w.internals.matmuls.insert(w.internals.matmuls.end(), {{n, V, C}, {n, C, V}, {V, C, n}});
    w.internals.bytes += 2 * logits;
    w.backward_input = {Work{}, body_.backward_work()};
    w.backward_weight = body_.weight_work();
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    const Tensor internals = store().acquire(key(mb, sb, kInternals), m_.dtype,
                                             internals_.elements(), internals_.encodable_elements());
    const Tensor x = body_.forward(ctx, mb, sb, spec_.epilogue.spec().residual_segment, internals);
    const std::int64_t n = m_.tokens(), V = spec_.vocab_weight.value.dim(0);
    const std::int32_t* targets = targets_of(m_, ctx, mb, sb);
    const Tensor d_x = d_features(internals);
    // Timed as the head: the vocabulary projection and the loss (the body above is not).
    const TimeAttributionScope head_time(TimeCategory::head);
    for (std::int64_t row = 0; row < n; row += logits_.dim(0)) {
      const std::int64_t rows = std::min(logits_.dim(0), n - row);
      const Tensor x_rows = x.rows(row, row + rows);
      if (ctx.head_mode == HeadMode::logits) {
        const std::int64_t first = static_cast<std::int64_t>(sb) * n + row;
        kernels::linear_forward(x_rows, spec_.vocab_weight.value, kernels::WeightLayout::out_in,
                                spec_.vocab_bias.value, ctx.logits_out.rows(first, first + rows),
                                false, m_.gemm16);
        continue;
      }
      const Tensor logits = logits_.rows(0, rows), losses = losses_.rows(0, rows);
      kernels::linear_forward(x_rows, spec_.vocab_weight.value, kernels::WeightLayout::out_in,
                              spec_.vocab_bias.value, logits, false, m_.gemm16);
      if (ctx.head_mode == HeadMode::train) {
        kernels::cross_entropy_forward_backward(logits, V, targets + row, losses,
                                                ctx.loss_gradient_scale);
        // d(features) = d(logits) @ W; d(W) += d(logits)^T features (and the bias's sums).
        kernels::linear_backward(logits, x_rows, spec_.vocab_weight.value,
                                 kernels::WeightLayout::out_in, d_x.rows(row, row + rows), false,
                                 spec_.vocab_weight.grad, spec_.vocab_bias.grad, m_.gemm16);
      } else {
        kernels::cross_entropy_forward(logits, V, targets + row, losses);
      }
      HeadBody::accumulate_loss(losses, targets + row, loss_);
    }
  }
  // Stage 0 has nothing left to do (the logits' gradient was formed in forward).
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    OASES_ASSERT(ctx.head_mode == HeadMode::train, "backward needs HeadMode::train");
    if (stage == 0) return;
    const Tensor internals = store().get(key(mb, sb, kInternals));
    body_.backward(ctx, mb, sb, internals, d_features(internals));
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return {CollectiveKind::all_reduce, comm::ReduceOp::sum, m_.tp,
            d_features(store().get(key(mb, sb, kInternals))), {}};
  }

 private:
  Tensor d_features(const Tensor& internals) const {
    return internals.view(d_features_, {m_.tokens(), m_.hidden});
  }

  const ModelContext& m_;
  HeadSpec spec_;
  SetLayout internals_;
  HeadBody body_;
  LossAccumulator& loss_;
  std::int64_t d_features_ = 0;
  Tensor logits_, losses_;  // [chunk, V], [chunk] scratch
  std::string name_ = "head";
};

// The vocab-parallel head's first segment; keeps everything the other two read.
class VocabParallelHeadSegment final : public Segment {
 public:
  VocabParallelHeadSegment(int id, const ModelContext& model, HeadSpec spec)
      : Segment(id, *model.store),
        m_(model),
        spec_(std::move(spec)),
        internals_(model.dtype),
        body_(model, spec_, internals_) {
    const std::int64_t n = model.tokens();
    logits_ = internals_.add(n * local_rows());
    row_max_ = internals_.add_statistics(n);
    sums_ = internals_.add_statistics(2 * n);
    losses_ = internals_.add_statistics(n);
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape = head_shape(m_, name_);
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.forward_reduce = ReduceKind::max;
    shape.backward_stages = 2;
    shape.sets = kInternals;
    shape.internals_bytes = internals_.bytes();
    shape.internals_statistics_bytes = internals_.statistics_bytes();
    shape.forward_collective_elements = m_.tokens();
    shape.backward_collective_elements = m_.tokens() * m_.hidden;
    // Forward: the body, then this rank's logits and their row maxima; backward stage 1 runs
    // the body back (stage 0 waits for head_loss's partial d(features)).
    const std::int64_t n = m_.tokens();
    SegmentWork& w = shape.work;
    w.known = true;
    w.internals = body_.forward_work();
    w.internals.matmuls.push_back({n, local_rows(), m_.hidden});
    w.internals.bytes += static_cast<double>(n * local_rows()) * static_cast<double>(dtype_size(m_.dtype));
    w.backward_input = {Work{}, body_.backward_work()};
    w.backward_weight = body_.weight_work();
    return shape;
  }
  const HeadSpec& spec() const { return spec_; }
  std::int64_t local_rows() const { return spec_.vocab_weight.value.dim(0); }

  // Views of instance (mb, sb)'s kept block.
  Tensor internals(int mb, int sb) const { return store().get(key(mb, sb, kInternals)); }
  Tensor logits(const Tensor& block) const {
    return block.view(logits_, {m_.tokens(), local_rows()});
  }
  Tensor row_max(const Tensor& block) const { return statistics(block, row_max_, m_.tokens()); }
  Tensor sums(const Tensor& block) const { return statistics(block, sums_, 2 * m_.tokens()); }
  Tensor losses(const Tensor& block) const { return statistics(block, losses_, m_.tokens()); }
  Tensor features(const Tensor& block) const { return body_.features(block); }

  void forward(const StepContext& ctx, int mb, int sb) override {
    OASES_ASSERT(ctx.head_mode != HeadMode::logits,
                 "whole logits are produced in a tensor-parallel group of one only");
    const Tensor block = store().acquire(key(mb, sb, kInternals), m_.dtype, internals_.elements(),
                                         internals_.encodable_elements());
    const Tensor x = body_.forward(ctx, mb, sb, spec_.epilogue.spec().residual_segment, block);
    const TimeAttributionScope head_time(TimeCategory::head);
    kernels::linear_forward(x, spec_.vocab_weight.value, kernels::WeightLayout::out_in,
                            spec_.vocab_bias.value, logits(block), false, m_.gemm16);
    kernels::cross_entropy_shard_max(logits(block), spec_.vocab_valid, row_max(block));
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    if (stage == 0) return;  // d(features) was formed by head_loss's backward
    body_.backward(ctx, mb, sb, internals(mb, sb), m_.slot(Slot::input_grad, mb, sb));
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return {CollectiveKind::all_reduce, comm::ReduceOp::max, m_.tp, row_max(internals(mb, sb)), {}};
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return {CollectiveKind::all_reduce, comm::ReduceOp::sum, m_.tp, m_.slot(Slot::input_grad, mb, sb), {}};
  }

 private:
  const ModelContext& m_;
  HeadSpec spec_;
  SetLayout internals_;
  HeadBody body_;
  Tensor statistics(const Tensor& block, int piece, std::int64_t count) const {
    return statistics_view(block, internals_.statistics_offset(piece), count);
  }
  std::int64_t logits_ = 0;
  int row_max_ = -1, sums_ = -1, losses_ = -1;
  std::string name_ = "head";
};

// Sums of exponentials and target logits over this rank's vocabulary block.
class HeadSoftmaxSegment final : public Segment {
 public:
  HeadSoftmaxSegment(int id, const ModelContext& model, const VocabParallelHeadSegment& head)
      : Segment(id, *model.store), m_(model), head_(head) {}
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape = head_shape(m_, name_);
    shape.has_forward_collective = true;
    shape.forward_collective_elements = 2 * m_.tokens();
    shape.reads_sets_of = {head_.id()};
    shape.work.known = true;
    shape.work.checkpoint.bytes = static_cast<double>(m_.tokens() * head_.local_rows()) *
                                  static_cast<double>(dtype_size(m_.dtype));
    shape.work.backward_input = {Work{}};
    return shape;
  }
  void forward(const StepContext& ctx, int mb, int sb) override {
    const Tensor block = head_.internals(mb, sb);
    const std::int64_t n = m_.tokens();
    const Tensor sums = head_.sums(block);
    kernels::cross_entropy_shard_sums(head_.logits(block), head_.spec().vocab_valid,
                                      targets_of(m_, ctx, mb, sb), head_.spec().vocab_begin,
                                      head_.row_max(block), sums.view(0, {n}), sums.view(n, {n}));
  }
  void backward(const StepContext&, int, int, int) override {}
  CollectiveCall forward_collective(int mb, int sb) override {
    return {CollectiveKind::all_reduce, comm::ReduceOp::sum, m_.tp,
            head_.sums(head_.internals(mb, sb)), {}};
  }

 private:
  const ModelContext& m_;
  const VocabParallelHeadSegment& head_;
  std::string name_ = "head_softmax";
};

// The losses; in training the logits become their gradient, which backward turns into the
// features' (partial) and the weight's gradients.
class HeadLossSegment final : public Segment {
 public:
  HeadLossSegment(int id, const ModelContext& model, const VocabParallelHeadSegment& head,
                  LossAccumulator& loss)
      : Segment(id, *model.store), m_(model), head_(head), loss_(loss) {}
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape = head_shape(m_, name_);
    shape.reads_sets_of = {head_.id()};
    // The vocabulary GEMM's weight gradient can wait: it reads the logits' gradient and the
    // features, which the head keeps anyway.
    shape.has_weight_part = true;
    // Forward turns the logits into their gradient in place; backward forms the partial
    // d(features) and the vocabulary block's weight gradient.
    const std::int64_t n = m_.tokens(), V = head_.local_rows(), C = m_.hidden;
    shape.work.known = true;
    shape.work.checkpoint.bytes =
        2.0 * static_cast<double>(n * V) * static_cast<double>(dtype_size(m_.dtype));
    shape.work.backward_input = {Work{{{n, C, V}}, 0}};
    shape.work.backward_weight.matmuls = {{V, C, n}};
    return shape;
  }
  void forward(const StepContext& ctx, int mb, int sb) override {
    const Tensor block = head_.internals(mb, sb);
    const std::int64_t n = m_.tokens();
    const Tensor sums = head_.sums(block), losses = head_.losses(block);
    const std::int32_t* targets = targets_of(m_, ctx, mb, sb);
    kernels::cross_entropy_shard_finish(head_.logits(block), head_.spec().vocab_valid, targets,
                                        head_.spec().vocab_begin, head_.row_max(block),
                                        sums.view(0, {n}), sums.view(n, {n}),
                                        ctx.loss_gradient_scale, losses,
                                        ctx.head_mode == HeadMode::train);
    HeadBody::accumulate_loss(losses, targets, loss_);
  }
  void backward(const StepContext& ctx, int mb, int sb, int) override {
    vocab_backward(ctx, mb, sb, true, true);
  }
  void backward_input(const StepContext& ctx, int mb, int sb, int) override {
    vocab_backward(ctx, mb, sb, true, false);
  }
  void backward_weight(const StepContext& ctx, int mb, int sb) override {
    vocab_backward(ctx, mb, sb, false, true);
  }

 private:
  const ModelContext& m_;
  // This rank's vocabulary block contributes a partial d(features) (`input`; the head's
  // backward collective sums it) and the gradients of its rows of the weight and bias (`weight`).
  void vocab_backward(const StepContext& ctx, int mb, int sb, bool input, bool weight) const {
    OASES_ASSERT(ctx.head_mode == HeadMode::train, "backward needs HeadMode::train");
    const Tensor block = head_.internals(mb, sb);
    const HeadSpec& spec = head_.spec();
    const TimeAttributionScope head_time(TimeCategory::head);
    kernels::linear_backward(head_.logits(block), head_.features(block), spec.vocab_weight.value,
                             kernels::WeightLayout::out_in,
                             input ? m_.slot(Slot::input_grad, mb, sb) : Tensor(), false,
                             weight ? spec.vocab_weight.grad : Tensor(),
                             weight ? spec.vocab_bias.grad : Tensor(), m_.gemm16);
  }

  const VocabParallelHeadSegment& head_;
  LossAccumulator& loss_;
  std::string name_ = "head_loss";
};

}  // namespace

void append_head_segments(int first_id, const ModelContext& model, HeadSpec spec,
                          LossAccumulator& loss, Arena& arena,
                          std::vector<std::unique_ptr<Segment>>& segments) {
  if (model.tp_size() == 1) {
    segments.push_back(
        std::make_unique<FusedHeadSegment>(first_id, model, std::move(spec), loss, arena));
    return;
  }
  auto head = std::make_unique<VocabParallelHeadSegment>(first_id, model, std::move(spec));
  const VocabParallelHeadSegment& head_ref = *head;
  segments.push_back(std::move(head));
  segments.push_back(std::make_unique<HeadSoftmaxSegment>(first_id + 1, model, head_ref));
  segments.push_back(std::make_unique<HeadLossSegment>(first_id + 2, model, head_ref, loss));
}

std::int64_t head_scratch_wide_elements(const ModelContext& model) {
  return model.tokens() * model.hidden;
}

}  // namespace oases::ops
