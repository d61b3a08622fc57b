// Causal multi-head self-attention, computed in blocks with an online softmax so that no
// thread ever holds more than one [block_q, block_k] tile of scores (never [seq, seq]).
//
// Layout (GPT-2 c_attn output): qkv [B, seq, 3*C] with C = heads * head_dim; columns
// [0, C) are q, [C, 2C) are k, [2C, 3C) are v; head h owns columns [h*hd, (h+1)*hd) of each.
// out [B, seq, C]: heads concatenated in the same order.
//   out_h = softmax(q_h k_h^T / sqrt(hd) + causal mask) v_h
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

}  // namespace oases::kernels::cpu
