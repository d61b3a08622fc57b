#include "kernels/cpu/peak_flops.h"

#include "core/buffer.h"
#include "core/timer.h"
#include "kernels/cpu/gemm.h"

#include <algorithm>

namespace oases::kernels::cpu {

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
