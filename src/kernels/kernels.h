// The kernels of the engine as functions of Tensors, chosen by device and dtype, and the
// process-level services of the devices that run them.
//
// This header is the kernels' only front door: everything outside kernels/ (ops, models,
// optimizers, communicators, the training loop, the CLI) calls these, never a device's kernels
// (kernels/cpu/, a future kernels/cuda/) directly. The test layout.kernel_front_door
// (tests/layout/kernel_includes_test.sh) fails when a file outside kernels/, or this header or
// its type headers, include a device's header. A Tensor carries its dtype and device, and each
// function checks that its arguments agree and forwards to the matching implementation
// (kernels/cpu/ for the CPU, by element type f32 or f64; kernels/half_kernels.h for bf16 and
// f16). A CUDA backend adds its implementations behind these declarations without changing a
// caller. The argument types are device-neutral (kernels/types.h, kernels/dropout_rule.h,
// kernels/gemm16_paths.h). The formulas, layouts, aliasing rules and determinism guarantees
// are those of the CPU kernels named in each comment; shapes are checked here.
//
// Process-level functions (choosing the BLAS kernels at start-up, the host's thread count, the
// peak measurement) live here too rather than in a second header, so that "include
// kernels/kernels.h" stays the whole rule; they take no device-specific types.
//
// Matrices are 2-dimensional views [rows, cols] whose rows may be strided (core/tensor.h);
// unless a comment says otherwise an argument must be contiguous.
//
// Mixed precision (bf16, f16). Every compute kernel below except cached_attention_forward and
// the optimizer updates also runs on 16-bit tensors (core/dtype.h: BFloat16, Float16), chosen
// by the dtype of its leading activation argument (x, dy, qkv, logits, wte, ...). The rules of
// a 16-bit call, type H:
//  - activations, their gradients and the parameters the call reads are H;
//  - statistics and losses are f32: layernorm mean and rstd, rmsnorm rstd, attention lse,
//    cross-entropy losses, row_max, sum_exp and target_logit;
//  - parameters and parameter-gradient accumulators (gamma, beta, weight, bias, dw, db,
//    dgamma, dbeta, dweight, dwte, dwpe, dtable, dbias) may each be H or f32 (fp32 master
//    gradients lose nothing; an H accumulator is rounded once per element per call);
//  - linear_forward's y and linear_backward's dx may be H or f32; rotary tables H or f32.
// Everything is computed in f32 (statistics, softmax, log-sum-exp and losses included) from
// the exactly widened inputs, and each 16-bit output is rounded once (round to nearest even).
// Matrix products accumulate in f32 by the path `paths` names for the format
// (kernels/gemm16_paths.h): choose_gemm16_paths() measures both paths at start-up and returns
// the choice and its reason for the log; keep the returned Gemm16Paths and pass it to every
// linear call.
#pragma once

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/dropout_rule.h"
#include "kernels/gemm16_paths.h"
#include "kernels/types.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace oases::kernels {

// How a linear layer's weight is stored: [in, out] (GPT-2's Conv1D) or [out, in]
// (torch.nn.Linear, LLaMA and BERT).
enum class WeightLayout : std::uint8_t { in_out, out_in };

// y[n, out] = x[n, in] @ W (+ bias[out]); with `accumulate`, y += instead. x and y may be
// strided matrices; bias may be empty (no bias). (cpu/gemm.h)
// 16-bit: x, w H; y and bias H or f32; product by paths.for_dtype(H), bias added in f32.
void linear_forward(const Tensor& x, const Tensor& w, WeightLayout layout, const Tensor& bias,
                    const Tensor& y, bool accumulate = false, const Gemm16Paths& paths = {});

// Gradients of linear_forward: dx[n, in] = dy @ W^T (overwritten, or added with
// accumulate_dx; skipped when dx is empty), dw += x^T @ dy (skipped when empty), db += column
// sums of dy (skipped when empty; formed in double in row order). dy, x and dx may be strided.
// The input gradient (dx alone) and the weight gradient (dw, db) may be formed by two calls,
// with the same results as one. (cpu/gemm.h)
// 16-bit: dy, x, w H; dx, dw, db H or f32 each (db's column sums in double, as in f32).
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, WeightLayout layout,
                     const Tensor& dx, bool accumulate_dx, const Tensor& dw, const Tensor& db,
                     const Gemm16Paths& paths = {});

// LayerNorm over the last dimension of x [n, C]; mean and rstd [n] saved. (cpu/layernorm.h)
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, double eps);
// dx overwritten (no aliasing); dgamma, dbeta accumulated.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta);

// Core attention over a [B * seq, (heads + 2 kv_heads) * head_dim] matrix of q|k|v rows;
// out [B * seq, heads * head_dim], lse [B, heads, seq]. (cpu/attention.h)
// `dropout` drops attention probabilities (kernels/dropout_rule.h has the mask's rule); backward
// must be given the forward's.
struct AttentionShape {
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = true;
};
void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                       const AttentionShape& shape, const AttentionDropout& dropout = {});
// dqkv overwritten, same layout as qkv.
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& dqkv, const AttentionShape& shape,
                        const AttentionDropout& dropout = {});

// Folds partial attention (part_out, part_lse: the same queries over other keys) into
// (out, lse), the layouts of attention_forward for `shape` (its seq: the queries): lse becomes
// log(e^lse + e^part_lse), out the rows mixed by those weights (ring attention; cpu/attention.h).
// 16-bit: out and part_out H, lse f32.
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part_out,
                     const Tensor& part_lse, const AttentionShape& shape);

// Causal attention of `rows` new positions over a key/value cache (cpu/cached_attention.h):
// qkv [rows, >= (heads + 2 kv_heads) * head_dim] (strided rows allowed) holds the new
// positions' q|k|v, at absolute positions past..past + rows - 1; their k and v are written
// into keys, values [kv_heads, capacity, head_dim] at those positions, and out [rows, heads *
// head_dim] (strided rows allowed) receives each new query's attention over positions 0 to
// its own.
void cached_attention_forward(const Tensor& qkv, const Tensor& keys, const Tensor& values,
                              const Tensor& out, std::int64_t past);

// RMSNorm over the last dimension of x [n, C] (LLaMA): y = x * rstd * w, rstd [n] saved.
// (cpu/rmsnorm.h)
void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd,
                     double eps);
// dx overwritten (no aliasing); dweight accumulated.
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight);

// Rotary position embedding, rotate-half pairing (cpu/rotary.h). Tables cos, sin
// [seq, head_dim / 2] of angles t * inv_freq[i] (head_dim / 2 = inv_freq.size()), computed in
// double; rotary_inverse_frequencies gives the plain frequencies theta^(-2i/head_dim).
std::vector<double> rotary_inverse_frequencies(std::int64_t head_dim, double theta);
void rotary_tables(std::int64_t seq, std::span<const double> inv_freq, const Tensor& cos,
                   const Tensor& sin);
// Rotates `heads` heads of width head_dim in place, in every row of x [batch * seq, >= heads *
// head_dim] (a strided column block of the fused q|k|v matrix); row (b, t) at position t.
// inverse = true rotates by -angle: the backward pass.
void rotary_apply(const Tensor& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, const Tensor& cos, const Tensor& sin, bool inverse);

// out [n, F] = silu(gate) * up, gate and up [n, F] (strided column blocks allowed).
// (cpu/swiglu.h)
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
// dgate, dup [n, F] overwritten (no aliasing with the inputs).
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                     const Tensor& dgate, const Tensor& dup);

enum class GeluForm : std::uint8_t { tanh, erf };
// y = gelu(x) elementwise; y may alias x. (cpu/gelu.h)
void gelu_forward(const Tensor& x, const Tensor& y, GeluForm form);
// dx = dy * gelu'(x); dx may alias dy.
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, GeluForm form);

// Dropout of x [B, seq, F] (given as any view of B * seq * F contiguous elements); y may
// alias x. The mask is kernels/dropout_rule.h's. (cpu/dropout.h)
void dropout_apply(const Tensor& x, const Tensor& y, std::int64_t batch, std::int64_t seq,
                   double p, const DropoutSite& site, const DropoutSlice& slice);
// out = residual + dropout(x + bias) over [B, seq, F]; bias and residual may be empty.
void bias_dropout_add_forward(const Tensor& x, const Tensor& bias, const Tensor& residual,
                              const Tensor& out, std::int64_t batch, std::int64_t seq, double p,
                              const DropoutSite& site, const DropoutSlice& slice);
// dx = dropout(dout) (dx may alias dout), dbias += column sums of dx when not empty.
void bias_dropout_add_backward(const Tensor& dout, const Tensor& dx, const Tensor& dbias,
                               std::int64_t batch, std::int64_t seq, double p,
                               const DropoutSite& site, const DropoutSlice& slice);

// out = a + b elementwise (out may alias a or b).
void add(const Tensor& a, const Tensor& b, const Tensor& out);
// dst := src converted to dst's element type (any pair of f64, f32, bf16, f16; 16-bit types
// are storage only: rounded to nearest even, cpu/convert.h). Same element count, contiguous.
void convert(const Tensor& src, const Tensor& dst);
// 8-bit floating point encodings of compressed activations (cpu/convert.h: OCP e4m3,
// saturating at +-448, and e5m2, with infinities; round to nearest even, NaN kept).
enum class Fp8Format : std::uint8_t { e4m3, e5m2 };
// dst (u8) := src (f32, bf16, f16 or f64) encoded. Same element count, contiguous. From f32,
// bf16 and f16 the value is rounded once (widening to f32 is exact); f64 is rounded to f32
// first, so twice, which is harmless next to fp8's 3 or 2 mantissa bits (f64 runs verify, they
// do not compress). Other types pass through f32 in pieces of a fixed buffer: no scratch
// memory in proportion to the tensor.
void encode_fp8(const Tensor& src, const Tensor& dst, Fp8Format format);
// dst (f32, bf16, f16 or f64) := src (u8) decoded; exact (every e4m3 and e5m2 value is a
// value of each of those types). Pieces of a fixed buffer, as encode_fp8.
void decode_fp8(const Tensor& src, const Tensor& dst, Fp8Format format);
// inout := in (op) inout element-wise, for two bf16 or two f16 tensors of one type and element
// count, contiguous, in host memory: the reduction MPI cannot do on 16-bit data itself (the
// communicators' reduction operators call it on the pieces MPI hands them). A sum is formed
// exactly in double and rounded once to the format (the correctly rounded sum of the two);
// max and min keep one operand's bits, a NaN on either side winning. (cpu/convert.h)
void reduce_into(const Tensor& in, const Tensor& inout, Reduction op);

// dst := src, same dtype and element count (contiguous; ranges may not overlap partially).
void copy(const Tensor& src, const Tensor& dst);
// dst := src for matrices of the same shape whose rows may be strided (column blocks of wider
// matrices); they must not overlap.
void copy_matrix(const Tensor& src, const Tensor& dst);
// dst += src for matrices of the same shape whose rows may be strided (column blocks of wider
// matrices); they must not overlap.
void add_matrix(const Tensor& src, const Tensor& dst);
// t := 0
void zero(const Tensor& t);

// Vocab-parallel token embedding plus positions (cpu/embedding.h): out [B * seq, C] =
// wte[tokens - range.begin] (zero rows for tokens outside the range) + wpe[t] (wpe may be
// empty).
void embedding_forward(const std::int32_t* tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out, std::int64_t batch, std::int64_t seq,
                       const VocabRange& range);
// dwte += scatter of dout by token (tokens in range); dwpe += sums over the batch (unless
// empty).
void embedding_backward(const Tensor& dout, const std::int32_t* tokens, const Tensor& dwte,
                        const Tensor& dwpe, std::int64_t batch, std::int64_t seq,
                        const VocabRange& range);

// out[b, t, :] += table[ids[b, t], :] (token types); and its backward dtable += scatter.
void embedding_accumulate(const std::int32_t* ids, const Tensor& table, const Tensor& out,
                          std::int64_t batch, std::int64_t seq);
void embedding_accumulate_backward(const Tensor& dout, const std::int32_t* ids,
                                   const Tensor& dtable, std::int64_t batch, std::int64_t seq);

// Cross-entropy over rows of logits [n, ld] whose first V columns are the vocabulary
// (cpu/cross_entropy.h). losses [n]. A negative target ignores its row (loss 0, zero
// gradient).
void cross_entropy_forward(const Tensor& logits, std::int64_t vocab, const std::int32_t* targets,
                           const Tensor& losses);
// Also overwrites logits with grad_scale * (softmax - onehot) (the gradient of grad_scale *
// sum of losses).
void cross_entropy_forward_backward(const Tensor& logits, std::int64_t vocab,
                                    const std::int32_t* targets, const Tensor& losses,
                                    double grad_scale);
// The vocab-parallel steps; this rank holds columns [vocab_begin, vocab_begin + V) of every
// row (V = `vocab`, the valid local columns; 0 when this rank's rows are all padding: its
// maxima are -inf, its sums 0, and its logits' gradient 0).
void cross_entropy_shard_max(const Tensor& logits, std::int64_t vocab, const Tensor& row_max);
void cross_entropy_shard_sums(const Tensor& logits, std::int64_t vocab,
                              const std::int32_t* targets, std::int64_t vocab_begin,
                              const Tensor& row_max, const Tensor& sum_exp,
                              const Tensor& target_logit);
void cross_entropy_shard_finish(const Tensor& logits, std::int64_t vocab,
                                const std::int32_t* targets, std::int64_t vocab_begin,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, double grad_scale,
                                const Tensor& losses, bool gradient);

// sum of x[i] in double, in index order.
double sum(const Tensor& x);
// sum of x[i]^2 in double, deterministic: independent of the thread count (cpu/optimizer.h).
double sum_of_squares(const Tensor& x);
// x *= factor (rounded to the element type once).
void scale(const Tensor& x, double factor);

// Optimizer updates with PyTorch's formulas in its order of operations (cpu/optimizer.h).
// Tensors of one dtype (f32 or f64) and element count, contiguous; each element's update reads
// only its own values, so a step over several slices gives the bits of one over their union.
// AdamW (torch.optim.AdamW): param, its gradient and its two moments.
void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWStep& step);
// SGD (torch.optim.SGD, dampening 0); momentum_buffer is empty when step.momentum == 0.
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                const SgdStep& step);
// The factor clip_grad_norm_ multiplies gradients by: min(1, max_norm / (total_norm + 1e-6)).
// A NaN total_norm gives NaN (as torch.clamp does), so a non-finite gradient is not hidden.
double clip_coefficient(double total_norm, double max_norm);

// Whether element (global_sample, position, global_feature) survives activation dropout with
// probability p at `site`: kernels/dropout_rule.h's rule evaluated on the host, for code that
// masks rows of host memory itself (the MoE experts' gathered rows). dropout_apply and
// bias_dropout_add_* draw the same mask.
bool dropout_keep(const DropoutSite& site, double p, std::int64_t global_sample,
                  std::int64_t position, std::int64_t global_feature);

// The 16-bit matrix-product paths (kernels/gemm16_paths.h; cpu/gemm16.h measures them).
// Whether `path` can multiply `operands` (DType::bf16 or DType::f16) here.
Gemm16Availability gemm16_available(Gemm16Path path, DType operands);
// The faster available path for one format on a representative product, measured (a few
// hundred ms the first time), with its reason for the log.
Gemm16Choice choose_gemm16_path(DType operands);
// Both formats' choices.
Gemm16PathsChoice choose_gemm16_paths();

// Process set-up and measurement.
//
// The peak of the matrix products in `operands` on `device`: f32 through the tiled sgemm of
// linear layers, f64 through dgemm, bf16 and f16 through `path` (gemm16), each the way the
// model's products run. The best rate over five transformer-like shapes (cpu/peak_flops.h),
// repeated for about `seconds` after a warm-up, at the current thread count;
// robust to a busy machine (ProductPeak::cpu_share). The denominator of MFU (train/peaks.h
// caches it per host). REQUIRES: seconds > 0; for 16-bit operands gemm16_available(path).
// (cpu/peak_flops.h)
ProductPeak measure_product_peak(DType operands, Gemm16Path path, double seconds,
                                 Device device = Device::cpu());
// Best FLOP/s of square f32 matrix products of size n on `device`, over repeated runs lasting
// about `seconds` in total, at the current thread count. (cpu/peak_flops.h)
double measure_peak_flops(std::int64_t n = 2048, double seconds = 1.0,
                          Device device = Device::cpu());
// The host BLAS and oneDNN as a peak measurement depends on them, e.g. "OpenBLAS 0.3.21
// Haswell" and "oneDNN 2.7.3": part of the key under which a measured peak is kept.
std::string blas_description();
std::string onednn_version();
// Call first in main(): when the host BLAS loaded generic kernels on a processor it does not
// recognise (Debian's OpenBLAS 0.3.21 on recent Xeons runs sgemm ~5x slower that way),
// re-executes the program with the same arguments and the best kernel family the processor
// supports (does not return then); otherwise returns. A user's OPENBLAS_CORETYPE is respected.
// (cpu/blas_runtime.h)
void reexec_with_better_blas_kernels(char** argv);
// The host BLAS's kernel family (e.g. "SkylakeX", "Prescott"), for logs and benchmark records.
std::string blas_kernels_name();
// The number of threads the host kernels share their work among (OpenMP; BLAS calls run one
// per thread inside it, cpu/gemm.h). Results do not depend on it. REQUIRES: threads >= 1.
void set_host_threads(int threads);

}  // namespace oases::kernels
