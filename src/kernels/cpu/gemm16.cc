#include "kernels/cpu/gemm16.h"

#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/convert.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using dnnl_type = dnnl::memory::data_type;

template <class Half>
constexpr DType half_dtype() {
  return std::is_same_v<Half, BFloat16> ? DType::bf16 : DType::f16;
}

dnnl_type to_dnnl(DType t) {
  switch (t) {
    case DType::bf16:
      return dnnl_type::bf16;
    case DType::f16:
      return dnnl_type::f16;
    case DType::f32:
      return dnnl_type::f32;
    default:
      break;
  }
  OASES_ASSERT(false, "gemm16: no oneDNN type for {}", dtype_name(t));
  __builtin_unreachable();
}

// Runs `body` with the calling thread's OpenMP thread limit at 1 (restored afterwards), so
// that oneDNN plans and runs each call on one thread: its blocking (and hence its summation
// order) then does not depend on the thread count.
template <class Body>
decltype(auto) with_one_omp_thread(Body&& body) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  struct Restore {
    int threads;
    ~Restore() { omp_set_num_threads(threads); }
  } restore{threads};
  return body();
}

// One matmul primitive for tiles of one shape: C[m, n] (+)= op(A)[m, K] op(B)[K, n] + bias.
struct TileMatmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, bias, c;
};

// Descriptors of the tile shapes; nullopt when oneDNN has no implementation, or only its
// reference one (a scalar loop, far slower than convert + sgemm).
std::optional<TileMatmul> make_tile_matmul(const dnnl::engine& engine, DType operands, DType c_type,
                                           Trans trans_a, Trans trans_b, std::int64_t m,
                                           std::int64_t n, std::int64_t K, std::int64_t lda,
                                           std::int64_t ldb, std::int64_t ldc, bool with_bias,
                                           bool accumulate, std::string* impl_name) {
  using dims = dnnl::memory::dims;
  const dnnl_type t = to_dnnl(operands);
  // op(A) [m, K]: stored [m, K] at row stride lda, or [K, m] (transposed) at lda.
  const dnnl::memory::desc a(dims{m, K}, t, trans_a == Trans::no ? dims{lda, 1} : dims{1, lda});
  const dnnl::memory::desc b(dims{K, n}, t, trans_b == Trans::no ? dims{ldb, 1} : dims{1, ldb});
  const dnnl::memory::desc c(dims{m, n}, to_dnnl(c_type), dims{ldc, 1});
  const dnnl::memory::desc bias =
      with_bias ? dnnl::memory::desc(dims{1, n}, dnnl_type::f32, dims{n, 1}) : dnnl::memory::desc();
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  const dnnl::matmul::desc desc(a, b, bias, c);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine, /*allow_empty=*/true);
  if (!pd) {
    if (impl_name != nullptr) *impl_name = "none";
    return std::nullopt;
  }
  const std::string impl = pd.impl_info_str();
  if (impl_name != nullptr) *impl_name = impl;
  if (impl.rfind("ref", 0) == 0) return std::nullopt;
  return TileMatmul{dnnl::matmul(pd), a, b, bias, c};
}

// Everything that selects a oneDNN product's primitives.
struct MatmulKey {
  DType operands, c_type;
  Trans trans_a, trans_b;
  std::int64_t M, N, K, lda, ldb, ldc;
  bool with_bias, accumulate;
  auto tied() const {
    return std::tie(operands, c_type, trans_a, trans_b, M, N, K, lda, ldb, ldc, with_bias,
                    accumulate);
  }
  bool operator<(const MatmulKey& other) const { return tied() < other.tied(); }
};

// The primitives of one product: C's tiles (cpu::gemm's grid) come in at most four shapes,
// full or last row of tiles times full or last column, indexed 2 * last_row + last_col.
struct ProductMatmuls {
  detail::GemmTiles tiles;
  std::int64_t down, across;
  std::array<std::optional<TileMatmul>, 4> kinds;
};

ProductMatmuls make_product_matmuls(const dnnl::engine& engine, const MatmulKey& key) {
  const detail::GemmTiles tiles = detail::gemm_tiles(key.M, key.N);
  ProductMatmuls product{
      tiles, (key.M + tiles.rows - 1) / tiles.rows, (key.N + tiles.cols - 1) / tiles.cols, {}};
  const std::int64_t last_rows = key.M - (product.down - 1) * tiles.rows;
  const std::int64_t last_cols = key.N - (product.across - 1) * tiles.cols;
  with_one_omp_thread([&] {
    for (int last_row = product.down > 1 ? 0 : 1; last_row < 2; ++last_row) {
      for (int last_col = product.across > 1 ? 0 : 1; last_col < 2; ++last_col) {
        const std::int64_t m = last_row ? last_rows : tiles.rows;
        const std::int64_t n = last_col ? last_cols : tiles.cols;
        std::string impl;
        auto& kind = product.kinds[static_cast<std::size_t>(last_row * 2 + last_col)];
        kind = make_tile_matmul(engine, key.operands, key.c_type, key.trans_a, key.trans_b, m, n,
                                key.K, key.lda, key.ldb, key.ldc, key.with_bias, key.accumulate,
                                &impl);
        OASES_ASSERT(kind.has_value(),
                     "gemm16: oneDNN has no optimised {} matmul for [{}, {}] x [{}, {}] "
                     "(implementation: {}); use the convert+sgemm path",
                     dtype_name(key.operands), m, key.K, key.K, n, impl);
      }
    }
  });
  return product;
}

// Uninitialised f32 scratch of a fixed element count (every element is written before it is
// read: no zero-filling pass), lent by a workspace or, without one, owned for one call.
class Scratch {
 public:
  Scratch(Gemm16Workspace* workspace, std::int64_t count);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return data_.get(); }

 private:
  Gemm16Workspace* workspace_;
  std::size_t count_;
  std::unique_ptr<float[]> data_;
};

}  // namespace
}  // namespace oases::kernels::cpu

namespace oases::kernels {

// Shapes a run multiplies are few (a model's layers repeat theirs), so the entries are kept
// for the workspace's life without eviction.
class Gemm16Workspace {
 public:
  // The primitives of the product `key` describes, built on first use. The reference stays
  // valid for the workspace's life (map nodes do not move).
  const cpu::ProductMatmuls& matmuls(const cpu::MatmulKey& key) {
    const std::lock_guard lock(mutex_);
    auto found = matmuls_.find(key);
    if (found == matmuls_.end()) {
      if (!engine_) engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
      found = matmuls_.emplace(key, cpu::make_product_matmuls(engine_, key)).first;
    }
    return found->second;
  }

  const dnnl::engine& engine() {
    const std::lock_guard lock(mutex_);
    if (!engine_) engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
    return engine_;
  }

  // A buffer of exactly `count` floats: a kept one when free, else a new one.
  std::unique_ptr<float[]> take_floats(std::size_t count) {
    {
      const std::lock_guard lock(mutex_);
      const auto found = free_floats_.find(count);
      if (found != free_floats_.end()) {
        std::unique_ptr<float[]> buffer = std::move(found->second);
        free_floats_.erase(found);
        return buffer;
      }
    }
    return std::make_unique_for_overwrite<float[]>(count);
  }

  // Keeps a buffer from take_floats(count) for the next call of that size.
  void give_back_floats(std::size_t count, std::unique_ptr<float[]> buffer) {
    const std::lock_guard lock(mutex_);
    free_floats_.emplace(count, std::move(buffer));
  }

 private:
  std::mutex mutex_;
  dnnl::engine engine_;  // created on the first oneDNN product
  std::map<cpu::MatmulKey, cpu::ProductMatmuls> matmuls_;
  std::multimap<std::size_t, std::unique_ptr<float[]>> free_floats_;
};

std::shared_ptr<Gemm16Workspace> make_gemm16_workspace() {
  return std::make_shared<Gemm16Workspace>();
}

}  // namespace oases::kernels

namespace oases::kernels::cpu {
namespace {

Scratch::Scratch(Gemm16Workspace* workspace, std::int64_t count)
    : workspace_(workspace), count_(static_cast<std::size_t>(std::max<std::int64_t>(count, 1))) {
  data_ = workspace_ != nullptr ? workspace_->take_floats(count_)
                                : std::make_unique_for_overwrite<float[]>(count_);
}

Scratch::~Scratch() {
  if (workspace_ != nullptr) workspace_->give_back_floats(count_, std::move(data_));
}

template <class Half>
void gemm16_onednn(Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                   const Half* A, std::int64_t lda, const Half* B, std::int64_t ldb,
                   const float* bias, bool accumulate, void* C, DType c_type, std::int64_t ldc,
                   Gemm16Workspace* workspace) {
  const MatmulKey key{half_dtype<Half>(), c_type,    trans_a, trans_b, M, N, K, lda, ldb, ldc,
                      bias != nullptr,    accumulate};
  // Without a workspace, the primitives live for this call alone.
  std::optional<dnnl::engine> own_engine;
  std::optional<ProductMatmuls> own_matmuls;
  if (workspace == nullptr) {
    own_engine.emplace(dnnl::engine::kind::cpu, 0);
    own_matmuls.emplace(make_product_matmuls(*own_engine, key));
  }
  const dnnl::engine& engine = workspace != nullptr ? workspace->engine() : *own_engine;
  const ProductMatmuls& product = workspace != nullptr ? workspace->matmuls(key) : *own_matmuls;
  const detail::GemmTiles tiles = product.tiles;
  const std::int64_t down = product.down, across = product.across;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const std::size_t c_size = dtype_size(c_type);
  const std::int64_t count = down * across;
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  // A failed execution cannot throw out of the parallel region: its status is kept and
  // reported after it.
  std::atomic<int> failure{dnnl_success};
  with_one_omp_thread([&] {
#pragma omp parallel num_threads(threads) if (count > 1 && work >= 2e6)
    {
      // One stream per thread for all its tiles (the stream only orders this thread's calls).
      dnnl_stream_t stream = nullptr;
      if (dnnl_stream_create(&stream, engine.get(), dnnl_stream_default_flags) != dnnl_success)
        failure = dnnl_runtime_error;
#pragma omp for schedule(dynamic)
      for (std::int64_t t = 0; t < count; ++t) {
        if (stream == nullptr) continue;
        const std::int64_t ti = t / across, tj = t % across;
        const std::int64_t i0 = ti * tiles.rows, j0 = tj * tiles.cols;
        const TileMatmul& kind = *product.kinds[static_cast<std::size_t>(
            (ti == down - 1 ? 2 : 0) + (tj == across - 1 ? 1 : 0))];
        const Half* a = trans_a == Trans::no ? A + i0 * lda : A + i0;
        const Half* b = trans_b == Trans::no ? B + j0 : B + j0 * ldb;
        void* c = static_cast<char*>(C) + static_cast<std::size_t>(i0 * ldc + j0) * c_size;
        const dnnl::memory::desc* descs[4] = {&kind.a, &kind.b, &kind.c, &kind.bias};
        void* handles[4] = {const_cast<Half*>(a), const_cast<Half*>(b), c,
                            const_cast<float*>(bias != nullptr ? bias + j0 : nullptr)};
        const int roles[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
        const int nargs = bias != nullptr ? 4 : 3;
        // Memory objects are thin wrappers of the caller's pointers; the C interface takes the
        // arguments as an array rather than a per-tile map.
        dnnl_memory_t memories[4] = {nullptr, nullptr, nullptr, nullptr};
        dnnl_exec_arg_t args[4];
        dnnl_status_t status = dnnl_success;
        for (int i = 0; i < nargs && status == dnnl_success; ++i) {
          status = dnnl_memory_create(&memories[i], &descs[i]->data, engine.get(), handles[i]);
          args[i] = {roles[i], memories[i]};
        }
        if (status == dnnl_success)
          status = dnnl_primitive_execute(kind.primitive.get(), stream, nargs, args);
        if (status == dnnl_success) status = dnnl_stream_wait(stream);
        for (dnnl_memory_t memory : memories)
          if (memory != nullptr) dnnl_memory_destroy(memory);
        if (status != dnnl_success) failure = status;
      }
      if (stream != nullptr) dnnl_stream_destroy(stream);
    }
  });
  OASES_ASSERT(failure.load() == dnnl_success, "gemm16: oneDNN matmul failed (status {})",
               failure.load());
}

// Rows x cols of a stored matrix at row stride ld, widened into the contiguous f32 `out`.
template <class Half>
void widen_matrix(const Half* src, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                  float* out) {
  if (ld == cols) {
    widen(src, out, rows * cols);
  } else {
    for (std::int64_t r = 0; r < rows; ++r) widen(src + r * ld, out + r * cols, cols);
  }
}

template <class Half>
void gemm16_convert(Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                    const Half* A, std::int64_t lda, const Half* B, std::int64_t ldb,
                    const float* bias, bool accumulate, void* C, DType c_type, std::int64_t ldc,
                    Gemm16Workspace* workspace) {
  // The stored shapes: A is [M, K] or, transposed, [K, M]; B [K, N] or [N, K].
  const std::int64_t a_rows = trans_a == Trans::no ? M : K, a_cols = trans_a == Trans::no ? K : M;
  const std::int64_t b_rows = trans_b == Trans::no ? K : N, b_cols = trans_b == Trans::no ? N : K;
  const Scratch a(workspace, a_rows * a_cols), b(workspace, b_rows * b_cols);
  widen_matrix(A, a_rows, a_cols, lda, a.get());
  widen_matrix(B, b_rows, b_cols, ldb, b.get());
  // The f32 accumulator: C itself when it is f32, else an f32 copy (widened from C when
  // accumulating; otherwise not read before the product overwrites it).
  std::optional<Scratch> scratch;
  float* c = nullptr;
  std::int64_t ldc32 = ldc;
  if (c_type == DType::f32) {
    c = static_cast<float*>(C);
  } else {
    scratch.emplace(workspace, M * N);
    c = scratch->get();
    ldc32 = N;
    if (accumulate) widen_matrix(static_cast<const Half*>(C), M, N, ldc, c);
  }
  bool c_holds_sum = accumulate;
  if (bias != nullptr) {
    for (std::int64_t i = 0; i < M; ++i) {
      float* row = c + i * ldc32;
      if (c_holds_sum) {
        for (std::int64_t j = 0; j < N; ++j) row[j] += bias[j];
      } else {
        std::memcpy(row, bias, static_cast<std::size_t>(N) * sizeof(float));
      }
    }
    c_holds_sum = true;
  }
  gemm<float>(trans_a, trans_b, M, N, K, 1.0f, a.get(), std::max<std::int64_t>(1, a_cols), b.get(),
              std::max<std::int64_t>(1, b_cols), c_holds_sum ? 1.0f : 0.0f, c, ldc32);
  if (c_type != DType::f32) {
    Half* c16 = static_cast<Half*>(C);
    for (std::int64_t i = 0; i < M; ++i) narrow(c + i * N, c16 + i * ldc, N);
  }
}

}  // namespace

Gemm16Availability gemm16_available(Gemm16Path path, DType operands) {
  OASES_ASSERT(operands == DType::bf16 || operands == DType::f16,
               "gemm16_available: {} is not a 16-bit type", dtype_name(operands));
  if (path == Gemm16Path::convert_sgemm) return {true, "OpenBLAS sgemm on widened operands"};
  // The products linear_forward and linear_backward make, with padded row strides (column
  // blocks of fused matrices): x W (+ bias) and x W^T into a 16-bit y, dy W^T accumulated
  // into a 16-bit dx, x^T dy accumulated into an f32 dw. oneDNN picks its implementation by
  // ISA, types, layout and attributes; the path is available only if every one of these gets
  // an optimised one (so that no later call meets a reference loop).
  struct Case {
    Trans a, b;
    bool bias, accumulate;
    DType c;
  };
  const Case cases[] = {{Trans::no, Trans::no, true, false, operands},
                        {Trans::no, Trans::yes, true, false, operands},
                        {Trans::no, Trans::yes, false, true, operands},
                        {Trans::yes, Trans::no, false, true, DType::f32}};
  std::vector<std::string> impls;
  for (const Case& c : cases) {
    std::string impl;
    const bool ok = with_one_omp_thread([&] {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      return make_tile_matmul(engine, operands, c.c, c.a, c.b, 256, 256, 256, 320, 320, 320, c.bias,
                              c.accumulate, &impl)
          .has_value();
    });
    if (!ok && impl == "none")
      return {false, fmt::format("oneDNN has no {} matmul on this CPU", dtype_name(operands))};
    if (!ok)
      return {false, fmt::format("oneDNN has only its reference {} matmul ({}) on this CPU",
                                 dtype_name(operands), impl)};
    if (std::find(impls.begin(), impls.end(), impl) == impls.end()) impls.push_back(impl);
  }
  return {true, fmt::format("oneDNN {}", fmt::join(impls, ", "))};
}

template <class Half>
void gemm16(Gemm16Path path, Trans trans_a, Trans trans_b, std::int64_t M, std::int64_t N,
            std::int64_t K, const Half* A, std::int64_t lda, const Half* B, std::int64_t ldb,
            const float* bias, bool accumulate, void* C, DType c_type, std::int64_t ldc,
            Gemm16Workspace* workspace) {
  static_assert(std::is_same_v<Half, BFloat16> || std::is_same_v<Half, Float16>);
  OASES_ASSERT(M >= 0 && N >= 0 && K >= 0, "gemm16: negative size M={} N={} K={}", M, N, K);
  OASES_ASSERT(c_type == DType::f32 || c_type == half_dtype<Half>(),
               "gemm16: {} operands with a {} result", dtype_name(half_dtype<Half>()),
               dtype_name(c_type));
  const std::int64_t a_cols = trans_a == Trans::no ? K : M;
  const std::int64_t b_cols = trans_b == Trans::no ? N : K;
  OASES_ASSERT(lda >= std::max<std::int64_t>(1, a_cols) &&
                   ldb >= std::max<std::int64_t>(1, b_cols) && ldc >= std::max<std::int64_t>(1, N),
               "gemm16: row strides lda={} ldb={} ldc={} for M={} N={} K={}", lda, ldb, ldc, M, N,
               K);
  if (M == 0 || N == 0) return;
  // An empty product (or the oneDNN path, which needs K > 0) goes through the convert path,
  // whose sgemm handles K = 0 as BLAS does.
  if (path == Gemm16Path::onednn && K > 0) {
    gemm16_onednn(trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, accumulate, C, c_type, ldc,
                  workspace);
  } else {
    gemm16_convert(trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, accumulate, C, c_type, ldc,
                   workspace);
  }
}

// Timed runs of each path in the start-up choice (each a few ms).
constexpr int kChoiceRuns = 7;

// How much faster oneDNN must be to be chosen over the portable path.
constexpr double kOnednnMargin = 1.1;

template <class Half>
Gemm16Choice choose_for(DType operands) {
  constexpr std::int64_t M = 256, K = 512, N = 1024;
  std::vector<Half> a(static_cast<std::size_t>(M * K)), b(static_cast<std::size_t>(K * N));
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = Half(static_cast<float>(i % 13) * 0.125f - 0.75f);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = Half(static_cast<float>(i % 7) * 0.25f - 0.75f);
  std::vector<float> c(static_cast<std::size_t>(M * N));
  // On one thread: both paths split C into the same tiles among the threads, so their ratio
  // is that of one core, and a single thread's timing is far steadier on a busy machine than
  // a team's (one descheduled thread stalls the whole region).
  // Timed with a workspace, as a run calls them: primitives and scratch from the warm-up on.
  const std::shared_ptr<Gemm16Workspace> workspace = make_gemm16_workspace();
  const auto seconds_of = [&](Gemm16Path path) {
    return with_one_omp_thread([&] {
      const Stopwatch watch;
      gemm16<Half>(path, Trans::no, Trans::no, M, N, K, a.data(), K, b.data(), N, nullptr, false,
                   c.data(), DType::f32, N, workspace.get());
      return watch.seconds();
    });
  };
  Gemm16Choice choice;
  choice.operands = operands;
  const std::string name(dtype_name(operands));
  Gemm16Availability onednn = gemm16_available(Gemm16Path::onednn, operands);
  // The widest vector instructions of this CPU, for the log.
  onednn.detail += fmt::format("; CPU: {}", detail::convert_isa_name(detail::best_convert_isa()));
  if (!onednn.available) {
    seconds_of(Gemm16Path::convert_sgemm);  // warm-up: thread team, pages
    choice.convert_sgemm_seconds = std::numeric_limits<double>::infinity();
    for (int run = 0; run < kChoiceRuns; ++run)
      choice.convert_sgemm_seconds =
          std::min(choice.convert_sgemm_seconds, seconds_of(Gemm16Path::convert_sgemm));
    choice.path = Gemm16Path::convert_sgemm;
    choice.reason = fmt::format("{} GEMM: convert+sgemm ({})", name, onednn.detail);
    return choice;
  }
  // Warm-up (thread team, oneDNN's JIT, pages), then the two paths alternate so that both see
  // the same load on a busy machine; the best run of each counts.
  seconds_of(Gemm16Path::convert_sgemm);
  seconds_of(Gemm16Path::onednn);
  choice.convert_sgemm_seconds = choice.onednn_seconds = std::numeric_limits<double>::infinity();
  for (int run = 0; run < kChoiceRuns; ++run) {
    choice.convert_sgemm_seconds =
        std::min(choice.convert_sgemm_seconds, seconds_of(Gemm16Path::convert_sgemm));
    choice.onednn_seconds = std::min(choice.onednn_seconds, seconds_of(Gemm16Path::onednn));
  }
  const double ratio = choice.convert_sgemm_seconds / choice.onednn_seconds;
  // The paths round differently in the last bits: a margin keeps the choice, and so a config's
  // results, from flipping between runs on a machine where the two are about as fast.
  if (ratio > kOnednnMargin) {
    choice.path = Gemm16Path::onednn;
    choice.reason =
        fmt::format("{} GEMM: oneDNN {:.2f}x faster than convert+sgemm on this CPU ({})", name,
                    ratio, onednn.detail);
  } else {
    choice.path = Gemm16Path::convert_sgemm;
    choice.reason =
        ratio > 1
            ? fmt::format(
                  "{} GEMM: convert+sgemm (oneDNN only {:.2f}x faster, below the {:.2f}x "
                  "it must gain; {})",
                  name, ratio, kOnednnMargin, onednn.detail)
            : fmt::format("{} GEMM: convert+sgemm {:.2f}x faster than oneDNN on this CPU ({})",
                          name, 1 / ratio, onednn.detail);
  }
  return choice;
}

Gemm16Choice choose_gemm16_path(DType operands) {
  OASES_ASSERT(operands == DType::bf16 || operands == DType::f16,
               "choose_gemm16_path: {} is not a 16-bit type", dtype_name(operands));
  return operands == DType::bf16 ? choose_for<BFloat16>(operands) : choose_for<Float16>(operands);
}

Gemm16PathsChoice choose_gemm16_paths() {
  Gemm16PathsChoice choice;
  choice.bf16 = choose_gemm16_path(DType::bf16);
  choice.f16 = choose_gemm16_path(DType::f16);
  choice.paths.bf16 = choice.bf16.path;
  choice.paths.f16 = choice.f16.path;
  return choice;
}

template void gemm16<BFloat16>(Gemm16Path, Trans, Trans, std::int64_t, std::int64_t, std::int64_t,
                               const BFloat16*, std::int64_t, const BFloat16*, std::int64_t,
                               const float*, bool, void*, DType, std::int64_t, Gemm16Workspace*);
template void gemm16<Float16>(Gemm16Path, Trans, Trans, std::int64_t, std::int64_t, std::int64_t,
                              const Float16*, std::int64_t, const Float16*, std::int64_t,
                              const float*, bool, void*, DType, std::int64_t, Gemm16Workspace*);

}  // namespace oases::kernels::cpu
