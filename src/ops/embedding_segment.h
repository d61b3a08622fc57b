// The input embedding, vocab-parallel (Megatron-LM): each rank of the tensor-parallel group
// holds a block of the vocabulary's rows and looks up the tokens that fall in it (zero rows for
// the others); learned positions and token types, where the architecture has them, are added
// once (by rank 0), so that the group's sum is word[token] + position[t] + type[0]. The
// forward collective sums the group's partial embeddings; the next segment's epilogue turns
// them into the first residual-stream value. Backward: the output gradient is whole on every
// rank, so every rank forms the same position and type gradients and its own word rows'.
#pragma once

#include "kernels/kernels.h"
#include "ops/context.h"
#include "ops/segment.h"

#include <memory>

namespace oases::ops {

struct EmbeddingSpec {
  ParamRef word;         // [local vocabulary rows, hidden]
  ParamRef positions;    // [seq_len, hidden], or absent (rotary models)
  ParamRef token_types;  // [types, hidden], or absent; every token has type 0
  kernels::VocabRange vocab;  // the real tokens this rank's rows hold
};

std::unique_ptr<Segment> make_embedding_segment(int id, const ModelContext& model,
                                                EmbeddingSpec spec);

}  // namespace oases::ops
