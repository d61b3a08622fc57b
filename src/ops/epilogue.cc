#include "ops/epilogue.h"

#include "core/error.h"
#include "kernels/kernels.h"

namespace oases::ops {

std::int64_t global_sample(const ModelContext& model, const StepContext& ctx, int mb, int sb,
                           std::int64_t first_row) {
  return ctx.micro_batches[static_cast<std::size_t>(mb)].global_sample_offset + sb * model.rows +
         first_row;
}

ResidualEpilogue::KeptPieces ResidualEpilogue::add_kept(SetLayout& layout, std::int64_t tokens,
                                                        std::int64_t hidden) const {
  if (!keeps()) return {};
  KeptPieces pieces;
  pieces.sum = layout.add(tokens * hidden);
  pieces.statistics = layout.add_statistics(spec_.post_norm.stats_per_row() * tokens);
  return pieces;
}

ResidualEpilogue::Kept ResidualEpilogue::kept(const Tensor& block, const SetLayout& layout,
                                              const KeptPieces& pieces, std::int64_t tokens,
                                              std::int64_t hidden) const {
  if (pieces.sum < 0) return {};
  return {block.view(pieces.sum, {tokens, hidden}),
          statistics_view(block, layout.statistics_offset(pieces.statistics),
                          spec_.post_norm.stats_per_row() * tokens)};
}

kernels::DropoutSite ResidualEpilogue::site(const ModelContext& model,
                                            const StepContext& ctx) const {
  return {model.seed, static_cast<std::uint32_t>(ctx.step), spec_.site.layer, spec_.site.site};
}

double ResidualEpilogue::probability(const ModelContext& model, const StepContext& ctx) const {
  return ctx.dropout_enabled ? model.dropout : 0.0;
}

void ResidualEpilogue::forward(const ModelContext& model, const StepContext& ctx, int mb, int sb,
                               std::int64_t rows, std::int64_t first_row, const Tensor& input,
                               const Tensor& residual, const Tensor& out,
                               const Kept& kept) const {
  if (spec_.copies_input) {
    kernels::copy(input, out);
    return;
  }
  const kernels::DropoutSlice slice{global_sample(model, ctx, mb, sb, first_row), 0};
  const double p = probability(model, ctx);
  const bool post_norm = spec_.post_norm.present();
  // The sum a lands in `out`, or in the kept block when a norm follows.
  OASES_ASSERT(!post_norm || kept.sum.shape() == out.shape(), "post-norm epilogue without its kept sum");
  const Tensor sum = post_norm ? kept.sum : out;
  if (spec_.residual_segment >= 0) {
    kernels::bias_dropout_add_forward(input, spec_.bias.value, residual, sum, rows,
                                      model.seq_len, spec_.dropout ? p : 0.0, site(model, ctx),
                                      slice);
  } else {
    OASES_ASSERT(!spec_.bias.present(), "an epilogue without a residual has no bias");
    kernels::dropout_apply(input, sum, rows, model.seq_len, spec_.dropout ? p : 0.0,
                           site(model, ctx), slice);
  }
  if (!post_norm) return;
  spec_.post_norm.forward(sum, out, kept.statistics);
  if (spec_.dropout_after_norm)
    kernels::dropout_apply(out, out, rows, model.seq_len, p, site(model, ctx), slice);
}

void ResidualEpilogue::backward(const ModelContext& model, const StepContext& ctx, int mb, int sb,
                                std::int64_t rows, std::int64_t first_row, const Tensor& d_out,
                                const Tensor& d_input, const Kept& kept,
                                const Tensor& scratch) const {
  if (spec_.copies_input) return;  // d(out) is the input's gradient, which the mover reads
  const kernels::DropoutSlice slice{global_sample(model, ctx, mb, sb, first_row), 0};
  const double p = probability(model, ctx);
  if (spec_.post_norm.present()) {
    if (spec_.dropout_after_norm)
      kernels::dropout_apply(d_out, d_out, rows, model.seq_len, p, site(model, ctx), slice);
    spec_.post_norm.backward(d_out, kept.sum, kept.statistics, scratch);
    kernels::copy(scratch, d_out);  // now d(a): the residual's gradient
  }
  kernels::bias_dropout_add_backward(d_out, d_input, spec_.bias.grad, rows, model.seq_len,
                                     spec_.dropout ? p : 0.0, site(model, ctx), slice);
}

}  // namespace oases::ops
