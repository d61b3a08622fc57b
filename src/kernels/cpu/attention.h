// Multi-head self-attention (causal or bidirectional, with grouped-query attention), computed
// in blocks with an online softmax so that no thread ever holds more than one
// [block_q, block_k] tile of scores (never [seq, seq]).
//
// Layout: qkv [batch, seq, (heads + 2 * kv_heads) * head_dim]: the q heads in columns
// [0, heads * hd), the k heads in [heads * hd, (heads + kv_heads) * hd), the v heads after
// them; head h of each part owns the hd columns starting at h * hd within the part. With
// kv_heads == heads this is GPT-2's c_attn output [B, seq, 3C], C = heads * head_dim.
// out [batch, seq, heads * hd]: heads concatenated in the same order.
//   out_h = softmax(q_h k_g^T / sqrt(hd) + mask) v_g,   g = h / (heads / kv_heads)
// (query head h shares key/value head g with the other heads of its group, as Hugging Face's
// LlamaAttention repeats k/v heads). The mask is causal (query i sees keys 0..i) or, for
// bidirectional attention (BERT), empty.
//
// OpenMP: the forward pass splits the work by (batch, q head, query block), the backward pass
// by (batch, kv head), looping over the q heads of the group inside, so that each dK and dV is
// accumulated by one thread (backward thus has batch * kv_heads tasks to spread). Every output
// element is computed by one task in a fixed order, so results are bitwise reproducible and do
// not depend on the number of threads. Float softmax uses exp_approx (kernels/cpu/fast_exp.h,
// relative error < 3e-7); double is exact up to rounding.
//
// Attention dropout (Megatron-LM's attention_dropout, PyTorch's dropout_p): each probability is
// dropped with probability p after the softmax and the survivors scaled by 1 / (1 - p), so
//   out_h = (mask * softmax(...) / (1 - p)) v_g.
// The row sums (and so lse) are those of the probabilities before dropout. Backward uses the
// same identity as without dropout, D_i = dO_i . O_i = sum_j P~_ij dP~_ij (P~ the dropped
// probabilities), and regenerates the mask tile by tile; nothing of size [seq, seq] is kept.
// The mask is a pure function of global indices (kernels/dropout_rule.h), so
// every tensor-parallel split of the heads, every split of the batch and recomputation draw
// the same one.
#pragma once

#include "kernels/cpu/dropout.h"

#include <cstdint>

namespace oases::kernels::cpu {

// REQUIRES: batch, seq >= 0; head_dim > 0; heads a positive multiple of kv_heads (or both 0).
struct AttentionShape {
  std::int64_t batch, seq, heads, kv_heads, head_dim;
  bool causal = true;
};

// Dropout on the attention probabilities of one call (kernels/dropout_rule.h).
using kernels::AttentionDropout;

// True when probability (query, key) of head global_head of sample global_sample survives:
// the attention-probability rule of kernels/dropout_rule.h (site must be < 256 and the global
// head < 2^24).
bool attention_probability_keep(const DropoutSite& site, double p, std::int64_t global_sample,
                                std::int64_t global_head, std::int64_t query, std::int64_t key);

// lse [batch, heads, seq]: the log-sum-exp of each row of scaled, masked scores; the backward
// pass rebuilds the probabilities from it tile by tile.
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& shape,
                       const AttentionDropout& dropout = {});

// dqkv (the layout of qkv) overwritten with the gradient with respect to qkv. dqkv must not
// alias any input. `dropout` must be the forward pass's.
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                        const AttentionShape& shape, const AttentionDropout& dropout = {});

// Folds a partial attention of the same queries over other keys into (out, lse), both the
// layouts of attention_forward's: lse becomes log(e^lse + e^part_lse) and each out row the
// mix of the two rows weighted by e^lse and e^part_lse (ring attention merges the blocks of
// keys it sees one at a time this way). A row with lse = -inf on one side takes the other's.
template <class T>
void attention_merge(T* out, T* lse, const T* part_out, const T* part_lse,
                     const AttentionShape& shape);

// Causal multi-head attention (GPT-2): the functions above with
// AttentionShape{B, seq, heads, heads, head_dim, true}, so qkv [B, seq, 3C], lse [B, heads,
// seq] and dqkv [B, seq, 3C].
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, std::int64_t B, std::int64_t seq,
                       std::int64_t heads, std::int64_t head_dim);

template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                        std::int64_t B, std::int64_t seq, std::int64_t heads,
                        std::int64_t head_dim);

// Tile edge of the public functions (queries and keys alike). At B=8, seq=256, heads=8,
// head_dim=64 (float), forward + backward CPU time is flat from 48 to 96 and up to 10% worse
// at 32 and 128.
inline constexpr std::int64_t kAttentionBlock = 64;

namespace detail {

// The public functions with an explicit tile edge, exposed so that tests can force many
// blocks (and partial ones) on small shapes. Any block >= 1 gives the same mathematics.
template <class T>
void attention_forward_blocked(const T* qkv, T* out, T* lse, const AttentionShape& shape,
                               std::int64_t block, const AttentionDropout& dropout = {});

template <class T>
void attention_backward_blocked(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                                const AttentionShape& shape, std::int64_t block,
                                const AttentionDropout& dropout = {});

// Causal multi-head forms.
template <class T>
void attention_forward_blocked(const T* qkv, T* out, T* lse, std::int64_t B, std::int64_t seq,
                               std::int64_t heads, std::int64_t head_dim, std::int64_t block);

template <class T>
void attention_backward_blocked(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                                std::int64_t B, std::int64_t seq, std::int64_t heads,
                                std::int64_t head_dim, std::int64_t block);

}  // namespace detail

}  // namespace oases::kernels::cpu
