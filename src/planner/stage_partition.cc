#include "planner/stage_partition.h"

#include "core/error.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <optional>

namespace oases::planner {
namespace {

void check_chunk_count(int layers, int chunks) {
  OASES_CHECK(layers >= 1, "model.layers = {}: a pipeline needs at least one layer", layers);
  OASES_CHECK(chunks >= 1,
              "parallel.pp x parallel.virtual_stages = {} chunks: both must be at least 1", chunks);
  OASES_CHECK(chunks <= layers,
              "parallel.pp x parallel.virtual_stages = {} chunks but model.layers = {}: each "
              "chunk needs at least one layer, so use at most {} chunks",
              chunks, layers, layers);
}

void check_costs(const StageCosts& costs) {
  const auto valid = [](double seconds) { return std::isfinite(seconds) && seconds >= 0; };
  for (std::size_t l = 0; l < costs.layer_seconds.size(); ++l)
    OASES_ASSERT(valid(costs.layer_seconds[l]), "layer {} costs {} s", l, costs.layer_seconds[l]);
  OASES_ASSERT(valid(costs.embedding_seconds), "embedding costs {} s", costs.embedding_seconds);
  OASES_ASSERT(valid(costs.head_seconds), "head costs {} s", costs.head_seconds);
  if (costs.layer_bytes.empty()) return;
  OASES_ASSERT(costs.layer_bytes.size() == costs.layer_seconds.size(),
               "{} layer byte counts for {} layers", costs.layer_bytes.size(),
               costs.layer_seconds.size());
  for (std::size_t l = 0; l < costs.layer_bytes.size(); ++l)
    OASES_ASSERT(costs.layer_bytes[l] >= 0, "layer {} needs {} bytes", l, costs.layer_bytes[l]);
  OASES_ASSERT(costs.embedding_bytes >= 0 && costs.head_bytes >= 0,
               "embedding needs {} bytes, head {} bytes", costs.embedding_bytes, costs.head_bytes);
}

// Chunk costs sorted from the largest down; splits compare by these lexicographically.
using SortedCosts = std::vector<double>;

SortedCosts with_cost(const SortedCosts& rest, double cost) {
  SortedCosts out;
  out.reserve(rest.size() + 1);
  const auto at = std::upper_bound(rest.begin(), rest.end(), cost, std::greater<>());
  out.insert(out.end(), rest.begin(), at);
  out.push_back(cost);
  out.insert(out.end(), at, rest.end());
  return out;
}

// The least bytes the largest chunk of any split needs (minimax over splits), for the error
// that no split fits the limit.
std::int64_t least_largest_chunk_bytes(const StageCosts& costs, int chunks) {
  const int layers = static_cast<int>(costs.layer_seconds.size());
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  // least[c][i]: chunks c.. over layers i..
  std::vector<std::vector<std::int64_t>> least(static_cast<std::size_t>(chunks) + 1,
                                               std::vector<std::int64_t>(layers + 1, kNone));
  least[chunks][layers] = 0;
  for (int c = chunks - 1; c >= 0; --c)
    for (int i = c; i <= layers - (chunks - c); ++i)
      for (int e = i + 1; e <= layers - (chunks - c - 1); ++e) {
        if (least[c + 1][e] == kNone) continue;
        least[c][i] =
            std::min(least[c][i], std::max(chunk_bytes(costs, c, chunks, i, e), least[c + 1][e]));
      }
  return least[0][0];
}

}  // namespace

double chunk_seconds(const StageCosts& costs, int index, int chunks, int begin, int end) {
  // One summation order everywhere, so that equal splits compare equal bit for bit.
  double seconds = index == 0 ? costs.embedding_seconds : 0.0;
  for (int l = begin; l < end; ++l) seconds += costs.layer_seconds[l];
  if (index == chunks - 1) seconds += costs.head_seconds;
  return seconds;
}

std::int64_t chunk_bytes(const StageCosts& costs, int index, int chunks, int begin, int end) {
  if (costs.layer_bytes.empty()) return 0;
  std::int64_t bytes = index == 0 ? costs.embedding_bytes : 0;
  for (int l = begin; l < end; ++l) bytes += costs.layer_bytes[l];
  if (index == chunks - 1) bytes += costs.head_bytes;
  return bytes;
}

std::vector<int> balance_stages(const StageCosts& costs, int chunks) {
  const int layers = static_cast<int>(costs.layer_seconds.size());
  check_chunk_count(layers, chunks);
  check_costs(costs);

  // Suffix problem (c, i): chunks c.. over layers i... best[c][i] is its optimum (nullopt when
  // no split fits the memory limit), end[c][i] where chunk c stops in it. Inserting the same
  // cost into two sorted cost lists keeps their order, strictly, so every optimal split is
  // optimal on each suffix: following the smallest optimal end from (0, 0) gives the
  // lexicographically smallest counts among the optimal splits.
  const auto rows = static_cast<std::size_t>(chunks) + 1;
  std::vector<std::vector<std::optional<SortedCosts>>> best(
      rows, std::vector<std::optional<SortedCosts>>(layers + 1));
  std::vector<std::vector<int>> end(rows, std::vector<int>(layers + 1, -1));
  best[chunks][layers] = SortedCosts{};
  for (int c = chunks - 1; c >= 0; --c)
    for (int i = c; i <= layers - (chunks - c); ++i)
      for (int e = i + 1; e <= layers - (chunks - c - 1); ++e) {
        if (!best[c + 1][e]) continue;
        if (chunk_bytes(costs, c, chunks, i, e) > costs.chunk_memory_limit) continue;
        SortedCosts candidate = with_cost(*best[c + 1][e], chunk_seconds(costs, c, chunks, i, e));
        if (!best[c][i] || candidate < *best[c][i]) {  // strict: ties keep the smaller end
          best[c][i] = std::move(candidate);
          end[c][i] = e;
        }
      }

  if (!best[0][0])
    OASES_FAIL(
        "no split of model.layers = {} into parallel.pp x parallel.virtual_stages = {} chunks "
        "keeps every chunk within {} bytes: the best split needs {} bytes in its largest "
        "chunk; use more pipeline stages or less memory per layer (recomputation, a smaller "
        "micro-batch)",
        layers, chunks, costs.chunk_memory_limit, least_largest_chunk_bytes(costs, chunks));

  std::vector<int> counts;
  counts.reserve(static_cast<std::size_t>(chunks));
  for (int c = 0, i = 0; c < chunks; ++c) {
    const int e = end[c][i];
    OASES_ASSERT(e > i, "no end recorded for chunk {} from layer {}", c, i);
    counts.push_back(e - i);
    i = e;
  }
  return counts;
}

std::vector<int> uniform_pipeline_layers(int layers, int chunks) {
  check_chunk_count(layers, chunks);
  std::vector<int> counts(static_cast<std::size_t>(chunks), layers / chunks);
  const int extra = layers % chunks;
  for (int c = chunks - extra; c < chunks; ++c) ++counts[c];
  return counts;
}

std::string format_pipeline_layers(const std::vector<int>& counts) {
  std::string text;
  for (std::size_t c = 0; c < counts.size(); ++c) {
    if (c > 0) text += ',';
    text += std::to_string(counts[c]);
  }
  return text;
}

std::vector<int> parse_pipeline_layers(std::string_view text, int layers, int chunks) {
  check_chunk_count(layers, chunks);
  const std::string valid = fmt::format(
      "give {} positive counts summing to model.layers = {}, such as \"{}\", or "
      "\"auto\"",
      chunks, layers, format_pipeline_layers(uniform_pipeline_layers(layers, chunks)));

  std::vector<int> counts;
  std::int64_t total = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string_view token = text.substr(start, comma - start);
    const auto first = token.find_first_not_of(" \t");
    token = first == std::string_view::npos
                ? std::string_view{}
                : token.substr(first, token.find_last_not_of(" \t") - first + 1);
    int count = 0;
    const auto [stop, status] = std::from_chars(token.data(), token.data() + token.size(), count);
    OASES_CHECK(status == std::errc{} && stop == token.data() + token.size() && count >= 1,
                "parallel.pipeline_layers = \"{}\": \"{}\" is not a positive layer count; {}", text,
                token, valid);
    counts.push_back(count);
    total += count;
    if (comma == text.size()) break;
    start = comma + 1;
  }

  OASES_CHECK(static_cast<int>(counts.size()) == chunks,
              "parallel.pipeline_layers = \"{}\" has {} counts but parallel.pp x "
              "parallel.virtual_stages = {} chunks; {}",
              text, counts.size(), chunks, valid);
  OASES_CHECK(total == layers,
              "parallel.pipeline_layers = \"{}\" sums to {} layers but model.layers = {}; {}", text,
              total, layers, valid);
  return counts;
}

}  // namespace oases::planner
