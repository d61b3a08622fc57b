// A GPT-shaped Program for schedule and simulator tests, without building a model.
#pragma once

#include "ops/program.h"

#include <string>

namespace oases::testing {

// The program of a GPT with `layers` layers on one rank of a tensor-parallel group of `tp`:
// embedding, (attention, mlp) per layer, head, with the set sizes of n tokens of width C.
inline ops::Program gpt_program(int layers, int tp = 1) {
  const std::size_t n = 512, C = 64, f = sizeof(float);
  ops::Program program;
  ops::SegmentShape embedding{"embedding", true, false, 1};
  embedding.ready_bucket = 0;
  program.segments.push_back(embedding);
  for (int l = 0; l < layers; ++l) {
    ops::SegmentShape attention{"attention." + std::to_string(l), true, true, 2};
    attention.sets = ops::kCheckpoint | ops::kInternals | ops::kCore;
    attention.checkpoint_bytes = n * C * f;
    attention.internals_bytes = (n * C + 2 * n + 3 * n * C / tp) * f;
    attention.core_bytes = (n * C / tp + 4 * n / tp) * f;
    attention.layer = l;
    attention.recomputable = true;
    attention.ready_bucket = 1 + l;
    ops::SegmentShape mlp{"mlp." + std::to_string(l), true, true, 2};
    mlp.sets = ops::kCheckpoint | ops::kInternals;
    mlp.checkpoint_bytes = n * C * f;
    mlp.internals_bytes = (n * C + 2 * n + 8 * n * C / tp) * f;
    mlp.layer = l;
    mlp.recomputable = true;
    program.segments.push_back(attention);
    program.segments.push_back(mlp);
  }
  ops::SegmentShape head{"head", false, true, 2};
  head.sets = ops::kInternals;
  head.internals_bytes = (2 * n * C + 2 * n) * f;
  head.ready_bucket = layers + 1;
  program.segments.push_back(head);
  return program;
}

}  // namespace oases::testing
