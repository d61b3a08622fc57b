// The measured peak of this machine for fp32 matrix products: the denominator of MFU.
#pragma once

namespace oases::kernels::cpu {

// Best FLOP/s of square sgemm of size n over repeated runs lasting about `seconds` in total,
// using the current OpenMP/BLAS thread count.
double measure_sgemm_flops(long n = 2048, double seconds = 1.0);

}  // namespace oases::kernels::cpu
