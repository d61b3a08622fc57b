#include "kernels/cpu/dropout.h"

#include "core/error.h"
#include "kernels/cpu/column_sums.h"
#include "core/philox.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace oases::kernels::cpu {
namespace {

// Below this many elements the cost of waking the OpenMP team exceeds the work.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 14;

void check_probability(double p) {
  OASES_ASSERT(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got {}", p);
}

void check_shape(std::int64_t B, std::int64_t seq, std::int64_t F, const DropoutSlice& slice) {
  OASES_ASSERT(B >= 0 && seq >= 0 && F >= 0, "dropout: negative size B={} seq={} F={}", B, seq, F);
  OASES_ASSERT(slice.sample_offset >= 0 && slice.feature_offset >= 0 && slice.position_offset >= 0,
               "dropout: negative slice offset (sample {}, feature {}, position {})",
               slice.sample_offset, slice.feature_offset, slice.position_offset);
}

// The keep decision of one site, with the key derived once per call.
class DropoutMask {
 public:
  DropoutMask(const DropoutSite& site, double p)
      : key_(philox_key(site.seed, (std::uint64_t{site.layer} << 32 | site.site) + 1)),
        step_(site.step),
        p_(p) {}

  bool keep(std::int64_t global_sample, std::int64_t position, std::int64_t global_feature) const {
    const PhiloxCounter counter = {static_cast<std::uint32_t>(global_feature),
                                   static_cast<std::uint32_t>(position),
                                   static_cast<std::uint32_t>(global_sample), step_};
    // uniform_open0 is k / 2^24 for an integer k, so the comparison in double is exact.
    return static_cast<double>(uniform_open0(philox4x32(counter, key_)[0])) > p_;
  }

 private:
  PhiloxKey key_;
  std::uint32_t step_;
  double p_;
};

// y = keep ? v * scale : 0 applied row by row; `value(row, f)` supplies v and `store(row, f,
// kept_value)` consumes the result, so the three public kernels share one mask loop.
template <class T, class Value, class Store>
void for_each_masked(std::int64_t B, std::int64_t seq, std::int64_t F, double p,
                     const DropoutSite& site, const DropoutSlice& slice, Threads threads,
                     Value value, Store store) {
  const DropoutMask mask(site, p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const std::int64_t rows = B * seq;
  for_each_index(rows, threads, rows * F >= kMinParallelWork, [&](std::int64_t row) {
    const std::int64_t sample = slice.sample_offset + row / seq;
    const std::int64_t position = slice.position_offset + row % seq;
    for (std::int64_t f = 0; f < F; ++f) {
      const bool kept = mask.keep(sample, position, slice.feature_offset + f);
      store(row, f, kept ? value(row, f) * scale : T(0));
    }
  });
}

}  // namespace

bool dropout_keep(const DropoutSite& site, double p, std::int64_t global_sample,
                  std::int64_t position, std::int64_t global_feature) {
  check_probability(p);
  if (p == 0.0) return true;
  return DropoutMask(site, p).keep(global_sample, position, global_feature);
}

template <class T>
void dropout_apply(const T* x, T* y, std::int64_t B, std::int64_t seq, std::int64_t F, double p,
                   const DropoutSite& site, DropoutSlice slice, Threads threads) {
  check_probability(p);
  check_shape(B, seq, F, slice);
  const std::int64_t n = B * seq * F;
  if (p == 0.0) {
    if (x == y) return;
    for_each_index(n, threads, n >= kMinParallelWork, [&](std::int64_t i) { y[i] = x[i]; });
    return;
  }
  for_each_masked<T>(
      B, seq, F, p, site, slice, threads,
      [x, F](std::int64_t row, std::int64_t f) { return x[row * F + f]; },
      [y, F](std::int64_t row, std::int64_t f, T v) { y[row * F + f] = v; });
}

template <class T>
void bias_dropout_add_forward(const T* x, const std::type_identity_t<T>* bias, const T* residual,
                              T* out, std::int64_t B, std::int64_t seq, std::int64_t F, double p,
                              const DropoutSite& site, DropoutSlice slice, Threads threads) {
  check_probability(p);
  check_shape(B, seq, F, slice);
  const std::int64_t rows = B * seq;
  if (p == 0.0) {
    for_each_index(rows, threads, rows * F >= kMinParallelWork, [&](std::int64_t row) {
      const T* xr = x + row * F;
      const T* rr = residual + row * F;
      T* outr = out + row * F;
      if (bias != nullptr) {
        for (std::int64_t f = 0; f < F; ++f) outr[f] = rr[f] + (xr[f] + bias[f]);
      } else {
        for (std::int64_t f = 0; f < F; ++f) outr[f] = rr[f] + xr[f];
      }
    });
    return;
  }
  for_each_masked<T>(
      B, seq, F, p, site, slice, threads,
      [x, bias, F](std::int64_t row, std::int64_t f) {
        return bias != nullptr ? x[row * F + f] + bias[f] : x[row * F + f];
      },
      [residual, out, F](std::int64_t row, std::int64_t f, T v) {
        out[row * F + f] = residual[row * F + f] + v;
      });
}

template <class T>
void bias_dropout_add_backward(const T* dout, T* dx, std::type_identity_t<T>* dbias, std::int64_t B,
                               std::int64_t seq, std::int64_t F, double p, const DropoutSite& site,
                               DropoutSlice slice) {
  dropout_apply(dout, dx, B, seq, F, p, site, slice);
  if (dbias != nullptr) accumulate_column_sums(dx, B * seq, F, dbias);
}

template <class T>
void add(const T* a, const T* b, T* out, std::int64_t n, Threads threads) {
  OASES_ASSERT(n >= 0, "add: negative size {}", n);
  for_each_index(n, threads, n >= kMinParallelWork, [&](std::int64_t i) { out[i] = a[i] + b[i]; });
}

template void dropout_apply<float>(const float*, float*, std::int64_t, std::int64_t, std::int64_t,
                                   double, const DropoutSite&, DropoutSlice, Threads);
template void dropout_apply<double>(const double*, double*, std::int64_t, std::int64_t,
                                    std::int64_t, double, const DropoutSite&, DropoutSlice,
                                    Threads);
template void bias_dropout_add_forward<float>(const float*, const float*, const float*, float*,
                                              std::int64_t, std::int64_t, std::int64_t, double,
                                              const DropoutSite&, DropoutSlice, Threads);
template void bias_dropout_add_forward<double>(const double*, const double*, const double*, double*,
                                               std::int64_t, std::int64_t, std::int64_t, double,
                                               const DropoutSite&, DropoutSlice, Threads);
template void bias_dropout_add_backward<float>(const float*, float*, float*, std::int64_t,
                                               std::int64_t, std::int64_t, double,
                                               const DropoutSite&, DropoutSlice);
template void bias_dropout_add_backward<double>(const double*, double*, double*, std::int64_t,
                                                std::int64_t, std::int64_t, double,
                                                const DropoutSite&, DropoutSlice);
template void add<float>(const float*, const float*, float*, std::int64_t, Threads);
template void add<double>(const double*, const double*, double*, std::int64_t, Threads);

}  // namespace oases::kernels::cpu
