#include "train/weight_versions.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cstddef>

namespace oases::train {

WeightVersions::WeightVersions(const Tensor& model_params, std::int64_t newest)
    : model_(model_params),
      other_(model_params.nbytes(), model_params.device()),
      other_view_(other_.tensor(model_params.dtype(), model_params.shape())),
      newest_(newest),
      in_model_(newest) {
  OASES_ASSERT(model_params.device().is_cpu(), "weight versions are swapped in host memory");
  kernels::copy(model_, other_view_);
}

void WeightVersions::use(std::int64_t version) {
  OASES_ASSERT(version == newest_ || version == newest_ - 1,
               "weights W({}) asked for, but only W({}) and W({}) are kept", version, newest_,
               newest_ - 1);
  if (version == in_model_) return;
  auto* a = static_cast<std::byte*>(model_.raw());
  auto* b = static_cast<std::byte*>(other_view_.raw());
  std::swap_ranges(a, a + model_.nbytes(), b);
  in_model_ = version;
}

void WeightVersions::begin_update() {
  use(newest_);
  kernels::copy(model_, other_view_);
  ++newest_;
  in_model_ = newest_;
}

void WeightVersions::set_older(const Tensor& values) {
  OASES_ASSERT(in_model_ == newest_, "the model's buffer does not hold the newest weights");
  kernels::copy(values, other_view_);
}

}  // namespace oases::train
