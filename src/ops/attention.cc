#include "ops/attention.h"

namespace oases::ops {

void CoreAttention::rotate(const Tensor& qkv) const {
  if (cos_.empty()) return;
  // q and k are adjacent column blocks with the same positions: one pass rotates both.
  kernels::rotary_apply(qkv, shape_.batch, shape_.seq, shape_.heads + shape_.kv_heads,
                        shape_.head_dim, cos_, sin_, false);
}

void CoreAttention::rotate_rows(const Tensor& rows, std::int64_t first, bool inverse) const {
  if (cos_.empty()) return;
  const std::int64_t count = rows.dim(0);
  kernels::rotary_apply(rows, 1, count, shape_.heads + shape_.kv_heads, shape_.head_dim,
                        cos_.rows(first, first + count), sin_.rows(first, first + count), inverse);
}

void CoreAttention::forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            const kernels::AttentionDropout& dropout) const {
  kernels::attention_forward(qkv, out, lse, shape_, dropout);
}

void CoreAttention::backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, const Tensor& dqkv,
                             const kernels::AttentionDropout& dropout) const {
  kernels::attention_backward(dout, qkv, out, lse, dqkv, shape_, dropout);
  // A rotation's transpose is its inverse: the gradient before rotation.
  if (!cos_.empty())
    kernels::rotary_apply(dqkv, shape_.batch, shape_.seq, shape_.heads + shape_.kv_heads,
                          shape_.head_dim, cos_, sin_, true);
}

}  // namespace oases::ops
