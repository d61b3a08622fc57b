// Dense matrix products on the CPU through CBLAS (OpenBLAS). Row-major throughout.
// Instantiated for float and double (double is what the finite-difference tests use).
#pragma once

#include <cstdint>
#include <type_traits>

namespace oases::kernels::cpu {

enum class Trans : bool { no = false, yes = true };

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. lda/ldb/ldc are row strides of the
// stored (untransposed) matrices: A is stored [M, K] (or [K, M] when transposed), B [K, N] (or
// [N, K]). As in BLAS, beta = 0 means C is not read.
template <class T>
void gemm(Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
          const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C,
          std::int64_t ldc);

// Affine map with weights in the GPT-2 "Conv1D" layout [in, out]:
//   y[n, out] = x[n, in] @ w[in, out] + b[out]       (b may be null: no bias)
// (Nullable pointers are written std::type_identity_t<T>* so that T is deduced from the other
// arguments and a bare nullptr can be passed; the function type is still plain const T*/T*.)
template <class T>
void linear_forward(const T* x, const T* w, const std::type_identity_t<T>* b, T* y, std::int64_t n,
                    std::int64_t in, std::int64_t out);

// Gradients of linear_forward.
//   dx[n, in]    = dy @ w^T       (overwritten; skipped when dx is null)
//   dw[in, out] += x^T @ dy       (accumulated: gradients sum over micro-batches; required)
//   db[out]     += sum_n dy       (accumulated; skipped when db is null). The sum over rows is
//                                  formed in double in row order, whatever the thread count.
template <class T>
void linear_backward(const T* dy, const T* x, const T* w, std::type_identity_t<T>* dx, T* dw,
                     std::type_identity_t<T>* db, std::int64_t n, std::int64_t in,
                     std::int64_t out);

}  // namespace oases::kernels::cpu
