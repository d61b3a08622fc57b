// Programs of real models for schedule tests: the segments, set sizes and buckets
// model::Model builds for one rank, from a model small enough to build by the dozen. Where
// gpt_program.h writes a program's shape by hand, these are what the engine would run, for
// every architecture and pipeline cut.
//
// The values are fixed: tests compare instruction lists and byte peaks computed from them.
#pragma once

#include "comm/communicator.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/program.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oases::testing {

// The smallest model the schedule tests cut: `layers` layers of `arch` of width 16, 2 heads
// (LLaMA: 1 key/value head), a feed-forward width of 24, a vocabulary of 23 and sequences of
// 4 tokens: its programs have every segment of the architecture, and a test builds dozens of
// them in milliseconds.
inline model::ModelConfig tiny_stage_model(const std::string& arch, std::int64_t layers) {
  model::ModelConfig c;
  c.arch = model::parse_architecture(arch);
  c.layers = layers;
  c.hidden = 16;
  c.heads = 2;
  c.kv_heads = arch == "llama" ? 1 : 0;
  c.ffn_hidden = 24;
  c.vocab_size = 23;
  c.seq_len = 4;
  return c;
}

// The program of one rank holding the chunks `chunks` of `model` (in model order; the whole
// model when empty) for micro-batches of 2 sequences in `sub_batches` parts (1 or 2), as rank
// tp->rank() of the tensor-parallel group `tp` builds it (null: alone in its group). The model
// is built to read its program only: `tp` needs no collective.
inline ops::Program tiny_stage_program(const model::ModelConfig& model, int sub_batches,
                                       const std::vector<model::LayerRange>& chunks = {},
                                       comm::Communicator* tp = nullptr) {
  comm::SelfCommunicator alone;
  model::ModelOptions o;
  o.micro_batch = 2;
  o.sub_batches = sub_batches;
  o.tp = tp != nullptr ? tp : &alone;
  o.layer_ranges = chunks;
  return model::Model(model, o).program();
}

// The programs of the `stages` ranks of a pipeline over `model` cut into stages x
// `virtual_stages` chunks of model.layers / chunks layers each (the later chunks take the
// remainder): chunk c holds layers [c L / C, (c + 1) L / C), and rank r the chunks r,
// r + stages, ... (tiny_stage_program's micro-batches).
inline std::vector<ops::Program> tiny_stage_programs(const model::ModelConfig& model, int stages,
                                                     int virtual_stages, int sub_batches) {
  const std::int64_t chunks = static_cast<std::int64_t>(stages) * virtual_stages;
  std::vector<ops::Program> out;
  for (int r = 0; r < stages; ++r) {
    std::vector<model::LayerRange> held;
    for (std::int64_t c = r; c < chunks; c += stages)
      held.push_back({c * model.layers / chunks, (c + 1) * model.layers / chunks});
    out.push_back(tiny_stage_program(model, sub_batches, held));
  }
  return out;
}

}  // namespace oases::testing
