#include "train/zero_partition.h"

#include <algorithm>
#include <memory>

namespace oases::train {

ZeroPartition::ZeroPartition(const std::vector<model::Model::Bucket>& buckets,
                             const optim::FlatLayout& whole,
                             const optim::OptimizerConfig& optimizer,
                             const std::function<GroupPlace(const model::Model::Bucket&)>& place_of) {
  // Where the optimizer may cut a parameter depends on its kind alone: ask one over no
  // parameters.
  const std::unique_ptr<optim::Optimizer> probe =
      optim::make_optimizer(optimizer, optim::FlatLayout{{}, 0, whole.dtype});
  for (const model::Model::Bucket& b : buckets) {
    const GroupPlace place = place_of(b);
    if (place.size <= 1) continue;
    Cut& cut = cut_[b.id];
    cut.block = place.rank;
    cut.cuts = optim::partition_range(whole, b.begin, b.end, place.size,
                                      [&](const optim::ParamSlot& p) { return probe->accepts_cut(p); });
  }
}

std::vector<std::int64_t> ZeroPartition::counts(int bucket) const {
  const std::vector<std::int64_t>& c = cuts(bucket);
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i + 1 < c.size(); ++i) out.push_back(c[i + 1] - c[i]);
  return out;
}

std::vector<int> ZeroPartition::cut_buckets() const {
  std::vector<int> ids;
  for (const auto& [id, cut] : cut_) ids.push_back(id);
  return ids;
}

void ZeroPartition::for_each_owned_range(
    const std::vector<model::Model::Bucket>& buckets,
    const std::function<void(std::int64_t, std::int64_t)>& visit) const {
  for (const model::Model::Bucket& b : buckets) {
    const auto cut = cut_.find(b.id);
    if (cut == cut_.end()) {
      visit(b.begin, b.end);
      continue;
    }
    const auto block = static_cast<std::size_t>(cut->second.block);
    visit(cut->second.cuts[block], cut->second.cuts[block + 1]);
  }
}

void ZeroPartition::for_each_foreign_range(
    const model::Model::Bucket& b, const std::function<void(std::int64_t, std::int64_t)>& visit) const {
  const auto cut = cut_.find(b.id);
  if (cut == cut_.end()) return;
  const auto block = static_cast<std::size_t>(cut->second.block);
  const std::vector<std::int64_t>& c = cut->second.cuts;
  if (b.begin < c[block]) visit(b.begin, c[block]);
  if (c[block + 1] < b.end) visit(c[block + 1], b.end);
}

std::vector<optim::OwnedRange> ZeroPartition::owned_ranges(
    const std::vector<model::Model::Bucket>& buckets) const {
  std::vector<optim::OwnedRange> owned;
  for_each_owned_range(buckets, [&](std::int64_t begin, std::int64_t end) {
    owned.push_back({begin, end});
  });
  return owned;
}

std::int64_t ZeroPartition::owned_elements(const std::vector<model::Model::Bucket>& buckets) const {
  std::int64_t elements = 0;
  for_each_owned_range(buckets, [&](std::int64_t begin, std::int64_t end) { elements += end - begin; });
  return elements;
}

std::size_t ZeroPartition::peak_gathered_bytes(const schedule::Schedule& schedule,
                                               const model::Model& model,
                                               std::size_t element) const {
  const auto foreign_bytes = [&](int bucket) {
    std::int64_t elements = 0;
    for_each_foreign_range(model.bucket(bucket),
                           [&](std::int64_t begin, std::int64_t end) { elements += end - begin; });
    return static_cast<std::size_t>(elements) * element;
  };
  std::size_t live = 0, peak = 0;
  for (const schedule::Instruction& ins : schedule) {
    if (ins.op == schedule::Op::gather_params) live += foreign_bytes(ins.bucket);
    if (ins.op == schedule::Op::release_params) live -= foreign_bytes(ins.bucket);
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace oases::train
