// Token + learned position embedding (GPT-2 wte + wpe).
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
// tokens [B, T] with values in [0, vocab); wte [vocab, C]; wpe [>= T, C]; out [B, T, C].
// Token ids are not range-checked here (vocab is not passed): the caller guarantees them.
template <class T>
void embedding_forward(const std::int32_t* tokens, const T* wte, const T* wpe, T* out,
                       std::int64_t B, std::int64_t seq, std::int64_t C);

// dwte[tokens[b, t], :] += dout[b, t, :];  dwpe[t, :] += sum_b dout[b, t, :]  (accumulated).
// Deterministic: each thread owns a slice of the C columns, so no two threads add to one element
// and every element's additions happen in (b, t) order, whatever the thread count.
template <class T>
void embedding_backward(const T* dout, const std::int32_t* tokens, T* dwte, T* dwpe,
                        std::int64_t B, std::int64_t seq, std::int64_t C);

}  // namespace oases::kernels::cpu
