// Matrix products of 16-bit operands (bf16 or f16) with fp32 accumulation, by one of two
// paths that compute the same mathematics:
//
//  - convert_sgemm: widen op(A) and op(B) to f32 (exact), multiply with OpenBLAS sgemm through
//    cpu::gemm<float> (tiles, thread-count independent), round the result once into C. Works
//    on every CPU, for both formats.
//  - onednn: oneDNN's matmul primitive (libdnnl, Debian's libdnnl-dev) on the 16-bit operands
//    directly, accumulating in f32 and rounding once into C. Used only where oneDNN has a
//    JIT-compiled kernel for the format on this CPU (bf16 on AVX-512 machines: "gemm:jit",
//    its bf16bf16f32 GEMM kernel, with vdpbf16ps where the CPU has AVX-512 BF16; none on
//    AVX2-only CPUs, and oneDNN 2.6 has none for f16 on any CPU): its reference
//    implementation is never used. C is cut into the same tiles as cpu::gemm and each tile is
//    one single-threaded oneDNN call, so the bits do not depend on the thread count either.
//
// Debian 12's OpenBLAS (0.3.21) is built without sbgemm (no cblas_sbgemm symbol), so there is
// no third, OpenBLAS-native, path.
//
// Which path is faster depends on the CPU; choose_gemm16_paths() measures both on a
// representative shape at start-up and returns the choice with its reason, for the caller to
// keep (in a Gemm16Paths value passed to the kernels; nothing is stored globally) and log.
//
// The two paths sum in different orders, so their last bits differ; one run keeps one path.
//
// Accuracy (either path): with A, B already rounded to the 16-bit format, every product of
// two elements is exact in f32 (8 + 8 or 11 + 11 significant bits < 24, barring underflow
// below f32's normal range) and the sum of K of them carries the f32 accumulation error,
// |error| <= ~K 2^-24 sum_k |a_ik||b_kj| (in practice blocked summation keeps it far below);
// a 16-bit C adds one rounding of the result (relative 2^-8 for bf16, 2^-11 for f16).
#pragma once

#include "core/dtype.h"
#include "kernels/cpu/gemm.h"
#include "kernels/gemm16_paths.h"

#include <cstdint>

namespace oases::kernels::cpu {

// The path names and the choice types (kernels/gemm16_paths.h).
using kernels::gemm16_path_from_name;
using kernels::gemm16_path_name;
using kernels::Gemm16Availability;
using kernels::Gemm16Choice;
using kernels::Gemm16Path;
using kernels::Gemm16Paths;
using kernels::Gemm16PathsChoice;
using kernels::Gemm16Workspace;
using kernels::make_gemm16_workspace;

// Whether `path` can multiply `operands` (DType::bf16 or DType::f16) on this CPU; `detail`
// names the implementation (e.g. "oneDNN brg:avx512_core_bf16") or says why not (e.g. "oneDNN
// has only its reference f16 matmul on this CPU").
Gemm16Availability gemm16_available(Gemm16Path path, DType operands);

// C[M, N] = (accumulate ? C : 0) + bias[N] + op(A)[M, K] op(B)[K, N], with A and B of the
// 16-bit type Half (BFloat16 or Float16) stored as in cpu::gemm (row strides lda, ldb of the
// stored matrices), accumulated in f32. C has element type c_type: DType::f32 or Half's own
// type; rows at stride ldc >= N. bias [N] (f32) may be null. The result is rounded once into
// C. C must not overlap A, B or bias. REQUIRES: gemm16_available(path, Half's type) (checked:
// an InternalError otherwise); M, N, K >= 0.
// `workspace` (kernels/gemm16_paths.h) keeps what a call of this shape needs for the next one:
// the oneDNN path's tile primitives, the convert path's f32 scratch (widened A and B, and the
// f32 accumulator of a 16-bit C). Null: the call builds and frees its own. The bits do not
// depend on it.
template <class Half>
void gemm16(Gemm16Path path, Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N,
            std::int64_t K, const Half* A, std::int64_t lda, const Half* B, std::int64_t ldb,
            const float* bias, bool accumulate, void* C, DType c_type, std::int64_t ldc,
            Gemm16Workspace* workspace = nullptr);

// The start-up choice for one format: the faster available path on a representative product
// (oneDNN only when at least 1.1x faster: the paths differ in the last bits, and a margin keeps
// a config's results from flipping between runs where they are about as fast)
// (x[256, 512] @ W[512, 1024], the shape class of a small transformer's layers; a few ms a
// run), each path timed 7 times alternately on one thread after a warm-up (the best run
// counts; one thread and alternation keep a busy machine from favouring either), with the
// times and a sentence for the log, e.g.
//   "bf16 GEMM: convert+sgemm 1.24x faster than oneDNN on this CPU (oneDNN gemm:jit; CPU:
//    avx512_bf16)"  or  "f16 GEMM: convert+sgemm (oneDNN has no f16 matmul on this CPU; CPU:
//    avx512_bf16)"  (measured on this project's 2-core Xeon VM, whose OpenBLAS SkylakeX sgemm
//    outruns oneDNN 2.6's bf16 kernels at the step-benchmark model's shapes too).
// Takes a few hundred ms the first time (oneDNN compiles its kernels).
Gemm16Choice choose_gemm16_path(DType operands);

Gemm16PathsChoice choose_gemm16_paths();

}  // namespace oases::kernels::cpu
