// A GPT-shaped Program for schedule and simulator tests, without building a model.
#pragma once

#include "ops/program.h"

#include <string>
#include <vector>

namespace oases::testing {

// The program of a GPT with `layers` layers on one rank of a tensor-parallel group of `tp`:
// embedding, (attention, mlp) per layer, head, with the set sizes of n tokens of width C.
// Under tensor parallelism (tp > 1) the head is vocab-parallel, as model::Model builds it:
// head (its forward collective reduces the row maxima), head_softmax (sums) and head_loss,
// the last two reading the logits the head keeps.
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
  ops::SegmentShape head{"head", tp > 1, true, 2};
  head.forward_reduce = ops::ReduceKind::max;
  head.sets = ops::kInternals;
  head.internals_bytes = (2 * n * C + 2 * n + (tp > 1 ? n * 256 / tp + 4 * n : 0)) * f;
  head.ready_bucket = layers + 1;
  program.segments.push_back(head);
  if (tp > 1) {
    const int at = static_cast<int>(program.segments.size()) - 1;
    ops::SegmentShape softmax{"head_softmax", true, false, 1};
    softmax.reads_sets_of = {at};
    ops::SegmentShape loss{"head_loss", false, false, 1};
    loss.reads_sets_of = {at};
    program.segments.push_back(softmax);
    program.segments.push_back(loss);
  }
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
  std::vector<int> moved_to;  // index in `program` of each segment of `uniform`
  for (const ops::SegmentShape& original : uniform.segments) {
    ops::SegmentShape shape = original;
    for (int& owner : shape.reads_sets_of) owner = moved_to[static_cast<std::size_t>(owner)];
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
    moved_to.push_back(static_cast<int>(program.segments.size()));
    program.segments.push_back(shape);
  }
  return program;
}

}  // namespace oases::testing
