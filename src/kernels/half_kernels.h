// The bf16 and f16 implementations of the functions of kernels/kernels.h, which forwards to
// them when a call's leading tensor holds a 16-bit type. Callers use kernels.h; its comments
// state the dtype rules, repeated here:
//
//  - Operands (activations, their gradients, parameters read in the call) share the call's
//    16-bit type H.
//  - Statistics and losses are f32: LayerNorm mean and rstd, RMSNorm rstd, attention lse,
//    cross-entropy losses and its row max / sum of exponentials / target logit.
//  - Parameters and parameter-gradient accumulators (gamma, beta, weight, bias; dw, db, dgamma,
//    dbeta, dweight, dwte, dwpe, dtable, dbias) may be H or f32 (fp32 master gradients). A
//    16-bit accumulator receives each call's contribution formed in f32 with one rounding per
//    element per call; an f32 one loses nothing.
//  - linear_forward's y and linear_backward's dx may be H or f32.
//
// Inside, every kernel computes in f32: its 16-bit inputs are widened (exactly) into f32
// scratch, the f32 kernel of kernels/cpu runs (so formulas, masks, determinism and thread-count
// independence are those of the f32 kernels), and the outputs are rounded once to H. The
// scratch comes from a per-thread pool that keeps its buffers from call to call (fresh
// allocations of activation-sized scratch page-fault on every call; half_kernels.cc says why
// the pool is per thread); the cost is one extra pass over the operands. Embedding forward
// reads the table rows it needs directly, and cross-entropy widens blocks of rows. Matrix
// products (linear_*) keep their scratch in the workspace their Gemm16Paths carries.
#pragma once

#include "core/tensor.h"
#include "kernels/kernels.h"

namespace oases::kernels::half {

bool is_half(DType t);  // bf16 or f16

void linear_forward(const Tensor& x, const Tensor& w, WeightLayout layout, const Tensor& bias,
                    const Tensor& y, bool accumulate, const Gemm16Paths& paths);
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, WeightLayout layout,
                     const Tensor& dx, bool accumulate_dx, const Tensor& dw, const Tensor& db,
                     const Gemm16Paths& paths);

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, double eps);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta);
void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd,
                     double eps);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight);

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                       const AttentionShape& shape, const AttentionDropout& dropout);
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, const AttentionShape& shape,
                        const AttentionDropout& dropout);
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part_out,
                     const Tensor& part_lse, const AttentionShape& shape);

void rotary_tables(std::int64_t seq, std::span<const double> inv_freq, const Tensor& cos,
                   const Tensor& sin);
void rotary_apply(const Tensor& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, const Tensor& cos, const Tensor& sin, bool inverse);

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                     const Tensor& dup);
void gelu_forward(const Tensor& x, const Tensor& y, GeluForm form);
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, GeluForm form);

void dropout_apply(const Tensor& x, const Tensor& y, std::int64_t batch, std::int64_t seq, double p,
                   const DropoutSite& site, const DropoutSlice& slice);
void bias_dropout_add_forward(const Tensor& x, const Tensor& bias, const Tensor& residual,
                              const Tensor& out, std::int64_t batch, std::int64_t seq, double p,
                              const DropoutSite& site, const DropoutSlice& slice);
void bias_dropout_add_backward(const Tensor& dout, const Tensor& dx, const Tensor& dbias,
                               std::int64_t batch, std::int64_t seq, double p,
                               const DropoutSite& site, const DropoutSlice& slice);
void add(const Tensor& a, const Tensor& b, const Tensor& out);

void embedding_forward(const std::int32_t* tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out, std::int64_t batch, std::int64_t seq,
                       const VocabRange& range);
void embedding_backward(const Tensor& dout, const std::int32_t* tokens, const Tensor& dwte,
                        const Tensor& dwpe, std::int64_t batch, std::int64_t seq,
                        const VocabRange& range);
void embedding_accumulate(const std::int32_t* ids, const Tensor& table, const Tensor& out,
                          std::int64_t batch, std::int64_t seq);
void embedding_accumulate_backward(const Tensor& dout, const std::int32_t* ids,
                                   const Tensor& dtable, std::int64_t batch, std::int64_t seq);

void cross_entropy_forward(const Tensor& logits, std::int64_t vocab, const std::int32_t* targets,
                           const Tensor& losses);
void cross_entropy_forward_backward(const Tensor& logits, std::int64_t vocab,
                                    const std::int32_t* targets, const Tensor& losses,
                                    double grad_scale);
void cross_entropy_shard_max(const Tensor& logits, std::int64_t vocab, const Tensor& row_max);
void cross_entropy_shard_sums(const Tensor& logits, std::int64_t vocab, const std::int32_t* targets,
                              std::int64_t vocab_begin, const Tensor& row_max,
                              const Tensor& sum_exp, const Tensor& target_logit);
void cross_entropy_shard_finish(const Tensor& logits, std::int64_t vocab,
                                const std::int32_t* targets, std::int64_t vocab_begin,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, double grad_scale, const Tensor& losses,
                                bool gradient);

double sum(const Tensor& x);
double sum_of_squares(const Tensor& x);
void scale(const Tensor& x, double factor);

}  // namespace oases::kernels::half
