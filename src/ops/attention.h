// Core self-attention of one tensor-parallel shard: softmax(q k^T / sqrt(head_dim) [+ causal
// mask]) v for this rank's heads, optionally with rotary position embedding applied to q and k
// first. Activations are rows of a fused [n, q|k|v] matrix (n = batch * seq): `heads` query
// heads, then `kv_heads` key heads and `kv_heads` value heads of width head_dim; query head h
// attends with key/value head h / (heads / kv_heads) (grouped-query attention; kv_heads =
// heads is ordinary multi-head attention).
#pragma once

#include "kernels/kernels.h"
#include "ops/context.h"

namespace oases::ops {

class CoreAttention {
 public:
  CoreAttention() = default;
  // cos, sin: rotary tables [seq, head_dim / 2], or empty for no rotary embedding.
  CoreAttention(kernels::AttentionShape shape, Tensor rope_cos, Tensor rope_sin)
      : shape_(shape), cos_(rope_cos), sin_(rope_sin) {}

  const kernels::AttentionShape& shape() const { return shape_; }
  // The same attention over `heads` query and `kv_heads` key/value heads (a split of these
  // heads: the same head width, rotary tables and mask).
  CoreAttention with_heads(std::int64_t heads, std::int64_t kv_heads) const {
    kernels::AttentionShape shape = shape_;
    shape.heads = heads;
    shape.kv_heads = kv_heads;
    return CoreAttention(shape, cos_, sin_);
  }
  std::int64_t qkv_width() const { return (shape_.heads + 2 * shape_.kv_heads) * shape_.head_dim; }
  std::int64_t out_width() const { return shape_.heads * shape_.head_dim; }
  std::int64_t lse_elements() const { return shape_.batch * shape_.heads * shape_.seq; }

  bool rotary() const { return !cos_.empty(); }
  // Applies the rotary embedding to the q and k blocks of qkv [n, qkv_width()] in place (once,
  // right after the projections, so that recomputing attention from a kept qkv does not
  // rotate twice). No-op without rotary.
  void rotate(const Tensor& qkv) const;
  // The same for `rows` consecutive positions of one sequence, from position `first` (the
  // rows of one context-parallel chunk); inverse: back (the gradient before rotation).
  void rotate_rows(const Tensor& rows, std::int64_t first, bool inverse) const;
  // qkv [n, qkv_width()] (already rotated); out [n, out_width()]; lse [lse_elements()].
  // `dropout` drops attention probabilities (its offsets are the global indices of this call's
  // first sequence and first head).
  void forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
               const kernels::AttentionDropout& dropout = {}) const;
  // dqkv [n, qkv_width()] overwritten with the gradient of the projections' outputs (before
  // rotation); `dropout` as in forward.
  void backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                const Tensor& dqkv, const kernels::AttentionDropout& dropout = {}) const;

 private:
  kernels::AttentionShape shape_;
  Tensor cos_, sin_;
};

}  // namespace oases::ops
