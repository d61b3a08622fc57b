// The mixture-of-experts segment (ops/layer_segments.h, MoeSpec): routing from ops/moe.h,
// experts built from the linear ops, all on this rank.
#include "core/buffer.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "ops/epilogue.h"
#include "ops/layer_segment_base.h"
#include "ops/layer_segments.h"
#include "ops/moe.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace oases::ops {
namespace {

int larger_capacity(const MoeSpec& spec) {
  return std::max(moe_capacity(spec.router, spec.group_tokens, true),
                  moe_capacity(spec.router, spec.group_tokens, false));
}

// Rows each expert's pieces hold: every group's slots at the larger capacity.
std::int64_t rows_per_expert(const MoeSpec& spec, std::int64_t tokens) {
  return tokens / spec.group_tokens * larger_capacity(spec);
}

class MoeSegment final : public detail::LayerSegment {
 public:
  MoeSegment(int id, const ModelContext& model, MoeSpec spec)
      : LayerSegment(id, model, spec), spec_(std::move(spec)) {
    OASES_CHECK(model.dtype == DType::f32 || model.dtype == DType::f64,
                "{}: mixture-of-experts layers run in fp32 or fp64 (train.precision), not {}",
                name(), dtype_name(model.dtype));
    OASES_CHECK(tokens_ % spec_.group_tokens == 0,
                "{}: model.moe_group_size = {} tokens must divide the {} tokens a segment instance "
                "processes (train.micro_batch / parallel.sub_batches sequences of model.seq_len); "
                "choose a group size that divides it",
                name(), spec_.group_tokens, tokens_);
    OASES_ASSERT(static_cast<int>(spec_.experts.size()) == spec_.router.experts,
                 "{}: {} experts built for a router over {}", name(), spec_.experts.size(),
                 spec_.router.experts);
    experts_ = spec_.router.experts;
    groups_ = tokens_ / spec_.group_tokens;
    rows_ = rows_per_expert(spec_, tokens_);
    const std::int64_t E = experts_, C = model.hidden;
    logits_ = internals_.add(tokens_ * E);
    if (has_noise()) noise_logits_ = internals_.add(tokens_ * E);
    pre_ = internals_.add(E * rows_ * spec_.activation.input_width());
    act_ = internals_.add(E * rows_ * spec_.activation.width());
    out_ = internals_.add(E * rows_ * C);
    router_grads_ = Buffer(static_cast<std::size_t>(2 * tokens_ * E) * dtype_size(model.dtype));
  }

  SegmentShape shape() const override {
    SegmentShape shape = layer_shape(kCheckpoint | kInternals);
    shape.has_weight_part = false;  // the routing gradient needs every expert's output first
    shape.deferred_gradient_bytes = 0;
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    dispatch(ctx, mb, sb, kCheckpoint | kInternals | kOutput, ctx.head_mode == HeadMode::train);
  }

 private:
  // One filled slot: the token (within the instance) and its index into the instance's slot
  // table [groups, experts, capacity].
  struct Entry {
    std::int64_t token;
    std::int64_t slot;
  };
  struct InstanceRouting {
    int capacity = 0;
    std::vector<int> slot_token;       // [groups * experts * capacity], token within the group
    std::vector<double> slot_weight;
    std::vector<std::vector<Entry>> by_expert;
  };

  bool has_noise() const {
    return spec_.router.gate == MoeGate::noisy_top_k && spec_.router.router_noise > 0;
  }

  void run(const StepContext& ctx, int mb, int sb, TensorSets parts) override {
    dispatch(ctx, mb, sb, parts, false);
  }
  void dispatch(const StepContext& ctx, int mb, int sb, TensorSets parts, bool collect) {
    if (m_.dtype == DType::f64) run_typed<double>(ctx, mb, sb, parts, collect);
    else run_typed<float>(ctx, mb, sb, parts, collect);
  }
  void backward_body(const StepContext& ctx, int mb, int sb, bool) override {
    if (m_.dtype == DType::f64) backward_typed<double>(ctx, mb, sb);
    else backward_typed<float>(ctx, mb, sb);
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
    InstanceRouting routing;
    const std::int64_t S = spec_.group_tokens, E = experts_;
    routing.capacity = moe_capacity(spec_.router, S, ctx.dropout_enabled);
    const auto cap = static_cast<std::int64_t>(routing.capacity);
    const auto table = static_cast<std::size_t>(groups_ * E * cap);
    routing.slot_token.assign(table, -1);
    routing.slot_weight.assign(table, 0);
    routing.by_expert.assign(static_cast<std::size_t>(E), {});
    const T* logits = internals.data<T>() + logits_;
    const T* noise = has_noise() ? internals.data<T>() + noise_logits_ : nullptr;
    std::vector<T> weights(static_cast<std::size_t>(E * cap));
    for (std::int64_t g = 0; g < groups_; ++g) {
      const std::size_t at = static_cast<std::size_t>(g * E * cap);
      const MoeGroupStats group = moe_route<T>(
          spec_.router, random_of(ctx, mb, sb, g), S, logits + g * S * E,
          noise ? noise + g * S * E : nullptr, routing.capacity, &routing.slot_token[at], weights.data());
      for (std::size_t i = 0; i < weights.size(); ++i)
        routing.slot_weight[at + i] = static_cast<double>(weights[i]);
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
    for (std::int64_t g = 0; g < groups_; ++g)
      for (std::int64_t e = 0; e < E; ++e)
        for (std::int64_t s = 0; s < cap; ++s) {
          const std::int64_t slot = (g * E + e) * cap + s;
          const int token = routing.slot_token[static_cast<std::size_t>(slot)];
          if (token >= 0) routing.by_expert[static_cast<std::size_t>(e)].push_back({g * S + token, slot});
        }
    return routing;
  }

  // Views of expert e's first n rows in the internals.
  Tensor expert_rows(const Tensor& internals, std::int64_t piece, std::int64_t e, std::int64_t n,
                     std::int64_t width) const {
    return internals.view(piece + e * rows_ * width, {n, width});
  }

  template <class T>
  static void gather(const Tensor& from, const std::vector<Entry>& entries, const Tensor& to) {
    const std::int64_t C = from.dim(1);
    for (std::size_t i = 0; i < entries.size(); ++i)
      std::copy_n(from.data<T>() + entries[i].token * C, C, to.data<T>() + static_cast<std::int64_t>(i) * C);
  }

  // Expert dropout on expert e's hidden activations [n, F] (or its gradient), in place.
  template <class T>
  void expert_dropout(const StepContext& ctx, int mb, int sb, std::int64_t e,
                      const std::vector<Entry>& entries, const Tensor& a) const {
    const double p = spec_.expert_dropout;
    if (p == 0 || !ctx.dropout_enabled) return;
    const kernels::DropoutSite site{m_.seed, static_cast<std::uint32_t>(ctx.step),
                                    static_cast<std::uint32_t>(layer_.layer), kDropoutSiteExpert};
    const std::int64_t first = global_sample(m_, ctx, mb, sb, layer_.at.first_row);
    const std::int64_t F = a.dim(1);
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::int64_t token = entries[i].token;
      T* row = a.data<T>() + static_cast<std::int64_t>(i) * F;
      for (std::int64_t f = 0; f < F; ++f)
        row[f] = kernels::cpu::dropout_keep(site, p, first + token / m_.seq_len,
                                            token % m_.seq_len, e * F + f)
                     ? row[f] * scale
                     : T(0);
    }
  }

  template <class T>
  void run_typed(const StepContext& ctx, int mb, int sb, TensorSets parts, bool collect) {
    const std::int64_t C = m_.hidden, E = experts_;
    const MlpActivation& act = spec_.activation;
    const Tensor checkpoint = acquire_or_get(mb, sb, kCheckpoint, parts, checkpoint_);
    const Tensor internals = acquire_or_get(mb, sb, kInternals, parts, internals_);
    if (parts & kCheckpoint) run_epilogue(ctx, mb, sb, checkpoint);
    if (!(parts & (kInternals | kOutput))) return;
    const Tensor x = body_input(checkpoint, internals);
    if (parts & kInternals) {
      run_pre_norm(checkpoint, internals);
      spec_.router_linear.forward(x, matrix(internals, logits_, E), m_.gemm16);
      if (has_noise()) spec_.noise_linear.forward(x, matrix(internals, noise_logits_, E), m_.gemm16);
    }
    if (collect && spec_.stats && spec_.stats->tokens_per_expert.empty()) spec_.stats->reset(experts_);
    const InstanceRouting routing =
        route_instance<T>(ctx, mb, sb, internals, collect ? spec_.stats : nullptr);
    if (parts & kInternals) {
      const Tensor gathered = m_.scratch_wide.view(0, {rows_, C});
      for (std::int64_t e = 0; e < E; ++e) {
        const auto& entries = routing.by_expert[static_cast<std::size_t>(e)];
        const auto n = static_cast<std::int64_t>(entries.size());
        if (n == 0) continue;
        const ExpertSpec& expert = spec_.experts[static_cast<std::size_t>(e)];
        const Tensor input = gathered.rows(0, n);
        gather<T>(x, entries, input);
        const Tensor pre = expert_rows(internals, pre_, e, n, act.input_width());
        const Tensor hidden = expert_rows(internals, act_, e, n, act.width());
        if (expert.up.size() == 1) {
          expert.up[0].forward(input, pre, m_.gemm16);
        } else {
          expert.up[0].forward(input, pre.columns(0, act.width()), m_.gemm16);
          expert.up[1].forward(input, pre.columns(act.width(), 2 * act.width()), m_.gemm16);
        }
        act.forward(pre, hidden);
        expert_dropout<T>(ctx, mb, sb, e, entries, hidden);
        expert.down.forward(hidden, expert_rows(internals, out_, e, n, C), m_.gemm16);
      }
    }
    if (parts & kOutput) {
      const Tensor output = rows_of(Slot::output, mb, sb);
      kernels::zero(output);
      T* y = output.data<T>();
      for (std::int64_t e = 0; e < E; ++e) {
        const auto& entries = routing.by_expert[static_cast<std::size_t>(e)];
        const T* out = internals.data<T>() + out_ + e * rows_ * C;
        for (std::size_t i = 0; i < entries.size(); ++i) {
          const T w = static_cast<T>(routing.slot_weight[static_cast<std::size_t>(entries[i].slot)]);
          T* row = y + entries[i].token * C;
          const T* source = out + static_cast<std::int64_t>(i) * C;
          for (std::int64_t c = 0; c < C; ++c) row[c] += w * source[c];
        }
      }
    }
  }

  template <class T>
  void backward_typed(const StepContext& ctx, int mb, int sb) {
    const std::int64_t C = m_.hidden, E = experts_, S = spec_.group_tokens;
    const MlpActivation& act = spec_.activation;
    const Tensor checkpoint = store().get(key(mb, sb, kCheckpoint));
    const Tensor internals = store().get(key(mb, sb, kInternals));
    const Tensor x = body_input(checkpoint, internals);
    const InstanceRouting routing = route_instance<T>(ctx, mb, sb, internals, nullptr);
    const std::int64_t cap = routing.capacity;
    const Tensor dy = rows_of(Slot::output_grad, mb, sb);
    const Tensor dx = rows_of(Slot::input_grad, mb, sb);
    kernels::zero(dx);
    std::vector<T> d_weight(routing.slot_weight.size(), T(0));
    // Scratch: gathered inputs, then output gradients (reused for the inputs' gradients),
    // then the activation's and its input's gradients.
    const Tensor gathered = m_.scratch_wide.view(0, {rows_, C});
    const Tensor d_rows = m_.scratch_wide.view(rows_ * C, {rows_, C});
    const Tensor d_hidden = m_.scratch_wide.view(2 * rows_ * C, {rows_, act.width()});
    const Tensor d_pre =
        m_.scratch_wide.view(rows_ * (2 * C + act.width()), {rows_, act.input_width()});
    for (std::int64_t e = 0; e < E; ++e) {
      const auto& entries = routing.by_expert[static_cast<std::size_t>(e)];
      const auto n = static_cast<std::int64_t>(entries.size());
      if (n == 0) continue;
      const ExpertSpec& expert = spec_.experts[static_cast<std::size_t>(e)];
      const T* out = internals.data<T>() + out_ + e * rows_ * C;
      const T* grad = dy.data<T>();
      T* d_out = d_rows.data<T>();
      for (std::int64_t i = 0; i < n; ++i) {
        const Entry& entry = entries[static_cast<std::size_t>(i)];
        const T w = static_cast<T>(routing.slot_weight[static_cast<std::size_t>(entry.slot)]);
        const T* g = grad + entry.token * C;
        double dot = 0;
        for (std::int64_t c = 0; c < C; ++c) {
          dot += static_cast<double>(out[i * C + c]) * static_cast<double>(g[c]);
          d_out[i * C + c] = w * g[c];
        }
        d_weight[static_cast<std::size_t>(entry.slot)] = static_cast<T>(dot);
      }
      const Tensor hidden = expert_rows(internals, act_, e, n, act.width());
      const Tensor pre = expert_rows(internals, pre_, e, n, act.input_width());
      const Tensor dh = d_hidden.rows(0, n), dp = d_pre.rows(0, n), input = gathered.rows(0, n);
      expert.down.backward(d_rows.rows(0, n), hidden, dh, false, m_.gemm16);
      expert_dropout<T>(ctx, mb, sb, e, entries, dh);
      act.backward(pre, dh, dp);
      gather<T>(x, entries, input);
      const Tensor d_input = d_rows.rows(0, n);
      if (expert.up.size() == 1) {
        expert.up[0].backward(dp, input, d_input, false, m_.gemm16);
      } else {
        expert.up[0].backward(dp.columns(0, act.width()), input, d_input, false, m_.gemm16);
        expert.up[1].backward(dp.columns(act.width(), 2 * act.width()), input, d_input, true,
                              m_.gemm16);
      }
      T* d_x = dx.data<T>();
      for (std::int64_t i = 0; i < n; ++i) {
        T* row = d_x + entries[static_cast<std::size_t>(i)].token * C;
        const T* source = d_input.data<T>() + i * C;
        for (std::int64_t c = 0; c < C; ++c) row[c] += source[c];
      }
    }
    // The router: d(weights) and the auxiliary terms back to the logits, then to x.
    const Tensor d_logits = router_grads_.tensor(m_.dtype, {tokens_, E});
    const Tensor d_noise = router_grads_.tensor(m_.dtype, {2 * tokens_, E}).rows(tokens_, 2 * tokens_);
    const T* logits = internals.data<T>() + logits_;
    const T* noise = has_noise() ? internals.data<T>() + noise_logits_ : nullptr;
    const double per_group = static_cast<double>(S) * ctx.loss_gradient_scale;
    for (std::int64_t g = 0; g < groups_; ++g)
      moe_route_backward<T>(spec_.router, random_of(ctx, mb, sb, g), S, logits + g * S * E,
                            noise ? noise + g * S * E : nullptr, routing.capacity,
                            d_weight.data() + g * E * cap, spec_.router.aux_coef * per_group,
                            spec_.router.z_coef * per_group, d_logits.data<T>() + g * S * E,
                            noise ? d_noise.data<T>() + g * S * E : nullptr);
    spec_.router_linear.backward(d_logits, x, dx, true, m_.gemm16);
    if (has_noise()) spec_.noise_linear.backward(d_noise, x, dx, true, m_.gemm16);
  }

  MoeSpec spec_;
  std::int64_t experts_ = 0, groups_ = 0, rows_ = 0;
  std::int64_t logits_ = 0, noise_logits_ = 0, pre_ = 0, act_ = 0, out_ = 0;  // in internals_
  Buffer router_grads_;  // d(logits) and d(noise logits) [tokens, E] each
};

}  // namespace

std::int64_t scratch_wide_elements(const MoeSpec& spec, std::int64_t seq_len) {
  const std::int64_t rows = rows_per_expert(spec, spec.at.rows * seq_len);
  return rows * (2 * spec.experts.front().down.local_out() + spec.activation.width() +
                 spec.activation.input_width());
}

std::unique_ptr<Segment> make_moe_segment(int id, const ModelContext& model, MoeSpec spec) {
  return std::make_unique<MoeSegment>(id, model, std::move(spec));
}

}  // namespace oases::ops
