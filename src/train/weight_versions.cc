#include "train/weight_versions.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cstddef>

namespace oases::train {

WeightVersions::WeightVersions(const Tensor& model_params, std::int64_t newest,
                               std::vector<Range> held)
    : model_(model_params),
      other_(model_params.nbytes()),
      other_view_(other_.tensor(model_params.dtype(), model_params.shape())),
      held_(std::move(held)),
      newest_(newest),
      in_model_(newest) {
  OASES_ASSERT(model_params.device().is_cpu(), "weight versions are swapped in host memory");
  for (const auto& [begin, end] : held_)
    OASES_ASSERT(0 <= begin && begin <= end && end <= model_params.numel(),
                 "held range [{}, {}) outside the {} parameters", begin, end,
                 model_params.numel());
  for_each_held([&](std::int64_t begin, std::int64_t end) {
    kernels::copy(model_.view(begin, {end - begin}), other_view_.view(begin, {end - begin}));
  });
}

template <class Visit>
void WeightVersions::for_each_held(Visit&& visit) const {
  if (held_.empty()) {
    visit(std::int64_t{0}, model_.numel());
    return;
  }
  for (const auto& [begin, end] : held_)
    if (end > begin) visit(begin, end);
}

void WeightVersions::use(std::int64_t version) {
  OASES_ASSERT(version == newest_ || version == newest_ - 1,
               "weights W({}) asked for, but only W({}) and W({}) are kept", version, newest_,
               newest_ - 1);
  if (version == in_model_) return;
  const std::size_t element = dtype_size(model_.dtype());
  for_each_held([&](std::int64_t begin, std::int64_t end) {
    auto* a = static_cast<std::byte*>(model_.raw()) + static_cast<std::size_t>(begin) * element;
    auto* b = static_cast<std::byte*>(other_view_.raw()) + static_cast<std::size_t>(begin) * element;
    std::swap_ranges(a, a + static_cast<std::size_t>(end - begin) * element, b);
  });
  in_model_ = version;
}

void WeightVersions::begin_update() {
  use(newest_);
  for_each_held([&](std::int64_t begin, std::int64_t end) {
    kernels::copy(model_.view(begin, {end - begin}), other_view_.view(begin, {end - begin}));
  });
  ++newest_;
  in_model_ = newest_;
}

void WeightVersions::set_older(const Tensor& values) {
  OASES_ASSERT(in_model_ == newest_, "the model's buffer does not hold the newest weights");
  OASES_ASSERT(values.numel() == model_.numel(), "{} stashed values for {} parameters",
               values.numel(), model_.numel());
  for_each_held([&](std::int64_t begin, std::int64_t end) {
    kernels::copy(values.view(begin, {end - begin}), other_view_.view(begin, {end - begin}));
  });
}

void WeightVersions::release_others() {
  if (held_.empty()) return;
  std::vector<Range> held = held_;
  std::ranges::sort(held);
  const std::size_t element = dtype_size(model_.dtype());
  std::int64_t at = 0;
  const auto release = [&](std::int64_t begin, std::int64_t end) {
    if (end > begin)
      other_.release(static_cast<std::size_t>(begin) * element,
                     static_cast<std::size_t>(end - begin) * element);
  };
  for (const auto& [begin, end] : held) {
    release(at, begin);
    at = std::max(at, end);
  }
  release(at, model_.numel());
}

}  // namespace oases::train
