// A GPT-shaped Program for schedule and simulator tests, without building a model.
#pragma once

#include "ops/program.h"

#include <string>
#include <vector>

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

// The same program with per-layer degrees (tp = the largest), as GptModel builds it: a reshard
// segment wherever the degree changes (embedding and head at tp). Layers at a lower degree hold
// fewer rows (degree / tp of them).
inline ops::Program gpt_program_with_degrees(const std::vector<int>& degrees, int tp) {
  const ops::Program uniform = gpt_program(static_cast<int>(degrees.size()), tp);
  ops::Program program;
  const auto degree_of = [&](int layer) {
    return layer < 0 || layer >= static_cast<int>(degrees.size())
               ? tp
               : degrees[static_cast<std::size_t>(layer)];
  };
  for (const ops::SegmentShape& original : uniform.segments) {
    ops::SegmentShape shape = original;
    const bool head = shape.name == "head";
    const bool layer_start = shape.name.rfind("attention.", 0) == 0;
    if (layer_start || head) {
      const int layer = head ? static_cast<int>(degrees.size()) : shape.layer;
      const int from = degree_of(layer - 1), to = degree_of(layer);
      if (from != to) {
        ops::SegmentShape reshard{"reshard." + std::to_string(layer), from < to, from > to,
                                  from < to ? 1 : 2};
        reshard.forward_kind = reshard.backward_kind = ops::CollectiveKind::all_gather;
        reshard.collective_ranks = from < to ? to / from : from / to;
        reshard.degree = from;
        program.segments.push_back(reshard);
      }
    }
    shape.degree = degree_of(shape.layer);
    const std::size_t scale = static_cast<std::size_t>(tp / shape.degree);
    shape.checkpoint_bytes /= scale;
    shape.internals_bytes /= scale;
    shape.core_bytes /= scale;
    program.segments.push_back(shape);
  }
  return program;
}

}  // namespace oases::testing
