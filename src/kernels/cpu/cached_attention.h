// Causal attention of new positions over a key/value cache: the attention step of incremental
// (cached) decoding. The new rows arrive as the fused q|k|v rows of kernels/cpu/attention.h;
// their keys and values are appended to the cache and each new query attends to every cached
// position up to and including its own:
//
//   out[i, h] = softmax_t(q[i, h] . K[g, t] / sqrt(hd), t in [0, past + i]) V[g, t]
//   g = h / (heads / kv_heads)   (grouped-query attention, as attention.h)
//
// for new row i at absolute position past + i. The result equals row past + i of the full
// causal attention over positions 0..past + i (attention_forward) up to rounding.
//
// Cache layout: keys and values [kv_heads, capacity, head_dim] each, head-major so that the
// positions one head attends over are one contiguous [length, head_dim] block.
//
// OpenMP: the work is split by (new row, query head); each output element is computed by one
// task in a fixed order, so the result does not depend on the thread count. Softmax uses
// std::exp (no approximation) and accumulates in the element type.
#pragma once

#include "kernels/types.h"

#include <cstdint>

namespace oases::kernels::cpu {

// REQUIRES: rows >= 0, past >= 0, past + rows <= capacity; head_dim > 0; heads a positive
// multiple of kv_heads.
using kernels::CachedAttentionShape;

// qkv: `rows` rows at stride ld_qkv >= (heads + 2 kv_heads) * head_dim (q and k already
// rotated where the model rotates them). Writes their keys and values into positions
// [past, past + rows) of keys and values (positions [0, past) must hold the earlier ones and
// are only read) and out: `rows` rows at stride ld_out >= heads * head_dim. out must not
// overlap qkv or the cache.
template <class T>
void cached_attention_forward(const T* qkv, std::int64_t ld_qkv, T* keys, T* values, T* out,
                              std::int64_t ld_out, const CachedAttentionShape& shape);

}  // namespace oases::kernels::cpu
