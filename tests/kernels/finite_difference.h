// Central finite differences in fp64 for checking kernel backward passes.
//
// Pattern: define a scalar loss L(inputs) = sum_i w_i * f(inputs)_i with fixed random weights
// w (so every output element matters), compute the analytic gradient with the kernel's
// backward pass given dout = w, and compare with (L(x + h e_j) - L(x - h e_j)) / 2h.
#pragma once

#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace oases::testing {

// Deterministic values in [lo, hi) from Philox, keyed by (seed, index).
inline std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  std::vector<double> v(n);
  const auto key = philox_key(seed, 0x5eed);
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key);
    v[i] = lo + (hi - lo) * (uniform_open0_f64(r[0], r[1]) - 0.5e-16);
  }
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic[j] against the central difference of loss() in x[j], for every j.
// loss() must read x (captured by reference). Tolerance: |a - n| <= atol + rtol * |n|.
inline void expect_gradient_matches(const std::string& what, std::vector<double>& x,
                                    const std::vector<double>& analytic,
                                    const std::function<double()>& loss, double h = 1e-6,
                                    double rtol = 1e-6, double atol = 1e-8) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double saved = x[j];
    x[j] = saved + h;
    const double up = loss();
    x[j] = saved - h;
    const double down = loss();
    x[j] = saved;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[j], numeric, atol + rtol * std::abs(numeric))
        << what << " element " << j;
  }
}

}  // namespace oases::testing
