// schedule::compress_kept_sets (schedule.h): Encode and Decode around the backward-side wait of
// every kept set, or of the kept sets of the layers given an encoding.
#include "schedule/kept_intervals.h"
#include "schedule/schedule.h"

#include "core/error.h"

#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

namespace oases::schedule {
namespace {

// How the kept sets of a segment are held (std::nullopt: as they are).
using EncodingOfSegment = std::function<std::optional<ops::ActivationEncoding>(int segment)>;

void compress(const ops::Program& program, Schedule& schedule,
              const EncodingOfSegment& encoding_of) {
  // Where to insert: Encodes after position i, Decodes before it, keyed by instance so that
  // sets moving at the same point share one instruction.
  using InstanceKey = std::tuple<int, int, int, int>;
  std::vector<std::map<InstanceKey, Instruction>> encodes_after(schedule.size()),
      decodes_before(schedule.size());
  const auto place = [&](std::vector<std::map<InstanceKey, Instruction>>& where, std::size_t at,
                         Op op, const KeptInterval& interval, ops::ActivationEncoding encoding) {
    auto [it, fresh] = where[at].try_emplace(
        InstanceKey{interval.batch, interval.segment, interval.micro_batch, interval.sub_batch},
        Instruction{op});
    Instruction& ins = it->second;
    if (fresh) {
      ins.segment = interval.segment;
      ins.micro_batch = interval.micro_batch;
      ins.sub_batch = interval.sub_batch;
      ins.batch = interval.batch;
      ins.chunk = interval.chunk;
      ins.encoding = encoding;
    }
    ins.sets = static_cast<ops::TensorSets>(ins.sets | interval.set);
  };
  for (const KeptInterval& interval : kept_intervals(program, schedule)) {
    // Only worth it when something else computes while the set waits.
    if (interval.compute_between == 0) continue;
    const std::optional<ops::ActivationEncoding> encoding = encoding_of(interval.segment);
    if (!encoding) continue;
    place(encodes_after, interval.last_forward_read, Op::encode, interval, *encoding);
    place(decodes_before, interval.first_backward_read, Op::decode, interval, *encoding);
  }

  Schedule out;
  out.reserve(schedule.size() * 2);
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    for (const auto& [key, ins] : decodes_before[i]) out.push_back(ins);
    out.push_back(schedule[i]);
    for (const auto& [key, ins] : encodes_after[i]) out.push_back(ins);
  }
  schedule = std::move(out);
}

}  // namespace

void compress_kept_sets(const ops::Program& program, Schedule& schedule,
                        ops::ActivationEncoding encoding) {
  compress(program, schedule, [&](int) { return std::optional(encoding); });
}

void compress_kept_sets(
    const ops::Program& program, Schedule& schedule,
    const std::vector<std::optional<ops::ActivationEncoding>>& layer_encodings) {
  compress(program, schedule, [&](int segment) -> std::optional<ops::ActivationEncoding> {
    const int layer = program.segments[static_cast<std::size_t>(segment)].layer;
    if (layer < 0) return std::nullopt;
    OASES_ASSERT(static_cast<std::size_t>(layer) < layer_encodings.size(),
                 "segment {} of layer {}, but the per-layer encodings name {} layers", segment,
                 layer, layer_encodings.size());
    return layer_encodings[static_cast<std::size_t>(layer)];
  });
}

}  // namespace oases::schedule
