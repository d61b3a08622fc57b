// Attention under context parallelism of the ring kind (ops/layer_segments.h,
// append_ring_attention_segments): the key/value blocks of the c ranks travel around the
// context-parallel group while each rank attends with its own queries to the block in hand.
//
// Shapes (one instance; c = cp ranks, r = this rank's cp rank; h, kv = the query and key/value
// heads of this tensor-parallel rank, d = head width):
//   n = rows x seq_len      this rank's tokens: rows x (half 0, half 1) x chunk, local order
//   m = rows x chunk        the tokens of one half (chunk r or chunk 2c-1-r of every row)
//   W = (h + 2 kv) d        q|k|v width, Q = h d (query and output width), KV = 2 kv d
//   block j                 k|v [n, KV] of rank j's tokens, in rank j's local order
//   step t                  attends to block (r - t) mod c: the local block at step 0
//
// The running output and log-sum-exp are kept per half, [m, Q] and [rows, h, chunk], the
// layouts of one attention call over a half's queries. Each (query half, key half) pair is one
// call over a [m, W] matrix of q (this rank's half) and k|v (the block's half): causal where
// both are the same chunk, whole where the query chunk comes later, skipped where earlier;
// bidirectional attention takes every pair whole. Its result is merged into the running one
// (kernels::attention_merge). Backward runs the pairs again with the merged output and
// log-sum-exp, which gives each pair's exact share of the gradients: dq adds up here, and the
// block's dk|dv travel back around the ring (a shift the other way per step), each rank adding
// its share, until they reach the block's owner.
#include "ops/layer_segments.h"

#include "ops/layer_segment_base.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <utility>

namespace oases::ops {
namespace {

using detail::LayerSegment;

// What the segments of a ring layer share: the shapes and the pairs of chunks.
struct Ring {
  const ModelContext* m = nullptr;
  std::int64_t rows = 0;                               // sequences of the instance
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;  // of this tensor-parallel rank
  bool causal = true;
  std::int64_t head_offset = 0;  // global index of this rank's head 0
  int ranks = 1, rank = 0;       // c, r

  std::int64_t tokens() const { return rows * m->seq_len; }
  std::int64_t chunk() const { return m->chunk_len(); }
  std::int64_t half_tokens() const { return rows * chunk(); }
  std::int64_t q_width() const { return heads * head_dim; }
  std::int64_t kv_width() const { return 2 * kv_heads * head_dim; }
  std::int64_t qkv_width() const { return q_width() + kv_width(); }
  std::int64_t half_lse() const { return rows * heads * chunk(); }
  int owner(int step) const { return ((rank - step) % ranks + ranks) % ranks; }
  kernels::AttentionShape pair_shape(bool diagonal) const {
    return {rows, chunk(), heads, kv_heads, head_dim, diagonal};
  }

  // How query half `a` of this rank attends to key half `b` of block `owner`.
  enum class Pair { skip, diagonal, whole };
  Pair pair(int a, int owner, int b) const {
    if (!causal) return Pair::whole;
    const std::int64_t query = m->chunk_of(rank, a), key = m->chunk_of(owner, b);
    return query > key ? Pair::whole : query == key ? Pair::diagonal : Pair::skip;
  }
  // Rows of `half` of every sequence of a local-order [n, w] matrix, one call per sequence:
  // visit(local rows of the sequence's half, the same rows within the half's [m, w] matrix).
  template <class Visit>
  void for_each_sequence(int half, const Visit& visit) const {
    const std::int64_t c = chunk(), seq = m->seq_len;
    for (std::int64_t row = 0; row < rows; ++row) visit(row * seq + half * c, row * c, c);
  }
  // [m, W] pair matrix: q of this rank's half a from `qkv` [n, W], k|v of half b from `kv`
  // [n, KV] (strided views allowed).
  void gather_pair(const Tensor& qkv, int a, const Tensor& kv, int b, const Tensor& pair) const {
    const std::int64_t Q = q_width(), W = qkv_width();
    for_each_sequence(a, [&](std::int64_t local, std::int64_t in_half, std::int64_t count) {
      kernels::copy_matrix(qkv.rows(local, local + count).columns(0, Q),
                           pair.rows(in_half, in_half + count).columns(0, Q));
    });
    for_each_sequence(b, [&](std::int64_t local, std::int64_t in_half, std::int64_t count) {
      kernels::copy_matrix(kv.rows(local, local + count),
                           pair.rows(in_half, in_half + count).columns(Q, W));
    });
  }
  // local-order [n, w] <-> the two halves' [m, w] matrices; `to_halves` picks the direction.
  void move_halves(const Tensor& local, const Tensor& half0, const Tensor& half1,
                   bool to_halves) const {
    for (int half = 0; half < 2; ++half)
      for_each_sequence(half, [&](std::int64_t at, std::int64_t in_half, std::int64_t count) {
        const Tensor a = local.rows(at, at + count);
        const Tensor b = (half == 0 ? half0 : half1).rows(in_half, in_half + count);
        to_halves ? kernels::copy_matrix(a, b) : kernels::copy_matrix(b, a);
      });
  }
  void move_halves(const Tensor& local, const Tensor& halves, bool to_halves) const {
    const std::int64_t m_rows = half_tokens();
    move_halves(local, halves.rows(0, m_rows), halves.rows(m_rows, 2 * m_rows), to_halves);
  }
  // Rotary positions of each chunk (in place on the q and k columns of a local-order [n, W]).
  void rotate(const CoreAttention& attention, const Tensor& qkv, bool inverse) const {
    if (!attention.rotary()) return;
    for (int half = 0; half < 2; ++half) {
      const std::int64_t first = m->chunk_of(rank, half) * chunk();
      for_each_sequence(half, [&](std::int64_t local, std::int64_t, std::int64_t count) {
        attention.rotate_rows(qkv.rows(local, local + count), first, inverse);
      });
    }
  }
  // A slot's first `elements` as a [rows, cols] matrix.
  Tensor slot(Slot s, int mb, int sb, std::int64_t count, std::int64_t cols) const {
    return m->slot(s, mb, sb).view(0, {count, cols});
  }
};

Ring ring_of(const ModelContext& model, const AttentionSpec& spec) {
  const kernels::AttentionShape& a = spec.attention.shape();
  Ring ring{&model,
            spec.at.rows,
            a.heads,
            a.kv_heads,
            a.head_dim,
            a.causal,
            static_cast<std::int64_t>(spec.at.shard) * a.heads,
            model.cp_size(),
            model.cp_rank()};
  return ring;
}

// Backward scratch of the pair calls, in scratch_wide: [m, W] pair, [m, W] its gradient,
// [m, Q] a pair's output, then its log-sum-exps (statistics).
struct PairScratch {
  Tensor pair, d_pair, out, lse;
};
PairScratch pair_scratch(const Ring& ring) {
  const ModelContext& m = *ring.m;
  const std::int64_t rows = ring.half_tokens(), W = ring.qkv_width(), Q = ring.q_width();
  const Tensor& s = m.scratch_wide;
  const std::int64_t lse_at = aligned_elements(m.dtype, 2 * rows * W + rows * Q);
  return {s.view(0, {rows, W}), s.view(rows * W, {rows, W}), s.view(2 * rows * W, {rows, Q}),
          statistics_view(s, lse_at, ring.half_lse())};
}

// The running attention of one instance (in the projections' core set): this rank's q|k|v
// (rotated), and per half the output and log-sum-exp merged so far.
struct RunningAttention {
  Tensor qkv;     // [n, W]
  Tensor out[2];  // [m, Q]
  Tensor lse[2];  // [rows, h, chunk]
};

// What every step segment does with the block in hand, forward and backward.
class StepAttention {
 public:
  StepAttention(const Ring& ring, int layer) : ring_(ring), layer_(layer) {}

  // Attends with this rank's queries to block `owner` (k|v [n, KV]) and merges into `run`
  // (`first`: the first block, which sets it).
  void forward(const StepContext& ctx, std::int64_t first_sample, const RunningAttention& run,
               const Tensor& kv, int owner, bool first) const {
    const PairScratch s = pair_scratch(ring_);
    for (int a = 0; a < 2; ++a) {
      bool set = !first;
      for (int b = 0; b < 2; ++b) {
        const Ring::Pair pair = ring_.pair(a, owner, b);
        if (pair == Ring::Pair::skip) continue;
        ring_.gather_pair(run.qkv, a, kv, b, s.pair);
        const kernels::AttentionShape shape = ring_.pair_shape(pair == Ring::Pair::diagonal);
        const kernels::AttentionDropout dropout = dropout_of(ctx, first_sample, a, owner, b);
        if (!set) {
          kernels::attention_forward(s.pair, run.out[a], run.lse[a], shape, dropout);
          set = true;
        } else {
          kernels::attention_forward(s.pair, s.out, s.lse, shape, dropout);
          kernels::attention_merge(run.out[a], run.lse[a], s.out, s.lse, ring_.pair_shape(false));
        }
      }
      OASES_ASSERT(set, "layer {}: query half {} of cp rank {} saw no key of the first block",
                   layer_, a, ring_.rank);
    }
  }
  // The gradients of block `owner`'s share: dq [2 m, Q] (halves) gains it (or takes it:
  // `first`), d_kv [n, KV] (the block's local order) takes it. d_out [2 m, Q] (halves).
  void backward(const StepContext& ctx, std::int64_t first_sample, const RunningAttention& run,
                const Tensor& kv, int owner, const Tensor& d_out, const Tensor& dq,
                const Tensor& d_kv, bool first) const {
    const PairScratch s = pair_scratch(ring_);
    const std::int64_t m_rows = ring_.half_tokens(), Q = ring_.q_width(), W = ring_.qkv_width();
    if (first) kernels::zero(dq);
    kernels::zero(d_kv);
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        const Ring::Pair pair = ring_.pair(a, owner, b);
        if (pair == Ring::Pair::skip) continue;
        ring_.gather_pair(run.qkv, a, kv, b, s.pair);
        kernels::attention_backward(d_out.rows(a * m_rows, (a + 1) * m_rows), s.pair, run.out[a],
                                    run.lse[a], s.d_pair,
                                    ring_.pair_shape(pair == Ring::Pair::diagonal),
                                    dropout_of(ctx, first_sample, a, owner, b));
        kernels::add_matrix(s.d_pair.columns(0, Q), dq.rows(a * m_rows, (a + 1) * m_rows));
        ring_.for_each_sequence(
            b, [&](std::int64_t local, std::int64_t in_half, std::int64_t count) {
              kernels::add_matrix(s.d_pair.rows(in_half, in_half + count).columns(Q, W),
                                  d_kv.rows(local, local + count));
            });
      }
  }

 private:
  // The unsplit attention's mask entries: global sample, head, query and key positions.
  kernels::AttentionDropout dropout_of(const StepContext& ctx, std::int64_t first_sample, int a,
                                       int owner, int b) const {
    const ModelContext& m = *ring_.m;
    if (!ctx.dropout_enabled || m.attention_dropout == 0) return {};
    const kernels::DropoutSite site{m.seed, static_cast<std::uint32_t>(ctx.step),
                                    static_cast<std::uint32_t>(layer_),
                                    kDropoutSiteAttentionProbabilities};
    kernels::AttentionDropout dropout{m.attention_dropout, site, first_sample, ring_.head_offset};
    dropout.query_offset = m.chunk_of(ring_.rank, a) * ring_.chunk();
    dropout.key_offset = m.chunk_of(owner, b) * ring_.chunk();
    return dropout;
  }

  Ring ring_;
  int layer_;
};

// The core set of the projections' segment: this rank's q|k|v and the running attention.
struct RunningLayout {
  SetLayout set;
  std::int64_t qkv = 0, out[2] = {0, 0};
  int lse[2] = {-1, -1};

  explicit RunningLayout(const Ring& ring) : set(ring.m->dtype) {
    qkv = set.add(ring.tokens() * ring.qkv_width());
    for (int a = 0; a < 2; ++a) out[a] = set.add(ring.half_tokens() * ring.q_width());
    for (int a = 0; a < 2; ++a) lse[a] = set.add_statistics(ring.half_lse());
  }
  RunningAttention view(const Ring& ring, const Tensor& block) const {
    RunningAttention r;
    r.qkv = block.view(qkv, {ring.tokens(), ring.qkv_width()});
    for (int a = 0; a < 2; ++a) {
      r.out[a] = block.view(out[a], {ring.half_tokens(), ring.q_width()});
      r.lse[a] = statistics_view(block, set.statistics_offset(lse[a]), ring.half_lse());
    }
    return r;
  }
};

// The ring layer's buffers: forward blocks in cp_send / cp_recv ([n, KV]); backward, the
// block's dk|dv travelling in cp_grad_send / cp_grad_recv ([n, KV]), the step's own share of a
// block's dk|dv in cp_kv_grad ([n, KV]), dq in cp_query_grad and the attention output's
// gradient in cp_out_grad (halves, [2 m, Q]).
Tensor kv_slot(const Ring& ring, Slot s, int mb, int sb) {
  return ring.slot(s, mb, sb, ring.tokens(), ring.kv_width());
}
Tensor halves_slot(const Ring& ring, Slot s, int mb, int sb) {
  return ring.slot(s, mb, sb, 2 * ring.half_tokens(), ring.q_width());
}

Segment::CollectiveCall shift(const Ring& ring, Slot send, Slot recv, int mb, int sb, int by) {
  Segment::CollectiveCall call{CollectiveKind::shift, comm::ReduceOp::sum, ring.m->cp,
                               kv_slot(ring, recv, mb, sb), kv_slot(ring, send, mb, sb)};
  call.shift = by;
  return call;
}

// Attention FLOPs of the block of step `step` (the pairs this rank computes), for pricing.
Work step_work(const Ring& ring, int step, bool backward) {
  Work w;
  const std::int64_t c = ring.chunk(), d = ring.head_dim, pairs = ring.rows * ring.heads;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      const Ring::Pair pair = ring.pair(a, ring.owner(step), b);
      if (pair == Ring::Pair::skip) continue;
      // A diagonal pair computes about half its tiles.
      const std::int64_t keys = pair == Ring::Pair::diagonal ? (c + 1) / 2 : c;
      const int products = backward ? 4 : 2;
      for (int i = 0; i < products; ++i) w.matmuls.push_back({c, keys, d, pairs});
      w.bytes += static_cast<double>(ring.half_tokens() * ring.qkv_width() *
                                     static_cast<std::int64_t>(dtype_size(ring.m->dtype))) *
                 (backward ? 4 : 2);
    }
  return w;
}

//   attention.l   r = epilogue(previous output)  [checkpoint] -> [pre-norm]  [internals]
//                 -> QKV, rotated  [core, with the running attention]
//                 -> this rank's k|v to the next rank                    | shift (cp)
// Backward: stage 0 gathers dq (every step's share) and the local block's dk|dv (the step-0
// share here, the other ranks' shares from the ring) and runs the projections back into the
// input's partial gradient (| AR over the layer's group); stage 1 is the layer's (pre-norm,
// epilogue). The core set is never dropped: the steps add to it.
class RingProjectionSegment final : public LayerSegment {
 public:
  RingProjectionSegment(int id, const ModelContext& model, AttentionSpec spec)
      : LayerSegment(id, model, spec),
        spec_(std::move(spec)),
        ring_(ring_of(model, spec_)),
        running_(ring_) {
    stash_d_qkv_ = deferred_.add(tokens_ * ring_.qkv_width());
    core_ = running_.set;
  }
  SegmentShape shape() const override {
    SegmentShape shape = layer_shape(kCheckpoint | kInternals | kCore);
    shape.forward_kind = CollectiveKind::shift;
    shape.context_parallel_ranks = ring_.ranks;
    shape.forward_collective_elements = tokens_ * ring_.kv_width();
    shape.never_dropped = kCore;
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint = epilogue_work();
    w.internals = pre_norm_work();
    Work stage0;
    add_qkv_work(spec_, w.core, stage0, w.backward_weight);
    const double qkv_bytes = static_cast<double>(tokens_ * ring_.qkv_width() *
                                                 static_cast<std::int64_t>(dtype_size(m_.dtype)));
    w.core.bytes = 2 * qkv_bytes;
    w.output.bytes = qkv_bytes;
    stage0.bytes = 4 * qkv_bytes;
    w.backward_input = {stage0, stage_one_work()};
    return shape;
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return shift(ring_, Slot::cp_send, Slot::cp_recv, mb, sb, 1);
  }
  void backward_weight(const StepContext&, int mb, int sb) override {
    qkv_weight_part(spec_, mb, sb, stash_d_qkv_, ring_.qkv_width());
  }

 private:
  void backward_body(const StepContext&, int mb, int sb, bool defer) override {
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const std::int64_t Q = ring_.q_width(), W = ring_.qkv_width();
    const Tensor d_qkv = defer ? matrix(acquire_stash(mb, sb), stash_d_qkv_, W)
                               : m_.scratch_wide.view(0, {tokens_, W});
    ring_.move_halves(d_qkv.columns(0, Q), halves_slot(ring_, Slot::cp_query_grad, mb, sb), false);
    // The local block's dk|dv: step 0's share and the rest of the ring's.
    const Tensor d_kv = kv_slot(ring_, Slot::cp_grad_recv, mb, sb);
    kernels::add(kv_slot(ring_, Slot::cp_kv_grad, mb, sb), d_kv, d_kv);
    kernels::copy_matrix(d_kv, d_qkv.columns(Q, W));
    ring_.rotate(spec_.attention, d_qkv, true);
    // This rank's heads contribute a partial gradient of the input; the group sums it.
    project_qkv_back(spec_, d_qkv, body_input(checkpoint, internals),
                     rows_of(Slot::input_grad, mb, sb), defer ? Part::input : Part::whole);
  }
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
    const Tensor core = acquire_or_get(mb, sb, kCore, parts, core_);
    if (parts & kCheckpoint) run_epilogue(ctx, mb, sb, checkpoint);
    if (parts & kInternals) run_pre_norm(checkpoint, internals);
    const RunningAttention run = running_.view(ring_, core);
    if (parts & kCore) {
      project_qkv(spec_, body_input(checkpoint, internals), run.qkv);
      ring_.rotate(spec_.attention, run.qkv, false);
    }
    if (parts & kOutput)
      kernels::copy_matrix(run.qkv.columns(ring_.q_width(), ring_.qkv_width()),
                           kv_slot(ring_, Slot::cp_send, mb, sb));
  }

  AttentionSpec spec_;
  Ring ring_;
  RunningLayout running_;
  std::int64_t stash_d_qkv_ = 0;  // in deferred_
};

// What the step segments share: the layer, the ring, the projections' segment whose running
// attention they read and add to.
class RingSegment : public Segment {
 public:
  RingSegment(int id, const ModelContext& model, const AttentionSpec& spec, std::string name,
              int projections, int step)
      : Segment(id, *model.store),
        m_(model),
        name_(std::move(name)),
        at_(spec.at),
        layer_(spec.layer),
        projections_(projections),
        step_(step),
        ring_(ring_of(model, spec)),
        running_(ring_),
        attention_(ring_, spec.layer),
        block_(model.dtype) {
    block_.add(ring_.tokens() * ring_.kv_width());
  }
  const std::string& name() const override { return name_; }

 protected:
  // "<kind><layer>.<step>" (built by appends: GCC 12's -Wrestrict misreads a chain of +).
  static std::string step_name(const char* kind, int layer, int step) {
    std::string name = kind;
    name += std::to_string(layer);
    name += '.';
    name += std::to_string(step);
    return name;
  }
  SegmentShape base_shape() const {
    SegmentShape shape;
    shape.name = name_;
    shape.degree = at_.degree;
    shape.layer = layer_;
    shape.collective_ranks = at_.degree;
    shape.context_parallel_ranks = ring_.ranks;
    shape.reads_sets_of = {projections_};
    shape.owner_sets_read = {kCore};
    return shape;
  }
  RunningAttention running(int mb, int sb) const {
    return running_.view(ring_, store().get({projections_, mb, sb, kCore}));
  }
  std::int64_t first_sample(const StepContext& ctx, int mb, int sb) const {
    return global_sample(m_, ctx, mb, sb, at_.first_row);
  }
  Tensor block(const Tensor& set) const { return set.view(0, {ring_.tokens(), ring_.kv_width()}); }
  int owner() const { return ring_.owner(step_); }

  const ModelContext& m_;
  std::string name_;
  Placement at_;
  int layer_;
  int projections_;
  int step_;
  Ring ring_;
  RunningLayout running_;
  StepAttention attention_;
  SetLayout block_;  // a received block [n, KV]
};

//   attention_ring.l.t   (t < c - 1) attention to the block of step t, merged into the running
//                        attention, while the transfers of the segments around it travel.
// Backward: the block's share of dq (added) and of its dk|dv (into cp_kv_grad).
class RingStepSegment final : public RingSegment {
 public:
  RingStepSegment(int id, const ModelContext& model, const AttentionSpec& spec, int projections,
                  int step)
      : RingSegment(id, model, spec, step_name("attention_ring.", spec.layer, step), projections,
                    step) {}
  SegmentShape shape() const override {
    SegmentShape shape = base_shape();
    shape.beside_transfers = true;
    // The block of a later step: the receive segment's checkpoint.
    if (step_ > 0) {
      shape.reads_sets_of.push_back(id() - 1);
      shape.owner_sets_read.push_back(kCheckpoint);
    }
    shape.work.known = true;
    shape.work.output = step_work(ring_, step_, false);
    shape.work.backward_input = {step_work(ring_, step_, true)};
    return shape;
  }
  void forward(const StepContext& ctx, int mb, int sb) override {
    const RunningAttention run = running(mb, sb);
    attention_.forward(ctx, first_sample(ctx, mb, sb), run, kv(run, mb, sb), owner(), step_ == 0);
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    OASES_ASSERT(stage == 0, "{} has one backward stage", name_);
    const RunningAttention run = running(mb, sb);
    attention_.backward(ctx, first_sample(ctx, mb, sb), run, kv(run, mb, sb), owner(),
                        halves_slot(ring_, Slot::cp_out_grad, mb, sb),
                        halves_slot(ring_, Slot::cp_query_grad, mb, sb),
                        kv_slot(ring_, Slot::cp_kv_grad, mb, sb), false);
  }

 private:
  // The block in hand: this rank's own at step 0, else the one the receive segment before
  // this one keeps.
  Tensor kv(const RunningAttention& run, int mb, int sb) const {
    if (step_ == 0) return run.qkv.columns(ring_.q_width(), ring_.qkv_width());
    return block(store().get({id() - 1, mb, sb, kCheckpoint}));
  }
};

//   attention_recv.l.t   (0 < t < c - 1) the block that arrived  [checkpoint]
//                        -> on to the next rank                            | shift (cp)
// Backward: the block's dk|dv so far (from the next rank) plus this rank's share, on towards
// the block's owner (| shift the other way).
class RingReceiveSegment final : public RingSegment {
 public:
  RingReceiveSegment(int id, const ModelContext& model, const AttentionSpec& spec, int projections,
                     int step)
      : RingSegment(id, model, spec, step_name("attention_recv.", spec.layer, step), projections,
                    step) {}
  SegmentShape shape() const override {
    SegmentShape shape = base_shape();
    shape.reads_sets_of.clear();
    shape.owner_sets_read.clear();
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.forward_kind = shape.backward_kind = CollectiveKind::shift;
    shape.forward_collective_elements = shape.backward_collective_elements =
        ring_.tokens() * ring_.kv_width();
    shape.recomputable = true;
    shape.sets = kCheckpoint;
    shape.checkpoint_bytes = block_.bytes();
    const double bytes = static_cast<double>(block_.bytes());
    shape.work.known = true;
    shape.work.checkpoint.bytes = 2 * bytes;
    shape.work.output.bytes = 2 * bytes;
    shape.work.backward_input = {Work{{}, 3 * bytes}};
    return shape;
  }
  void forward(const StepContext&, int mb, int sb) override { run(mb, sb, kCheckpoint | kOutput); }
  void recompute(const StepContext&, int mb, int sb, TensorSets sets) override {
    run(mb, sb, sets);
  }
  void backward(const StepContext&, int mb, int sb, int stage) override {
    OASES_ASSERT(stage == 0, "{} has one backward stage", name_);
    kernels::add(kv_slot(ring_, Slot::cp_kv_grad, mb, sb),
                 kv_slot(ring_, Slot::cp_grad_recv, mb, sb),
                 kv_slot(ring_, Slot::cp_grad_send, mb, sb));
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return shift(ring_, Slot::cp_send, Slot::cp_recv, mb, sb, 1);
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return shift(ring_, Slot::cp_grad_send, Slot::cp_grad_recv, mb, sb, -1);
  }

 private:
  void run(int mb, int sb, TensorSets parts) {
    const Tensor set = acquire_or_get(mb, sb, kCheckpoint, parts, block_);
    if (parts & kCheckpoint) kernels::copy(kv_slot(ring_, Slot::cp_recv, mb, sb), block(set));
    if (parts & kOutput) kernels::copy(block(set), kv_slot(ring_, Slot::cp_send, mb, sb));
  }
};

//   attention_out.l   the block that arrived last  [checkpoint] -> attention to it, merged
//                     -> out-projection of the running output (row-parallel)  | AR (layer group)
// Backward: stage 0 runs the projection back (the attention output's gradient, kept for the
// other steps in cp_out_grad), then this block's share of dq and of its dk|dv, which goes back
// around the ring (| shift the other way).
class RingOutputSegment final : public RingSegment {
 public:
  RingOutputSegment(int id, const ModelContext& model, AttentionSpec spec, int projections)
      : RingSegment(id, model, spec, "attention_out." + std::to_string(spec.layer), projections,
                    model.cp_size() - 1),
        spec_(std::move(spec)),
        deferred_(model.dtype) {
    stash_output_grad_ = deferred_.add(ring_.tokens() * m_.hidden);
  }
  SegmentShape shape() const override {
    SegmentShape shape = base_shape();
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.forward_kind = reduction();
    shape.backward_kind = CollectiveKind::shift;
    shape.sequence_sharded = spec_.sequence_parallel;
    shape.recomputable = true;
    shape.has_weight_part = true;
    shape.deferred_gradient_bytes = deferred_.bytes();
    shape.sets = kCheckpoint;
    shape.checkpoint_bytes = block_.bytes();
    const std::int64_t n = ring_.tokens(), C = m_.hidden, Q = ring_.q_width();
    shape.forward_collective_elements = n * C;
    shape.backward_collective_elements = n * ring_.kv_width();
    const double moved =
        static_cast<double>(n * Q * static_cast<std::int64_t>(dtype_size(m_.dtype)));
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint.bytes = 2 * static_cast<double>(block_.bytes());
    w.core = step_work(ring_, step_, false);
    w.output.matmuls = {{n, C, Q}};
    w.output.bytes = 2 * moved;
    Work stage0 = step_work(ring_, step_, true);
    stage0.matmuls.push_back({n, Q, C});
    stage0.bytes += 4 * moved;
    w.backward_input = {stage0};
    w.backward_weight.matmuls = {{Q, C, n}};
    w.backward_weight.bytes = 2 * moved;
    return shape;
  }
  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kCore | kOutput);
  }
  // kCore never comes: the running attention is merged once, in forward.
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets & ~kCore);
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    OASES_ASSERT(stage == 0, "{} has one backward stage", name_);
    backward_body(ctx, mb, sb, false);
  }
  void backward_input(const StepContext& ctx, int mb, int sb, int stage) override {
    OASES_ASSERT(stage == 0, "{} has one backward stage", name_);
    backward_body(ctx, mb, sb, true);
  }
  void backward_weight(const StepContext&, int mb, int sb) override {
    const Tensor stash = store().get(key(mb, sb, kDeferredGradients));
    spec_.out_proj.backward_weight(stash.view(stash_output_grad_, {ring_.tokens(), m_.hidden}),
                                   attention_output(mb, sb), m_.gemm16);
    store().release(key(mb, sb, kDeferredGradients));
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return {reduction(),
            comm::ReduceOp::sum,
            spec_.at.group,
            m_.slot_rows(Slot::output, mb, sb, spec_.at.rows),
            {}};
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return shift(ring_, Slot::cp_grad_send, Slot::cp_grad_recv, mb, sb, -1);
  }

 private:
  CollectiveKind reduction() const { return partial_sum_collective(spec_.sequence_parallel); }
  // The running output in local order [n, Q] (at the start of scratch_wide).
  Tensor attention_output(int mb, int sb) const {
    const RunningAttention run = running(mb, sb);
    const Tensor local = m_.scratch_wide.view(0, {ring_.tokens(), ring_.q_width()});
    ring_.move_halves(local, run.out[0], run.out[1], false);
    return local;
  }
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) {
    const Tensor set = acquire_or_get(mb, sb, kCheckpoint, parts, block_);
    if (parts & kCheckpoint) kernels::copy(kv_slot(ring_, Slot::cp_recv, mb, sb), block(set));
    const RunningAttention run = running(mb, sb);
    if (parts & kCore)
      attention_.forward(ctx, first_sample(ctx, mb, sb), run, block(set), owner(), false);
    if (parts & kOutput)
      spec_.out_proj.forward(attention_output(mb, sb),
                             m_.slot_rows(Slot::output, mb, sb, spec_.at.rows), m_.gemm16);
  }
  void backward_body(const StepContext& ctx, int mb, int sb, bool defer) {
    const std::int64_t n = ring_.tokens();
    const Tensor d_output = m_.slot_rows(Slot::output_grad, mb, sb, spec_.at.rows);
    const Tensor attn = attention_output(mb, sb);
    const Tensor d_attn = m_.scratch_wide.view(n * ring_.q_width(), {n, ring_.q_width()});
    if (defer) {
      const Tensor stash =
          store().acquire(key(mb, sb, kDeferredGradients), deferred_.dtype(), deferred_.elements());
      const Tensor copy = stash.view(stash_output_grad_, {n, m_.hidden});
      kernels::copy(d_output, copy);
      spec_.out_proj.backward_input(copy, attn, d_attn, m_.gemm16);
    } else {
      spec_.out_proj.backward(d_output, attn, d_attn, m_.gemm16);
    }
    const Tensor d_out = halves_slot(ring_, Slot::cp_out_grad, mb, sb);
    ring_.move_halves(d_attn, d_out, true);
    const Tensor set = store().get(key(mb, sb, kCheckpoint));
    attention_.backward(ctx, first_sample(ctx, mb, sb), running(mb, sb), block(set), owner(), d_out,
                        halves_slot(ring_, Slot::cp_query_grad, mb, sb),
                        kv_slot(ring_, Slot::cp_grad_send, mb, sb), true);
  }

  AttentionSpec spec_;
  SetLayout deferred_;
  std::int64_t stash_output_grad_ = 0;  // in deferred_
};

}  // namespace

void append_ring_attention_segments(int first_id, const ModelContext& model, AttentionSpec spec,
                                    std::vector<std::unique_ptr<Segment>>& segments) {
  OASES_ASSERT(static_cast<int>(segments.size()) == first_id, "{} segments before id {}",
               segments.size(), first_id);
  const int c = model.cp_size();
  OASES_ASSERT(c > 1, "{}: ring attention over {} context-parallel ranks", spec.name, c);
  segments.push_back(std::make_unique<RingProjectionSegment>(first_id, model, spec));
  for (int step = 0; step + 1 < c; ++step) {
    if (step > 0)
      segments.push_back(std::make_unique<RingReceiveSegment>(static_cast<int>(segments.size()),
                                                              model, spec, first_id, step));
    segments.push_back(std::make_unique<RingStepSegment>(static_cast<int>(segments.size()), model,
                                                         spec, first_id, step));
  }
  segments.push_back(std::make_unique<RingOutputSegment>(static_cast<int>(segments.size()), model,
                                                         std::move(spec), first_id));
}

std::int64_t ring_attention_scratch_elements(const ModelContext& model, const AttentionSpec& spec) {
  const Ring ring = ring_of(model, spec);
  const std::int64_t m = ring.half_tokens(), W = ring.qkv_width(), Q = ring.q_width();
  const std::int64_t pairs = aligned_elements(model.dtype, 2 * m * W + m * Q) +
                             statistics_footprint(model.dtype, ring.half_lse());
  return std::max({pairs, 2 * ring.tokens() * Q, ring.tokens() * W});
}

}  // namespace oases::ops
