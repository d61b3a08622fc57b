// Dropout with masks that are a pure function of global indices, and the residual epilogue
// that follows every tensor-parallel reduction.
//
// The keep decision for element (sample b, position t, feature f) at a site is
//   Philox(key = (seed, site stream), counter = (global_feature, t, global_sample, step))
// with the site stream derived from (layer, site). Shards pass their offsets into the global
// batch and feature dimensions, so any layout (and any recomputation) draws the same mask.
// The backward pass regenerates the mask; nothing is stored. kernels/dropout_rule.h states the
// rule exactly (the key, the counter and the comparison), for every device.
// Kept values are multiplied by scale = T(1 / (1 - p)) (as PyTorch does), dropped ones are 0.
// p must be in [0, 1) (OASES_ASSERT). p = 0 draws no random numbers at all.
#pragma once

#include "kernels/cpu/threads.h"
#include "kernels/dropout_rule.h"

#include <cstdint>
#include <type_traits>

namespace oases::kernels::cpu {

using kernels::DropoutSite;
using kernels::DropoutSlice;

// True when the element survives dropout with probability p of being dropped.
bool dropout_keep(const DropoutSite& site, double p, std::int64_t global_sample,
                  std::int64_t position, std::int64_t global_feature);

// y[b, t, f] = keep ? x / (1 - p) : 0 over a [B, seq, F] tensor. p = 0 copies; y may alias x.
// Backward is the same call applied to the output gradient.
template <class T>
void dropout_apply(const T* x, T* y, std::int64_t B, std::int64_t seq, std::int64_t F, double p,
                   const DropoutSite& site, DropoutSlice slice = {},
                   Threads threads = Threads::team);

// out = residual + dropout(x + bias)  over [B, seq, F]; bias [F] may be null. out may alias
// residual or x.
// (bias and dbias are std::type_identity_t<T>* so that a bare nullptr can be passed: T is
// deduced from the other arguments.)
template <class T>
void bias_dropout_add_forward(const T* x, const std::type_identity_t<T>* bias, const T* residual,
                              T* out, std::int64_t B, std::int64_t seq, std::int64_t F, double p,
                              const DropoutSite& site, DropoutSlice slice = {},
                              Threads threads = Threads::team);

// Given dout: dx = dropout(dout) (overwritten, may alias dout), dbias += sum over rows of dx
// (when non-null; formed in double in row order, whatever the thread count). The residual's
// gradient is dout itself.
template <class T>
void bias_dropout_add_backward(const T* dout, T* dx, std::type_identity_t<T>* dbias, std::int64_t B,
                               std::int64_t seq, std::int64_t F, double p, const DropoutSite& site,
                               DropoutSlice slice = {});

// out[i] = a[i] + b[i]  (out may alias a or b)
template <class T>
void add(const T* a, const T* b, T* out, std::int64_t n, Threads threads = Threads::team);

}  // namespace oases::kernels::cpu
