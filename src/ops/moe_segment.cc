// The three segments of a mixture-of-experts layer (ops/layer_segments.h, MoeSpec): dispatch,
// experts and combine, with the expert-parallel all-to-alls between them. Routing comes from
// ops/moe.h; the experts are built from the linear ops.
#include "core/buffer.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "ops/epilogue.h"
#include "ops/layer_segment_base.h"
#include "ops/layer_segments.h"
#include "ops/moe.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace oases::ops {

// The combine's gradient of every slot's weight, which the dispatch's backward reads: kept
// under the combine's key (ops/activation_store.h numbers the other private sets).
inline constexpr std::uint8_t kMoeWeightGradients = 128;

namespace {

// The type the router, the routing weights and every sum over a token's slots are computed in:
// f64 in fp64 runs, else f32 (whatever the activations; 16-bit values are rounded once).
template <class T>
using Wide = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T, class V>
T narrow(V value) {
  if constexpr (std::is_same_v<T, V>) return value;
  else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) return static_cast<T>(value);
  else return T(static_cast<float>(value));
}

// Runs body.template operator()<T>() for the activations' element type.
template <class Body>
void for_dtype(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::f64: return body.template operator()<double>();
    case DType::f32: return body.template operator()<float>();
    case DType::bf16: return body.template operator()<BFloat16>();
    case DType::f16: return body.template operator()<Float16>();
    default: OASES_FAIL("mixture-of-experts layers do not run in {}", dtype_name(dtype));
  }
}

// The raw header of an MoE row and a routing row (ops/context.h, moe_header_elements).
struct RowHeader {
  std::int32_t sample = -1, position = 0;
};
static_assert(sizeof(RowHeader) == 8);
template <class T>
RowHeader read_header(const T* at) {
  RowHeader h;
  std::memcpy(static_cast<void*>(&h), static_cast<const void*>(at), sizeof h);
  return h;
}
template <class T>
void write_header(T* at, RowHeader h) {
  std::memcpy(static_cast<void*>(at), static_cast<const void*>(&h), sizeof h);
}
struct SlotRoute {
  std::int64_t token = -1;  // within the segment instance; -1: an empty slot
  double weight = 0;
};
static_assert(sizeof(SlotRoute) == 16);
template <class T>
SlotRoute read_route(const T* table, std::int64_t row) {
  SlotRoute r;
  std::memcpy(static_cast<void*>(&r), reinterpret_cast<const char*>(table) + row * sizeof r, sizeof r);
  return r;
}
template <class T>
void write_route(T* table, std::int64_t row, SlotRoute r) {
  std::memcpy(reinterpret_cast<char*>(table) + row * sizeof r, static_cast<const void*>(&r), sizeof r);
}

// Empties row `row` of an MoE buffer: zeros, then the header of an empty slot.
template <class T>
void empty_row(T* buffer, std::int64_t row, std::int64_t width, std::int64_t hidden) {
  std::fill_n(buffer + row * width, width, narrow<T>(0.0f));
  write_header(buffer + row * width + hidden, RowHeader{});
}

int larger_capacity(const MoeSpec& spec) {
  return std::max(moe_capacity(spec.router, spec.group_tokens, true),
                  moe_capacity(spec.router, spec.group_tokens, false));
}

// What the three segments of one layer share. Every MoE buffer holds `experts x rows` rows of
// `width` = hidden + header columns: a token's activations, then its global sample and position
// as raw int32 (RowHeader; sample -1: an empty slot). Sent buffers are expert-major (expert e's rows [e x rows, ...),
// within them group-major: slot s of group g is row g x capacity_max + s), so block j of the
// all-to-all holds the experts of rank j; a received buffer is [source rank][local expert][rows].
struct MoeLayout {
  int experts = 0;            // E, over every rank
  int ranks = 1;              // the expert-parallel group
  int rank = 0;
  int local = 0;              // experts on each rank: E / ranks
  std::int64_t groups = 0;    // dispatch groups per segment instance
  int capacity_max = 0;       // slots per group and expert (training or evaluation, the larger)
  std::int64_t rows = 0;      // per expert and source: groups x capacity_max
  std::int64_t width = 0;     // hidden + header
  std::int64_t header = 0;    // moe_header_elements
  std::int64_t route = 0;     // moe_routing_elements: a routing row
  std::int64_t hidden = 0;

  MoeLayout(const ModelContext& model, const MoeSpec& spec) {
    experts = spec.router.experts;
    ranks = spec.expert_ranks;
    rank = model.ep ? model.ep->rank() : 0;
    OASES_ASSERT(ranks == (model.ep ? model.ep->size() : 1), "{} expert ranks in a group of {}",
                 ranks, model.ep ? model.ep->size() : 1);
    local = experts / ranks;
    const std::int64_t tokens = spec.at.rows * model.seq_len;
    groups = tokens / spec.group_tokens;
    capacity_max = larger_capacity(spec);
    rows = groups * capacity_max;
    hidden = model.hidden;
    header = moe_header_elements(model.dtype);
    route = moe_routing_elements(model.dtype);
    width = hidden + header;
  }
  std::int64_t total_rows() const { return experts * rows; }
  // The first row of (source, local expert) in a received buffer.
  std::int64_t received(int source, int local_expert) const {
    return (static_cast<std::int64_t>(source) * local + local_expert) * rows;
  }
};

// Rows of a received buffer that hold tokens, per local expert: (row in the buffer).
template <class T>
std::vector<std::vector<std::int64_t>> filled_rows(const MoeLayout& layout, const T* buffer) {
  std::vector<std::vector<std::int64_t>> filled(static_cast<std::size_t>(layout.local));
  for (int e = 0; e < layout.local; ++e)
    for (int source = 0; source < layout.ranks; ++source)
      for (std::int64_t r = 0; r < layout.rows; ++r) {
        const std::int64_t row = layout.received(source, e) + r;
        if (read_header(buffer + row * layout.width + layout.hidden).sample >= 0)
          filled[static_cast<std::size_t>(e)].push_back(row);
      }
  return filled;
}

// The slots of one segment instance, recomputed from the logits wherever needed:
// slot_token[row] (the token within the instance, -1: empty) and its weight, for every row of
// a sent buffer.
struct InstanceRouting {
  int capacity = 0;
  std::vector<std::int64_t> slot_token;
  std::vector<double> slot_weight;
};

// The dispatch: epilogue into h, pre-norm, router, routing; its output is the dispatch buffer
// (and the routing slot), its forward collective the dispatch all-to-all.
class MoeDispatchSegment final : public detail::LayerSegment {
 public:
  MoeDispatchSegment(int id, const ModelContext& model, MoeSpec spec)
      : LayerSegment(id, model, spec), spec_(std::move(spec)), layout_(model, spec_) {
    OASES_CHECK(tokens_ % spec_.group_tokens == 0,
                "{}: model.moe_group_size = {} tokens must divide the {} tokens a segment instance "
                "processes (train.micro_batch / parallel.sub_batches sequences of model.seq_len, "
                "split over the tensor-parallel replicas); choose a group size that divides it",
                name(), spec_.group_tokens, tokens_);
    // The router's logits are statistics: f32 under 16-bit activations.
    const std::int64_t E = layout_.experts;
    logits_ = internals_.add_statistics(tokens_ * E);
    if (has_noise()) noise_logits_ = internals_.add_statistics(tokens_ * E);
    router_grads_ =
        Buffer(static_cast<std::size_t>(2 * tokens_ * E) * dtype_size(statistics_dtype(model.dtype)));
  }

  SegmentShape shape() const override {
    SegmentShape shape = layer_shape(kCheckpoint | kInternals);
    shape.has_weight_part = false;  // the router's gradient needs the combine's first
    shape.deferred_gradient_bytes = 0;
    // At degree 1 nothing sums the input's gradient; at degree k the group sums it together
    // with the slot weights' gradients, which are partial too (the experts' outputs are).
    shape.backward_stages = split() ? 2 : 1;
    shape.has_backward_collective = split();
    shape.backward_collective_elements = split() ? reduced_elements() : 0;
    // The slot weights' gradients must be whole on every rank of the group (the router's
    // backward reads them all), so the group all-reduces even under sequence parallelism; the
    // shard segment before then takes its block of the input's gradient.
    shape.backward_kind = CollectiveKind::all_reduce;
    shape.forward_kind = CollectiveKind::all_to_all;
    shape.collective_ranks = layout_.ranks;
    shape.forward_collective_elements = layout_.total_rows() * layout_.width;
    // The router's product (and the noise's), routing, and the copy of each slot's row; in
    // backward the rows' gradients onto their tokens and the router's products back.
    const std::int64_t E = layout_.experts, C = m_.hidden;
    const int routers = has_noise() ? 2 : 1;
    const double slots = static_cast<double>(layout_.total_rows() * layout_.width) *
                         static_cast<double>(dtype_size(m_.dtype));
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint = epilogue_work();
    w.internals = pre_norm_work();
    for (int r = 0; r < routers; ++r) w.internals.matmuls.push_back({tokens_, E, C});
    w.output.bytes = 2 * slots;
    // The router's backward (input and weight products) runs with the rest of the last stage:
    // the dispatch has no weight part to defer.
    Work gather, router = stage_one_work();
    gather.bytes = slots + row_bytes();
    for (int r = 0; r < routers; ++r)
      router.matmuls.insert(router.matmuls.end(), {{tokens_, C, E}, {C, E, tokens_}});
    if (split()) {
      w.backward_input = {gather, router};
    } else {
      gather += router;
      w.backward_input = {gather};
    }
    return shape;
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return {CollectiveKind::all_to_all, comm::ReduceOp::sum, m_.ep,
            m_.slot(Slot::moe_recv, mb, sb).view(0, {layout_.total_rows() * layout_.width}),
            m_.slot(Slot::moe_send, mb, sb).view(0, {layout_.total_rows() * layout_.width})};
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    OASES_ASSERT(split(), "{} has no backward collective at degree 1", name());
    return {CollectiveKind::all_reduce, comm::ReduceOp::sum, layer_.at.group,
            m_.slot(Slot::moe_grad_recv, mb, sb).view(0, {reduced_elements()}), {}};
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    // The ranks of a split layer route the same rows: the first counts them.
    dispatch(ctx, mb, sb, kCheckpoint | kInternals | kOutput,
             ctx.head_mode == HeadMode::train && layer_.at.shard == 0);
  }
  // Stage 0 gathers the experts' input gradients onto the tokens; stage 1 (the same call at
  // degree 1) adds the router's and runs on to the previous segment (under sequence
  // parallelism the shard segment before runs the pre-norm and epilogue back on its block).
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    OASES_ASSERT(stage < (split() ? 2 : 1), "{}: backward stage {}", name(), stage);
    for_dtype(m_.dtype, [&]<class T>() { backward_typed<T>(ctx, mb, sb, stage); });
    if ((stage == 1 || !split()) && !layer_.sequence_parallel)
      backward_to_previous(ctx, mb, sb, store().get(key(mb, sb, kCheckpoint)),
                           store().get(key(mb, sb, kInternals)));
  }
  void backward_input(const StepContext& ctx, int mb, int sb, int stage) override {
    backward(ctx, mb, sb, stage);
  }

 private:
  bool has_noise() const {
    return spec_.router.gate == MoeGate::noisy_top_k && spec_.router.router_noise > 0;
  }
  bool split() const { return layer_.at.degree > 1; }
  // What the backward collective sums: the input's gradient [tokens, hidden], then the
  // gradient of every slot's weight.
  std::int64_t reduced_elements() const { return tokens_ * m_.hidden + layout_.total_rows(); }
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    dispatch(ctx, mb, sb, parts, false);
  }
  void backward_body(const StepContext&, int, int, bool) override {
    OASES_FAIL("{}: backward runs whole", name());
  }
  void dispatch(const StepContext& ctx, int mb, int sb, TensorSets parts, bool collect) {
    for_dtype(m_.dtype, [&]<class T>() { run_typed<T>(ctx, mb, sb, parts, collect); });
  }
  // The router's logits [tokens, E] (and the noise logits) in the router's type.
  Tensor logits(const Tensor& internals, int piece) const {
    return statistics_view(internals, internals_.statistics_offset(piece), tokens_ * layout_.experts)
        .view(0, {tokens_, layout_.experts});
  }

  MoeRandom random_of(const StepContext& ctx, int mb, int sb, std::int64_t group) const {
    MoeRandom random;
    random.seed = m_.seed;
    random.step = static_cast<std::uint32_t>(ctx.step);
    random.layer = static_cast<std::uint32_t>(layer_.layer);
    random.global_token = global_sample(m_, ctx, mb, sb, layer_.at.first_row) * m_.seq_len +
                          group * spec_.group_tokens;
    random.seq_len = m_.seq_len;
    random.training = ctx.dropout_enabled;
    return random;
  }

  template <class T>
  InstanceRouting route_instance(const StepContext& ctx, int mb, int sb, const Tensor& internals,
                                 MoeLayerStats* stats) const {
    using R = Wide<T>;
    InstanceRouting routing;
    const std::int64_t S = spec_.group_tokens, E = layout_.experts;
    routing.capacity = moe_capacity(spec_.router, S, ctx.dropout_enabled);
    const int cap = routing.capacity;
    routing.slot_token.assign(static_cast<std::size_t>(layout_.total_rows()), -1);
    routing.slot_weight.assign(routing.slot_token.size(), 0);
    const R* logits = this->logits(internals, logits_).template data<R>();
    const R* noise = has_noise() ? this->logits(internals, noise_logits_).template data<R>() : nullptr;
    std::vector<int> tokens(static_cast<std::size_t>(E * cap));
    std::vector<R> weights(tokens.size());
    for (std::int64_t g = 0; g < layout_.groups; ++g) {
      const MoeGroupStats group = moe_route<R>(spec_.router, random_of(ctx, mb, sb, g), S,
                                               logits + g * S * E, noise ? noise + g * S * E : nullptr,
                                               cap, tokens.data(), weights.data());
      for (std::int64_t e = 0; e < E; ++e)
        for (int s = 0; s < cap; ++s) {
          const auto from = static_cast<std::size_t>(e * cap + s);
          if (tokens[from] < 0) continue;
          const auto row = static_cast<std::size_t>(e * layout_.rows + g * layout_.capacity_max + s);
          routing.slot_token[row] = g * S + tokens[from];
          routing.slot_weight[row] = static_cast<double>(weights[from]);
        }
      if (stats) {
        for (std::size_t e = 0; e < group.tokens_per_expert.size(); ++e)
          stats->tokens_per_expert[e] += static_cast<double>(group.tokens_per_expert[e]);
        stats->tokens += static_cast<double>(S);
        stats->dropped_tokens += static_cast<double>(group.dropped_tokens);
        stats->groups += 1;
        stats->aux_sum += group.aux;
        stats->z_sum += group.z;
      }
    }
    return routing;
  }

  template <class T>
  void run_typed(const StepContext& ctx, int mb, int sb, TensorSets parts, bool collect) {
    const std::int64_t E = layout_.experts, C = m_.hidden, W = layout_.width;
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
    if (parts & kCheckpoint) run_epilogue(ctx, mb, sb, checkpoint);
    const Tensor x = body_input(checkpoint, internals);
    if (parts & kInternals) {
      run_pre_norm(checkpoint, internals);
      // 16-bit x and weights give f32 logits: the product is formed and kept in f32.
      spec_.router_linear.forward(x, logits(internals, logits_), m_.gemm16);
      if (has_noise()) spec_.noise_linear.forward(x, logits(internals, noise_logits_), m_.gemm16);
    }
    if (!(parts & kOutput)) return;
    if (collect && spec_.stats && spec_.stats->tokens_per_expert.empty()) spec_.stats->reset(static_cast<int>(E));
    const InstanceRouting routing =
        route_instance<T>(ctx, mb, sb, internals, collect ? spec_.stats : nullptr);
    // The residual for the combine to keep; the dispatch buffer: each slot's token row and
    // where it comes from; the routing for the combine.
    if (!layer_.sequence_parallel)
      kernels::copy(residual(checkpoint), rows_of(Slot::moe_residual, mb, sb));
    T* send = m_.slot(Slot::moe_send, mb, sb).data<T>();
    T* table = m_.slot(Slot::moe_routing, mb, sb).data<T>();
    const std::int64_t first_sample = global_sample(m_, ctx, mb, sb, layer_.at.first_row);
    const T* rows = x.data<T>();
    for (std::int64_t row = 0; row < layout_.total_rows(); ++row) {
      const std::int64_t token = routing.slot_token[static_cast<std::size_t>(row)];
      write_route(table, row, {token, routing.slot_weight[static_cast<std::size_t>(row)]});
      if (token < 0) {
        empty_row(send, row, W, C);
        continue;
      }
      T* out = send + row * W;
      std::copy_n(rows + token * C, C, out);
      write_header(out + C, {static_cast<std::int32_t>(first_sample + token / m_.seq_len),
                             static_cast<std::int32_t>(token % m_.seq_len)});
    }
  }

  template <class T>
  void backward_typed(const StepContext& ctx, int mb, int sb, int stage) {
    using R = Wide<T>;
    const std::int64_t C = m_.hidden, W = layout_.width;
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const InstanceRouting routing = route_instance<T>(ctx, mb, sb, internals, nullptr);
    const Tensor dx = rows_of(Slot::input_grad, mb, sb);
    const ActivationKey weight_grads{id() + 2, mb, sb, kMoeWeightGradients};
    T* reduced = m_.slot(Slot::moe_grad_recv, mb, sb).data<T>();
    const std::int64_t dx_elements = tokens_ * C;
    if (stage == 1) {  // the group summed both
      kernels::copy(Tensor::of(reduced, {tokens_, C}), dx);
      std::vector<R> d_weight(static_cast<std::size_t>(layout_.total_rows()));
      for (std::size_t i = 0; i < d_weight.size(); ++i)
        d_weight[i] = static_cast<R>(reduced[dx_elements + static_cast<std::int64_t>(i)]);
      return router_backward<T>(ctx, mb, sb, routing, internals, d_weight.data(), dx);
    }
    // Each slot's input gradient, back from its expert, onto its token (summed in the wide
    // type: a token's slots add up before one rounding to 16 bits).
    const T* received = reduced;
    std::vector<R> summed;
    R* d_x = nullptr;
    if constexpr (std::is_same_v<T, R>) {
      kernels::zero(dx);
      d_x = dx.data<T>();
    } else {
      summed.assign(static_cast<std::size_t>(dx_elements), R(0));
      d_x = summed.data();
    }
    for (std::int64_t row = 0; row < layout_.total_rows(); ++row) {
      const std::int64_t token = routing.slot_token[static_cast<std::size_t>(row)];
      if (token < 0) continue;
      const T* from = received + row * W;
      R* to = d_x + token * C;
      for (std::int64_t c = 0; c < C; ++c) to[c] += static_cast<R>(from[c]);
    }
    if constexpr (!std::is_same_v<T, R>)
      kernels::convert(Tensor::of(summed.data(), {tokens_, C}), dx);
    const R* d_weight = store().get(weight_grads).data<R>();
    if (!split()) {
      router_backward<T>(ctx, mb, sb, routing, internals, d_weight, dx);
      return store().release(weight_grads);
    }
    // For the group to sum (in the activations' type, as every tensor-parallel sum is): the
    // received rows are spent.
    std::copy_n(dx.data<T>(), dx_elements, reduced);
    for (std::int64_t i = 0; i < layout_.total_rows(); ++i)
      reduced[dx_elements + i] = narrow<T>(d_weight[i]);
    store().release(weight_grads);
  }

  // The router: the slot weights' (whole) gradients and the auxiliary terms back to the
  // logits, then to x, added to dx. The router's backward runs in its own type: under 16-bit
  // activations x and the weights are widened to f32 and dx's share is added in f32.
  template <class T>
  void router_backward(const StepContext& ctx, int mb, int sb, const InstanceRouting& routing,
                       const Tensor& internals, const Wide<T>* d_weight, const Tensor& dx) {
    using R = Wide<T>;
    const std::int64_t E = layout_.experts, S = spec_.group_tokens;
    const Tensor x = body_input(store().get(key(mb, sb, kCheckpoint)), internals);
    const int cap = routing.capacity;
    std::vector<R> group_grads(static_cast<std::size_t>(E * cap));
    const DType router_dtype = statistics_dtype(m_.dtype);
    const Tensor d_logits = router_grads_.tensor(router_dtype, {tokens_, E});
    const Tensor d_noise = router_grads_.tensor(router_dtype, {2 * tokens_, E}).rows(tokens_, 2 * tokens_);
    const R* logits = this->logits(internals, logits_).template data<R>();
    const R* noise = has_noise() ? this->logits(internals, noise_logits_).template data<R>() : nullptr;
    const double per_group = static_cast<double>(S) * ctx.loss_gradient_scale;
    for (std::int64_t g = 0; g < layout_.groups; ++g) {
      for (std::int64_t e = 0; e < E; ++e)
        for (int s = 0; s < cap; ++s)
          group_grads[static_cast<std::size_t>(e * cap + s)] =
              d_weight[e * layout_.rows + g * layout_.capacity_max + s];
      moe_route_backward<R>(spec_.router, random_of(ctx, mb, sb, g), S, logits + g * S * E,
                            noise ? noise + g * S * E : nullptr, cap, group_grads.data(),
                            spec_.router.aux_coef * per_group, spec_.router.z_coef * per_group,
                            d_logits.data<R>() + g * S * E,
                            noise ? d_noise.data<R>() + g * S * E : nullptr);
    }
    if constexpr (std::is_same_v<T, R>) {
      spec_.router_linear.backward(d_logits, x, dx, true, m_.gemm16);
      if (has_noise()) spec_.noise_linear.backward(d_noise, x, dx, true, m_.gemm16);
    } else {
      std::vector<float> x_wide(static_cast<std::size_t>(x.numel())), dx_wide(x_wide.size());
      const Tensor xw = Tensor::of(x_wide.data(), x.shape());
      const Tensor dxw = Tensor::of(dx_wide.data(), dx.shape());
      kernels::convert(x, xw);
      kernels::convert(dx, dxw);
      const auto widened_backward = [&](const ColumnParallelLinear& linear, const Tensor& dy) {
        const ParamRef& w = linear.weight();
        std::vector<float> w_wide(static_cast<std::size_t>(w.value.numel()));
        const Tensor ww = Tensor::of(w_wide.data(), w.value.shape());
        kernels::convert(w.value, ww);
        kernels::linear_backward(dy, xw, ww, linear.layout(), dxw, true, w.grad, Tensor());
      };
      widened_backward(spec_.router_linear, d_logits);
      if (has_noise()) widened_backward(spec_.noise_linear, d_noise);
      kernels::convert(dxw, dx);
    }
  }

  MoeSpec spec_;
  MoeLayout layout_;
  std::int64_t logits_ = 0, noise_logits_ = 0;  // in internals_
  Buffer router_grads_;  // d(logits) and d(noise logits) [tokens, E] each
};

// The experts: this rank's experts on the rows the dispatch all-to-all brought. Checkpoint: those
// rows; internals: each expert's activations. Output: the experts' outputs in the same rows,
// which the combine all-to-all sends back; backward: the rows' gradients, sent back by the
// backward all-to-all.
class MoeExpertsSegment final : public Segment {
 public:
  MoeExpertsSegment(int id, const ModelContext& model, MoeSpec spec)
      : Segment(id, *model.store), m_(model), spec_(std::move(spec)), layout_(model, spec_),
        name_("experts." + std::to_string(spec_.layer)), checkpoint_(model.dtype), internals_(model.dtype) {
    OASES_ASSERT(static_cast<int>(spec_.experts.size()) == layout_.local,
                 "{}: {} experts built for {} per rank", name_, spec_.experts.size(), layout_.local);
    const std::int64_t rows = layout_.total_rows();
    input_ = checkpoint_.add(rows * layout_.width);
    pre_ = internals_.add(rows * spec_.activation.input_width());
    act_ = internals_.add(rows * spec_.activation.width());
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.forward_kind = shape.backward_kind = CollectiveKind::all_to_all;
    shape.collective_ranks = layout_.ranks;
    shape.degree = spec_.at.degree;
    shape.layer = spec_.layer;
    shape.recomputable = true;
    shape.sets = kCheckpoint | kInternals;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.internals_bytes = internals_.bytes();
    shape.forward_collective_elements = shape.backward_collective_elements =
        layout_.total_rows() * layout_.width;
    // Each local expert's products on its slots from every source (all of them, as if full:
    // the capacity bounds them), the activation, and the copies in and out of the buffers.
    const MlpActivation& act = spec_.activation;
    const std::int64_t rows = layout_.ranks * layout_.rows, C = layout_.hidden, F = act.width();
    const double e = static_cast<double>(dtype_size(m_.dtype));
    const double buffer = static_cast<double>(layout_.total_rows() * layout_.width) * e;
    const auto ups = static_cast<std::int64_t>(spec_.experts.front().up.size());
    SegmentWork& w = shape.work;
    w.known = true;
    w.checkpoint.bytes = 2 * buffer;
    w.internals.bytes = buffer + static_cast<double>(layout_.local * rows * (act.input_width() + F)) * e;
    w.output.bytes = 2 * buffer;
    Work stage0;
    stage0.bytes = 3 * buffer + static_cast<double>(layout_.local * rows * (2 * act.input_width() + F)) * e;
    Work weights;
    for (int x = 0; x < layout_.local; ++x) {
      for (std::int64_t u = 0; u < ups; ++u) {
        w.internals.matmuls.push_back({rows, F, C});
        stage0.matmuls.push_back({rows, C, F});
        weights.matmuls.push_back({C, F, rows});
      }
      w.output.matmuls.push_back({rows, C, F});
      stage0.matmuls.push_back({rows, F, C});
      weights.matmuls.push_back({F, C, rows});
    }
    w.backward_input = {stage0, Work{}};
    w.backward_weight = weights;
    return shape;
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return a2a(Slot::moe_send, Slot::moe_recv, mb, sb);
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    return a2a(Slot::moe_grad_send, Slot::moe_grad_recv, mb, sb);
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    run(ctx, mb, sb, kCheckpoint | kInternals | kOutput);
  }
  void recompute(const StepContext& ctx, int mb, int sb, TensorSets sets) override {
    run(ctx, mb, sb, sets);
  }
  void backward(const StepContext& ctx, int mb, int sb, int stage) override {
    if (stage == 1) return;  // the gradients went back to their tokens' ranks
    for_dtype(m_.dtype, [&]<class T>() { backward_typed<T>(ctx, mb, sb); });
  }

 private:
  CollectiveCall a2a(Slot send, Slot receive, int mb, int sb) const {
    const std::int64_t n = layout_.total_rows() * layout_.width;
    return {CollectiveKind::all_to_all, comm::ReduceOp::sum, m_.ep,
            m_.slot(receive, mb, sb).view(0, {n}), m_.slot(send, mb, sb).view(0, {n})};
  }
  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) {
    for_dtype(m_.dtype, [&]<class T>() { run_typed<T>(ctx, mb, sb, parts); });
  }
  // Expert e's first n rows of an internals piece of `width` columns.
  Tensor piece(const Tensor& internals, std::int64_t offset, int e, std::int64_t n,
               std::int64_t width) const {
    return internals.view(offset + e * layout_.ranks * layout_.rows * width, {n, width});
  }
  template <class T>
  static void gather(const T* rows, std::int64_t row_width, const std::vector<std::int64_t>& which,
                     std::int64_t columns, const Tensor& to) {
    for (std::size_t i = 0; i < which.size(); ++i)
      std::copy_n(rows + which[i] * row_width, columns,
                  to.data<T>() + static_cast<std::int64_t>(i) * columns);
  }
  // Expert dropout on local expert e's hidden activations (or their gradient) [n, F], in place,
  // keyed by each row's global sample and position.
  template <class T>
  void expert_dropout(const StepContext& ctx, int e, const T* input,
                      const std::vector<std::int64_t>& which, const Tensor& a) const {
    const double p = spec_.expert_dropout;
    if (p == 0 || !ctx.dropout_enabled) return;
    const kernels::DropoutSite site{m_.seed, static_cast<std::uint32_t>(ctx.step),
                                    static_cast<std::uint32_t>(spec_.layer), kDropoutSiteExpert};
    // Keyed by the whole expert's hidden index: this rank holds columns [shard x F, +F).
    const std::int64_t F = a.dim(1), W = layout_.width, C = layout_.hidden;
    const std::int64_t global_expert = static_cast<std::int64_t>(layout_.rank) * layout_.local + e;
    const std::int64_t first = (global_expert * spec_.at.degree + spec_.at.shard) * F;
    using R = Wide<T>;
    const auto scale = static_cast<R>(1.0 / (1.0 - p));
    for (std::size_t i = 0; i < which.size(); ++i) {
      const RowHeader header = read_header(input + which[i] * W + C);
      T* row = a.data<T>() + static_cast<std::int64_t>(i) * F;
      for (std::int64_t f = 0; f < F; ++f)
        row[f] = kernels::dropout_keep(site, p, header.sample, header.position, first + f)
                     ? narrow<T>(static_cast<R>(row[f]) * scale)
                     : narrow<T>(R(0));
    }
  }

  template <class T>
  void run_typed(const StepContext& ctx, int mb, int sb, TensorSets parts) {
    const MlpActivation& act = spec_.activation;
    const std::int64_t C = layout_.hidden, W = layout_.width, F = act.width();
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
    const std::int64_t n_all = layout_.total_rows();
    if (parts & kCheckpoint)
      kernels::copy(m_.slot(Slot::moe_recv, mb, sb).view(0, {n_all * W}),
                    checkpoint.view(input_, {n_all * W}));
    if (!(parts & (kInternals | kOutput))) return;
    const T* input = checkpoint.data<T>() + input_;
    const auto filled = filled_rows(layout_, input);
    const Tensor gathered = m_.scratch_wide.view(0, {layout_.ranks * layout_.rows, C});
    const Tensor outputs = m_.scratch_wide.view(layout_.ranks * layout_.rows * C,
                                                {layout_.ranks * layout_.rows, C});
    T* send = m_.slot(Slot::moe_send, mb, sb).data<T>();
    if (parts & kOutput) {
      // Empty slots go back empty.
      for (std::int64_t row = 0; row < n_all; ++row) empty_row(send, row, W, C);
    }
    for (int e = 0; e < layout_.local; ++e) {
      const auto& which = filled[static_cast<std::size_t>(e)];
      const auto n = static_cast<std::int64_t>(which.size());
      if (n == 0) continue;
      const ExpertSpec& expert = spec_.experts[static_cast<std::size_t>(e)];
      const Tensor pre = piece(internals, pre_, e, n, act.input_width());
      const Tensor hidden = piece(internals, act_, e, n, F);
      if (parts & kInternals) {
        const Tensor x = gathered.rows(0, n);
        gather(input, W, which, C, x);
        if (expert.up.size() == 1) {
          expert.up[0].forward(x, pre, m_.gemm16);
        } else {
          expert.up[0].forward(x, pre.columns(0, F), m_.gemm16);
          expert.up[1].forward(x, pre.columns(F, 2 * F), m_.gemm16);
        }
        act.forward(pre, hidden);
        expert_dropout<T>(ctx, e, input, which, hidden);
      }
      if (parts & kOutput) {
        const Tensor y = outputs.rows(0, n);
        // Split over a group, each rank's output is a partial sum: one of them adds the bias.
        if (spec_.at.shard == 0) expert.down.forward(hidden, y, m_.gemm16);
        else expert.down.forward_without_bias(hidden, y, m_.gemm16);
        for (std::int64_t i = 0; i < n; ++i) {
          T* row = send + which[static_cast<std::size_t>(i)] * W;
          std::copy_n(y.data<T>() + i * C, C, row);
          std::copy_n(input + which[static_cast<std::size_t>(i)] * W + C, layout_.header, row + C);
        }
      }
    }
  }

  template <class T>
  void backward_typed(const StepContext& ctx, int mb, int sb) {
    const MlpActivation& act = spec_.activation;
    const std::int64_t C = layout_.hidden, W = layout_.width, F = act.width();
    const std::int64_t n_all = layout_.total_rows(), per_expert = layout_.ranks * layout_.rows;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const T* input = checkpoint.data<T>() + input_;
    const auto filled = filled_rows(layout_, input);
    const T* d_out = m_.slot(Slot::moe_grad_recv, mb, sb).data<T>();
    T* d_send = m_.slot(Slot::moe_grad_send, mb, sb).data<T>();
    std::fill_n(d_send, n_all * W, narrow<T>(0.0f));
    // Scratch: gathered inputs, output gradients (then the inputs' gradients), the hidden
    // activations' and the up projections' gradients.
    const Tensor gathered = m_.scratch_wide.view(0, {per_expert, C});
    const Tensor d_rows = m_.scratch_wide.view(per_expert * C, {per_expert, C});
    const Tensor d_hidden = m_.scratch_wide.view(2 * per_expert * C, {per_expert, F});
    const Tensor d_pre = m_.scratch_wide.view(per_expert * (2 * C + F), {per_expert, act.input_width()});
    for (int e = 0; e < layout_.local; ++e) {
      const auto& which = filled[static_cast<std::size_t>(e)];
      const auto n = static_cast<std::int64_t>(which.size());
      if (n == 0) continue;
      const ExpertSpec& expert = spec_.experts[static_cast<std::size_t>(e)];
      const Tensor pre = piece(internals, pre_, e, n, act.input_width());
      const Tensor hidden = piece(internals, act_, e, n, F);
      const Tensor dy = d_rows.rows(0, n), dh = d_hidden.rows(0, n), dp = d_pre.rows(0, n);
      const Tensor x = gathered.rows(0, n);
      gather(d_out, W, which, C, dy);
      expert.down.backward(dy, hidden, dh, false, m_.gemm16);
      expert_dropout<T>(ctx, e, input, which, dh);
      act.backward(pre, dh, dp);
      gather(input, W, which, C, x);
      const Tensor dx = d_rows.rows(0, n);  // dy is consumed
      if (expert.up.size() == 1) {
        expert.up[0].backward(dp, x, dx, false, m_.gemm16);
      } else {
        expert.up[0].backward(dp.columns(0, F), x, dx, false, m_.gemm16);
        expert.up[1].backward(dp.columns(F, 2 * F), x, dx, true, m_.gemm16);
      }
      for (std::int64_t i = 0; i < n; ++i)
        std::copy_n(dx.data<T>() + i * C, C, d_send + which[static_cast<std::size_t>(i)] * W);
    }
  }

  const ModelContext& m_;
  MoeSpec spec_;
  MoeLayout layout_;
  std::string name_;
  SetLayout checkpoint_, internals_;
  std::int64_t input_ = 0, pre_ = 0, act_ = 0;
};

// The combine: each token's experts' outputs, weighted, into the output slot (the next
// segment's epilogue adds the residual). Checkpoint: the residual h (read by the next
// epilogue, as every layer segment's checkpoint is), the returned rows and the routing; backward:
// the rows' gradients go back to the experts by the backward all-to-all, the weights' gradients
// to the dispatch.
class MoeCombineSegment final : public Segment {
 public:
  MoeCombineSegment(int id, const ModelContext& model, MoeSpec spec)
      : Segment(id, *model.store), m_(model), spec_(std::move(spec)), layout_(model, spec_),
        name_("moe_combine." + std::to_string(spec_.layer)), checkpoint_(model.dtype),
        tokens_(spec_.at.rows * model.seq_len) {
    // First the residual h, where the next epilogue reads its residual (ops/epilogue.h); under
    // sequence parallelism the shard segment before the dispatch holds it.
    if (!spec_.sequence_parallel) residual_ = checkpoint_.add(tokens_ * m_.hidden);
    returned_ = checkpoint_.add(layout_.total_rows() * layout_.width);
    routing_ = checkpoint_.add(layout_.total_rows() * layout_.route);
  }
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    // Over the layer's group (one rank at degree 1): the experts' partial outputs summed, or
    // under sequence parallelism each rank's block of the tokens.
    shape.forward_kind = reduction();
    shape.sequence_sharded = spec_.sequence_parallel;
    shape.backward_kind = CollectiveKind::all_to_all;
    shape.collective_ranks = layout_.ranks;
    shape.degree = spec_.at.degree;
    shape.layer = spec_.layer;
    shape.recomputable = true;
    shape.sets = kCheckpoint;
    shape.checkpoint_bytes = checkpoint_.bytes();
    shape.forward_collective_elements = tokens_ * m_.hidden;
    shape.backward_collective_elements = layout_.total_rows() * layout_.width;
    // The weighted sum of the returned rows into the output, and back.
    const double e = static_cast<double>(dtype_size(m_.dtype));
    const double buffer = static_cast<double>(layout_.total_rows() * layout_.width) * e;
    const double rows = static_cast<double>(tokens_ * m_.hidden) * e;
    shape.work.known = true;
    shape.work.checkpoint.bytes = 2 * buffer + 2 * rows;
    shape.work.output.bytes = buffer + rows;
    shape.work.backward_input = {Work{{}, 2 * buffer + rows}, Work{}};
    return shape;
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return {reduction(),
            comm::ReduceOp::sum,
            spec_.at.group,
            m_.slot_rows(Slot::output, mb, sb, spec_.at.rows),
            {}};
  }
  CollectiveCall backward_collective(int mb, int sb) override {
    const std::int64_t n = layout_.total_rows() * layout_.width;
    return {CollectiveKind::all_to_all, comm::ReduceOp::sum, m_.ep,
            m_.slot(Slot::moe_grad_recv, mb, sb).view(0, {n}),
            m_.slot(Slot::moe_grad_send, mb, sb).view(0, {n})};
  }
  void forward(const StepContext&, int mb, int sb) override { run(mb, sb, kCheckpoint | kOutput); }
  void recompute(const StepContext&, int mb, int sb, TensorSets sets) override { run(mb, sb, sets); }
  void backward(const StepContext&, int mb, int sb, int stage) override {
    if (stage == 1) return;  // the rows' gradients went to the experts
    for_dtype(m_.dtype, [&]<class T>() { backward_typed<T>(mb, sb); });
  }

 private:
  void run(int mb, int sb, TensorSets parts) {
    for_dtype(m_.dtype, [&]<class T>() { run_typed<T>(mb, sb, parts); });
  }
  CollectiveKind reduction() const { return partial_sum_collective(spec_.sequence_parallel); }
  template <class T>
  void run_typed(int mb, int sb, TensorSets parts) {
    const std::int64_t n = layout_.total_rows(), C = layout_.hidden, W = layout_.width;
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    if (parts & kCheckpoint) {
      if (!spec_.sequence_parallel)
        kernels::copy(m_.slot_rows(Slot::moe_residual, mb, sb, spec_.at.rows),
                      checkpoint.view(residual_, {tokens_, C}));
      kernels::copy(m_.slot(Slot::moe_recv, mb, sb).view(0, {n * W}), checkpoint.view(returned_, {n * W}));
      kernels::copy(m_.slot(Slot::moe_routing, mb, sb).view(0, {n * layout_.route}),
                    checkpoint.view(routing_, {n * layout_.route}));
    }
    if (!(parts & kOutput)) return;
    using R = Wide<T>;
    const Tensor output = m_.slot_rows(Slot::output, mb, sb, spec_.at.rows);
    // A token's experts add up in the wide type, rounded once to 16 bits.
    std::vector<R> summed;
    R* y = nullptr;
    if constexpr (std::is_same_v<T, R>) {
      kernels::zero(output);
      y = output.data<T>();
    } else {
      summed.assign(static_cast<std::size_t>(tokens_ * C), R(0));
      y = summed.data();
    }
    const T* rows = checkpoint.data<T>() + returned_;
    const T* table = checkpoint.data<T>() + routing_;
    for (std::int64_t row = 0; row < n; ++row) {
      const SlotRoute route = read_route(table, row);
      if (route.token < 0) continue;
      const auto w = static_cast<R>(route.weight);
      const T* from = rows + row * W;
      R* to = y + route.token * C;
      for (std::int64_t c = 0; c < C; ++c) to[c] += w * static_cast<R>(from[c]);
    }
    if constexpr (!std::is_same_v<T, R>) kernels::convert(Tensor::of(y, {tokens_, C}), output);
  }
  template <class T>
  void backward_typed(int mb, int sb) {
    const std::int64_t n = layout_.total_rows(), C = layout_.hidden, W = layout_.width;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const T* rows = checkpoint.data<T>() + returned_;
    const T* table = checkpoint.data<T>() + routing_;
    const T* dy = m_.slot_rows(Slot::output_grad, mb, sb, spec_.at.rows).data<T>();
    using R = Wide<T>;
    T* d_send = m_.slot(Slot::moe_grad_send, mb, sb).data<T>();
    // The slot weights' gradients, in the router's type (f32 under 16-bit activations).
    R* d_weight =
        store().acquire(key(mb, sb, kMoeWeightGradients), statistics_dtype(m_.dtype), n).data<R>();
    for (std::int64_t row = 0; row < n; ++row) {
      T* to = d_send + row * W;
      const SlotRoute route = read_route(table, row);
      if (route.token < 0) {
        std::fill_n(to, W, narrow<T>(0.0f));
        d_weight[row] = R(0);
        continue;
      }
      const auto w = static_cast<R>(route.weight);
      const T* g = dy + route.token * C;
      const T* from = rows + row * W;
      double dot = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        dot += static_cast<double>(from[c]) * static_cast<double>(g[c]);
        to[c] = narrow<T>(w * static_cast<R>(g[c]));
      }
      std::copy_n(from + C, layout_.header, to + C);
      d_weight[row] = static_cast<R>(dot);
    }
  }

  const ModelContext& m_;
  MoeSpec spec_;
  MoeLayout layout_;
  std::string name_;
  SetLayout checkpoint_;
  std::int64_t tokens_;
  std::int64_t residual_ = 0, returned_ = 0, routing_ = 0;  // in checkpoint_
};

}  // namespace

std::int64_t moe_slot_rows(const MoeRouterSpec& router, std::int64_t group_tokens,
                           std::int64_t tokens) {
  const int capacity = std::max(moe_capacity(router, group_tokens, true),
                                moe_capacity(router, group_tokens, false));
  return static_cast<std::int64_t>(router.experts) * (tokens / group_tokens) * capacity;
}

std::int64_t scratch_wide_elements(const MoeSpec& spec, std::int64_t seq_len) {
  // The experts' scratch: one expert's rows from every source rank.
  const std::int64_t rows = moe_slot_rows(spec.router, spec.group_tokens, spec.at.rows * seq_len) /
                            spec.router.experts * spec.expert_ranks;
  const std::int64_t hidden = spec.experts.front().down.local_out();
  return rows * (2 * hidden + spec.activation.width() + spec.activation.input_width());
}

void append_moe_segments(int first_id, const ModelContext& model, const MoeSpec& spec,
                         std::vector<std::unique_ptr<Segment>>& segments) {
  segments.push_back(std::make_unique<MoeDispatchSegment>(first_id, model, spec));
  segments.push_back(std::make_unique<MoeExpertsSegment>(first_id + 1, model, spec));
  segments.push_back(std::make_unique<MoeCombineSegment>(first_id + 2, model, spec));
}

}  // namespace oases::ops
