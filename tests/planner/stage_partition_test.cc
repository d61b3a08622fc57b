// Stage partition: the dynamic program picks the same split as brute force over every
// composition of the layers (random costs, with and without a memory limit, with ties), a heavy
// embedding or head moves layers off its chunk, equal costs give the uniform split, and bad
// counts or chunk numbers fail naming the setting.
#include "planner/stage_partition.h"

#include "support/files.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <random>

namespace oases::planner {
namespace {

using oases::testing::expect_user_error;

// Every way to write `layers` as `chunks` positive counts, in lexicographic order.
std::vector<std::vector<int>> compositions(int layers, int chunks) {
  std::vector<std::vector<int>> all;
  std::vector<int> counts;
  std::function<void(int, int)> extend = [&](int left, int parts) {
    if (parts == 1) {
      counts.push_back(left);
      all.push_back(counts);
      counts.pop_back();
      return;
    }
    for (int first = 1; first <= left - (parts - 1); ++first) {
      counts.push_back(first);
      extend(left - first, parts - 1);
      counts.pop_back();
    }
  };
  extend(layers, chunks);
  return all;
}

struct SplitCosts {
  std::vector<double> seconds;  // per chunk
  std::int64_t largest_bytes = 0;
};

// Each chunk's seconds, summed in model order with the embedding first and the head last.
SplitCosts split_costs(const StageCosts& costs, const std::vector<int>& counts) {
  SplitCosts out;
  int layer = 0;
  for (std::size_t c = 0; c < counts.size(); ++c) {
    double seconds = c == 0 ? costs.embedding_seconds : 0.0;
    std::int64_t bytes = c == 0 ? costs.embedding_bytes : 0;
    for (int k = 0; k < counts[c]; ++k, ++layer) {
      seconds += costs.layer_seconds[layer];
      if (!costs.layer_bytes.empty()) bytes += costs.layer_bytes[layer];
    }
    if (c + 1 == counts.size()) {
      seconds += costs.head_seconds;
      bytes += costs.head_bytes;
    }
    out.seconds.push_back(seconds);
    out.largest_bytes = std::max(out.largest_bytes, bytes);
  }
  return out;
}

// The split the header promises, by enumeration: fits the memory limit; smallest sorted-down
// chunk costs; then smallest counts (compositions come in lexicographic order, so the first
// one found among equals).
std::optional<std::vector<int>> brute_force(const StageCosts& costs, int chunks) {
  std::optional<std::vector<int>> best;
  std::vector<double> best_sorted;
  for (const auto& counts : compositions(static_cast<int>(costs.layer_seconds.size()), chunks)) {
    const SplitCosts split = split_costs(costs, counts);
    if (!costs.layer_bytes.empty() && split.largest_bytes > costs.chunk_memory_limit) continue;
    std::vector<double> sorted = split.seconds;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    if (!best || sorted < best_sorted) {
      best = counts;
      best_sorted = sorted;
    }
  }
  return best;
}

std::int64_t brute_force_least_largest_bytes(const StageCosts& costs, int chunks) {
  std::int64_t least = std::numeric_limits<std::int64_t>::max();
  for (const auto& counts : compositions(static_cast<int>(costs.layer_seconds.size()), chunks))
    least = std::min(least, split_costs(costs, counts).largest_bytes);
  return least;
}

double largest(const std::vector<double>& values) {
  return *std::max_element(values.begin(), values.end());
}

// Costs drawn either real (ties only by structure) or as small integers (ties everywhere, so
// the tie-breaking rule is what decides).
StageCosts random_costs(std::mt19937& rng, int layers, bool integer_costs) {
  std::uniform_real_distribution<double> real(0.1, 2.0);
  std::uniform_int_distribution<int> small(0, 3);
  const auto draw = [&] { return integer_costs ? static_cast<double>(small(rng)) : real(rng); };
  StageCosts costs;
  for (int l = 0; l < layers; ++l) costs.layer_seconds.push_back(draw());
  costs.embedding_seconds = draw();
  costs.head_seconds = 2 * draw();
  return costs;
}

// Seed 20240611: fixed so a failure reproduces; the draws cover every (layers, chunks) pair
// below several times over.
constexpr std::uint32_t kSeed = 20240611;

TEST(BalanceStages, MatchesBruteForceOnRandomCosts) {
  std::mt19937 rng(kSeed);
  int cases = 0;
  for (int repeat = 0; repeat < 6; ++repeat)
    for (int layers = 1; layers <= 10; ++layers)
      for (int chunks = 1; chunks <= std::min(5, layers); ++chunks) {
        const bool integer_costs = repeat % 2 == 1;
        const StageCosts costs = random_costs(rng, layers, integer_costs);
        const std::vector<int> counts = balance_stages(costs, chunks);
        const auto expected = brute_force(costs, chunks);
        ASSERT_TRUE(expected.has_value());
        EXPECT_EQ(counts, *expected) << layers << " layers, " << chunks << " chunks, "
                                     << (integer_costs ? "integer" : "real") << " costs";
        EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), layers);
        EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int n) { return n >= 1; }));
        ++cases;
      }
  EXPECT_EQ(cases, 6 * 40);
}

TEST(BalanceStages, MatchesBruteForceUnderMemoryLimit) {
  std::mt19937 rng(kSeed + 1);
  std::uniform_int_distribution<std::int64_t> bytes(1, 100);
  std::uniform_real_distribution<double> tightness(0.0, 1.0);
  int bound = 0, infeasible = 0;
  for (int repeat = 0; repeat < 4; ++repeat)
    for (int layers = 1; layers <= 10; ++layers)
      for (int chunks = 1; chunks <= std::min(5, layers); ++chunks) {
        StageCosts costs = random_costs(rng, layers, repeat % 2 == 1);
        for (int l = 0; l < layers; ++l) costs.layer_bytes.push_back(bytes(rng));
        costs.embedding_bytes = bytes(rng);
        costs.head_bytes = bytes(rng);
        // A limit from somewhat below the least any split needs (infeasible) up to the
        // largest chunk of the split that ignores memory (no bound).
        StageCosts unbounded = costs;
        unbounded.layer_bytes.clear();
        const std::int64_t free_choice =
            split_costs(costs, balance_stages(unbounded, chunks)).largest_bytes;
        const std::int64_t least = brute_force_least_largest_bytes(costs, chunks);
        costs.chunk_memory_limit =
            least - 5 + static_cast<std::int64_t>(tightness(rng) * (free_choice - least + 5));

        const auto expected = brute_force(costs, chunks);
        if (!expected) {
          ++infeasible;
          expect_user_error(
              [&] { balance_stages(costs, chunks); },
              {"model.layers = " + std::to_string(layers), std::to_string(chunks) + " chunks",
               "within " + std::to_string(costs.chunk_memory_limit) + " bytes",
               "needs " + std::to_string(least) + " bytes"});
          continue;
        }
        const std::vector<int> counts = balance_stages(costs, chunks);
        EXPECT_EQ(counts, *expected)
            << layers << " layers, " << chunks << " chunks, limit " << costs.chunk_memory_limit;
        EXPECT_LE(split_costs(costs, counts).largest_bytes, costs.chunk_memory_limit);
        if (counts != balance_stages(unbounded, chunks)) ++bound;
      }
  // The draws exercise all three outcomes: no split fits, the limit changes the split, and it
  // does not.
  EXPECT_GT(infeasible, 5);
  EXPECT_GT(bound, 5);
}

TEST(BalanceStages, HeavyEmbeddingOrHeadMovesLayersOffItsChunk) {
  constexpr int kLayers = 16, kChunks = 4;
  const std::vector<int> uniform = uniform_pipeline_layers(kLayers, kChunks);
  StageCosts costs;
  costs.layer_seconds.assign(kLayers, 1.0);
  EXPECT_EQ(balance_stages(costs, kChunks), uniform);

  const std::vector<std::pair<double, double>> embedding_and_head = {{3, 0}, {0, 3}, {2.5, 2.5}};
  for (const auto& [embedding, head] : embedding_and_head) {
    costs.embedding_seconds = embedding;
    costs.head_seconds = head;
    const std::vector<int> counts = balance_stages(costs, kChunks);
    const std::vector<double> seconds = split_costs(costs, counts).seconds;
    const int least = *std::min_element(counts.begin(), counts.end());
    if (embedding > 0) {
      EXPECT_LT(counts.front(), uniform.front()) << "embedding " << embedding;
      EXPECT_EQ(counts.front(), least);
    }
    if (head > 0) {
      EXPECT_LT(counts.back(), uniform.back()) << "head " << head;
      EXPECT_EQ(counts.back(), least);
    }
    // Better than keeping the uniform counts, and no chunk cheaper than the total spread
    // evenly allows for the largest.
    EXPECT_LT(largest(seconds), largest(split_costs(costs, uniform).seconds));
    EXPECT_GE(largest(seconds), (kLayers + embedding + head) / kChunks);
  }
}

TEST(BalanceStages, EqualCostsGiveUniformCounts) {
  for (const double each : {1.0, 0.37, 1e-3})
    for (int layers = 1; layers <= 24; ++layers)
      for (int chunks = 1; chunks <= layers; ++chunks) {
        StageCosts costs;
        costs.layer_seconds.assign(layers, each);
        EXPECT_EQ(balance_stages(costs, chunks), uniform_pipeline_layers(layers, chunks))
            << layers << " layers of " << each << " s, " << chunks << " chunks";
      }
}

TEST(BalanceStages, RejectsMoreChunksThanLayers) {
  StageCosts costs;
  costs.layer_seconds.assign(4, 1.0);
  expect_user_error([&] { balance_stages(costs, 5); },
                    {"parallel.pp x parallel.virtual_stages = 5 chunks but model.layers = 4",
                     "each chunk needs at least one layer", "at most 4 chunks"});
  expect_user_error([&] { balance_stages(costs, 0); },
                    {"parallel.pp x parallel.virtual_stages = 0 chunks"});
  expect_user_error([&] { balance_stages(StageCosts{}, 1); }, {"model.layers = 0"});
}

TEST(UniformPipelineLayers, EvenWithTheExtraLayersLast) {
  for (int layers = 1; layers <= 40; ++layers)
    for (int chunks = 1; chunks <= layers; ++chunks) {
      const std::vector<int> counts = uniform_pipeline_layers(layers, chunks);
      ASSERT_EQ(static_cast<int>(counts.size()), chunks);
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), layers);
      EXPECT_TRUE(std::is_sorted(counts.begin(), counts.end()));
      EXPECT_LE(counts.back() - counts.front(), 1) << layers << " over " << chunks;
      EXPECT_GE(counts.front(), 1);
    }
  expect_user_error([] { uniform_pipeline_layers(3, 4); },
                    {"parallel.pp x parallel.virtual_stages = 4 chunks but model.layers = 3"});
}

TEST(ParsePipelineLayers, ReadsCountsWithSpaces) {
  EXPECT_EQ(parse_pipeline_layers("3,4,4,5", 16, 4), (std::vector<int>{3, 4, 4, 5}));
  EXPECT_EQ(parse_pipeline_layers(" 3 , 4,4 ,\t5 ", 16, 4), (std::vector<int>{3, 4, 4, 5}));
  EXPECT_EQ(parse_pipeline_layers("7", 7, 1), (std::vector<int>{7}));
  // What format_pipeline_layers writes reads back.
  for (int layers = 1; layers <= 12; ++layers)
    for (int chunks = 1; chunks <= layers; ++chunks) {
      const std::vector<int> counts = uniform_pipeline_layers(layers, chunks);
      EXPECT_EQ(parse_pipeline_layers(format_pipeline_layers(counts), layers, chunks), counts);
    }
}

TEST(ParsePipelineLayers, RejectsBadCountsNamingTheSetting) {
  const std::string valid = "4 positive counts summing to model.layers = 16, such as \"4,4,4,4\"";
  for (const std::string text : {"3,4,x,5", "3,4,0,9", "3,-4,4,13", "3,4,,9", "", "3.5,4,4,4.5",
                                 "auto", "99999999999,1,1,1", "3,4,4,5,"}) {
    SCOPED_TRACE(text);
    expect_user_error(
        [&] { parse_pipeline_layers(text, 16, 4); },
        {"parallel.pipeline_layers = \"" + text + "\"", "is not a positive layer count", valid});
  }
  expect_user_error([] { parse_pipeline_layers("4,4,8", 16, 4); },
                    {"parallel.pipeline_layers = \"4,4,8\" has 3 counts",
                     "parallel.pp x parallel.virtual_stages = 4 chunks", valid});
  expect_user_error(
      [] { parse_pipeline_layers("4, 4, 4, 5", 16, 4); },
      {"parallel.pipeline_layers = \"4, 4, 4, 5\" sums to 17 layers", "model.layers = 16", valid});
  // The suggestion is the uniform split, extra layers last.
  expect_user_error([] { parse_pipeline_layers("1,1,1", 10, 4); }, {"such as \"2,2,3,3\""});
  expect_user_error([] { parse_pipeline_layers("1,1,1,1,1", 4, 5); },
                    {"parallel.pp x parallel.virtual_stages = 5 chunks but model.layers = 4"});
}

}  // namespace
}  // namespace oases::planner
