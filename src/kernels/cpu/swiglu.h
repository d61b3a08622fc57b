// SwiGLU, the gated activation of LLaMA's MLP (Hugging Face LlamaMLP: act_fn(gate_proj(x)) *
// up_proj(x) with act_fn = SiLU):
//   out = silu(gate) * up,   silu(g) = g * sigmoid(g)
//
// Strides let gate and up be two halves of one fused projection output: rows of width F are
// read at stride ld_in from both (e.g. up = gate + F, ld_in = 2F) and written at stride ld_out.
//
// Accuracy: sigmoid is 1 / (1 + exp(-g)) with exp_approx (kernels/cpu/fast_exp.h). In float
// that is the vectorised exp (relative error < 3e-7), so silu and both gradients are within
// about 1e-6 relative of the exact values (a few float ulps) while |g| <= 87; for g < -87 the
// exponential is clamped and silu(g) comes out below 1e-35 in magnitude instead of below
// 1e-36 (an absolute error under 1e-35). In double, exp is std::exp with its argument capped
// at 700 (the same effect below g = -700, at the 1e-300 scale).
// Every element is independent; results do not depend on the thread count.
#pragma once

#include "kernels/cpu/threads.h"

#include <cstdint>

namespace oases::kernels::cpu {

// out[i, :F] = silu(gate[i, :F]) * up[i, :F] for rows i in [0, n); gate and up rows at stride
// ld_in, out rows at stride ld_out. out may be gate or up itself when ld_out == ld_in
// (element-wise in place); otherwise it must not overlap them.
// REQUIRES: n, F >= 0; ld_in, ld_out >= F.
template <class T>
void swiglu_forward(const T* gate, const T* up, std::int64_t ld_in, T* out, std::int64_t ld_out,
                    std::int64_t n, std::int64_t F, Threads threads = Threads::team);

// Given dout (rows at stride ld_out), with s = sigmoid(gate):
//   dgate = dout * up * s * (1 + gate * (1 - s))     (d silu / dg = s + g s (1 - s))
//   dup   = dout * silu(gate)
// both overwritten, rows at stride ld_grad (dgate and dup may be the two halves of one fused
// gradient buffer). They must not overlap gate, up or dout.
// REQUIRES: n, F >= 0; ld_in, ld_out, ld_grad >= F.
template <class T>
void swiglu_backward(const T* gate, const T* up, std::int64_t ld_in, const T* dout,
                     std::int64_t ld_out, T* dgate, T* dup, std::int64_t ld_grad, std::int64_t n,
                     std::int64_t F, Threads threads = Threads::team);

}  // namespace oases::kernels::cpu
