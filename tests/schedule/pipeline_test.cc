// Pipeline orders: every generator passes the verifier over the sizes the issue names, each
// order has the shape its paper describes, live activations meet each schedule's bound, and
// hand-broken orders are rejected naming the rank and position.
#include "schedule/pipeline.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

namespace oases::schedule {
namespace {

using Kind = PipelineAction::Kind;

PipelineSpec spec_of(PipelineKind kind, int stages, int micro_batches, int virtual_stages = 1) {
  return {kind, stages, virtual_stages, micro_batches};
}

// Every (spec) the issue asks the generators to pass: P in {2, 3, 4, 8}, m in {P, 2P, 4P + 1}
// (interleaved: v in {2, 4} and m in {P, 2P, 4P}, multiples of P).
std::vector<PipelineSpec> issue_specs() {
  std::vector<PipelineSpec> specs;
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p + 1}) {
      for (PipelineKind kind :
           {PipelineKind::gpipe, PipelineKind::one_f_one_b, PipelineKind::zero_bubble}) {
        specs.push_back(spec_of(kind, p, m));
      }
    }
    for (int v : {2, 4}) {
      for (int m : {p, 2 * p, 4 * p}) specs.push_back(spec_of(PipelineKind::interleaved, p, m, v));
    }
  }
  return specs;
}

std::string describe(const PipelineSpec& s) {
  return fmt::format("{} P={} v={} m={}", name(s.kind), s.stages, s.virtual_stages,
                     s.micro_batches);
}

std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError";
  return "";
}
std::string rejection(const PipelineSpec& spec, const PipelineOrders& orders) {
  try {
    verify_pipeline_orders(spec, orders);
  } catch (const InternalError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted orders that should be rejected";
  return "";
}
void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in\n" << message;
}

std::size_t position_of(const std::vector<PipelineAction>& order, const PipelineAction& a) {
  const auto it = std::find(order.begin(), order.end(), a);
  EXPECT_NE(it, order.end()) << "no " << to_string(a);
  return static_cast<std::size_t>(it - order.begin());
}

TEST(PipelineKinds, NamesRoundTripAndUnknownNamesListTheValidOnes) {
  for (PipelineKind kind :
       {PipelineKind::gpipe, PipelineKind::one_f_one_b, PipelineKind::interleaved,
        PipelineKind::zero_bubble, PipelineKind::two_bw}) {
    EXPECT_EQ(parse_pipeline_kind(name(kind), "parallel.pipeline"), kind);
  }
  const std::string message =
      user_error([] { parse_pipeline_kind("pipedream", "parallel.pipeline"); });
  expect_contains(message, "parallel.pipeline = \"pipedream\"");
  expect_contains(message, "\"gpipe\", \"1f1b\", \"interleaved\", \"zero-bubble\", \"2bw\"");
}

TEST(PipelineSpecs, BadSpecsSayWhatIsValid) {
  expect_contains(user_error([] { pipeline_orders(spec_of(PipelineKind::gpipe, 0, 4)); }),
                  "parallel.pp = 0");
  expect_contains(user_error([] { pipeline_orders(spec_of(PipelineKind::one_f_one_b, 2, 0)); }),
                  "0 micro-batches");
  const std::string not_multiple =
      user_error([] { pipeline_orders(spec_of(PipelineKind::interleaved, 4, 6, 2)); });
  expect_contains(not_multiple, "parallel.pp = 4");
  expect_contains(not_multiple, "6 micro-batches");
  expect_contains(not_multiple, "valid: a multiple of 4 (4, 8, 12, ...)");
  expect_contains(user_error([] { pipeline_orders(spec_of(PipelineKind::interleaved, 4, 8, 1)); }),
                  "parallel.virtual_stages = 1 with parallel.pipeline = \"interleaved\"");
  expect_contains(user_error([] { pipeline_orders(spec_of(PipelineKind::one_f_one_b, 4, 8, 2)); }),
                  "parallel.virtual_stages = 2 needs parallel.pipeline = \"interleaved\"");
  expect_contains(user_error([] { pipeline_orders(spec_of(PipelineKind::two_bw, 4, 4)); }),
                  "parallel.pipeline = \"2bw\" needs more micro-batches per step than pipeline "
                  "stages (parallel.pp = 4), but a step has 4; valid: 5 or more");
}

TEST(PipelineOrders, EveryGeneratorPassesTheVerifier) {
  for (const PipelineSpec& spec : issue_specs()) {
    const PipelineOrders orders = pipeline_orders(spec);
    EXPECT_NO_THROW(verify_pipeline_orders(spec, orders)) << describe(spec);
    std::size_t actions = 0;
    for (const auto& order : orders) actions += order.size();
    const std::size_t per_pair = spec.splits_backward() ? 3 : 2;
    EXPECT_EQ(actions, per_pair * static_cast<std::size_t>(spec.chunks() * spec.micro_batches))
        << describe(spec);
  }
  // Fewer micro-batches than stages, and a single stage, run too.
  for (PipelineKind kind :
       {PipelineKind::gpipe, PipelineKind::one_f_one_b, PipelineKind::zero_bubble}) {
    for (auto [p, m] : {std::pair{4, 1}, std::pair{4, 3}, std::pair{1, 3}}) {
      const PipelineSpec spec = spec_of(kind, p, m);
      EXPECT_NO_THROW(verify_pipeline_orders(spec, pipeline_orders(spec))) << describe(spec);
    }
  }
  const PipelineSpec one_rank = spec_of(PipelineKind::interleaved, 1, 3, 2);
  EXPECT_NO_THROW(verify_pipeline_orders(one_rank, pipeline_orders(one_rank)));
}

TEST(PipelineOrders, GPipeRunsEveryForwardBeforeAnyBackward) {
  const PipelineSpec spec = spec_of(PipelineKind::gpipe, 4, 9);
  for (const auto& order : pipeline_orders(spec)) {
    for (std::size_t i = 0; i < order.size(); ++i) {
      const bool in_forward_half = i < static_cast<std::size_t>(spec.micro_batches);
      EXPECT_EQ(order[i].kind == Kind::forward, in_forward_half);
      EXPECT_EQ(order[i].micro_batch, static_cast<int>(i) % spec.micro_batches);
    }
  }
}

// PipeDream-flush: P - r - 1 forwards ahead, then strictly one forward, one backward.
TEST(PipelineOrders, OneFOneBWarmsUpThenAlternates) {
  for (int m : {2, 4, 9}) {
    const PipelineSpec spec = spec_of(PipelineKind::one_f_one_b, 4, m);
    const PipelineOrders orders = pipeline_orders(spec);
    for (int r = 0; r < spec.stages; ++r) {
      const auto& order = orders[static_cast<std::size_t>(r)];
      const int warm_up = std::min(spec.stages - r - 1, m);
      int forwards = 0, backwards = 0;
      for (std::size_t i = 0; i < order.size(); ++i) {
        const bool forward = order[i].kind == Kind::forward;
        EXPECT_EQ(order[i].micro_batch, forward ? forwards : backwards);
        forward ? ++forwards : ++backwards;
        if (static_cast<int>(i) < warm_up) {
          EXPECT_TRUE(forward) << "rank " << r << " at " << i;
        }
        // After the warm-up each backward is preceded by exactly warm-up + its index + 1
        // forwards, until they run out.
        if (!forward) {
          EXPECT_EQ(forwards, std::min(m, warm_up + backwards)) << "rank " << r;
        }
      }
    }
  }
}

// Megatron's interleaved order: forwards visit the rank's chunks in runs of P micro-batches,
// cycling up the model; backwards cycle down; each chunk sees its micro-batches in order.
TEST(PipelineOrders, InterleavedVisitsChunksInGroupsOfPMicroBatches) {
  for (int v : {2, 4}) {
    const PipelineSpec spec = spec_of(PipelineKind::interleaved, 4, 8, v);
    const PipelineOrders orders = pipeline_orders(spec);
    for (int r = 0; r < spec.stages; ++r) {
      std::vector<int> forward_chunks, backward_chunks;
      std::vector<int> next_forward(static_cast<std::size_t>(v), 0),
          next_backward(static_cast<std::size_t>(v), 0);
      for (const PipelineAction& a : orders[static_cast<std::size_t>(r)]) {
        const int local = a.chunk / spec.stages;
        EXPECT_EQ(a.chunk % spec.stages, r);
        auto& next = a.kind == Kind::forward ? next_forward : next_backward;
        EXPECT_EQ(a.micro_batch, next[static_cast<std::size_t>(local)]++);
        (a.kind == Kind::forward ? forward_chunks : backward_chunks).push_back(local);
      }
      for (std::size_t k = 0; k < forward_chunks.size(); ++k) {
        const int run = static_cast<int>(k) / spec.stages;
        EXPECT_EQ(forward_chunks[k], run % v) << "rank " << r << " forward " << k;
        EXPECT_EQ(backward_chunks[k], v - 1 - run % v) << "rank " << r << " backward " << k;
      }
      // Megatron's warm-up: (P - r - 1) 2 + (v - 1) P forwards before the first backward.
      const auto& order = orders[static_cast<std::size_t>(r)];
      const auto first_backward =
          std::find_if(order.begin(), order.end(),
                       [](const PipelineAction& a) { return a.kind == Kind::backward; });
      EXPECT_EQ(first_backward - order.begin(),
                std::min((spec.stages - r - 1) * 2 + (v - 1) * spec.stages, 8 * v) + 1);
    }
  }
}

// ZB-H1 is 1F1B with each B split into I and W: dropping the W's and reading I as B gives the
// 1F1B order back; rank r's W of micro-batch i comes after I(i + r) (while there is one).
TEST(PipelineOrders, ZeroBubbleIsOneFOneBWithWeightGradientsDeferredByRank) {
  for (int m : {4, 8, 17}) {
    const PipelineOrders zb = pipeline_orders(spec_of(PipelineKind::zero_bubble, 4, m));
    const PipelineOrders plain = pipeline_orders(spec_of(PipelineKind::one_f_one_b, 4, m));
    for (std::size_t r = 0; r < zb.size(); ++r) {
      std::vector<PipelineAction> without_weights;
      for (PipelineAction a : zb[r]) {
        if (a.kind == Kind::backward_weight) continue;
        if (a.kind == Kind::backward_input) a.kind = Kind::backward;
        without_weights.push_back(a);
      }
      EXPECT_EQ(without_weights, plain[r]) << "rank " << r;
      for (int i = 0; i < m; ++i) {
        const int after = std::min(i + static_cast<int>(r), m - 1);
        EXPECT_GT(position_of(zb[r], {Kind::backward_weight, static_cast<int>(r), i}),
                  position_of(zb[r], {Kind::backward_input, static_cast<int>(r), after}));
      }
    }
  }
}

TEST(PipelineMemory, LiveActivationsMeetEachSchedulesBound) {
  for (const PipelineSpec& spec : issue_specs()) {
    const int p = spec.stages, m = spec.micro_batches, v = spec.virtual_stages;
    const std::vector<int> live = max_in_flight(pipeline_orders(spec));
    const std::vector<int> until_w = max_in_flight_until_weight_gradient(pipeline_orders(spec));
    ASSERT_EQ(live.size(), static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      const auto at = static_cast<std::size_t>(r);
      switch (spec.kind) {
        case PipelineKind::gpipe:
          EXPECT_EQ(live[at], m) << describe(spec);
          break;
        case PipelineKind::one_f_one_b:
          EXPECT_EQ(live[at], std::min(p - r, m)) << describe(spec);
          break;
        case PipelineKind::zero_bubble:
          // The input gradient frees as 1F1B's backward does; the deferred W's keep every rank
          // at rank 0's 1F1B bound.
          EXPECT_EQ(live[at], std::min(p - r, m)) << describe(spec);
          EXPECT_EQ(until_w[at], std::min(p, m)) << describe(spec) << " rank " << r;
          break;
        case PipelineKind::interleaved:
          // Megatron's warm-up count plus the one forward of the first steady pair, in chunks
          // of 1/v of the rank's layers: on rank 0 with m >= 2P that is P v + P - 1 chunks,
          // 1 + (P - 1) / (P v) times 1F1B's P micro-batches.
          EXPECT_EQ(live[at], std::min((p - r - 1) * 2 + (v - 1) * p + 1, m * v)) << describe(spec);
          if (r == 0 && m >= 2 * p) {
            EXPECT_NEAR(static_cast<double>(live[at]) / v,
                        p * (1.0 + static_cast<double>(p - 1) / (p * v)), 1e-12);
          }
          break;
        case PipelineKind::two_bw:
          FAIL();
      }
      if (!spec.splits_backward()) {
        EXPECT_EQ(until_w[at], live[at]);
      }
    }
  }
}

TEST(PipelineVerifier, RejectsAMissingBackwardNamingRankAndPosition) {
  const PipelineSpec spec = spec_of(PipelineKind::one_f_one_b, 3, 6);
  PipelineOrders orders = pipeline_orders(spec);
  auto& rank1 = orders[1];
  rank1.erase(rank1.begin() +
              static_cast<std::ptrdiff_t>(position_of(rank1, {Kind::backward, 1, 4})));
  const std::string message = rejection(spec, orders);
  expect_contains(message, fmt::format("rank 1 position {} (end of its list)", rank1.size()));
  expect_contains(message, "B(c1,mb4) never runs");
}

TEST(PipelineVerifier, RejectsAWeightGradientBeforeItsInputGradient) {
  const PipelineSpec spec = spec_of(PipelineKind::zero_bubble, 4, 8);
  PipelineOrders orders = pipeline_orders(spec);
  auto& rank2 = orders[2];
  const std::size_t input = position_of(rank2, {Kind::backward_input, 2, 3});
  const std::size_t weight = position_of(rank2, {Kind::backward_weight, 2, 3});
  std::swap(rank2[input], rank2[weight]);
  const std::string message = rejection(spec, orders);
  expect_contains(message, fmt::format("rank 2 position {} (W(c2,mb3))", input));
  expect_contains(message, "before its input gradient I(c2,mb3)");
}

// GPipe on two ranks: rank 0 swaps its second forward with its first backward. Its backward
// waits for rank 1's, which rank 1 runs only after a forward that waits for rank 0's second.
TEST(PipelineVerifier, RejectsACyclicWaitNamingEveryBlockedRank) {
  const PipelineSpec spec = spec_of(PipelineKind::gpipe, 2, 2);
  PipelineOrders orders = pipeline_orders(spec);
  std::swap(orders[0][1], orders[0][2]);  // F(c0,mb1) <-> B(c0,mb0)
  const std::string message = rejection(spec, orders);
  expect_contains(message, "cycle");
  expect_contains(message, "rank 0 position 1 (B(c0,mb0)) waits for rank 1 position 2 (B(c1,mb0))");
  expect_contains(message, "rank 1 position 1 (F(c1,mb1)) waits for rank 0 position 2 (F(c0,mb1))");
}

TEST(PipelineVerifier, RejectsActionsOnTheWrongRankTwiceOrOfTheWrongKind) {
  const PipelineSpec spec = spec_of(PipelineKind::one_f_one_b, 2, 2);
  PipelineOrders wrong_rank = pipeline_orders(spec);
  wrong_rank[0].push_back({Kind::forward, 1, 0});
  expect_contains(rejection(spec, wrong_rank),
                  "rank 0 position 4 (F(c1,mb0)): chunk 1 lives on rank 1");

  PipelineOrders twice = pipeline_orders(spec);
  twice[1].insert(twice[1].begin() + 1, twice[1][0]);
  expect_contains(rejection(spec, twice), "rank 1 position 1 (F(c1,mb0)): runs a second time");

  PipelineOrders split = pipeline_orders(spec);
  split[1][1].kind = Kind::backward_input;
  expect_contains(rejection(spec, split),
                  "rank 1 position 1 (I(c1,mb0)): a 1f1b pipeline runs F and B");

  PipelineOrders early = pipeline_orders(spec);
  std::swap(early[1][0], early[1][1]);
  expect_contains(rejection(spec, early), "rank 1 position 0 (B(c1,mb0)): runs before its forward");

  PipelineOrders outside = pipeline_orders(spec);
  outside[0][0].micro_batch = 2;
  expect_contains(rejection(spec, outside), "micro-batch outside [0, 2)");

  EXPECT_THROW(verify_pipeline_orders(spec, PipelineOrders(1)), InternalError);
}

}  // namespace
}  // namespace oases::schedule
