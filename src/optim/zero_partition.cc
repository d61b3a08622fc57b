#include "optim/zero_partition.h"

#include "core/error.h"

#include <algorithm>

namespace oases::optim {

std::vector<std::int64_t> partition_range(const FlatLayout& layout, std::int64_t begin,
                                          std::int64_t end, int members,
                                          const std::function<bool(const ParamSlot&)>& accepts_cut) {
  OASES_ASSERT(members >= 1 && 0 <= begin && begin <= end && end <= layout.total_numel,
               "partition of [{}, {}) into {} blocks (flat array of {})", begin, end, members,
               layout.total_numel);
  const std::int64_t block = (end - begin + members - 1) / members;
  std::vector<std::int64_t> cuts{begin};
  for (int i = 1; i < members; ++i) {
    std::int64_t cut = std::min(end, begin + i * block);
    if (cut > begin && cut < end) {
      for_each_param_slice(layout, cut, cut + 1, [&](std::size_t index, std::int64_t, std::int64_t) {
        const ParamSlot& p = layout.params[index];
        if (cut == p.offset || accepts_cut(p)) return;
        cut = cut - p.offset < p.end() - cut ? p.offset : p.end();
      });
    }
    cuts.push_back(std::clamp(cut, cuts.back(), end));
  }
  cuts.push_back(end);
  return cuts;
}

FlatLayout owned_layout(const FlatLayout& whole, const std::vector<OwnedRange>& owned) {
  FlatLayout layout;
  layout.dtype = whole.dtype;
  layout.total_numel = whole.total_numel;
  std::int64_t previous_end = 0;
  for (const OwnedRange& range : owned) {
    OASES_ASSERT(previous_end <= range.begin && range.begin <= range.end,
                 "owned ranges must ascend without overlap: [{}, {}) after {}", range.begin,
                 range.end, previous_end);
    previous_end = range.end;
    if (range.begin == range.end) continue;
    for_each_param_slice(whole, range.begin, range.end,
                         [&](std::size_t index, std::int64_t lo, std::int64_t hi) {
                           const ParamSlot& p = whole.params[index];
                           if (lo == p.offset && hi == p.end()) {
                             layout.params.push_back(p);
                             return;
                           }
                           ParamSlot part{p.name, lo, {hi - lo}, p.weight_decay};
                           const std::int64_t padding_begin = p.end() - p.padding;
                           part.padding = std::max<std::int64_t>(0, hi - std::max(lo, padding_begin));
                           layout.params.push_back(std::move(part));
                         });
  }
  validate_layout(layout);
  return layout;
}

}  // namespace oases::optim
