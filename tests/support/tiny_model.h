// The tiny transformers the model, runtime and engine tests build: small enough that a step
// takes milliseconds on one core, with every dimension the code splits or pads still more than
// one. A test whose model differs in a value takes the fixture and sets that value on the
// result, so the difference stands next to the test's reason for it.
//
// The values are fixed: tests compare losses, shapes and byte counts computed from them.
#pragma once

#include "model/config.h"

#include <cstdint>
#include <string>

namespace oases::testing {

// `layers` layers of `arch` ("gpt", "llama" or "bert") of width 32: 2 heads of 16 (key/value
// heads as many), a feed-forward width of 64, a vocabulary of 50 and sequences of 16 tokens,
// no dropout. Two heads split over a tensor-parallel group of two; the vocabulary, not a
// power of two, pads to 52 rows at degree four.
inline model::ModelConfig tiny_model(std::int64_t layers = 2, const std::string& arch = "gpt") {
  model::ModelConfig c;
  c.arch = model::parse_architecture(arch);
  c.layers = layers;
  c.hidden = 32;
  c.heads = 2;
  c.ffn_hidden = 64;
  c.vocab_size = 50;
  c.seq_len = 16;
  c.dropout = 0;
  return c;
}

// tiny_model with a mixture of experts: the feed-forward block of every second layer (layers
// 1, 3, ...) is an MoE layer of 4 experts under the default (switch) gate, so a model of two
// or more layers holds dense and MoE layers both.
inline model::ModelConfig tiny_moe_model(std::int64_t layers = 2, const std::string& arch = "gpt") {
  model::ModelConfig c = tiny_model(layers, arch);
  c.moe_every = 2;
  c.experts = 4;
  return c;
}

// The model of the tests that split one computation (pipeline stages, the backward pass in
// input and weight parts) and compare it with the whole in fp64: `layers` layers of `arch`
// of width 32 with 4 heads (LLaMA: 2 key/value heads, so grouped-query attention is split
// too), a feed-forward width of 48, a vocabulary of 37 (prime: padded under any tensor-
// parallel degree), sequences of 8 and dropout 0.1 (masks keyed by position and sample must
// agree between the split run and the whole).
inline model::ModelConfig tiny_equivalence_model(const std::string& arch, std::int64_t layers) {
  model::ModelConfig c;
  c.arch = model::parse_architecture(arch);
  c.layers = layers;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = arch == "llama" ? 2 : 0;
  c.ffn_hidden = 48;
  c.vocab_size = 37;
  c.seq_len = 8;
  c.dropout = 0.1;
  return c;
}

}  // namespace oases::testing
