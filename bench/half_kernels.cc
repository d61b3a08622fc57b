// The step's kernels other than matrix products, in fp32 and in bf16, at the step-benchmark
// shapes (configs/bench*.toml: 2048 tokens, hidden 512, 8 heads of 64; GPT and BERT ffn 2048,
// LLaMA ffn 1376 with 4 kv heads; vocabulary 50304 in chunks of 256 rows), timed side by side in
// one process through kernels/kernels.h. Prints one line per kernel: its fp32 and bf16 times
// (best of the repeats; the precisions alternate so that both see the same load), the ratio
// (> 1: bf16 slower than fp32) and the bf16 call's memory traffic in GB/s (bytes of its 16-bit
// operands read and written, f32 statistics and accumulators included), then the per-step sum
// for each model (calls per step x time per call). Shows which 16-bit kernels pay for their
// conversions and where the bf16 step's time outside the products goes.
//
//   half_kernels [--repeats 5]
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace oases;

namespace {

constexpr std::int64_t kTokens = 2048, kBatch = 8, kSeq = 256, kHidden = 512, kHeads = 8,
                       kHeadDim = 64, kVocab = 50304, kHeadChunk = 256;

// Storage for one tensor of either element type, filled with small values.
struct Buffer {
  std::vector<float> f32;
  std::vector<BFloat16> bf16;
  Buffer(std::int64_t n, float scale) : f32(static_cast<std::size_t>(n)), bf16(f32.size()) {
    for (std::size_t i = 0; i < f32.size(); ++i) {
      f32[i] = scale * (static_cast<float>(i % 97) / 97.0f - 0.5f);
      bf16[i] = BFloat16(f32[i]);
    }
  }
  Tensor view(DType t, Shape shape) {
    return t == DType::f32 ? Tensor::of(f32.data(), std::move(shape))
                           : Tensor::of(bf16.data(), std::move(shape));
  }
};

struct Timing {
  std::string name;
  double f32 = std::numeric_limits<double>::infinity();
  double bf16 = std::numeric_limits<double>::infinity();
  double bf16_bytes = 0;  // memory traffic of the bf16 call
};

// Times body(f32) and body(bf16) alternately, best of `repeats` after one warm-up each.
Timing time_both(const std::string& name, double bf16_bytes, int repeats,
                 const std::function<void(DType)>& body) {
  Timing t{name, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
           bf16_bytes};
  body(DType::f32);
  body(DType::bf16);
  for (int r = 0; r < repeats; ++r) {
    for (DType d : {DType::f32, DType::bf16}) {
      const Stopwatch watch;
      body(d);
      double& best = d == DType::f32 ? t.f32 : t.bf16;
      best = std::min(best, watch.seconds());
    }
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  kernels::reexec_with_better_blas_kernels(argv);
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::max(1, std::atoi(argv[i + 1]));

  const std::int64_t n = kTokens, C = kHidden, F_gpt = 2048, F_llama = 1376;
  std::vector<Timing> rows;
  const double h2 = 2.0;  // bytes of a bf16 element

  {  // GELU on fc1's output [n, 2048]
    Buffer x(n * F_gpt, 4.0f), y(n * F_gpt, 1.0f), dy(n * F_gpt, 1.0f), dx(n * F_gpt, 1.0f);
    rows.push_back(time_both("gelu tanh fwd", h2 * 2 * n * F_gpt, repeats, [&](DType d) {
      kernels::gelu_forward(x.view(d, {n, F_gpt}), y.view(d, {n, F_gpt}), kernels::GeluForm::tanh);
    }));
    rows.push_back(time_both("gelu tanh bwd", h2 * 3 * n * F_gpt, repeats, [&](DType d) {
      kernels::gelu_backward(x.view(d, {n, F_gpt}), dy.view(d, {n, F_gpt}), dx.view(d, {n, F_gpt}),
                             kernels::GeluForm::tanh);
    }));
    rows.push_back(time_both("gelu erf fwd", h2 * 2 * n * F_gpt, repeats, [&](DType d) {
      kernels::gelu_forward(x.view(d, {n, F_gpt}), y.view(d, {n, F_gpt}), kernels::GeluForm::erf);
    }));
    rows.push_back(time_both("gelu erf bwd", h2 * 3 * n * F_gpt, repeats, [&](DType d) {
      kernels::gelu_backward(x.view(d, {n, F_gpt}), dy.view(d, {n, F_gpt}), dx.view(d, {n, F_gpt}),
                             kernels::GeluForm::erf);
    }));
  }
  {  // SwiGLU on the fused gate|up output [n, 2 * 1376]
    const std::int64_t F = F_llama;
    Buffer gu(n * 2 * F, 4.0f), out(n * F, 1.0f), dout(n * F, 1.0f), dgu(n * 2 * F, 1.0f);
    rows.push_back(time_both("swiglu fwd", h2 * 3 * n * F, repeats, [&](DType d) {
      const Tensor both = gu.view(d, {n, 2 * F});
      kernels::swiglu_forward(both.columns(0, F), both.columns(F, 2 * F), out.view(d, {n, F}));
    }));
    rows.push_back(time_both("swiglu bwd", h2 * 5 * n * F, repeats, [&](DType d) {
      const Tensor both = gu.view(d, {n, 2 * F}), dboth = dgu.view(d, {n, 2 * F});
      kernels::swiglu_backward(both.columns(0, F), both.columns(F, 2 * F), dout.view(d, {n, F}),
                               dboth.columns(0, F), dboth.columns(F, 2 * F));
    }));
  }
  {  // rotary on q (8 heads) and k (4 heads) of the fused q|k|v [n, 1024]
    const std::int64_t width = (kHeads + 2 * 4) * kHeadDim;
    Buffer qkv(n * width, 2.0f), cos(kSeq * kHeadDim / 2, 1.0f), sin(kSeq * kHeadDim / 2, 1.0f);
    for (DType d : {DType::f32, DType::bf16})
      kernels::rotary_tables(kSeq, kernels::rotary_inverse_frequencies(kHeadDim, 10000.0),
                             cos.view(d, {kSeq * kHeadDim / 2}),
                             sin.view(d, {kSeq * kHeadDim / 2}));
    rows.push_back(time_both("rotary q+k", h2 * 2 * n * 12 * kHeadDim, repeats, [&](DType d) {
      const Tensor m = qkv.view(d, {n, width});
      const Tensor c = cos.view(d, {kSeq * kHeadDim / 2}), s = sin.view(d, {kSeq * kHeadDim / 2});
      kernels::rotary_apply(m.columns(0, kHeads * kHeadDim), kBatch, kSeq, kHeads, kHeadDim, c, s,
                            false);
      kernels::rotary_apply(m.columns(kHeads * kHeadDim, (kHeads + 4) * kHeadDim), kBatch, kSeq, 4,
                            kHeadDim, c, s, false);
    }));
  }
  {  // residual add, bias-dropout-add (p = 0) [n, C]
    Buffer a(n * C, 1.0f), b(n * C, 1.0f), o(n * C, 1.0f), bias(C, 0.1f);
    Buffer dbias32(C, 0.0f);
    rows.push_back(time_both("add", h2 * 3 * n * C, repeats, [&](DType d) {
      kernels::add(a.view(d, {n, C}), b.view(d, {n, C}), o.view(d, {n, C}));
    }));
    rows.push_back(time_both("bias-dropout-add fwd", h2 * 3 * n * C, repeats, [&](DType d) {
      kernels::bias_dropout_add_forward(a.view(d, {n, C}), bias.view(d, {C}), b.view(d, {n, C}),
                                        o.view(d, {n, C}), kBatch, kSeq, 0.0, {}, {});
    }));
    rows.push_back(time_both("bias-dropout-add bwd", h2 * 2 * n * C, repeats, [&](DType d) {
      kernels::bias_dropout_add_backward(a.view(d, {n, C}), o.view(d, {n, C}),
                                         dbias32.view(DType::f32, {C}), kBatch, kSeq, 0.0, {}, {});
    }));
  }
  {  // norms [n, C]
    Buffer x(n * C, 2.0f), y(n * C, 1.0f), dy(n * C, 1.0f), dx(n * C, 1.0f), g(C, 1.0f),
        beta(C, 0.1f), mean(n, 0.0f), rstd(n, 0.0f), dg(C, 0.0f), db(C, 0.0f);
    rows.push_back(time_both("layernorm fwd", h2 * 2 * n * C, repeats, [&](DType d) {
      kernels::layernorm_forward(x.view(d, {n, C}), g.view(DType::f32, {C}),
                                 beta.view(DType::f32, {C}), y.view(d, {n, C}),
                                 mean.view(DType::f32, {n}), rstd.view(DType::f32, {n}), 1e-5);
    }));
    rows.push_back(time_both("layernorm bwd", h2 * 3 * n * C, repeats, [&](DType d) {
      kernels::layernorm_backward(dy.view(d, {n, C}), x.view(d, {n, C}), g.view(DType::f32, {C}),
                                  mean.view(DType::f32, {n}), rstd.view(DType::f32, {n}),
                                  dx.view(d, {n, C}), dg.view(DType::f32, {C}),
                                  db.view(DType::f32, {C}));
    }));
    rows.push_back(time_both("rmsnorm fwd", h2 * 2 * n * C, repeats, [&](DType d) {
      kernels::rmsnorm_forward(x.view(d, {n, C}), g.view(DType::f32, {C}), y.view(d, {n, C}),
                               rstd.view(DType::f32, {n}), 1e-5);
    }));
    rows.push_back(time_both("rmsnorm bwd", h2 * 3 * n * C, repeats, [&](DType d) {
      kernels::rmsnorm_backward(dy.view(d, {n, C}), x.view(d, {n, C}), g.view(DType::f32, {C}),
                                rstd.view(DType::f32, {n}), dx.view(d, {n, C}),
                                dg.view(DType::f32, {C}));
    }));
  }
  {  // causal attention, 8 heads of 64 (GPT: q|k|v [n, 1536])
    const std::int64_t width = 3 * C;
    Buffer qkv(n * width, 1.0f), out(n * C, 1.0f), lse(kBatch * kHeads * kSeq, 0.0f),
        dout(n * C, 0.5f), dqkv(n * width, 0.0f);
    const kernels::AttentionShape shape{kBatch, kSeq, kHeads, kHeads, kHeadDim, true};
    rows.push_back(time_both("attention fwd", h2 * (n * width + n * C), repeats, [&](DType d) {
      kernels::attention_forward(qkv.view(d, {n, width}), out.view(d, {n, C}),
                                 lse.view(DType::f32, {kBatch * kHeads * kSeq}), shape);
    }));
    rows.push_back(
        time_both("attention bwd", h2 * (2 * n * width + 2 * n * C), repeats, [&](DType d) {
          kernels::attention_backward(
              dout.view(d, {n, C}), qkv.view(d, {n, width}), out.view(d, {n, C}),
              lse.view(DType::f32, {kBatch * kHeads * kSeq}), dqkv.view(d, {n, width}), shape);
        }));
  }
  {  // the head's cross-entropy on one chunk of logits [256, V]
    Buffer logits(kHeadChunk * kVocab, 8.0f), losses(kHeadChunk, 0.0f);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(kHeadChunk));
    for (std::size_t i = 0; i < targets.size(); ++i)
      targets[i] = static_cast<std::int32_t>((i * 7919) % kVocab);
    rows.push_back(
        time_both("cross-entropy chunk", h2 * 2 * kHeadChunk * kVocab, repeats, [&](DType d) {
          kernels::cross_entropy_forward_backward(
              logits.view(d, {kHeadChunk, kVocab}), kVocab, targets.data(),
              losses.view(DType::f32, {kHeadChunk}), 1.0 / kTokens);
        }));
  }

  std::printf("%-22s %10s %10s %8s %12s\n", "kernel (one call)", "fp32 ms", "bf16 ms", "ratio",
              "bf16 GB/s");
  for (const Timing& t : rows)
    std::printf("%-22s %10.3f %10.3f %7.2fx %12.1f\n", t.name.c_str(), t.f32 * 1e3, t.bf16 * 1e3,
                t.bf16 / t.f32, t.bf16_bytes / t.bf16 / 1e9);
  return 0;
}
