// Softmax + cross-entropy over the vocabulary, fused so the probabilities never get a buffer
// of their own: the logits buffer is overwritten by its gradient.
//
// logits are rows of stride ld >= V; only the first V columns are real vocabulary (columns
// [V, ld) are padding: they take no part in the softmax and get zero gradient).
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

// losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]]   (targets in [0, V))
template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, T* losses,
                           std::int64_t n, std::int64_t V, std::int64_t ld);

// As cross_entropy_forward, and then logits[i, :] := grad_scale * (softmax(logits[i, :V]) -
// onehot(targets[i])), zero in padding columns: the gradient of grad_scale * sum_i losses[i].
template <class T>
void cross_entropy_forward_backward(T* logits, const std::int32_t* targets, T* losses,
                                    std::int64_t n, std::int64_t V, std::int64_t ld,
                                    T grad_scale);

}  // namespace oases::kernels::cpu
