// Masked-language-model inputs and targets for BERT pre-training, drawn from counter-based
// Philox keyed by global indices: a sample's mask depends only on (seed, stream, global sample
// index, position), never on how a batch is split across ranks, micro-batches or calls.
//
// Vocabulary: a tokenizer whose vocabulary holds [MASK], [CLS], [SEP] and [PAD] (BERT's
// WordPiece) gives their ids (tokenizer_mlm_special_tokens) and the model's vocabulary is its
// V; for any other the special tokens are appended after its V tokens, so the model's
// vocabulary is V + 4 (see mlm_special_tokens).
//
// Row layout: inputs and targets rows are [seq_len]: position 0 is [CLS], positions
// 1 .. seq_len - 2 hold the seq_len - 2 text tokens of the window in order, and position
// seq_len - 1 is [SEP]. Each text position p of global sample s is drawn independently; CLS
// and SEP are never selected.
//
// Exactly (a CUDA twin or another trainer must draw the same bits):
//   key     = philox_key(seed, fnv1a64("data.mlm"))
//   counter = {uint32(p), uint32(s), uint32(stream), uint32(stream >> 32)}
//   r       = philox4x32(counter, key)
//   selected      iff r[0] < 644245094            (floor(0.15 * 2^32): probability 0.15)
//   for a selected position, target = the original token and input =
//     [MASK]               if r[1] < 3435973836   (floor(0.8 * 2^32): probability 0.8)
//     random token         if r[1] < 3865470566   (floor(0.9 * 2^32): probability 0.1)
//     the original token   otherwise              (probability 0.1)
//   random token  = (uint64(r[2]) * V) >> 32, in [0, V) (a bias below V / 2^32 per id)
//   r[3] is unused.
// Unselected positions keep their token and get target -1 (ignored by the cross-entropy
// kernels), as do CLS and SEP. The random replacement may equal the original token (as in
// BERT and Hugging Face's DataCollatorForLanguageModeling).
//
// `stream` separates draws that must differ: pass the training step for training batches
// and a distinct value per evaluation batch (evaluation that must be repeatable uses the
// same values every time).
#pragma once

#include "data/tokenizer.h"

#include <cstdint>
#include <optional>

namespace oases::data {

struct MlmSpecialTokens {
  std::int32_t mask, cls, sep, pad;
};

// mask = V, cls = V + 1, sep = V + 2, pad = V + 3 for a tokenizer vocabulary of size V.
// REQUIRES: 1 <= V and V + 3 fits in int32.
MlmSpecialTokens mlm_special_tokens(std::int64_t tokenizer_vocab);
// The ids of [MASK], [CLS], [SEP] and [PAD] in `tokenizer`'s vocabulary; nullopt when it lacks
// any of them.
std::optional<MlmSpecialTokens> tokenizer_mlm_special_tokens(const Tokenizer& tokenizer);

// text_tokens [rows, seq_len - 2]: the windows of samples first_global_sample ..
// first_global_sample + rows - 1, each token in [0, tokenizer_vocab) (UserError otherwise:
// the data was prepared with another tokenizer). Writes inputs and targets [rows, seq_len] as
// described above. REQUIRES: rows >= 0, seq_len >= 2, first_global_sample >= 0 and the last
// global sample index below 2^32. Rows are split across OpenMP threads; the result does not
// depend on the thread count.
void mlm_mask(const std::int32_t* text_tokens, std::int64_t rows, std::int64_t seq_len,
              std::int64_t tokenizer_vocab, std::uint64_t seed, std::uint64_t stream,
              std::int64_t first_global_sample, std::int32_t* inputs, std::int32_t* targets);
// The same with the special tokens `special` (the tokenizer's own, or mlm_special_tokens').
void mlm_mask(const std::int32_t* text_tokens, std::int64_t rows, std::int64_t seq_len,
              std::int64_t tokenizer_vocab, const MlmSpecialTokens& special, std::uint64_t seed,
              std::uint64_t stream, std::int64_t first_global_sample, std::int32_t* inputs,
              std::int32_t* targets);

// The number of selected positions (targets that are not -1) mlm_mask gives for these
// samples: the selection does not depend on the tokens, so the loss normaliser of a global
// batch can be computed by any rank for all samples without reading them.
std::int64_t mlm_selected_count(std::int64_t rows, std::int64_t seq_len, std::uint64_t seed,
                                std::uint64_t stream, std::int64_t first_global_sample);

}  // namespace oases::data
