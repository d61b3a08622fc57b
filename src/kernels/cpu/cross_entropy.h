// Softmax + cross-entropy over the vocabulary, fused so the probabilities never get a buffer
// of their own: the logits buffer is overwritten by its gradient.
//
// logits are rows of stride ld >= V; only the first V columns are real vocabulary (columns
// [V, ld) are padding: they take no part in the softmax and get zero gradient).
//
// Ignored rows: a negative target (the -100 or -1 label of a masked-language-model position
// that is not predicted, as torch's ignore_index) means the row takes no part in the loss: its
// loss is 0 and its gradient row is all zeros (padding included), in every function below, and
// no exponentials are evaluated for it. Normalising the loss (grad_scale) by the number of
// rows that are not ignored is the caller's business. A target >= V is an engine bug, which
// the unsharded functions check (InternalError); the shard functions see one slice of the
// vocabulary and cannot.
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

// losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]]   (targets < V; negative:
// ignored, loss 0)
template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, T* losses, std::int64_t n,
                           std::int64_t V, std::int64_t ld);

// As cross_entropy_forward, and then logits[i, :] := grad_scale * (softmax(logits[i, :V]) -
// onehot(targets[i])), zero in padding columns: the gradient of grad_scale * sum_i losses[i]
// (a row with a negative target: loss 0, gradient row all zeros).
template <class T>
void cross_entropy_forward_backward(T* logits, const std::int32_t* targets, T* losses,
                                    std::int64_t n, std::int64_t V, std::int64_t ld, T grad_scale);

// Vocab-parallel cross-entropy, in three steps separated by reductions over the group of ranks
// that each hold a slice of the vocabulary. This rank holds columns [vocab_begin, vocab_begin +
// V) of every row (stride ld); a target outside that range belongs to another rank.
//   1. cross_entropy_shard_max:  row_max[i] = max over local columns      -> all-reduce max
//   2. cross_entropy_shard_sums: sum_exp[i] = sum_j exp(logit - row_max[i]), target_logit[i] =
//      the target's logit if this rank holds it, else 0                     -> all-reduce sum
//      (an ignored row, negative target: sum_exp 0 and target_logit 0, nothing evaluated)
//   3. cross_entropy_shard_finish: losses[i] = log(sum_exp) + row_max - target_logit and, when
//      `gradient`, logits := grad_scale * (softmax - onehot) over local columns (padding 0)
//      (an ignored row: loss 0 and, when `gradient`, a zero gradient row).
template <class T>
void cross_entropy_shard_max(const T* logits, std::int64_t n, std::int64_t V, std::int64_t ld,
                             T* row_max);

template <class T>
void cross_entropy_shard_sums(const T* logits, const std::int32_t* targets,
                              std::int64_t vocab_begin, const T* row_max, std::int64_t n,
                              std::int64_t V, std::int64_t ld, T* sum_exp, T* target_logit);

template <class T>
void cross_entropy_shard_finish(T* logits, const std::int32_t* targets, std::int64_t vocab_begin,
                                const T* row_max, const T* sum_exp, const T* target_logit,
                                std::int64_t n, std::int64_t V, std::int64_t ld, T grad_scale,
                                T* losses, bool gradient);

}  // namespace oases::kernels::cpu
