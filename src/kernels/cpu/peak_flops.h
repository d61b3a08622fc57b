// The measured peak of this machine's matrix products, per element type and product path: the
// denominator of MFU (kernels.h's measure_product_peak is the front door).
#pragma once

#include "core/dtype.h"
#include "kernels/gemm16_paths.h"

#include <string>

namespace oases::kernels::cpu {

// One measurement: the best sustained rate over a few transformer-like shapes, and how much of
// the cores the measurement had (see measure_product_peak in kernels.h).
struct ProductPeak {
  double flops_per_s = 0;
  double seconds = 0;     // wall time the measurement took
  double cpu_share = 1;   // of the best run: CPU time / (wall time x threads), at most 1
  bool loaded = false;    // no run had the cores to itself: the rate is scaled by cpu_share
  int runs = 0;
  std::string shape;      // of the best run, "MxKxN"
};

// Best FLOP/s of C[M, N] = A[M, K] B[K, N] in `operands` (f32 through the tiled sgemm, f64
// through dgemm, bf16/f16 through gemm16 with `path`) over the shapes 2048x512x2048,
// 2048x2048x512, 1024x1024x1024, 2048x1024x4096 and 2048x512x8192, repeated for about
// `seconds` after a warm-up, at the current thread count. REQUIRES: seconds > 0; for 16-bit operands gemm16_available(path).
ProductPeak measure_product_peak(DType operands, Gemm16Path path, double seconds);

// Best FLOP/s of square sgemm of size n over repeated runs lasting about `seconds` in total,
// using the current OpenMP/BLAS thread count.
double measure_sgemm_flops(long n = 2048, double seconds = 1.0);

}  // namespace oases::kernels::cpu
