// Rotary position embedding (RoPE) with the "rotate half" pairing of Hugging Face's
// LlamaForCausalLM: element i of a head is rotated together with element i + d/2.
//
// For head_dim d (even), position t and i in [0, d/2):
//   inv_freq[i] = theta^(-2i/d),   angle(t, i) = t * inv_freq[i]
// and a head vector x = [x1, x2] (x1 = x[:d/2], x2 = x[d/2:]) becomes
//   out1 = x1 * cos(angle) - x2 * sin(angle),   out2 = x2 * cos(angle) + x1 * sin(angle)
// which is (x1 + i x2) * exp(i angle) in complex terms. The rotation is orthogonal, so the
// gradient of its input is the inverse rotation (angle -> -angle) of the output gradient.
#pragma once

#include "kernels/cpu/threads.h"

#include <cstdint>
#include <span>
#include <vector>

namespace oases::kernels::cpu {

// inv_freq[i] = theta^(-2i/d) for i in [0, head_dim / 2).
// REQUIRES: head_dim even and positive, theta > 0.
std::vector<double> rotary_inverse_frequencies(std::int64_t head_dim, double theta);

// cos, sin [seq, head_dim / 2] for head_dim / 2 = inv_freq.size(): cos[t, i] =
// cos(t * inv_freq[i]), sin likewise (the frequencies as rotary_inverse_frequencies gives them,
// or scaled ones such as LLaMA 3's). Angles and their cosines and sines are computed in double
// and rounded to T. (Hugging Face forms the angles in float32, which at position t moves them
// by up to about t * 6e-8 * inv_freq radians.)
// REQUIRES: seq >= 0, inv_freq not empty.
template <class T>
void rotary_tables(std::int64_t seq, std::span<const double> inv_freq, T* cos, T* sin);

// Rotates, in place, `heads` consecutive heads of width head_dim in every row of a
// [B, seq, ld] buffer, starting at column 0 of x (callers pass qkv + the column offset of the
// q or k heads). Row (b, t) has position t and reads row t of the tables. inverse = true
// rotates by -angle: the inverse of the forward rotation, and exactly its backward pass
// (apply it to the gradient of the output to get the gradient of the input).
// REQUIRES: ld >= heads * head_dim; cos and sin from rotary_tables with at least seq rows and
// the same head_dim. Rows are independent; the result does not depend on the thread count.
template <class T>
void rotary_apply(T* x, std::int64_t ld, std::int64_t B, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, const T* cos, const T* sin, bool inverse,
                  Threads threads = Threads::team);

}  // namespace oases::kernels::cpu
