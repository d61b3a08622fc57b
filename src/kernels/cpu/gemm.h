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
//
// Independent of the thread count: C is cut into a grid of tiles that depends on M and N alone
// (detail::gemm_tiles) and each tile is one single-threaded BLAS call over the whole of K, the
// tiles shared among the OpenMP threads. OpenBLAS's own threading is not used: it does not
// split K, but its results still change with its thread count (its threaded driver cuts K
// into blocks differently from its serial one, and its row/column split moves elements
// between full and edge micro-kernel tiles). The bits depend on the BLAS kernels, i.e. the
// processor, never on how many threads run. REQUIRES: OpenBLAS's OpenMP or sequential build,
// which runs a call on the calling thread alone inside an active parallel region or when
// omp_get_max_threads() is 1 (its pthreads build would thread each tile by its own count).
template <class T>
void gemm(Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
          const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C,
          std::int64_t ldc);

// The same product as one BLAS call on the calling thread alone, whatever the thread count
// (no tiles, no threads): for kernels that share their own tasks among threads and multiply
// small tiles inside them (attention). Sizes are not checked beyond BLAS's own; K > 0.
template <class T>
void gemm_on_calling_thread(Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N,
                            std::int64_t K, T alpha, const T* A, std::int64_t lda, const T* B,
                            std::int64_t ldb, T beta, T* C, std::int64_t ldc);

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
//                ([out, in]); accumulated (gradients sum over micro-batches); contiguous;
//                skipped when dw is null (an input-gradient-only pass, whose weight gradient
//                a later call with dx null forms)
//   db[out]   += sum_n dy    (accumulated; skipped when db is null). The sum over rows is formed
//                             in double in row order, whatever the thread count.
// dy rows at stride lddy >= out, x rows at stride ldx >= in. dx must not overlap the inputs.
template <class T>
void linear_backward(const T* dy, std::int64_t lddy, const T* x, std::int64_t ldx, const T* w,
                     WeightLayout layout, std::type_identity_t<T>* dx, std::int64_t lddx,
                     bool accumulate_dx, std::type_identity_t<T>* dw, std::type_identity_t<T>* db,
                     std::int64_t n, std::int64_t in, std::int64_t out);

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

// Tiling of gemm's C: edges are multiples of kGemmTileAlign (whole micro-kernel tiles, except
// at C's own edge), no shorter than kGemmMinTileEdge unless C is, and halved until there are
// kGemmTargetTiles tiles (enough for 16 threads on large products). Each tile packs its own
// rows of op(A) and columns of op(B): on one thread the products of a configs/bench.toml step
// take ~8% more CPU time than whole-matrix calls (11-20% for the layers' products, 0-7% for
// the vocabulary's); on two threads they take 0.9-1.06x the time of OpenBLAS's own threading
// (measured on a busy 2-core Xeon, SkylakeX kernels).
inline constexpr std::int64_t kGemmTileAlign = 64;
inline constexpr std::int64_t kGemmMinTileEdge = 256;
inline constexpr std::int64_t kGemmTargetTiles = 16;

namespace detail {

// Tile edges of gemm's C [M, N]: rows x cols, except the last row and column of tiles.
struct GemmTiles {
  std::int64_t rows, cols;
  std::int64_t count(std::int64_t M, std::int64_t N) const {
    return ((M + rows - 1) / rows) * ((N + cols - 1) / cols);
  }
};
GemmTiles gemm_tiles(std::int64_t M, std::int64_t N);

}  // namespace detail

}  // namespace oases::kernels::cpu
