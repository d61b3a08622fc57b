#include "schedule/pipeline.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>

namespace oases::schedule {
namespace {

using Kind = PipelineAction::Kind;

constexpr int kKinds = 4;

PipelineAction action(Kind kind, int chunk, int micro_batch) {
  return {kind, chunk, micro_batch};
}

// Dense index of an action, for the per-(kind, chunk, micro-batch) tables of the checks.
class ActionIndex {
 public:
  explicit ActionIndex(const PipelineSpec& spec)
      : chunks_(spec.chunks()), micro_batches_(spec.micro_batches) {}
  std::size_t size() const {
    return static_cast<std::size_t>(kKinds) * static_cast<std::size_t>(chunks_) *
           static_cast<std::size_t>(micro_batches_);
  }
  std::size_t operator()(const PipelineAction& a) const {
    return (static_cast<std::size_t>(a.kind) * static_cast<std::size_t>(chunks_) +
            static_cast<std::size_t>(a.chunk)) *
               static_cast<std::size_t>(micro_batches_) +
           static_cast<std::size_t>(a.micro_batch);
  }

 private:
  int chunks_;
  int micro_batches_;
};

std::vector<PipelineAction> gpipe(int rank, int micro_batches) {
  std::vector<PipelineAction> order;
  for (int mb = 0; mb < micro_batches; ++mb) order.push_back(action(Kind::forward, rank, mb));
  for (int mb = 0; mb < micro_batches; ++mb) order.push_back(action(Kind::backward, rank, mb));
  return order;
}

// 1F1B, and with `split` ZB-H1, whose W of micro-batch i waits until after I(i + rank): the
// later a rank sits in the pipeline, the fewer forwards it runs ahead, and it spends exactly
// that slack on deferred W's, so every rank keeps min(P, m) micro-batches live.
std::vector<PipelineAction> one_f_one_b(int rank, int stages, int micro_batches, bool split) {
  const int warm_up = std::min(stages - rank - 1, micro_batches);
  std::vector<PipelineAction> order;
  for (int mb = 0; mb < warm_up; ++mb) order.push_back(action(Kind::forward, rank, mb));
  int weights_done = 0;
  for (int mb = 0; mb < micro_batches; ++mb) {
    if (warm_up + mb < micro_batches) {
      order.push_back(action(Kind::forward, rank, warm_up + mb));
    }
    if (!split) {
      order.push_back(action(Kind::backward, rank, mb));
      continue;
    }
    order.push_back(action(Kind::backward_input, rank, mb));
    if (mb >= rank) order.push_back(action(Kind::backward_weight, rank, weights_done++));
  }
  while (split && weights_done < micro_batches) {
    order.push_back(action(Kind::backward_weight, rank, weights_done++));
  }
  return order;
}

std::vector<PipelineAction> interleaved(int rank, int stages, int chunks_per_rank,
                                        int micro_batches) {
  const int group = stages * chunks_per_rank;  // virtual micro-batches per round of chunks
  const int total = micro_batches * chunks_per_rank;
  const auto micro_batch_of = [&](int k) { return k / group * stages + k % stages; };
  const auto forward_of = [&](int k) {
    const int local_chunk = k % group / stages;
    return action(Kind::forward, rank + local_chunk * stages, micro_batch_of(k));
  };
  const auto backward_of = [&](int k) {
    const int local_chunk = chunks_per_rank - 1 - k % group / stages;
    return action(Kind::backward, rank + local_chunk * stages, micro_batch_of(k));
  };
  const int warm_up = std::min((stages - rank - 1) * 2 + (chunks_per_rank - 1) * stages, total);
  std::vector<PipelineAction> order;
  for (int k = 0; k < warm_up; ++k) order.push_back(forward_of(k));
  for (int k = 0; k < total - warm_up; ++k) {
    order.push_back(forward_of(warm_up + k));
    order.push_back(backward_of(k));
  }
  for (int k = total - warm_up; k < total; ++k) order.push_back(backward_of(k));
  return order;
}

bool kind_allowed(const PipelineSpec& spec, Kind kind) {
  if (kind == Kind::forward) return true;
  return spec.splits_backward() ? kind != Kind::backward : kind == Kind::backward;
}

// Every action a rank must run, in a fixed order, for the completeness check.
std::vector<PipelineAction> required_actions(const PipelineSpec& spec, int rank) {
  std::vector<Kind> kinds{Kind::forward};
  if (spec.splits_backward()) {
    kinds.push_back(Kind::backward_input);
    kinds.push_back(Kind::backward_weight);
  } else {
    kinds.push_back(Kind::backward);
  }
  std::vector<PipelineAction> out;
  for (int chunk = rank; chunk < spec.chunks(); chunk += spec.stages) {
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      for (Kind kind : kinds) out.push_back(action(kind, chunk, mb));
    }
  }
  return out;
}

std::string where(int rank, std::size_t position, const PipelineAction& a) {
  return fmt::format("rank {} position {} ({})", rank, position, to_string(a));
}

// Checks one rank's list alone; records each action's position in `position_of`.
void verify_rank(const PipelineSpec& spec, const ActionIndex& index, int rank,
                 const std::vector<PipelineAction>& order, std::vector<long>& position_of) {
  for (std::size_t i = 0; i < order.size(); ++i) {
    const PipelineAction& a = order[i];
    OASES_ASSERT(a.chunk >= 0 && a.chunk < spec.chunks(),
                 "pipeline order rejected: {}: chunk outside [0, {})", where(rank, i, a),
                 spec.chunks());
    OASES_ASSERT(spec.rank_of_chunk(a.chunk) == rank,
                 "pipeline order rejected: {}: chunk {} lives on rank {}", where(rank, i, a),
                 a.chunk, spec.rank_of_chunk(a.chunk));
    OASES_ASSERT(a.micro_batch >= 0 && a.micro_batch < spec.micro_batches,
                 "pipeline order rejected: {}: micro-batch outside [0, {})", where(rank, i, a),
                 spec.micro_batches);
    OASES_ASSERT(a.kind >= Kind::forward && a.kind <= Kind::backward_weight,
                 "pipeline order rejected: rank {} position {}: unknown action kind {}", rank, i,
                 static_cast<int>(a.kind));
    OASES_ASSERT(kind_allowed(spec, a.kind), "pipeline order rejected: {}: a {} pipeline runs {}",
                 where(rank, i, a), name(spec.kind),
                 spec.splits_backward() ? "F, I and W" : "F and B");
    const long first = position_of[index(a)];
    OASES_ASSERT(first < 0,
                 "pipeline order rejected: {}: runs a second time (first at position {})",
                 where(rank, i, a), first);
    if (a.kind == Kind::backward || a.kind == Kind::backward_input) {
      const PipelineAction forward = action(Kind::forward, a.chunk, a.micro_batch);
      OASES_ASSERT(position_of[index(forward)] >= 0,
                   "pipeline order rejected: {}: runs before its forward {}", where(rank, i, a),
                   to_string(forward));
    }
    if (a.kind == Kind::backward_weight) {
      const PipelineAction input = action(Kind::backward_input, a.chunk, a.micro_batch);
      OASES_ASSERT(position_of[index(input)] >= 0,
                   "pipeline order rejected: {}: runs before its input gradient {}",
                   where(rank, i, a), to_string(input));
    }
    position_of[index(a)] = static_cast<long>(i);
  }
  for (const PipelineAction& a : required_actions(spec, rank)) {
    OASES_ASSERT(position_of[index(a)] >= 0,
                 "pipeline order rejected: rank {} position {} (end of its list): {} never runs",
                 rank, order.size(), to_string(a));
  }
}

// Runs every rank's list as far as dependencies allow; a rank blocked for good is part of a
// cyclic wait. Each rank passes each of its actions once.
void verify_no_cyclic_wait(const PipelineSpec& spec, const ActionIndex& index,
                           const PipelineOrders& orders, const std::vector<long>& position_of) {
  const auto ranks = static_cast<std::size_t>(spec.stages);
  std::vector<bool> done(index.size(), false);
  std::vector<std::size_t> position(ranks, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      const auto& order = orders[rank];
      std::size_t& at = position[rank];
      for (; at < order.size(); ++at, progress = true) {
        const auto dependency = pipeline_dependency(spec, order[at]);
        if (dependency && !done[index(*dependency)]) break;
        done[index(order[at])] = true;
      }
    }
  }
  std::string blocked;
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    const std::size_t at = position[rank];
    if (at == orders[rank].size()) continue;
    const PipelineAction& a = orders[rank][at];
    const PipelineAction dependency = *pipeline_dependency(spec, a);
    const int dependency_rank = spec.rank_of_chunk(dependency.chunk);
    blocked += fmt::format(
        "{}{} waits for {}", blocked.empty() ? "" : "; ", where(static_cast<int>(rank), at, a),
        where(dependency_rank, static_cast<std::size_t>(position_of[index(dependency)]),
              dependency));
  }
  OASES_ASSERT(blocked.empty(),
               "pipeline order rejected: the ranks wait on each other in a cycle: {}", blocked);
}

// The most pairs live at once when `releases(kind)` ends a pair's life.
template <class Releases>
std::vector<int> max_live(const PipelineOrders& orders, Releases releases) {
  std::vector<int> out;
  for (const auto& order : orders) {
    int live = 0, peak = 0;
    for (const PipelineAction& a : order) {
      if (a.kind == Kind::forward) peak = std::max(peak, ++live);
      if (releases(a.kind)) --live;
    }
    out.push_back(peak);
  }
  return out;
}

}  // namespace

std::string_view name(PipelineKind kind) { return value_name<PipelineKind>(kPipelineKindNames, kind); }

PipelineKind parse_pipeline_kind(std::string_view text, std::string_view setting) {
  return parse_named_value<PipelineKind>(kPipelineKindNames, text, setting);
}

void check_pipeline_spec(const PipelineSpec& spec) {
  OASES_CHECK(spec.stages >= 1, "parallel.pp = {}: the pipeline needs at least 1 stage",
              spec.stages);
  OASES_CHECK(spec.micro_batches >= 1,
              "{} micro-batches per step: a pipeline step needs at least 1", spec.micro_batches);
  OASES_CHECK(spec.kind != PipelineKind::two_bw || spec.micro_batches > spec.stages,
              "parallel.pipeline = \"2bw\" needs more micro-batches per step than pipeline "
              "stages (parallel.pp = {}), but a step has {}; valid: {} or more",
              spec.stages, spec.micro_batches, spec.stages + 1);
  if (spec.kind != PipelineKind::interleaved) {
    OASES_CHECK(spec.virtual_stages == 1,
                "parallel.virtual_stages = {} needs parallel.pipeline = \"interleaved\" (found "
                "\"{}\"); valid: 1 with \"{}\"",
                spec.virtual_stages, name(spec.kind), name(spec.kind));
    return;
  }
  OASES_CHECK(spec.virtual_stages >= 2,
              "parallel.virtual_stages = {} with parallel.pipeline = \"interleaved\": valid: 2 or "
              "more model chunks per rank (or pipeline = \"1f1b\" for one)",
              spec.virtual_stages);
  OASES_CHECK(spec.micro_batches % spec.stages == 0,
              "parallel.pipeline = \"interleaved\" runs micro-batches in groups of parallel.pp = "
              "{}, but a step has {} micro-batches; valid: a multiple of {} ({}, {}, {}, ...)",
              spec.stages, spec.micro_batches, spec.stages, spec.stages, 2 * spec.stages,
              3 * spec.stages);
}

PipelineOrders pipeline_orders(const PipelineSpec& spec) {
  check_pipeline_spec(spec);
  PipelineOrders orders;
  for (int rank = 0; rank < spec.stages; ++rank) {
    switch (spec.kind) {
      case PipelineKind::gpipe:
        orders.push_back(gpipe(rank, spec.micro_batches));
        break;
      case PipelineKind::one_f_one_b:
      case PipelineKind::two_bw:  // one step on its own; pipeline_2bw.h chains steps
        orders.push_back(one_f_one_b(rank, spec.stages, spec.micro_batches, false));
        break;
      case PipelineKind::zero_bubble:
        orders.push_back(one_f_one_b(rank, spec.stages, spec.micro_batches, true));
        break;
      case PipelineKind::interleaved:
        orders.push_back(interleaved(rank, spec.stages, spec.virtual_stages, spec.micro_batches));
        break;
    }
  }
  return orders;
}

std::optional<PipelineAction> pipeline_dependency(const PipelineSpec& spec,
                                                  const PipelineAction& a) {
  switch (a.kind) {
    case Kind::forward:
      if (a.chunk == 0) return std::nullopt;
      return action(Kind::forward, a.chunk - 1, a.micro_batch);
    case Kind::backward:
    case Kind::backward_input:
      if (a.chunk == spec.chunks() - 1) return action(Kind::forward, a.chunk, a.micro_batch);
      return action(a.kind, a.chunk + 1, a.micro_batch);
    case Kind::backward_weight:
      return action(Kind::backward_input, a.chunk, a.micro_batch);
  }
  OASES_ASSERT(false, "unknown pipeline action kind {}", static_cast<int>(a.kind));
}

void verify_pipeline_orders(const PipelineSpec& spec, const PipelineOrders& orders) {
  OASES_ASSERT(spec.stages >= 1 && spec.virtual_stages >= 1 && spec.micro_batches >= 1,
               "pipeline spec with P = {}, v = {}, m = {}", spec.stages, spec.virtual_stages,
               spec.micro_batches);
  OASES_ASSERT(orders.size() == static_cast<std::size_t>(spec.stages),
               "pipeline order rejected: {} rank lists for {} stages", orders.size(), spec.stages);
  const ActionIndex index(spec);
  std::vector<long> position_of(index.size(), -1);
  for (int rank = 0; rank < spec.stages; ++rank) {
    verify_rank(spec, index, rank, orders[static_cast<std::size_t>(rank)], position_of);
  }
  verify_no_cyclic_wait(spec, index, orders, position_of);
}

std::vector<int> max_in_flight(const PipelineOrders& orders) {
  return max_live(orders,
                  [](Kind kind) { return kind == Kind::backward || kind == Kind::backward_input; });
}

std::vector<int> max_in_flight_until_weight_gradient(const PipelineOrders& orders) {
  return max_live(
      orders, [](Kind kind) { return kind == Kind::backward || kind == Kind::backward_weight; });
}

std::string to_string(const PipelineAction& a) {
  constexpr std::array<char, kKinds> kLetters{'F', 'B', 'I', 'W'};
  const auto kind = static_cast<std::size_t>(a.kind);
  return fmt::format("{}(c{},mb{})", kind < kLetters.size() ? kLetters[kind] : '?', a.chunk,
                     a.micro_batch);
}

}  // namespace oases::schedule
