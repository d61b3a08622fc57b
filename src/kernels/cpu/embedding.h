// Token + learned position embedding (GPT-2 wte + wpe), and the extra embeddings added onto
// them (BERT's token types).
#pragma once

#include "kernels/types.h"

#include <cstdint>

namespace oases::kernels::cpu {

// The rows of the vocabulary this rank holds (vocab-parallel embedding): wte row i is token
// begin + i. The default holds every token.
using kernels::VocabRange;

// out[b, t, :] = wte[tokens[b, t] - range.begin, :] + wpe[t, :]
// tokens [B, T] with values in [0, vocab); wte [range rows, C]; wpe [>= T, C] or null (no
// positions: another rank adds them); out [B, T, C]. A token outside the range contributes a
// zero row (its owner contributes it, and the partial sums are reduced). Token ids are not
// range-checked here (vocab is not passed): the caller guarantees them.
template <class T>
void embedding_forward(const std::int32_t* tokens, const T* wte, const T* wpe, T* out,
                       std::int64_t B, std::int64_t seq, std::int64_t C, VocabRange range = {});

// dwte[tokens[b, t] - range.begin, :] += dout[b, t, :] for tokens in range;
// dwpe[t, :] += sum_b dout[b, t, :] unless dwpe is null (accumulated).
// Deterministic: each thread owns a slice of the C columns, so no two threads add to one element
// and every element's additions happen in (b, t) order, whatever the thread count.
template <class T>
void embedding_backward(const T* dout, const std::int32_t* tokens, T* dwte, T* dwpe, std::int64_t B,
                        std::int64_t seq, std::int64_t C, VocabRange range = {});

// out[b, t, :] += table[ids[b, t], :]  (e.g. BERT's token type embeddings onto the token and
// position sum). ids [B, seq], table [rows, C], out [B, seq, C]. ids are not range-checked
// (the table's row count is not passed): the caller guarantees them.
template <class T>
void embedding_accumulate(const std::int32_t* ids, const T* table, T* out, std::int64_t B,
                          std::int64_t seq, std::int64_t C);

// dtable[ids[b, t], :] += dout[b, t, :]  (accumulated). Deterministic as embedding_backward:
// each thread owns a slice of the C columns and adds in (b, t) order.
template <class T>
void embedding_accumulate_backward(const T* dout, const std::int32_t* ids, T* dtable,
                                   std::int64_t B, std::int64_t seq, std::int64_t C);

}  // namespace oases::kernels::cpu
