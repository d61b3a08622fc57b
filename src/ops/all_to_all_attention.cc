// Attention under context parallelism of the all-to-all kind (ops/layer_segments.h,
// append_all_to_all_attention_segments): DeepSpeed-Ulysses as three segments.
//
// Shapes (one instance; c = cp ranks, r = this rank's cp rank; h, kv = the query and key/value
// heads of this tensor-parallel rank, d = head width; h' = h / c, kv' = kv / c):
//   n = rows x seq_len        this rank's tokens (two chunks of every sequence)
//   W = (h + 2 kv) d          q|k|v width of this tensor-parallel rank
//   W' = (h' + 2 kv') d       the same for one head group, O = h d, O' = h' d
//   N = rows x full_seq_len   every token of the instance's sequences, in sequence order
//
// Head group j is query heads [j h', (j + 1) h') with key/value heads [j kv', (j + 1) kv'):
// h' / kv' = h / kv, so every query head keeps its key/value head. Rank j computes the core
// attention of head group j over every token; an all-to-all block to or from rank j is [n, W']
// or [n, O'] rows in rank j's local token order.
#include "ops/layer_segments.h"

#include "ops/layer_segment_base.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <utility>

namespace oases::ops {
namespace {

using detail::LayerSegment;

// What the three segments share: the head split and the moves between layouts.
struct HeadSplit {
  const ModelContext* m = nullptr;
  std::int64_t rows = 0;                               // sequences of the instance
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;  // of this tensor-parallel rank
  int groups = 1;                                      // c

  std::int64_t local_tokens() const { return rows * m->seq_len; }
  std::int64_t full_tokens() const { return rows * m->full_seq_len; }
  std::int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  std::int64_t group_heads() const { return heads / groups; }
  std::int64_t group_kv_heads() const { return kv_heads / groups; }
  std::int64_t group_qkv_width() const { return qkv_width() / groups; }
  std::int64_t out_width() const { return heads * head_dim; }
  std::int64_t group_out_width() const { return out_width() / groups; }

  // Calls move(q|k|v column range in the whole [.., W] layout, the same range in a group's
  // [.., W'] layout) for head group j's three column blocks.
  template <class Move>
  void for_each_qkv_block(int j, const Move& move) const {
    const std::int64_t d = head_dim, hq = group_heads(), hk = group_kv_heads();
    const std::int64_t whole[3] = {j * hq * d, (heads + j * hk) * d,
                                   (heads + kv_heads + j * hk) * d};
    const std::int64_t group[3] = {0, hq * d, (hq + hk) * d};
    const std::int64_t width[3] = {hq * d, hk * d, hk * d};
    for (int part = 0; part < 3; ++part) move(whole[part], group[part], width[part]);
  }
  // Block j of an all-to-all buffer of `width` columns per block.
  Tensor block(const Tensor& buffer, int j, std::int64_t width) const {
    return buffer.view(j * local_tokens() * width, {local_tokens(), width});
  }
  // whole [n, W] <-> `buffer`: block j holds head group j's columns; `out`: from whole into
  // the buffer, else back.
  void move_qkv_columns(const Tensor& whole, const Tensor& buffer, bool out) const {
    for (int j = 0; j < groups; ++j) {
      const Tensor group = block(buffer, j, group_qkv_width());
      for_each_qkv_block(j,
                         [&](std::int64_t whole_column, std::int64_t group_column, std::int64_t w) {
                           const Tensor a = whole.columns(whole_column, whole_column + w);
                           const Tensor b = group.columns(group_column, group_column + w);
                           out ? kernels::copy_matrix(a, b) : kernels::copy_matrix(b, a);
                         });
    }
  }
  // [n, O] <-> `buffer`: block j holds head group j's columns [n, O'].
  void move_out_columns(const Tensor& whole, const Tensor& buffer, bool out) const {
    const std::int64_t w = group_out_width();
    for (int j = 0; j < groups; ++j) {
      const Tensor a = whole.columns(j * w, (j + 1) * w), b = block(buffer, j, w);
      out ? kernels::copy_matrix(a, b) : kernels::copy_matrix(b, a);
    }
  }
  // Calls move(rows of block j's local tokens, the same tokens' rows in sequence order, count)
  // for every chunk of every sequence rank j holds.
  template <class Move>
  void for_each_chunk(int j, const Move& move) const {
    const std::int64_t chunk = m->chunk_len(), seq = m->seq_len, full = m->full_seq_len;
    for (std::int64_t row = 0; row < rows; ++row)
      for (int half = 0; half < 2; ++half)
        move(row * seq + half * chunk, row * full + m->chunk_of(j, half) * chunk, chunk);
  }
  // full [N, width] in sequence order <-> `buffer`: block j holds rank j's tokens; `out`: from
  // full into the buffer, else back.
  void move_rows(const Tensor& full, const Tensor& buffer, std::int64_t width, bool out) const {
    for (int j = 0; j < groups; ++j) {
      const Tensor group = block(buffer, j, width);
      for_each_chunk(j, [&](std::int64_t local, std::int64_t global, std::int64_t count) {
        const Tensor a = full.rows(global, global + count), b = group.rows(local, local + count);
        out ? kernels::copy(a, b) : kernels::copy(b, a);
      });
    }
  }
  // An all-to-all slot of micro-batch mb, sub-batch sb: its first `elements`.
  Tensor slot(Slot s, int mb, int sb, std::int64_t elements) const {
    return m->slot(s, mb, sb).view(0, {elements});
  }
};

HeadSplit head_split(const ModelContext& model, const AttentionSpec& spec) {
  const kernels::AttentionShape& a = spec.attention.shape();
  HeadSplit split{&model, spec.at.rows, a.heads, a.kv_heads, a.head_dim, model.cp_size()};
  OASES_ASSERT(a.heads % split.groups == 0 && a.kv_heads % split.groups == 0,
               "{}: {} heads and {} kv heads in {} groups", spec.name, a.heads, a.kv_heads,
               split.groups);
  return split;
}

// The all-to-all that exchanges `elements` per rank of slot `send` into slot `recv`.
Segment::CollectiveCall exchange(const HeadSplit& split, Slot send, Slot recv, int mb, int sb,
                                 std::int64_t elements) {
  return {CollectiveKind::all_to_all, comm::ReduceOp::sum, split.m->cp,
          split.slot(recv, mb, sb, elements), split.slot(send, mb, sb, elements)};
}

//   attention.l   r = epilogue(previous output)  [checkpoint]
//                 -> [pre-norm]  [internals]
//                 -> QKV (this tensor-parallel rank's heads, not kept)
//                 -> head group j's columns to rank j                     | A2A (cp)
// Backward: stage 0 gathers the q|k|v gradient that came back from every group and runs the
// projections back into the input's partial gradient (| AR over the layer's group); stage 1 is
// the layer's (pre-norm, epilogue).
class ProjectionSegment final : public LayerSegment {
 public:
  ProjectionSegment(int id, const ModelContext& model, AttentionSpec spec)
      : LayerSegment(id, model, spec), spec_(std::move(spec)), split_(head_split(model, spec_)) {
    stash_d_qkv_ = deferred_.add(tokens_ * split_.qkv_width());
  }
  SegmentShape shape() const override {
    SegmentShape shape = layer_shape(kCheckpoint | kInternals);
    shape.forward_kind = CollectiveKind::all_to_all;
    shape.context_parallel_ranks = split_.groups;
    shape.forward_collective_elements = tokens_ * split_.qkv_width();
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint = epilogue_work();
    w.internals = pre_norm_work();
    Work stage0;
    add_qkv_work(spec_, w.output, stage0, w.backward_weight);
    w.output.bytes =
        2.0 * static_cast<double>(tokens_ * split_.qkv_width() * dtype_size(m_.dtype));
    stage0.bytes = w.output.bytes;
    w.backward_input = {stage0, stage_one_work()};
    return shape;
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return exchange(split_, Slot::cp_send, Slot::cp_recv, mb, sb, tokens_ * split_.qkv_width());
  }
  void backward_weight(const StepContext&, int mb, int sb) override {
    qkv_weight_part(spec_, mb, sb, stash_d_qkv_, split_.qkv_width());
  }

 private:
  void backward_body(const StepContext&, int mb, int sb, bool defer) override {
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const Tensor d_qkv = defer ? matrix(acquire_stash(mb, sb), stash_d_qkv_, split_.qkv_width())
                               : m_.scratch_wide.view(0, {tokens_, split_.qkv_width()});
    split_.move_qkv_columns(
        d_qkv, split_.slot(Slot::cp_grad_recv, mb, sb, tokens_ * split_.qkv_width()), false);
    // This rank's heads contribute a partial gradient of the input; the group sums it.
    project_qkv_back(spec_, d_qkv, body_input(checkpoint, internals),
                     rows_of(Slot::input_grad, mb, sb), defer ? Part::input : Part::whole);
  }
  // The q|k|v leave at once: attention_core keeps them (as its checkpoint), and the
  // projections' backward needs only their input, so they are formed in scratch for kOutput
  // rather than kept.
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
    if (parts & kCheckpoint) run_epilogue(ctx, mb, sb, checkpoint);
    if (parts & kInternals) run_pre_norm(checkpoint, internals);
    if (!(parts & kOutput)) return;
    const Tensor qkv = m_.scratch_wide.view(0, {tokens_, split_.qkv_width()});
    project_qkv(spec_, body_input(checkpoint, internals), qkv);
    split_.move_qkv_columns(qkv, split_.slot(Slot::cp_send, mb, sb, tokens_ * split_.qkv_width()),
                            true);
  }

  AttentionSpec spec_;
  HeadSplit split_;
  std::int64_t stash_d_qkv_ = 0;  // in deferred_
};

//   attention_core.l   every token's q|k|v of head group r, in sequence order, rotated
//                      [checkpoint] -> core attention  [core]
//                      -> each rank's tokens of the output to that rank     | A2A (cp)
// Backward: stage 0 takes the output's gradient of every token of group r (the all-to-all of
// attention_out's backward), runs attention back and sends each rank its tokens' q|k|v
// gradient (| A2A); stage 1 is empty.
class CoreSegment final : public Segment {
 public:
  CoreSegment(int id, const ModelContext& model, const AttentionSpec& spec)
      : Segment(id, *model.store),
        m_(model),
        name_("attention_core." + std::to_string(spec.layer)),
        layer_(spec.layer),
        at_(spec.at),
        split_(head_split(model, spec)),
        core_(spec.attention.with_heads(split_.group_heads(), split_.group_kv_heads())),
        checkpoint_(model.dtype),
        core_set_(model.dtype) {
    qkv_ = checkpoint_.add(split_.full_tokens() * split_.group_qkv_width());
    out_ = core_set_.add(split_.full_tokens() * split_.group_out_width());
    lse_ = core_set_.add_statistics(core_.lse_elements());
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.forward_kind = shape.backward_kind = CollectiveKind::all_to_all;
    shape.collective_ranks = split_.groups;
    shape.context_parallel_ranks = split_.groups;
    shape.degree = at_.degree;
    shape.layer = layer_;
    shape.recomputable = true;
    shape.sets = kCheckpoint | kCore;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.core_bytes = core_set_.bytes();
    shape.core_statistics_bytes = core_set_.statistics_bytes();
    shape.forward_collective_elements = split_.local_tokens() * split_.out_width();
    shape.backward_collective_elements = split_.local_tokens() * split_.qkv_width();
    const kernels::AttentionShape& h = core_.shape();
    const std::int64_t S = h.seq, d = h.head_dim, pairs = h.batch * h.heads;
    const double e = static_cast<double>(dtype_size(m_.dtype));
    const double scores = static_cast<double>(pairs * S * S) * e;
    const double moved_in =
        static_cast<double>(split_.full_tokens() * split_.group_qkv_width()) * e;
    const double moved_out =
        static_cast<double>(split_.full_tokens() * split_.group_out_width()) * e;
    const double dropout_traffic = m_.attention_dropout > 0 ? 2 * scores + scores / e : 0.0;
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint.bytes = 2 * moved_in;
    if (core_.rotary())
      w.checkpoint.bytes +=
          2.0 * static_cast<double>(split_.full_tokens() * (h.heads + h.kv_heads) * d) * e;
    w.core.matmuls = {{S, S, d, pairs}, {S, d, S, pairs}};
    w.core.bytes = 2 * scores + dropout_traffic;
    w.output.bytes = 2 * moved_out;
    Work stage0;
    stage0.matmuls = {{S, S, d, pairs}, {S, d, S, pairs}, {S, d, S, pairs}, {S, d, S, pairs}};
    stage0.bytes = 3 * scores + dropout_traffic + 2 * moved_in + 2 * moved_out;
    w.backward_input = {stage0, Work{}};
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kCore | kOutput);
  }
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets);
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    if (stage != 0) return;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor core = store().get(key(mb, sb, kCore));
    const std::int64_t N = split_.full_tokens(), Wg = split_.group_qkv_width(),
                       Og = split_.group_out_width();
    const Tensor d_out = m_.scratch_narrow.view(0, {N, Og});
    split_.move_rows(
        d_out, split_.slot(Slot::cp_grad_recv, mb, sb, split_.local_tokens() * split_.out_width()),
        Og, false);
    const Tensor d_qkv = m_.scratch_wide.view(0, {N, Wg});
    core_.backward(d_out, qkv(checkpoint), out(core), lse(core), d_qkv,
                   probability_dropout(ctx, mb, sb));
    split_.move_rows(
        d_qkv, split_.slot(Slot::cp_grad_send, mb, sb, split_.local_tokens() * split_.qkv_width()),
        Wg, true);
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return exchange(split_, Slot::cp_send, Slot::cp_recv, mb, sb,
                    split_.local_tokens() * split_.out_width());
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return exchange(split_, Slot::cp_grad_send, Slot::cp_grad_recv, mb, sb,
                    split_.local_tokens() * split_.qkv_width());
  }

 private:
  Tensor qkv(const Tensor& checkpoint) const {
    return checkpoint.view(qkv_, {split_.full_tokens(), split_.group_qkv_width()});
  }
  Tensor out(const Tensor& core) const {
    return core.view(out_, {split_.full_tokens(), split_.group_out_width()});
  }
  Tensor lse(const Tensor& core) const {
    return statistics_view(core, core_set_.statistics_offset(lse_), core_.lse_elements());
  }
  // kCheckpoint: the q|k|v that arrived, in sequence order and rotated (once: recomputing the
  // core from it does not rotate again); kCore: attention; kOutput: each rank's tokens of the
  // output into the send slot.
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) {
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor core = acquire_or_get(mb, sb, kCore, parts, core_set_);
    const std::int64_t n = split_.local_tokens();
    if (parts & kCheckpoint) {
      split_.move_rows(qkv(checkpoint), split_.slot(Slot::cp_recv, mb, sb, n * split_.qkv_width()),
                       split_.group_qkv_width(), false);
      core_.rotate(qkv(checkpoint));
    }
    if (parts & kCore)
      core_.forward(qkv(checkpoint), out(core), lse(core), probability_dropout(ctx, mb, sb));
    if (parts & kOutput)
      split_.move_rows(out(core), split_.slot(Slot::cp_send, mb, sb, n * split_.out_width()),
                       split_.group_out_width(), true);
  }
  // Keyed as the unsplit attention's: the group's first head is global head
  // shard x h + r x h'.
  kernels::AttentionDropout probability_dropout(const StepContext& ctx, int mb, int sb) const {
    if (!ctx.dropout_enabled || m_.attention_dropout == 0) return {};
    const kernels::DropoutSite site{m_.seed, static_cast<std::uint32_t>(ctx.step),
                                    static_cast<std::uint32_t>(layer_),
                                    kDropoutSiteAttentionProbabilities};
    return {m_.attention_dropout, site, global_sample(m_, ctx, mb, sb, at_.first_row),
            static_cast<std::int64_t>(at_.shard) * split_.heads +
                static_cast<std::int64_t>(m_.cp_rank()) * split_.group_heads()};
  }

  const ModelContext& m_;
  std::string name_;
  int layer_;
  Placement at_;
  HeadSplit split_;
  CoreAttention core_;
  SetLayout checkpoint_, core_set_;
  std::int64_t qkv_ = 0, out_ = 0;  // in checkpoint_, core_set_
  int lse_ = -1;                    // in core_set_
};

//   attention_out.l   this rank's tokens of every head group's output  [checkpoint]
//                     -> out-projection (row-parallel)                 | AR (layer group)
// Backward: stage 0 runs the projection back and sends head group j's columns of the
// gradient to rank j (| A2A); stage 1 is empty.
class OutputSegment final : public Segment {
 public:
  OutputSegment(int id, const ModelContext& model, AttentionSpec spec)
      : Segment(id, *model.store),
        m_(model),
        spec_(std::move(spec)),
        name_("attention_out." + std::to_string(spec_.layer)),
        split_(head_split(model, spec_)),
        checkpoint_(model.dtype),
        deferred_(model.dtype) {
    const std::int64_t n = split_.local_tokens();
    attn_ = checkpoint_.add(n * split_.out_width());
    stash_output_grad_ = deferred_.add(n * m_.hidden);
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.forward_kind = reduction();
    shape.backward_kind = CollectiveKind::all_to_all;
    shape.sequence_sharded = spec_.sequence_parallel;
    shape.collective_ranks = spec_.at.degree;
    shape.context_parallel_ranks = split_.groups;
    shape.degree = spec_.at.degree;
    shape.layer = spec_.layer;
    shape.recomputable = true;
    shape.has_weight_part = true;
    shape.deferred_gradient_bytes = deferred_.bytes();
    shape.sets = kCheckpoint;
    shape.checkpoint_bytes = checkpoint_.bytes();
    const std::int64_t n = split_.local_tokens(), C = m_.hidden, O = split_.out_width();
    shape.forward_collective_elements = n * C;
    shape.backward_collective_elements = n * O;
    const double moved = static_cast<double>(n * O * dtype_size(m_.dtype));
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint.bytes = 2 * moved;
    w.output.matmuls = {{n, C, O}};
    w.backward_input = {Work{{{n, O, C}}, 2 * moved}, Work{}};
    w.backward_weight.matmuls = {{O, C, n}};
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kOutput);
  }
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets);
  }
  void backward(const StepContext&, int mb, int sb, int stage) override {
    if (stage == 0) backward_body(mb, sb, false);
  }
  void backward_input(const StepContext&, int mb, int sb, int stage) override {
    if (stage == 0) backward_body(mb, sb, true);
  }
  void backward_weight(const StepContext&, int mb, int sb) override {
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor stash = store().get(key(mb, sb, kDeferredGradients));
    spec_.out_proj.backward_weight(
        stash.view(stash_output_grad_, {split_.local_tokens(), m_.hidden}), attn(checkpoint),
        m_.gemm16);
    store().release(key(mb, sb, kDeferredGradients));
  }
  // The partial sums of the output projection: whole on every rank of the layer's group, or
  // (sequence parallelism) each rank's block of the tokens.
  CollectiveCall forward_collective(int mb, int sb) override {
    return {reduction(),
            comm::ReduceOp::sum,
            spec_.at.group,
            m_.slot_rows(Slot::output, mb, sb, spec_.at.rows),
            {}};
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return exchange(split_, Slot::cp_grad_send, Slot::cp_grad_recv, mb, sb,
                    split_.local_tokens() * split_.out_width());
  }

 private:
  CollectiveKind reduction() const { return partial_sum_collective(spec_.sequence_parallel); }
  Tensor attn(const Tensor& checkpoint) const {
    return checkpoint.view(attn_, {split_.local_tokens(), split_.out_width()});
  }
  void backward_body(int mb, int sb, bool defer) {
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const std::int64_t n = split_.local_tokens();
    Tensor d_output = m_.slot_rows(Slot::output_grad, mb, sb, spec_.at.rows);
    const Tensor d_attn = m_.scratch_wide.view(0, {n, split_.out_width()});
    if (defer) {
      const Tensor stash =
          store().acquire(key(mb, sb, kDeferredGradients), deferred_.dtype(), deferred_.elements());
      const Tensor copy = stash.view(stash_output_grad_, {n, m_.hidden});
      kernels::copy(d_output, copy);
      spec_.out_proj.backward_input(copy, attn(checkpoint), d_attn, m_.gemm16);
    } else {
      spec_.out_proj.backward(d_output, attn(checkpoint), d_attn, m_.gemm16);
    }
    split_.move_out_columns(d_attn, split_.slot(Slot::cp_grad_send, mb, sb, n * split_.out_width()),
                            true);
  }
  // kCheckpoint: the output rows that arrived, head group j's from rank j; kOutput: the
  // projection's partial sums.
  void run(const StepContext&, int mb, int sb, TensorSets parts) {
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const std::int64_t n = split_.local_tokens();
    if (parts & kCheckpoint)
      split_.move_out_columns(attn(checkpoint),
                              split_.slot(Slot::cp_recv, mb, sb, n * split_.out_width()), false);
    if (parts & kOutput)
      spec_.out_proj.forward(attn(checkpoint), m_.slot_rows(Slot::output, mb, sb, spec_.at.rows),
                             m_.gemm16);
  }

  const ModelContext& m_;
  AttentionSpec spec_;
  std::string name_;
  HeadSplit split_;
  SetLayout checkpoint_, deferred_;
  std::int64_t attn_ = 0;               // in checkpoint_
  std::int64_t stash_output_grad_ = 0;  // in deferred_
};

}  // namespace

void append_all_to_all_attention_segments(int first_id, const ModelContext& model,
                                          AttentionSpec spec,
                                          std::vector<std::unique_ptr<Segment>>& segments) {
  OASES_ASSERT(static_cast<int>(segments.size()) == first_id, "{} segments before id {}",
               segments.size(), first_id);
  segments.push_back(std::make_unique<ProjectionSegment>(first_id, model, spec));
  segments.push_back(std::make_unique<CoreSegment>(first_id + 1, model, spec));
  segments.push_back(std::make_unique<OutputSegment>(first_id + 2, model, std::move(spec)));
}

}  // namespace oases::ops
