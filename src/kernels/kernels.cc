#include "kernels/kernels.h"

#include "core/error.h"
#include "core/time_breakdown.h"
#include "kernels/argument_checks.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas_runtime.h"
#include "kernels/cpu/cached_attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm16.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/peak_flops.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rotary.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/half_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

// Each compute function here is a timed section (core/time_breakdown.h): with a TimeBreakdown
// installed on the calling thread it adds its seconds and one call to its category, otherwise
// it costs a pointer test. Categories: products (linear_*), attention (attention_*,
// cached_attention_forward), norms (layernorm_*, rmsnorm_*), head (cross_entropy_*, and what a
// head op calls under a TimeAttributionScope: its vocabulary projection), optimizer
// (adamw_update, sgd_update, and sum_of_squares and scale: the gradient clipping),
// conversions (convert, encode_fp8, decode_fp8, in conversions.cc) and elementwise (the rest).
namespace oases::kernels {
namespace {

// Calls body(T{}) with T the element type of `dtype` (f32 -> float, f64 -> double).
template <class Body>
decltype(auto) by_dtype(DType dtype, const char* what, Body&& body) {
  switch (dtype) {
    case DType::f32: return body(float{});
    case DType::f64: return body(double{});
    default: break;
  }
  OASES_ASSERT(false, "{}: no kernel for {} tensors", what, dtype_name(dtype));
  __builtin_unreachable();
}

// The common dtype of the non-empty tensors, all on the CPU (the only device with kernels in
// this build).
DType common_dtype(const char* what, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t->empty()) continue;
    OASES_ASSERT(t->device().is_cpu(), "{}: no kernel for tensors on {}", what,
                 t->device().str());
    if (first == nullptr) first = t;
    OASES_ASSERT(t->dtype() == first->dtype(), "{}: mixed element types {} and {}", what,
                 dtype_name(first->dtype()), dtype_name(t->dtype()));
  }
  OASES_ASSERT(first != nullptr, "{}: no tensor arguments", what);
  return first->dtype();
}

template <class T>
T* ptr(const Tensor& t) {
  return t.empty() ? nullptr : t.data<T>();
}

using detail::check_contiguous;
using detail::check_matrix;

cpu::WeightLayout cpu_layout(WeightLayout layout) {
  return layout == WeightLayout::in_out ? cpu::WeightLayout::in_out : cpu::WeightLayout::out_in;
}

cpu::AttentionShape cpu_shape(const AttentionShape& s) {
  return {s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, s.causal};
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, WeightLayout layout, const Tensor& bias,
                    const Tensor& y, bool accumulate, const Gemm16Paths& paths) {
  const TimedSection timed(TimeCategory::products);
  if (half::is_half(x.dtype()))
    return half::linear_forward(x, w, layout, bias, y, accumulate, paths);
  const DType dtype = common_dtype("linear_forward", {&x, &w, &bias, &y});
  const std::int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
  check_matrix("linear_forward y", y, n, out);
  check_matrix("linear_forward w", w, layout == WeightLayout::in_out ? in : out,
               layout == WeightLayout::in_out ? out : in);
  check_contiguous("linear_forward", {&w, &bias});
  OASES_ASSERT(bias.empty() || bias.numel() == out, "linear_forward: bias of {} for {} outputs",
               bias.numel(), out);
  by_dtype(dtype, "linear_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::linear_forward<T>(x.data<T>(), x.stride(0), w.data<T>(), cpu_layout(layout), ptr<T>(bias),
                           y.data<T>(), y.stride(0), n, in, out, accumulate);
  });
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, WeightLayout layout,
                     const Tensor& dx, bool accumulate_dx, const Tensor& dw, const Tensor& db,
                     const Gemm16Paths& paths) {
  const TimedSection timed(TimeCategory::products);
  if (half::is_half(dy.dtype()))
    return half::linear_backward(dy, x, w, layout, dx, accumulate_dx, dw, db, paths);
  const DType dtype = common_dtype("linear_backward", {&dy, &x, &w, &dx, &dw, &db});
  const std::int64_t n = x.dim(0), in = x.dim(1), out = dy.dim(1);
  check_matrix("linear_backward dy", dy, n, out);
  if (!dx.empty()) check_matrix("linear_backward dx", dx, n, in);
  check_contiguous("linear_backward", {&w, &dw, &db});
  by_dtype(dtype, "linear_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::linear_backward<T>(dy.data<T>(), dy.stride(0), x.data<T>(), x.stride(0), w.data<T>(),
                            cpu_layout(layout), ptr<T>(dx), dx.empty() ? in : dx.stride(0),
                            accumulate_dx, ptr<T>(dw), ptr<T>(db), n, in, out);
  });
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, double eps) {
  const TimedSection timed(TimeCategory::norms);
  if (half::is_half(x.dtype())) return half::layernorm_forward(x, gamma, beta, y, mean, rstd, eps);
  const DType dtype = common_dtype("layernorm_forward", {&x, &gamma, &beta, &y, &mean, &rstd});
  check_contiguous("layernorm_forward", {&x, &gamma, &beta, &y, &mean, &rstd});
  const std::int64_t C = gamma.numel(), n = x.numel() / C;
  OASES_ASSERT(y.numel() == x.numel() && mean.numel() == n && rstd.numel() == n,
               "layernorm_forward shapes");
  by_dtype(dtype, "layernorm_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::layernorm_forward<T>(x.data<T>(), gamma.data<T>(), beta.data<T>(), y.data<T>(),
                              mean.data<T>(), rstd.data<T>(), n, C, eps);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta) {
  const TimedSection timed(TimeCategory::norms);
  if (half::is_half(dy.dtype()))
    return half::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  const DType dtype =
      common_dtype("layernorm_backward", {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta});
  check_contiguous("layernorm_backward", {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta});
  const std::int64_t C = gamma.numel(), n = x.numel() / C;
  by_dtype(dtype, "layernorm_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::layernorm_backward<T>(dy.data<T>(), x.data<T>(), gamma.data<T>(), mean.data<T>(),
                               rstd.data<T>(), dx.data<T>(), dgamma.data<T>(), dbeta.data<T>(),
                               n, C);
  });
}

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                       const AttentionShape& s, const AttentionDropout& dropout) {
  const TimedSection timed(TimeCategory::attention);
  if (half::is_half(qkv.dtype())) return half::attention_forward(qkv, out, lse, s, dropout);
  const DType dtype = common_dtype("attention_forward", {&qkv, &out, &lse});
  check_contiguous("attention_forward", {&qkv, &out, &lse});
  by_dtype(dtype, "attention_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::attention_forward<T>(qkv.data<T>(), out.data<T>(), lse.data<T>(), cpu_shape(s), dropout);
  });
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& dqkv, const AttentionShape& s,
                        const AttentionDropout& dropout) {
  const TimedSection timed(TimeCategory::attention);
  if (half::is_half(dout.dtype()))
    return half::attention_backward(dout, qkv, out, lse, dqkv, s, dropout);
  const DType dtype = common_dtype("attention_backward", {&dout, &qkv, &out, &lse, &dqkv});
  check_contiguous("attention_backward", {&dout, &qkv, &out, &lse, &dqkv});
  by_dtype(dtype, "attention_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::attention_backward<T>(dout.data<T>(), qkv.data<T>(), out.data<T>(), lse.data<T>(),
                               dqkv.data<T>(), cpu_shape(s), dropout);
  });
}

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part_out,
                     const Tensor& part_lse, const AttentionShape& s) {
  const TimedSection timed(TimeCategory::attention);
  OASES_ASSERT(out.numel() == s.batch * s.seq * s.heads * s.head_dim &&
                   part_out.numel() == out.numel() && lse.numel() == s.batch * s.heads * s.seq &&
                   part_lse.numel() == lse.numel(),
               "attention_merge: out {}, {}; lse {}, {}", out.shape().str(), part_out.shape().str(),
               lse.shape().str(), part_lse.shape().str());
  if (half::is_half(out.dtype())) return half::attention_merge(out, lse, part_out, part_lse, s);
  const DType dtype = common_dtype("attention_merge", {&out, &lse, &part_out, &part_lse});
  check_contiguous("attention_merge", {&out, &lse, &part_out, &part_lse});
  by_dtype(dtype, "attention_merge", [&](auto zero) {
    using T = decltype(zero);
    cpu::attention_merge<T>(out.data<T>(), lse.data<T>(), part_out.data<T>(), part_lse.data<T>(),
                            cpu_shape(s));
  });
}

void cached_attention_forward(const Tensor& qkv, const Tensor& keys, const Tensor& values,
                              const Tensor& out, std::int64_t past) {
  const TimedSection timed(TimeCategory::attention);
  const DType dtype = common_dtype("cached_attention_forward", {&qkv, &keys, &values, &out});
  check_contiguous("cached_attention_forward", {&keys, &values});
  OASES_ASSERT(keys.ndim() == 3 && keys.shape() == values.shape() && qkv.ndim() == 2 &&
                   out.ndim() == 2 && out.dim(0) == qkv.dim(0) && out.dim(1) % keys.dim(2) == 0,
               "cached_attention_forward: qkv {}, cache {} and {}, out {}", qkv.shape().str(),
               keys.shape().str(), values.shape().str(), out.shape().str());
  CachedAttentionShape s;
  s.rows = qkv.dim(0);
  s.past = past;
  s.kv_heads = keys.dim(0);
  s.capacity = keys.dim(1);
  s.head_dim = keys.dim(2);
  s.heads = out.dim(1) / s.head_dim;
  OASES_ASSERT(qkv.dim(1) >= (s.heads + 2 * s.kv_heads) * s.head_dim,
               "cached_attention_forward: qkv {} for {} + 2 x {} heads of {}", qkv.shape().str(),
               s.heads, s.kv_heads, s.head_dim);
  by_dtype(dtype, "cached_attention_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::cached_attention_forward<T>(qkv.data<T>(), qkv.stride(0), keys.data<T>(),
                                     values.data<T>(), out.data<T>(), out.stride(0), s);
  });
}

void gelu_forward(const Tensor& x, const Tensor& y, GeluForm form) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(x.dtype())) return half::gelu_forward(x, y, form);
  const DType dtype = common_dtype("gelu_forward", {&x, &y});
  check_contiguous("gelu_forward", {&x, &y});
  by_dtype(dtype, "gelu_forward", [&](auto zero) {
    using T = decltype(zero);
    if (form == GeluForm::tanh) cpu::gelu_forward<T>(x.data<T>(), y.data<T>(), x.numel());
    else cpu::gelu_erf_forward<T>(x.data<T>(), y.data<T>(), x.numel());
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, GeluForm form) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(x.dtype())) return half::gelu_backward(x, dy, dx, form);
  const DType dtype = common_dtype("gelu_backward", {&x, &dy, &dx});
  check_contiguous("gelu_backward", {&x, &dy, &dx});
  by_dtype(dtype, "gelu_backward", [&](auto zero) {
    using T = decltype(zero);
    if (form == GeluForm::tanh)
      cpu::gelu_backward<T>(x.data<T>(), dy.data<T>(), dx.data<T>(), x.numel());
    else
      cpu::gelu_erf_backward<T>(x.data<T>(), dy.data<T>(), dx.data<T>(), x.numel());
  });
}

void dropout_apply(const Tensor& x, const Tensor& y, std::int64_t batch, std::int64_t seq,
                   double p, const DropoutSite& site, const DropoutSlice& slice) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(x.dtype())) return half::dropout_apply(x, y, batch, seq, p, site, slice);
  const DType dtype = common_dtype("dropout_apply", {&x, &y});
  check_contiguous("dropout_apply", {&x, &y});
  const std::int64_t F = x.numel() / (batch * seq);
  by_dtype(dtype, "dropout_apply", [&](auto zero) {
    using T = decltype(zero);
    cpu::dropout_apply<T>(x.data<T>(), y.data<T>(), batch, seq, F, p, site, slice);
  });
}

void bias_dropout_add_forward(const Tensor& x, const Tensor& bias, const Tensor& residual,
                              const Tensor& out, std::int64_t batch, std::int64_t seq, double p,
                              const DropoutSite& site, const DropoutSlice& slice) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(x.dtype()))
    return half::bias_dropout_add_forward(x, bias, residual, out, batch, seq, p, site, slice);
  const DType dtype = common_dtype("bias_dropout_add_forward", {&x, &bias, &residual, &out});
  check_contiguous("bias_dropout_add_forward", {&x, &bias, &residual, &out});
  OASES_ASSERT(!residual.empty(), "bias_dropout_add_forward needs a residual");
  const std::int64_t F = x.numel() / (batch * seq);
  by_dtype(dtype, "bias_dropout_add_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::bias_dropout_add_forward<T>(x.data<T>(), ptr<T>(bias), residual.data<T>(), out.data<T>(),
                                     batch, seq, F, p, site, slice);
  });
}

void bias_dropout_add_backward(const Tensor& dout, const Tensor& dx, const Tensor& dbias,
                               std::int64_t batch, std::int64_t seq, double p,
                               const DropoutSite& site, const DropoutSlice& slice) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(dout.dtype()))
    return half::bias_dropout_add_backward(dout, dx, dbias, batch, seq, p, site, slice);
  const DType dtype = common_dtype("bias_dropout_add_backward", {&dout, &dx, &dbias});
  check_contiguous("bias_dropout_add_backward", {&dout, &dx, &dbias});
  const std::int64_t F = dout.numel() / (batch * seq);
  by_dtype(dtype, "bias_dropout_add_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::bias_dropout_add_backward<T>(dout.data<T>(), dx.data<T>(), ptr<T>(dbias), batch, seq, F,
                                      p, site, slice);
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(a.dtype())) return half::add(a, b, out);
  const DType dtype = common_dtype("add", {&a, &b, &out});
  check_contiguous("add", {&a, &b, &out});
  OASES_ASSERT(a.numel() == b.numel() && a.numel() == out.numel(), "add: sizes {} {} {}",
               a.numel(), b.numel(), out.numel());
  by_dtype(dtype, "add", [&](auto zero) {
    using T = decltype(zero);
    cpu::add<T>(a.data<T>(), b.data<T>(), out.data<T>(), a.numel());
  });
}

void copy(const Tensor& src, const Tensor& dst) {
  const TimedSection timed(TimeCategory::elementwise);
  common_dtype("copy", {&src, &dst});
  check_contiguous("copy", {&src, &dst});
  OASES_ASSERT(src.numel() == dst.numel(), "copy of {} elements into {}", src.numel(),
               dst.numel());
  if (src.raw() != dst.raw() && src.nbytes() > 0) std::memmove(dst.raw(), src.raw(), src.nbytes());
}

void copy_matrix(const Tensor& src, const Tensor& dst) {
  const TimedSection timed(TimeCategory::elementwise);
  common_dtype("copy_matrix", {&src, &dst});
  OASES_ASSERT(
      src.ndim() == 2 && src.shape() == dst.shape() && src.stride(1) == 1 && dst.stride(1) == 1,
      "copy_matrix of a {}-dimensional [{}, {}] view into [{}, {}]", src.ndim(), src.dim(0),
      src.ndim() > 1 ? src.dim(1) : 0, dst.dim(0), dst.ndim() > 1 ? dst.dim(1) : 0);
  OASES_ASSERT(src.device().is_cpu() && dst.device().is_cpu(),
               "copy_matrix: no kernel for tensors on {}", src.device().str());
  const std::size_t row_bytes = static_cast<std::size_t>(src.dim(1)) * src.element_size();
  const auto* from = static_cast<const std::byte*>(src.raw());
  auto* to = static_cast<std::byte*>(dst.raw());
  const auto from_stride = static_cast<std::size_t>(src.stride(0)) * src.element_size();
  const auto to_stride = static_cast<std::size_t>(dst.stride(0)) * dst.element_size();
  for (std::int64_t r = 0; r < src.dim(0); ++r)
    std::memcpy(to + static_cast<std::size_t>(r) * to_stride,
                from + static_cast<std::size_t>(r) * from_stride, row_bytes);
}

void add_matrix(const Tensor& src, const Tensor& dst) {
  common_dtype("add_matrix", {&src, &dst});
  OASES_ASSERT(
      src.ndim() == 2 && src.shape() == dst.shape() && src.stride(1) == 1 && dst.stride(1) == 1,
      "add_matrix of a {}-dimensional [{}, {}] view into [{}, {}]", src.ndim(), src.dim(0),
      src.ndim() > 1 ? src.dim(1) : 0, dst.dim(0), dst.ndim() > 1 ? dst.dim(1) : 0);
  if (src.is_contiguous() && dst.is_contiguous()) return add(dst, src, dst);
  for (std::int64_t r = 0; r < src.dim(0); ++r) {
    const Tensor to = dst.rows(r, r + 1);
    add(to, src.rows(r, r + 1), to);
  }
}

void zero(const Tensor& t) {
  const TimedSection timed(TimeCategory::elementwise);
  check_contiguous("zero", {&t});
  OASES_ASSERT(t.device().is_cpu(), "zero: no kernel for tensors on {}", t.device().str());
  if (t.nbytes() > 0) std::memset(t.raw(), 0, t.nbytes());
}

void embedding_forward(const std::int32_t* tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out, std::int64_t batch, std::int64_t seq,
                       const VocabRange& range) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(wte.dtype()))
    return half::embedding_forward(tokens, wte, wpe, out, batch, seq, range);
  const DType dtype = common_dtype("embedding_forward", {&wte, &wpe, &out});
  check_contiguous("embedding_forward", {&wte, &wpe, &out});
  const std::int64_t C = out.numel() / (batch * seq);
  by_dtype(dtype, "embedding_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::embedding_forward<T>(tokens, wte.data<T>(), ptr<T>(wpe), out.data<T>(), batch, seq, C,
                              range);
  });
}

void embedding_backward(const Tensor& dout, const std::int32_t* tokens, const Tensor& dwte,
                        const Tensor& dwpe, std::int64_t batch, std::int64_t seq,
                        const VocabRange& range) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(dout.dtype()))
    return half::embedding_backward(dout, tokens, dwte, dwpe, batch, seq, range);
  const DType dtype = common_dtype("embedding_backward", {&dout, &dwte, &dwpe});
  check_contiguous("embedding_backward", {&dout, &dwte, &dwpe});
  const std::int64_t C = dout.numel() / (batch * seq);
  by_dtype(dtype, "embedding_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::embedding_backward<T>(dout.data<T>(), tokens, dwte.data<T>(), ptr<T>(dwpe), batch, seq,
                               C, range);
  });
}

void cross_entropy_forward(const Tensor& logits, std::int64_t vocab, const std::int32_t* targets,
                           const Tensor& losses) {
  const TimedSection timed(TimeCategory::head);
  if (half::is_half(logits.dtype()))
    return half::cross_entropy_forward(logits, vocab, targets, losses);
  const DType dtype = common_dtype("cross_entropy_forward", {&logits, &losses});
  by_dtype(dtype, "cross_entropy_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::cross_entropy_forward<T>(logits.data<T>(), targets, losses.data<T>(), logits.dim(0),
                                  vocab, logits.stride(0));
  });
}

void cross_entropy_forward_backward(const Tensor& logits, std::int64_t vocab,
                                    const std::int32_t* targets, const Tensor& losses,
                                    double grad_scale) {
  const TimedSection timed(TimeCategory::head);
  if (half::is_half(logits.dtype()))
    return half::cross_entropy_forward_backward(logits, vocab, targets, losses, grad_scale);
  const DType dtype = common_dtype("cross_entropy_forward_backward", {&logits, &losses});
  by_dtype(dtype, "cross_entropy_forward_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::cross_entropy_forward_backward<T>(logits.data<T>(), targets, losses.data<T>(),
                                           logits.dim(0), vocab, logits.stride(0),
                                           static_cast<T>(grad_scale));
  });
}

void cross_entropy_shard_max(const Tensor& logits, std::int64_t vocab, const Tensor& row_max) {
  const TimedSection timed(TimeCategory::head);
  if (half::is_half(logits.dtype())) return half::cross_entropy_shard_max(logits, vocab, row_max);
  const DType dtype = common_dtype("cross_entropy_shard_max", {&logits, &row_max});
  by_dtype(dtype, "cross_entropy_shard_max", [&](auto zero) {
    using T = decltype(zero);
    if (vocab == 0) {
      std::fill(row_max.data<T>(), row_max.data<T>() + row_max.numel(),
                -std::numeric_limits<T>::infinity());
      return;
    }
    cpu::cross_entropy_shard_max<T>(logits.data<T>(), logits.dim(0), vocab, logits.stride(0),
                                    row_max.data<T>());
  });
}

void cross_entropy_shard_sums(const Tensor& logits, std::int64_t vocab,
                              const std::int32_t* targets, std::int64_t vocab_begin,
                              const Tensor& row_max, const Tensor& sum_exp,
                              const Tensor& target_logit) {
  const TimedSection timed(TimeCategory::head);
  if (half::is_half(logits.dtype()))
    return half::cross_entropy_shard_sums(logits, vocab, targets, vocab_begin, row_max, sum_exp,
                                          target_logit);
  const DType dtype =
      common_dtype("cross_entropy_shard_sums", {&logits, &row_max, &sum_exp, &target_logit});
  by_dtype(dtype, "cross_entropy_shard_sums", [&](auto zero) {
    using T = decltype(zero);
    if (vocab == 0) {
      std::fill(sum_exp.data<T>(), sum_exp.data<T>() + sum_exp.numel(), T(0));
      std::fill(target_logit.data<T>(), target_logit.data<T>() + target_logit.numel(), T(0));
      return;
    }
    cpu::cross_entropy_shard_sums<T>(logits.data<T>(), targets, vocab_begin, row_max.data<T>(),
                                     logits.dim(0), vocab, logits.stride(0), sum_exp.data<T>(),
                                     target_logit.data<T>());
  });
}

void cross_entropy_shard_finish(const Tensor& logits, std::int64_t vocab,
                                const std::int32_t* targets, std::int64_t vocab_begin,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, double grad_scale,
                                const Tensor& losses, bool gradient) {
  const TimedSection timed(TimeCategory::head);
  if (half::is_half(logits.dtype()))
    return half::cross_entropy_shard_finish(logits, vocab, targets, vocab_begin, row_max, sum_exp,
                                            target_logit, grad_scale, losses, gradient);
  const DType dtype = common_dtype("cross_entropy_shard_finish",
                                   {&logits, &row_max, &sum_exp, &target_logit, &losses});
  by_dtype(dtype, "cross_entropy_shard_finish", [&](auto zero) {
    using T = decltype(zero);
    if (vocab == 0) {  // the loss from the group's sums; no logit of this rank is real
      const std::int64_t n = losses.numel();
      for (std::int64_t i = 0; i < n; ++i)
        losses.data<T>()[i] = targets[i] < 0 ? T(0)
                                             : std::log(sum_exp.data<T>()[i]) + row_max.data<T>()[i] -
                                                   target_logit.data<T>()[i];
      if (gradient)
        for (std::int64_t r = 0; r < logits.dim(0); ++r)
          std::fill(logits.data<T>() + r * logits.stride(0),
                    logits.data<T>() + r * logits.stride(0) + logits.dim(1), T(0));
      return;
    }
    cpu::cross_entropy_shard_finish<T>(logits.data<T>(), targets, vocab_begin, row_max.data<T>(),
                                       sum_exp.data<T>(), target_logit.data<T>(), logits.dim(0),
                                       vocab, logits.stride(0), static_cast<T>(grad_scale),
                                       losses.data<T>(), gradient);
  });
}

double sum(const Tensor& x) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(x.dtype())) return half::sum(x);
  const DType dtype = common_dtype("sum", {&x});
  check_contiguous("sum", {&x});
  return by_dtype(dtype, "sum", [&](auto zero) {
    using T = decltype(zero);
    const T* p = x.data<T>();
    double total = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) total += static_cast<double>(p[i]);
    return total;
  });
}

double sum_of_squares(const Tensor& x) {
  const TimedSection timed(TimeCategory::optimizer);
  if (half::is_half(x.dtype())) return half::sum_of_squares(x);
  const DType dtype = common_dtype("sum_of_squares", {&x});
  check_contiguous("sum_of_squares", {&x});
  return by_dtype(dtype, "sum_of_squares", [&](auto zero) {
    using T = decltype(zero);
    return cpu::sum_of_squares<T>(x.data<T>(), x.numel());
  });
}

void scale(const Tensor& x, double factor) {
  const TimedSection timed(TimeCategory::optimizer);
  if (half::is_half(x.dtype())) return half::scale(x, factor);
  const DType dtype = common_dtype("scale", {&x});
  check_contiguous("scale", {&x});
  by_dtype(dtype, "scale", [&](auto zero) {
    using T = decltype(zero);
    cpu::scale_in_place<T>(x.data<T>(), x.numel(), static_cast<T>(factor));
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd,
                     double eps) {
  const TimedSection timed(TimeCategory::norms);
  if (half::is_half(x.dtype())) return half::rmsnorm_forward(x, weight, y, rstd, eps);
  const DType dtype = common_dtype("rmsnorm_forward", {&x, &weight, &y, &rstd});
  check_contiguous("rmsnorm_forward", {&x, &weight, &y, &rstd});
  const std::int64_t C = weight.numel(), n = x.numel() / C;
  OASES_ASSERT(y.numel() == x.numel() && rstd.numel() == n, "rmsnorm_forward shapes");
  by_dtype(dtype, "rmsnorm_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::rmsnorm_forward<T>(x.data<T>(), weight.data<T>(), y.data<T>(), rstd.data<T>(), n, C, eps);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight) {
  const TimedSection timed(TimeCategory::norms);
  if (half::is_half(dy.dtype())) return half::rmsnorm_backward(dy, x, weight, rstd, dx, dweight);
  const DType dtype = common_dtype("rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight});
  check_contiguous("rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight});
  const std::int64_t C = weight.numel(), n = x.numel() / C;
  by_dtype(dtype, "rmsnorm_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::rmsnorm_backward<T>(dy.data<T>(), x.data<T>(), weight.data<T>(), rstd.data<T>(),
                             dx.data<T>(), dweight.data<T>(), n, C);
  });
}

std::vector<double> rotary_inverse_frequencies(std::int64_t head_dim, double theta) {
  return cpu::rotary_inverse_frequencies(head_dim, theta);
}

void rotary_tables(std::int64_t seq, std::span<const double> inv_freq, const Tensor& cos,
                   const Tensor& sin) {
  const TimedSection timed(TimeCategory::elementwise);
  const auto head_dim = static_cast<std::int64_t>(2 * inv_freq.size());
  if (half::is_half(cos.dtype())) return half::rotary_tables(seq, inv_freq, cos, sin);
  const DType dtype = common_dtype("rotary_tables", {&cos, &sin});
  check_contiguous("rotary_tables", {&cos, &sin});
  OASES_ASSERT(cos.numel() == seq * head_dim / 2 && sin.numel() == cos.numel(),
               "rotary_tables: tables of {} for [{}, {}]", cos.numel(), seq, head_dim / 2);
  by_dtype(dtype, "rotary_tables", [&](auto zero) {
    using T = decltype(zero);
    cpu::rotary_tables<T>(seq, inv_freq, cos.data<T>(), sin.data<T>());
  });
}

void rotary_apply(const Tensor& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, const Tensor& cos, const Tensor& sin, bool inverse) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(x.dtype()))
    return half::rotary_apply(x, batch, seq, heads, head_dim, cos, sin, inverse);
  const DType dtype = common_dtype("rotary_apply", {&x, &cos, &sin});
  OASES_ASSERT(x.ndim() == 2 && x.dim(0) == batch * seq && x.dim(1) >= heads * head_dim,
               "rotary_apply: {} for {} rows of {} heads of {}", x.shape().str(), batch * seq,
               heads, head_dim);
  by_dtype(dtype, "rotary_apply", [&](auto zero) {
    using T = decltype(zero);
    cpu::rotary_apply<T>(x.data<T>(), x.stride(0), batch, seq, heads, head_dim, cos.data<T>(),
                         sin.data<T>(), inverse);
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(gate.dtype())) return half::swiglu_forward(gate, up, out);
  const DType dtype = common_dtype("swiglu_forward", {&gate, &up, &out});
  OASES_ASSERT(gate.shape() == up.shape() && gate.shape() == out.shape() &&
                   gate.stride(0) == up.stride(0),
               "swiglu_forward shapes {} {} {}", gate.shape().str(), up.shape().str(),
               out.shape().str());
  by_dtype(dtype, "swiglu_forward", [&](auto zero) {
    using T = decltype(zero);
    cpu::swiglu_forward<T>(gate.data<T>(), up.data<T>(), gate.stride(0), out.data<T>(),
                           out.stride(0), gate.dim(0), gate.dim(1));
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                     const Tensor& dgate, const Tensor& dup) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(gate.dtype())) return half::swiglu_backward(gate, up, dout, dgate, dup);
  const DType dtype = common_dtype("swiglu_backward", {&gate, &up, &dout, &dgate, &dup});
  OASES_ASSERT(gate.stride(0) == up.stride(0) && dgate.stride(0) == dup.stride(0) &&
                   dout.shape() == gate.shape() && dgate.shape() == gate.shape(),
               "swiglu_backward shapes");
  by_dtype(dtype, "swiglu_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::swiglu_backward<T>(gate.data<T>(), up.data<T>(), gate.stride(0), dout.data<T>(),
                            dout.stride(0), dgate.data<T>(), dup.data<T>(), dgate.stride(0),
                            gate.dim(0), gate.dim(1));
  });
}

void embedding_accumulate(const std::int32_t* ids, const Tensor& table, const Tensor& out,
                          std::int64_t batch, std::int64_t seq) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(out.dtype())) return half::embedding_accumulate(ids, table, out, batch, seq);
  const DType dtype = common_dtype("embedding_accumulate", {&table, &out});
  check_contiguous("embedding_accumulate", {&table, &out});
  const std::int64_t C = out.numel() / (batch * seq);
  by_dtype(dtype, "embedding_accumulate", [&](auto zero) {
    using T = decltype(zero);
    cpu::embedding_accumulate<T>(ids, table.data<T>(), out.data<T>(), batch, seq, C);
  });
}

void embedding_accumulate_backward(const Tensor& dout, const std::int32_t* ids,
                                   const Tensor& dtable, std::int64_t batch, std::int64_t seq) {
  const TimedSection timed(TimeCategory::elementwise);
  if (half::is_half(dout.dtype()))
    return half::embedding_accumulate_backward(dout, ids, dtable, batch, seq);
  const DType dtype = common_dtype("embedding_accumulate_backward", {&dout, &dtable});
  check_contiguous("embedding_accumulate_backward", {&dout, &dtable});
  const std::int64_t C = dout.numel() / (batch * seq);
  by_dtype(dtype, "embedding_accumulate_backward", [&](auto zero) {
    using T = decltype(zero);
    cpu::embedding_accumulate_backward<T>(dout.data<T>(), ids, dtable.data<T>(), batch, seq, C);
  });
}

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWStep& step) {
  const TimedSection timed(TimeCategory::optimizer);
  const DType dtype = common_dtype("adamw_update", {&param, &grad, &exp_avg, &exp_avg_sq});
  check_contiguous("adamw_update", {&param, &grad, &exp_avg, &exp_avg_sq});
  const std::int64_t n = param.numel();
  OASES_ASSERT(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n,
               "adamw_update: {} parameters with {} gradients and moments of {} and {}", n,
               grad.numel(), exp_avg.numel(), exp_avg_sq.numel());
  by_dtype(dtype, "adamw_update", [&](auto zero) {
    using T = decltype(zero);
    cpu::adamw_update<T>(param.data<T>(), grad.data<T>(), exp_avg.data<T>(),
                         exp_avg_sq.data<T>(), n, step);
  });
}

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                const SgdStep& step) {
  const TimedSection timed(TimeCategory::optimizer);
  const DType dtype = common_dtype("sgd_update", {&param, &grad, &momentum_buffer});
  check_contiguous("sgd_update", {&param, &grad, &momentum_buffer});
  const std::int64_t n = param.numel();
  OASES_ASSERT(grad.numel() == n, "sgd_update: {} parameters with {} gradients", n, grad.numel());
  OASES_ASSERT(momentum_buffer.empty() ? step.momentum == 0 : momentum_buffer.numel() == n,
               "sgd_update: momentum {} with a buffer of {} for {} parameters", step.momentum,
               momentum_buffer.empty() ? 0 : momentum_buffer.numel(), n);
  by_dtype(dtype, "sgd_update", [&](auto zero) {
    using T = decltype(zero);
    cpu::sgd_update<T>(param.data<T>(), grad.data<T>(), ptr<T>(momentum_buffer), n, step);
  });
}

double clip_coefficient(double total_norm, double max_norm) {
  return cpu::clip_coefficient(total_norm, max_norm);
}

bool dropout_keep(const DropoutSite& site, double p, std::int64_t global_sample,
                  std::int64_t position, std::int64_t global_feature) {
  return cpu::dropout_keep(site, p, global_sample, position, global_feature);
}

Gemm16Availability gemm16_available(Gemm16Path path, DType operands) {
  return cpu::gemm16_available(path, operands);
}

Gemm16Choice choose_gemm16_path(DType operands) { return cpu::choose_gemm16_path(operands); }

Gemm16PathsChoice choose_gemm16_paths() { return cpu::choose_gemm16_paths(); }

ProductPeak measure_product_peak(DType operands, Gemm16Path path, double seconds, Device device) {
  OASES_ASSERT(device.is_cpu(), "measure_product_peak: no kernel for {}", device.str());
  const cpu::ProductPeak p = cpu::measure_product_peak(operands, path, seconds);
  return ProductPeak{p.flops_per_s, p.seconds, p.cpu_share, p.loaded, p.runs, p.shape};
}

double measure_peak_flops(std::int64_t n, double seconds, Device device) {
  OASES_ASSERT(device.is_cpu(), "measure_peak_flops: no kernel for {}", device.str());
  return cpu::measure_sgemm_flops(static_cast<long>(n), seconds);
}

void reexec_with_better_blas_kernels(char** argv) { cpu::reexec_with_better_openblas_core(argv); }

std::string blas_kernels_name() { return cpu::openblas_core_name(); }

std::string blas_description() { return cpu::openblas_description(); }

std::string onednn_version() { return cpu::onednn_version(); }

void set_host_threads(int threads) {
  OASES_ASSERT(threads >= 1, "set_host_threads({})", threads);
  omp_set_num_threads(threads);
}

}  // namespace oases::kernels
