// Causal multi-head self-attention, computed in blocks with an online softmax so that no
// thread ever holds more than one [block_q, block_k] tile of scores (never [seq, seq]).
//
// Layout (GPT-2 c_attn output): qkv [B, seq, 3*C] with C = heads * head_dim; columns
// [0, C) are q, [C, 2C) are k, [2C, 3C) are v; head h owns columns [h*hd, (h+1)*hd) of each.
// out [B, seq, C]: heads concatenated in the same order.
//   out_h = softmax(q_h k_h^T / sqrt(hd) + causal mask) v_h
//
// OpenMP: the forward pass splits the work by (batch, head, query block), the backward pass
// by (batch, head), so that each pair's dK and dV are accumulated by one thread. Every output
// element is computed by one task in a fixed order, so results are bitwise reproducible and
// do not depend on the number of threads. Float softmax uses exp_approx (kernels/cpu/
// fast_exp.h, relative error < 3e-7); double is exact up to rounding.
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

// lse [B, heads, seq]: the log-sum-exp of each row of scaled, masked scores; the backward
// pass rebuilds the probabilities from it tile by tile.
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, std::int64_t B, std::int64_t seq,
                       std::int64_t heads, std::int64_t head_dim);

// dqkv [B, seq, 3*C] overwritten with the gradient with respect to qkv.
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
void attention_forward_blocked(const T* qkv, T* out, T* lse, std::int64_t B, std::int64_t seq,
                               std::int64_t heads, std::int64_t head_dim, std::int64_t block);

template <class T>
void attention_backward_blocked(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                                std::int64_t B, std::int64_t seq, std::int64_t heads,
                                std::int64_t head_dim, std::int64_t block);

}  // namespace detail

}  // namespace oases::kernels::cpu
