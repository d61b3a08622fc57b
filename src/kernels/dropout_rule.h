// Dropout masks as pure functions of global indices: the rule every device's dropout kernels
// draw by, and the arguments that name a mask.
//
// A mask depends on the element's global position in the batch, never on how it is split or
// when it is computed, so every tensor-parallel, data-parallel or expert layout and every
// recomputation draws the same one, and the backward pass regenerates it instead of keeping it.
// Exactly (a device's twin must draw the same bits; core/philox.h has Philox4x32-10,
// philox_key and uniform_open0, which is k / 2^24 for an integer k in [1, 2^24]):
//
// Activation dropout of element (sample b, position t, feature f) at a site:
//   key     = philox_key(seed, ((uint64(layer) << 32) | site) + 1)
//   counter = {uint32(global_feature), uint32(t), uint32(global_sample), step}
//   keep    = double(uniform_open0(philox4x32(counter, key)[0])) > p
//
// Attention-probability dropout of probability (query, key) of head global_head of a sample:
//   key     = philox_key(seed, ((uint64(layer) << 32) | (site | global_head << 8)) + 1)
//   counter = {uint32(key / 4), uint32(query), uint32(global_sample), step}
//   keep    = double(uniform_open0(philox4x32(counter, key)[key % 4])) > p
// (one Philox block serves four adjacent keys; the site word carries the head above bit 8, so
// site must be < 256 and the global head < 2^24).
//
// Kept values are multiplied by scale = T(1 / (1 - p)) in the element type T (as PyTorch
// does), dropped ones are 0. p must be in [0, 1); p = 0 draws no random numbers at all.
#pragma once

#include <cstdint>

namespace oases::kernels {

// Which mask: one stream per (seed, layer, site), a new mask every optimizer step.
struct DropoutSite {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;   // optimizer step (a new mask every step)
  std::uint32_t layer = 0;  // transformer layer; the embedding uses its own site id
  std::uint32_t site = 0;   // which dropout within the layer
};

// Where a shard's local [B, seq, F] block sits in the global batch, sequence and feature
// dimensions: local element (b, t, f) is global (sample_offset + b, position_offset + t,
// feature_offset + f). A sequence-parallel shard holding positions [p0, p0 + seq) of one
// sample passes B = 1 and position_offset = p0.
struct DropoutSlice {
  std::int64_t sample_offset = 0;    // global index of local sample 0
  std::int64_t feature_offset = 0;   // global index of local feature 0
  std::int64_t position_offset = 0;  // position of local position 0 within its sequence
};

// Dropout on the attention probabilities of one call. p = 0 (the default) draws nothing.
struct AttentionDropout {
  double p = 0;                    // probability of dropping a probability, in [0, 1)
  DropoutSite site;                // seed, step, layer and site of the mask's stream
  std::int64_t sample_offset = 0;  // global index of batch row 0
  std::int64_t head_offset = 0;    // global index of query head 0
  // Positions within the sequence of the call's query 0 and key 0: a call over one chunk of
  // queries against another chunk of keys (ring attention) draws the unsplit mask's entries.
  std::int64_t query_offset = 0;
  std::int64_t key_offset = 0;
};

}  // namespace oases::kernels
