// The matrix products of the step-benchmark model (configs/bench.toml: GPT, 6 layers, hidden
// 512, ffn 2048, seq 256, micro-batch 8, vocabulary 50304) in fp32 and in bf16 and f16 by each
// 16-bit path (kernels/cpu/gemm16.h: convert+sgemm, oneDNN where it has an optimised kernel),
// timed side by side in one process through kernels::linear_forward / linear_backward, and the
// start-up choice (choose_gemm16_paths) with its reasons. Prints one line per product with its
// time in fp32 and each variant's time as a ratio to fp32 (< 1: faster than fp32), then the
// step's totals (the layers' products times the layer count, plus the LM head), the bf16
// product peak of the chosen bf16 path on a few shapes (GFLOP/s, all threads), the speed of
// the f32 <-> bf16/f16 conversions by each instruction family this CPU has (kernels/cpu/
// convert.h), and the start-up choice.
//
//   gemm16 [--tokens 2048] [--repeats 3] [--no-head]
//
// --tokens sets the rows of every product (micro-batch x seq; 2048 for the benchmark step),
// --repeats the runs of each variant (the best is kept; variants alternate so that all see the
// same load), --no-head leaves out the three vocabulary products (most of the time).
#include "kernels/cpu/gemm16.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "kernels/cpu/blas_runtime.h"
#include "kernels/cpu/convert.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace oases;
using kernels::WeightLayout;

namespace {

struct Product {
  std::string name;
  std::int64_t in, out;
  WeightLayout layout;
  int per_step;  // how many such layers in a step (6 layers; 1 head)
};

enum class Pass { forward, input_grad, weight_grad };
const char* pass_name(Pass p) {
  return p == Pass::forward ? "fwd" : p == Pass::input_grad ? "dx" : "dw";
}

// Operands of one product in one element type, filled with small values.
template <class T>
struct Operands {
  std::vector<T> x, w, y, dy, dx;
  std::vector<float> dw;  // f32 gradient accumulator (as master gradients)
  Operands(std::int64_t n, std::int64_t in, std::int64_t out)
      : x(static_cast<std::size_t>(n * in)),
        w(static_cast<std::size_t>(in * out)),
        y(static_cast<std::size_t>(n * out)),
        dy(static_cast<std::size_t>(n * out)),
        dx(static_cast<std::size_t>(n * in)),
        dw(static_cast<std::size_t>(in * out)) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(static_cast<float>(i % 17) * 0.06f - 0.5f);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = T(static_cast<float>(i % 13) * 0.01f - 0.06f);
    for (std::size_t i = 0; i < dy.size(); ++i)
      dy[i] = T(static_cast<float>(i % 11) * 0.02f - 0.1f);
  }
};

template <class T>
void run(Operands<T>& o, const Product& p, std::int64_t n, Pass pass,
         const kernels::Gemm16Paths& paths) {
  const Tensor x = Tensor::of(o.x.data(), {n, p.in});
  const Tensor w = p.layout == WeightLayout::in_out ? Tensor::of(o.w.data(), {p.in, p.out})
                                                    : Tensor::of(o.w.data(), {p.out, p.in});
  const Tensor dw = p.layout == WeightLayout::in_out ? Tensor::of(o.dw.data(), {p.in, p.out})
                                                     : Tensor::of(o.dw.data(), {p.out, p.in});
  const Tensor dy = Tensor::of(o.dy.data(), {n, p.out});
  switch (pass) {
    case Pass::forward:
      kernels::linear_forward(x, w, p.layout, Tensor(), Tensor::of(o.y.data(), {n, p.out}), false,
                              paths);
      break;
    case Pass::input_grad:
      kernels::linear_backward(dy, x, w, p.layout, Tensor::of(o.dx.data(), {n, p.in}), false,
                               Tensor(), Tensor(), paths);
      break;
    case Pass::weight_grad:
      kernels::linear_backward(dy, x, w, p.layout, Tensor(), false, dw, Tensor(), paths);
      break;
  }
}

// Widening and narrowing of `count` elements (one fc1 activation of the step) by each
// instruction family this CPU has, single-threaded, as multiples of the portable code's speed.
void print_conversion_speeds(std::int64_t count) {
  using kernels::cpu::detail::ConvertIsa;
  namespace detail = kernels::cpu::detail;
  std::vector<float> f(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 1000) * 0.37f - 180.0f;
  std::vector<BFloat16> b(f.size());
  std::vector<Float16> h(f.size());
  const auto best_of = [](const auto& body) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < 4; ++r) {
      const Stopwatch watch;
      body();
      if (r > 0) best = std::min(best, watch.seconds());
    }
    return best;
  };
  double portable[4] = {};
  std::printf("conversions of %lld elements, 1 thread (ms; speed-up over portable):\n",
              static_cast<long long>(count));
  for (ConvertIsa isa :
       {ConvertIsa::portable, ConvertIsa::avx2_f16c, ConvertIsa::avx512, ConvertIsa::avx512_bf16}) {
    if (!detail::convert_isa_supported(isa)) continue;
    const double t[4] = {best_of([&] { detail::narrow_with(isa, f.data(), b.data(), count); }),
                         best_of([&] { detail::widen_with(isa, b.data(), f.data(), count); }),
                         best_of([&] { detail::narrow_with(isa, f.data(), h.data(), count); }),
                         best_of([&] { detail::widen_with(isa, h.data(), f.data(), count); })};
    if (isa == ConvertIsa::portable) std::copy(t, t + 4, portable);
    std::printf(
        "  %-12s f32->bf16 %6.2f (%4.1fx)  bf16->f32 %6.2f (%4.1fx)  f32->f16 %6.2f (%4.1fx)"
        "  f16->f32 %6.2f (%4.1fx)\n",
        detail::convert_isa_name(isa), t[0] * 1e3, portable[0] / t[0], t[1] * 1e3,
        portable[1] / t[1], t[2] * 1e3, portable[2] / t[2], t[3] * 1e3, portable[3] / t[3]);
  }
}

// The bf16 product peak: GFLOP/s of C[M, N] = A[M, K] B[K, N] (bf16 operands, f32 C) by the
// chosen bf16 path at the current thread count, best of `repeats` runs after a warm-up, on
// square-ish shapes around the step's (2048 x 512 x 2048 is the shape oneDNN's own benchmark
// is quoted at). The denominator of the bf16 step's fraction of peak in bench/RESULTS.md.
void print_product_peaks(const kernels::Gemm16Paths& paths, int repeats) {
  struct Shape {
    std::int64_t M, K, N;
  };
  const Shape shapes[] = {
      {2048, 512, 2048}, {2048, 2048, 512}, {2048, 512, 1536}, {2048, 2048, 2048}};
  std::printf("bf16 product peak by %s (GFLOP/s, best of %d):",
              std::string(kernels::gemm16_path_name(paths.bf16)).c_str(), repeats);
  for (const Shape& shape : shapes) {
    std::vector<BFloat16> a(static_cast<std::size_t>(shape.M * shape.K)),
        b(static_cast<std::size_t>(shape.K * shape.N));
    for (std::size_t i = 0; i < a.size(); ++i)
      a[i] = BFloat16(static_cast<float>(i % 17) * 0.06f - 0.5f);
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = BFloat16(static_cast<float>(i % 13) * 0.01f - 0.06f);
    std::vector<float> c(static_cast<std::size_t>(shape.M * shape.N));
    const Tensor at = Tensor::of(a.data(), {shape.M, shape.K});
    const Tensor bt = Tensor::of(b.data(), {shape.K, shape.N});
    const Tensor ct = Tensor::of(c.data(), {shape.M, shape.N});
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats + 1; ++r) {
      const Stopwatch watch;
      kernels::linear_forward(at, bt, WeightLayout::in_out, Tensor(), ct, false, paths);
      if (r > 0) best = std::min(best, watch.seconds());
    }
    const double flops = 2.0 * static_cast<double>(shape.M * shape.K * shape.N);
    std::printf("  %lldx%lldx%lld %.1f", static_cast<long long>(shape.M),
                static_cast<long long>(shape.K), static_cast<long long>(shape.N),
                flops / best * 1e-9);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  kernels::cpu::reexec_with_better_openblas_core(argv);
  std::int64_t n = 2048;
  int repeats = 3;
  bool head = true;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--tokens" && i + 1 < argc)
      n = std::stoll(argv[++i]);
    else if (flag == "--repeats" && i + 1 < argc)
      repeats = std::stoi(argv[++i]);
    else if (flag == "--no-head")
      head = false;
    else {
      std::fprintf(stderr, "usage: gemm16 [--tokens N] [--repeats R] [--no-head]\n");
      return 2;
    }
  }
  try {
    using kernels::Gemm16Path;
    std::printf("OpenBLAS kernels: %s\n", kernels::cpu::openblas_core_name().c_str());
    const kernels::Gemm16PathsChoice choice = kernels::choose_gemm16_paths();
    std::vector<Product> products = {{"qkv", 512, 1536, WeightLayout::in_out, 6},
                                     {"attn-proj", 512, 512, WeightLayout::in_out, 6},
                                     {"fc1", 512, 2048, WeightLayout::in_out, 6},
                                     {"fc2", 2048, 512, WeightLayout::in_out, 6}};
    if (head) products.push_back({"lm-head", 512, 50304, WeightLayout::out_in, 1});

    // The variants: fp32, then each format by each available path.
    struct Variant {
      std::string name;
      DType type;
      Gemm16Path path;
    };
    std::vector<Variant> variants = {{"fp32", DType::f32, Gemm16Path::convert_sgemm}};
    for (DType t : {DType::bf16, DType::f16}) {
      for (Gemm16Path path : {Gemm16Path::convert_sgemm, Gemm16Path::onednn}) {
        const std::string name =
            std::string(dtype_name(t)) + " " + std::string(kernels::gemm16_path_name(path));
        const kernels::Gemm16Availability available = kernels::gemm16_available(path, t);
        if (available.available) {
          variants.push_back({name, t, path});
        } else {
          std::printf("%s: unavailable (%s)\n", name.c_str(), available.detail.c_str());
        }
      }
    }

    std::printf("%-10s %-4s %10s", "product", "pass", "fp32 ms");
    for (std::size_t v = 1; v < variants.size(); ++v)
      std::printf(" %22s", variants[v].name.c_str());
    std::printf("\n");
    std::vector<double> step_totals(variants.size(), 0.0);
    // One workspace for every variant (its entries are per dtype and shape), kept across the
    // repeats as a model keeps its own: the timings are those of a run's steady state.
    const std::shared_ptr<kernels::Gemm16Workspace> workspace = kernels::make_gemm16_workspace();
    for (const Product& p : products) {
      Operands<float> f32(n, p.in, p.out);
      Operands<BFloat16> b16(n, p.in, p.out);
      Operands<Float16> h16(n, p.in, p.out);
      for (Pass pass : {Pass::forward, Pass::input_grad, Pass::weight_grad}) {
        std::vector<double> best(variants.size(), std::numeric_limits<double>::infinity());
        for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up
          for (std::size_t v = 0; v < variants.size(); ++v) {
            const kernels::Gemm16Paths paths{variants[v].path, variants[v].path, workspace};
            const Stopwatch watch;
            if (variants[v].type == DType::f32)
              run(f32, p, n, pass, paths);
            else if (variants[v].type == DType::bf16)
              run(b16, p, n, pass, paths);
            else
              run(h16, p, n, pass, paths);
            if (r > 0) best[v] = std::min(best[v], watch.seconds());
          }
        }
        std::printf("%-10s %-4s %10.2f", p.name.c_str(), pass_name(pass), best[0] * 1e3);
        for (std::size_t v = 1; v < variants.size(); ++v)
          std::printf(" %21.2fx", best[v] / best[0]);
        std::printf("\n");
        for (std::size_t v = 0; v < variants.size(); ++v) step_totals[v] += best[v] * p.per_step;
      }
    }
    std::printf("%-15s %10.1f", "step products", step_totals[0] * 1e3);
    for (std::size_t v = 1; v < variants.size(); ++v)
      std::printf(" %21.2fx", step_totals[v] / step_totals[0]);
    std::printf("   (ms for fp32; ratios to fp32)\n");
    print_product_peaks(choice.paths, repeats);
    print_conversion_speeds(n * 2048);
    std::printf("start-up choice: %s\n", choice.bf16.reason.c_str());
    std::printf("start-up choice: %s\n", choice.f16.reason.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm16: %s\n", e.what());
    return 1;
  }
}
