// Stage partition: how many consecutive transformer layers each pipeline chunk holds, the value
// of `parallel.pipeline_layers`.
//
// A pipeline of P stages with v virtual stages per rank cuts the model into chunks = P * v
// pieces of consecutive layers, in model order: chunk 0 holds the first layers and the word
// embedding, the last chunk holds the last layers and the head (LM head + loss). Which rank runs
// a chunk is the schedule's business; here a split is just the counts, one per chunk, each
// >= 1, summing to model.layers.
//
// A pipeline's step runs at the pace of its slowest chunk, so balance_stages picks the split
// whose most expensive chunk is cheapest. Among the splits that tie, it keeps the one whose
// chunk costs, sorted from the largest down, are lexicographically smallest (after the largest,
// the second largest is as small as it can be, and so on); among splits with the same sorted
// costs, the lexicographically smallest counts. So the result depends on nothing but the costs,
// and equal layer costs with a free embedding and head give uniform_pipeline_layers.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace oases::planner {

struct StageCosts {
  // Seconds of forward + backward of each transformer layer, in model order; all >= 0.
  std::vector<double> layer_seconds;
  double embedding_seconds = 0;  // on chunk 0, >= 0
  double head_seconds = 0;       // LM head + loss, on the last chunk, >= 0

  // Optional memory bound: a chunk's bytes are the sum of its layers' layer_bytes, plus
  // embedding_bytes on chunk 0 and head_bytes on the last chunk, and must not exceed
  // chunk_memory_limit. layer_bytes is either empty (no bound) or one entry per layer. A
  // schedule keeps a different number of micro-batches in flight on each stage; the caller
  // prices a layer at the most any chunk keeps, which makes the bound safe for every chunk.
  std::vector<std::int64_t> layer_bytes;
  std::int64_t embedding_bytes = 0;
  std::int64_t head_bytes = 0;
  std::int64_t chunk_memory_limit = std::numeric_limits<std::int64_t>::max();
};

// Seconds of the chunk `index` of `chunks` holding layers [begin, end): its layers, plus the
// embedding when it is the first chunk and the head when it is the last.
double chunk_seconds(const StageCosts& costs, int index, int chunks, int begin, int end);
// Bytes of that chunk under the memory bound (0 when costs.layer_bytes is empty).
std::int64_t chunk_bytes(const StageCosts& costs, int index, int chunks, int begin, int end);

// The layer count of each of `chunks` chunks, chosen as the header describes, by an exact
// dynamic program over contiguous layers (O(chunks^2 * layers^2) time). UserError when
// chunks > layers, chunks < 1, or no split keeps every chunk within the memory limit (the
// message gives the least bytes any split needs in its largest chunk). InternalError when a
// cost is negative or not finite, or layer_bytes has the wrong length.
std::vector<int> balance_stages(const StageCosts& costs, int chunks);

// `layers` layers over `chunks` chunks as evenly as possible: every chunk gets layers / chunks,
// and the last layers % chunks chunks one more. The extra layers go to the end because the
// first stages keep the most micro-batches' activations in flight (1F1B: P on stage 0, one on
// the last) and chunk 0 also holds the embedding. UserError when chunks > layers or chunks < 1.
std::vector<int> uniform_pipeline_layers(int layers, int chunks);

// Explicit counts as `parallel.pipeline_layers` gives them: comma-separated positive integers,
// spaces allowed around each ("3,4,4,5", "3, 4, 4, 5"), exactly `chunks` of them, summing to
// `layers`. "auto" is the caller's to handle (with balance_stages). UserError naming
// parallel.pipeline_layers, the value found and a valid value (the uniform split) for each
// violation.
std::vector<int> parse_pipeline_layers(std::string_view text, int layers, int chunks);

// "3,4,4,5": the counts as parallel.pipeline_layers spells them.
std::string format_pipeline_layers(const std::vector<int>& counts);

}  // namespace oases::planner
