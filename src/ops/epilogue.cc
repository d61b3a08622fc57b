#include "ops/epilogue.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <algorithm>

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

namespace {

// Calls run(first, count, batch, seq, slice) for the runs of tokens [first_token, first_token +
// tokens) of `rows` sequences whose first is global sample `sample`: one call over whole
// sequences when the range is all of them, else one per sequence (and, under context
// parallelism, per chunk) the range touches (positions
// [p0, p1) of it, with the slice's position offset p0), so that dropout masks follow each
// token's global sample and position. `first` counts from first_token.
template <class Run>
void for_each_token_run(const ModelContext& model, std::int64_t rows, std::int64_t sample,
                        std::int64_t first_token, std::int64_t tokens, const Run& run) {
  const std::int64_t seq = model.seq_len;
  if (first_token == 0 && tokens == rows * seq && model.cp_size() == 1) {
    run(std::int64_t{0}, tokens, rows, seq, kernels::DropoutSlice{sample, 0, 0});
    return;
  }
  OASES_ASSERT(first_token >= 0 && first_token + tokens <= rows * seq,
               "tokens [{}, {}) outside {} sequences of {}", first_token, first_token + tokens,
               rows, seq);
  // A run ends at a sequence's end and, under context parallelism, at a chunk's.
  const std::int64_t chunk = model.chunk_len();
  for (std::int64_t t = first_token; t < first_token + tokens;) {
    const std::int64_t row = t / seq, local = t - row * seq;
    const std::int64_t end =
        std::min(first_token + tokens, row * seq + (local / chunk + 1) * chunk);
    run(t - first_token, end - t, std::int64_t{1}, end - t,
        kernels::DropoutSlice{sample + row, 0, model.position(local)});
    t = end;
  }
}

}  // namespace

kernels::DropoutSite ResidualEpilogue::site(const ModelContext& model,
                                            const StepContext& ctx) const {
  return {model.seed, static_cast<std::uint32_t>(ctx.step), spec_.site.layer, spec_.site.site};
}

double ResidualEpilogue::probability(const ModelContext& model, const StepContext& ctx) const {
  return ctx.dropout_enabled ? model.dropout : 0.0;
}

void ResidualEpilogue::forward(const ModelContext& model, const StepContext& ctx, int mb, int sb,
                               std::int64_t rows, std::int64_t first_row, const Tensor& input,
                               const Tensor& residual, const Tensor& out, const Kept& kept,
                               std::int64_t first_token) const {
  if (spec_.copies_input) {
    kernels::copy(input, out);
    return;
  }
  const std::int64_t sample = global_sample(model, ctx, mb, sb, first_row);
  const std::int64_t tokens = out.dim(0);
  const double p = probability(model, ctx);
  const bool post_norm = spec_.post_norm.present();
  // The sum a lands in `out`, or in the kept block when a norm follows.
  OASES_ASSERT(!post_norm || kept.sum.shape() == out.shape(), "post-norm epilogue without its kept sum");
  const Tensor sum = post_norm ? kept.sum : out;
  OASES_ASSERT(spec_.residual_segment >= 0 || !spec_.bias.present(),
               "an epilogue without a residual has no bias");
  for_each_token_run(model, rows, sample, first_token, tokens,
                     [&](std::int64_t first, std::int64_t count, std::int64_t batch,
                         std::int64_t seq, const kernels::DropoutSlice& slice) {
                       const Tensor in = input.rows(first, first + count);
                       const Tensor s = sum.rows(first, first + count);
                       if (spec_.residual_segment >= 0)
                         kernels::bias_dropout_add_forward(
                             in, spec_.bias.value, residual.rows(first, first + count), s, batch,
                             seq, spec_.dropout ? p : 0.0, site(model, ctx), slice);
                       else
                         kernels::dropout_apply(in, s, batch, seq, spec_.dropout ? p : 0.0,
                                                site(model, ctx), slice);
                     });
  if (!post_norm) return;
  spec_.post_norm.forward(sum, out, kept.statistics);
  if (spec_.dropout_after_norm)
    for_each_token_run(model, rows, sample, first_token, tokens,
                       [&](std::int64_t first, std::int64_t count, std::int64_t batch,
                           std::int64_t seq, const kernels::DropoutSlice& slice) {
                         const Tensor o = out.rows(first, first + count);
                         kernels::dropout_apply(o, o, batch, seq, p, site(model, ctx), slice);
                       });
}

void ResidualEpilogue::backward(const ModelContext& model, const StepContext& ctx, int mb, int sb,
                                std::int64_t rows, std::int64_t first_row, const Tensor& d_out,
                                const Tensor& d_input, const Kept& kept, const Tensor& scratch,
                                std::int64_t first_token) const {
  if (spec_.copies_input) return;  // d(out) is the input's gradient, which the mover reads
  const std::int64_t sample = global_sample(model, ctx, mb, sb, first_row);
  const std::int64_t tokens = d_out.dim(0);
  const double p = probability(model, ctx);
  if (spec_.post_norm.present()) {
    if (spec_.dropout_after_norm)
      for_each_token_run(model, rows, sample, first_token, tokens,
                         [&](std::int64_t first, std::int64_t count, std::int64_t batch,
                             std::int64_t seq, const kernels::DropoutSlice& slice) {
                           const Tensor d = d_out.rows(first, first + count);
                           kernels::dropout_apply(d, d, batch, seq, p, site(model, ctx), slice);
                         });
    const Tensor d_sum = scratch.rows(0, tokens);
    spec_.post_norm.backward(d_out, kept.sum, kept.statistics, d_sum);
    kernels::copy(d_sum, d_out);  // now d(a): the residual's gradient
  }
  for_each_token_run(model, rows, sample, first_token, tokens,
                     [&](std::int64_t first, std::int64_t count, std::int64_t batch,
                         std::int64_t seq, const kernels::DropoutSlice& slice) {
                       kernels::bias_dropout_add_backward(
                           d_out.rows(first, first + count), d_input.rows(first, first + count),
                           spec_.bias.grad, batch, seq, spec_.dropout ? p : 0.0, site(model, ctx),
                           slice);
                     });
}

}  // namespace oases::ops
