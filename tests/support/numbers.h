// Comparing numbers in tests: a tensor's values as doubles, and the relative L2 difference
// that equivalence tests hold to a tolerance (kFp64Tolerance in fp64).
#pragma once

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/kernels.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace oases::testing {

// The values of a contiguous tensor of any floating-point dtype, as doubles.
inline std::vector<double> values(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  kernels::convert(t, Tensor::of(out.data(), {t.numel()}));
  return out;
}

// ||a - b|| / ||b|| (the absolute difference when b is all zeros). REQUIRES: equal sizes.
inline double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// `count` token ids below `vocab` for step `step` and stream `stream` (inputs, targets),
// drawn from Philox under `key`: the same on every rank, so each takes its own rows.
inline std::vector<std::int32_t> philox_tokens(std::int64_t step, std::uint32_t stream,
                                               std::int64_t count, std::uint32_t vocab,
                                               PhiloxKey key) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int32_t>(
        philox4x32({static_cast<std::uint32_t>(i), stream, static_cast<std::uint32_t>(step), 0},
                   key)[0] % vocab);
  return t;
}

}  // namespace oases::testing
