// The epilogue that turns the reduced output of one segment into the next residual-stream
// value, run first by the segment that follows the collective:
//
//   a   = residual + dropout(partial + bias)     (no residual: a = dropout(partial), or the
//                                                partial itself without dropout)
//   out = post_norm(a)                           (post-norm architectures: BERT; else out = a)
//   out = dropout(out)                           (only `dropout_after_norm`: BERT's embedding)
//
// and its backward: given d(out) in place, it leaves d(residual) there and writes d(partial)
// (and accumulates d(bias), d(norm)). Dropout masks are keyed by (seed, step, site, global
// sample, position, feature) (kernels/cpu/dropout.h), so recomputation and every parallel
// layout draw the same masks; the backward pass regenerates them.
//
// Dropout sites are numbered forever (part of the mask key), so that checkpoints and tests
// stay reproducible: the embedding's site is (layer = model.layers, site 0); the residual
// branches of layer l are (l, 1) after attention and (l, 2) after the MLP; layer l's attention
// probabilities are (l, 6) (kernels/cpu/attention.h; sites 3 to 5 are the MoE layers', ops/moe.h).
#pragma once

#include "kernels/kernels.h"
#include "ops/context.h"
#include "ops/norm.h"
#include "ops/segment.h"

#include <cstdint>

namespace oases::ops {

inline constexpr std::uint32_t kDropoutSiteEmbedding = 0;
inline constexpr std::uint32_t kDropoutSiteAttention = 1;
inline constexpr std::uint32_t kDropoutSiteMlp = 2;
inline constexpr std::uint32_t kDropoutSiteAttentionProbabilities = 6;

struct DropoutSiteId {
  std::uint32_t layer = 0;
  std::uint32_t site = 0;
};

// The global index of the first of `first_row`.. sequences of sub-batch sb of micro-batch mb.
std::int64_t global_sample(const ModelContext& model, const StepContext& ctx, int mb, int sb,
                           std::int64_t first_row);

class ResidualEpilogue {
 public:
  struct Spec {
    ParamRef bias;               // added to the partial sums after their reduction
    bool dropout = true;         // dropout(partial + bias) at `site`
    DropoutSiteId site;
    int residual_segment = -1;   // whose checkpoint is the residual (-1: none)
    Norm post_norm;              // applied after the residual add (absent: none)
    bool dropout_after_norm = false;
    // The input already is the residual-stream value (a reshard's rows or an activation
    // received from the previous pipeline stage): the epilogue is a copy, and its backward
    // leaves d(out) as the input's gradient.
    bool copies_input = false;
  };

  ResidualEpilogue() = default;
  explicit ResidualEpilogue(Spec spec) : spec_(std::move(spec)) {}
  const Spec& spec() const { return spec_; }

  // What a post-norm epilogue keeps with its output for the backward pass: the sum a
  // [tokens, hidden] and the norm's statistics. Both empty for the others.
  struct Kept {
    Tensor sum, statistics;
  };
  // Where they sit in a kept set's block (sum < 0: nothing kept).
  struct KeptPieces {
    std::int64_t sum = -1;
    int statistics = -1;
  };
  bool keeps() const { return !spec_.copies_input && spec_.post_norm.present(); }
  // Adds the kept pieces for `tokens` rows of width `hidden` to `layout` (none when nothing is
  // kept).
  KeptPieces add_kept(SetLayout& layout, std::int64_t tokens, std::int64_t hidden) const;
  // The kept tensors in `block`, laid out by `layout` with `pieces`.
  Kept kept(const Tensor& block, const SetLayout& layout, const KeptPieces& pieces,
            std::int64_t tokens, std::int64_t hidden) const;

  // Runs on `rows` sequences starting at row `first_row` of sub-batch sb (the dropout masks
  // follow their global sample indices). input, residual, out [rows * seq, hidden]; residual
  // is ignored without a residual segment; `kept` as kept() gives it.
  //
  // Under sequence parallelism the tensors hold a shard instead: tokens [first_token,
  // first_token + out.dim(0)) of those rows in order (sample-major); the masks are those of the
  // same tokens in the whole call.
  void forward(const ModelContext& model, const StepContext& ctx, int mb, int sb, std::int64_t rows,
               std::int64_t first_row, const Tensor& input, const Tensor& residual,
               const Tensor& out, const Kept& kept, std::int64_t first_token = 0) const;
  // d_out holds d(out) and is left holding d(residual); d_input receives d(partial sums).
  // scratch [tokens, hidden] is overwritten (tokens: d_out.dim(0), a shard as in forward).
  void backward(const ModelContext& model, const StepContext& ctx, int mb, int sb,
                std::int64_t rows, std::int64_t first_row, const Tensor& d_out,
                const Tensor& d_input, const Kept& kept, const Tensor& scratch,
                std::int64_t first_token = 0) const;

 private:
  kernels::DropoutSite site(const ModelContext& model, const StepContext& ctx) const;
  double probability(const ModelContext& model, const StepContext& ctx) const;

  Spec spec_;
};

}  // namespace oases::ops
