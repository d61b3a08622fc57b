#include "kernels/cpu/peak_flops.h"

#include "core/buffer.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm16.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <ctime>
#include <memory>
#include <type_traits>

namespace oases::kernels::cpu {
namespace {

struct ProductShape {
  std::int64_t m, k, n;
};

// The products of a small transformer layer on 2048 token rows (x W, dy W^T at hidden 512 and
// width 2048), a square one, and the wide ones of larger layers and of a vocabulary head, whose
// long rows BLAS runs fastest: a peak below the rate a model's own products reach would put
// MFU above 1.
constexpr std::array<ProductShape, 5> kPeakShapes{{{2048, 512, 2048},
                                                   {2048, 2048, 512},
                                                   {1024, 1024, 1024},
                                                   {2048, 1024, 4096},
                                                   {2048, 512, 8192}}};

// Below this share of the cores during a run, the machine was clearly busy with something
// else and the run's rate is scaled up by the share; above it the wall-clock rate stands (a
// team's threads idle briefly at its end, which is not load).
constexpr double kLoadedShare = 0.75;

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <class T>
void fill(T* out, std::int64_t n, int period, float scale) {
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = T(static_cast<float>(i % period) * scale - 0.5f);
}

template <class T>
ProductPeak measure(DType operands, Gemm16Path path, double seconds) {
  std::int64_t a_elems = 0, b_elems = 0, c_elems = 0;
  for (const ProductShape& s : kPeakShapes) {
    a_elems = std::max(a_elems, s.m * s.k);
    b_elems = std::max(b_elems, s.k * s.n);
    c_elems = std::max(c_elems, s.m * s.n);
  }
  Buffer a(static_cast<std::size_t>(a_elems) * sizeof(T)), b(static_cast<std::size_t>(b_elems) * sizeof(T));
  Buffer c(static_cast<std::size_t>(c_elems) * sizeof(T));
  fill(a.as<T>(), a_elems, 7, 0.125f);
  fill(b.as<T>(), b_elems, 5, 0.25f);
  // Reused scratch and primitives, as a model's products have them.
  const std::shared_ptr<Gemm16Workspace> workspace = make_gemm16_workspace();
  const auto product = [&](const ProductShape& s) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      gemm<T>(Trans::no, Trans::no, s.m, s.n, s.k, T(1), a.as<T>(), s.k, b.as<T>(), s.n, T(0),
              c.as<T>(), s.n);
    } else {
      gemm16<T>(path, Trans::no, Trans::no, s.m, s.n, s.k, a.as<T>(), s.k, b.as<T>(), s.n,
                nullptr, false, c.as<T>(), operands, s.n, workspace.get());
    }
  };
  const Stopwatch total;
  for (const ProductShape& s : kPeakShapes) product(s);  // warm-up: threads, pages, JIT
  const double threads = static_cast<double>(omp_get_max_threads());
  ProductPeak peak;
  double best_unloaded = 0, best_scaled = 0;
  ProductPeak scaled;
  const Stopwatch timed;
  do {
    for (const ProductShape& s : kPeakShapes) {
      const double cpu_before = process_cpu_seconds();
      const Stopwatch one;
      product(s);
      const double wall = one.seconds();
      const double share =
          std::min(1.0, (process_cpu_seconds() - cpu_before) / (wall * threads));
      const double rate = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) *
                          static_cast<double>(s.n) / wall;
      ++peak.runs;
      const std::string shape = fmt::format("{}x{}x{}", s.m, s.k, s.n);
      if (share >= kLoadedShare) {
        if (rate > best_unloaded) {
          best_unloaded = rate;
          peak.cpu_share = share;
          peak.shape = shape;
        }
      } else if (rate / share > best_scaled) {
        best_scaled = rate / share;
        scaled.cpu_share = share;
        scaled.shape = shape;
      }
    }
  } while (timed.seconds() < seconds);
  if (best_unloaded > 0) {
    peak.flops_per_s = best_unloaded;
  } else {
    peak.flops_per_s = best_scaled;
    peak.loaded = true;
    peak.cpu_share = scaled.cpu_share;
    peak.shape = scaled.shape;
  }
  peak.seconds = total.seconds();
  return peak;
}

}  // namespace

ProductPeak measure_product_peak(DType operands, Gemm16Path path, double seconds) {
  OASES_ASSERT(seconds > 0, "measure_product_peak: seconds = {}", seconds);
  switch (operands) {
    case DType::f32: return measure<float>(operands, path, seconds);
    case DType::f64: return measure<double>(operands, path, seconds);
    case DType::bf16: return measure<BFloat16>(operands, path, seconds);
    case DType::f16: return measure<Float16>(operands, path, seconds);
    default: break;
  }
  OASES_ASSERT(false, "measure_product_peak: no product of {} operands", dtype_name(operands));
  __builtin_unreachable();
}

double measure_sgemm_flops(long n, double seconds) {
  const auto elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  Buffer a(elems * sizeof(float)), b(elems * sizeof(float)), c(elems * sizeof(float));
  for (std::size_t i = 0; i < elems; ++i) {
    a.as<float>()[i] = static_cast<float>(i % 7) * 0.1f;
    b.as<float>()[i] = static_cast<float>(i % 5) * 0.1f;
  }
  gemm(Trans::no, Trans::no, n, n, n, 1.0f, a.as<float>(), n, b.as<float>(), n, 0.0f,
       c.as<float>(), n);  // warm-up: thread pool start, page faults
  double best = 0;
  const Stopwatch total;
  do {
    const Stopwatch one;
    gemm(Trans::no, Trans::no, n, n, n, 1.0f, a.as<float>(), n, b.as<float>(), n, 0.0f,
         c.as<float>(), n);
    best = std::max(best, 2.0 * static_cast<double>(n) * static_cast<double>(n) *
                              static_cast<double>(n) / one.seconds());
  } while (total.seconds() < seconds);
  return best;
}

}  // namespace oases::kernels::cpu
