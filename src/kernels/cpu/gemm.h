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

// How a linear layer's weight matrix is stored.
enum class WeightLayout {
  in_out,  // [in, out]: GPT-2's Conv1D (y = x @ w)
  out_in,  // [out, in]: torch.nn.Linear (y = x @ w^T), as LLaMA and BERT checkpoints store it
};

// Affine map over strided rows:
//   y[n, out] = x[n, in] @ W + b[out]        (accumulate = false: y overwritten)
//   y[n, out] += x[n, in] @ W + b[out]       (accumulate = true)
// with W the [in, out] matrix that w holds in `layout` and b null for no bias. x rows at stride
// ldx >= in, y rows at stride ldy >= out; y's columns past `out` are not touched. The bias is
// added into y before the product (as torch.addmm(b, x, w), which GPT-2's Conv1D calls).
// y must not overlap x, w or b.
// (Nullable pointers are written std::type_identity_t<T>* so that T is deduced from the other
// arguments and a bare nullptr can be passed; the function type is still plain const T*/T*.)
template <class T>
void linear_forward(const T* x, std::int64_t ldx, const T* w, WeightLayout layout,
                    const std::type_identity_t<T>* b, T* y, std::int64_t ldy, std::int64_t n,
                    std::int64_t in, std::int64_t out, bool accumulate = false);

// Gradients of linear_forward (W as above):
//   dx[n, in]  = dy @ W^T   (overwritten, or added onto dx when accumulate_dx; skipped when dx
//                            is null; rows at stride lddx >= in)
//   dw        += the gradient of w in its own layout: x^T @ dy ([in, out]) or dy^T @ x
//                ([out, in]); accumulated (gradients sum over micro-batches); required, and
//                contiguous
//   db[out]   += sum_n dy    (accumulated; skipped when db is null). The sum over rows is formed
//                             in double in row order, whatever the thread count.
// dy rows at stride lddy >= out, x rows at stride ldx >= in. dx must not overlap the inputs.
template <class T>
void linear_backward(const T* dy, std::int64_t lddy, const T* x, std::int64_t ldx, const T* w,
                     WeightLayout layout, std::type_identity_t<T>* dx, std::int64_t lddx,
                     bool accumulate_dx, T* dw, std::type_identity_t<T>* db, std::int64_t n,
                     std::int64_t in, std::int64_t out);

// Contiguous rows and the GPT-2 "Conv1D" layout [in, out]:
//   y[n, out] = x[n, in] @ w[in, out] + b[out]       (b may be null: no bias)
template <class T>
void linear_forward(const T* x, const T* w, const std::type_identity_t<T>* b, T* y, std::int64_t n,
                    std::int64_t in, std::int64_t out);

// Gradients of the contiguous [in, out] linear_forward.
//   dx[n, in]    = dy @ w^T       (overwritten; skipped when dx is null)
//   dw[in, out] += x^T @ dy       (accumulated: gradients sum over micro-batches; required)
//   db[out]     += sum_n dy       (accumulated; skipped when db is null). The sum over rows is
//                                  formed in double in row order, whatever the thread count.
template <class T>
void linear_backward(const T* dy, const T* x, const T* w, std::type_identity_t<T>* dx, T* dw,
                     std::type_identity_t<T>* db, std::int64_t n, std::int64_t in,
                     std::int64_t out);

}  // namespace oases::kernels::cpu
