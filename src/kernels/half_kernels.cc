#include "kernels/half_kernels.h"

#include "core/error.h"
#include "kernels/argument_checks.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm16.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rotary.h"
#include "kernels/cpu/swiglu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace oases::kernels::half {
namespace {

// dst = src widened, by the OpenMP team or (threads = calling_thread) on the calling thread.
void widen_any(const void* src, DType type, float* dst, std::int64_t n,
               cpu::Threads threads = cpu::Threads::team) {
  switch (type) {
    case DType::bf16:
      cpu::widen(static_cast<const BFloat16*>(src), dst, n, threads);
      return;
    case DType::f16:
      cpu::widen(static_cast<const Float16*>(src), dst, n, threads);
      return;
    case DType::f32:
      cpu::widen(static_cast<const float*>(src), dst, n, threads);
      return;
    default:
      break;
  }
  OASES_ASSERT(false, "widen: {} is not f32, bf16 or f16", dtype_name(type));
}

void narrow_any(const float* src, void* dst, DType type, std::int64_t n,
                cpu::Threads threads = cpu::Threads::team) {
  switch (type) {
    case DType::bf16:
      cpu::narrow(src, static_cast<BFloat16*>(dst), n, threads);
      return;
    case DType::f16:
      cpu::narrow(src, static_cast<Float16*>(dst), n, threads);
      return;
    case DType::f32:
      cpu::narrow(src, static_cast<float*>(dst), n, threads);
      return;
    default:
      break;
  }
  OASES_ASSERT(false, "narrow: {} is not f32, bf16 or f16", dtype_name(type));
}

// Reusable f32 scratch for the f32 images below, one pool per calling thread. Fresh
// allocations of a step's activation-sized images (megabytes each, above malloc's mmap
// threshold) are returned to the kernel on free and page-faulted in again on the next call:
// measured on the configs/bench.toml bf16 step, that cost about a quarter of the step. The
// kernels of kernels.h take no caller-owned state apart from a linear call's Gemm16Paths, and
// giving every 16-bit kernel a workspace argument would change the whole front door for
// scratch that never outlives a call; so the pool is thread-local, with no value that could
// change a result (a buffer's contents are overwritten before they are read). Memory is
// bounded: a call takes a free buffer of exactly its size or allocates one, so the pool holds
// at most the buffers of the most a call of each size has used at once, and never more than
// kMaxPooledBytes (a buffer given back past that is freed).
class ScratchPool {
 public:
  static constexpr std::size_t kMaxPooledBytes = std::size_t{1} << 30;

  std::unique_ptr<float[]> take(std::size_t count) {
    const auto found = free_.find(count);
    if (found == free_.end()) return std::make_unique_for_overwrite<float[]>(count);
    std::unique_ptr<float[]> buffer = std::move(found->second);
    free_.erase(found);
    pooled_bytes_ -= count * sizeof(float);
    return buffer;
  }

  void give_back(std::size_t count, std::unique_ptr<float[]> buffer) {
    if (pooled_bytes_ + count * sizeof(float) > kMaxPooledBytes) return;  // freed
    pooled_bytes_ += count * sizeof(float);
    free_.emplace(count, std::move(buffer));
  }

  static ScratchPool& of_this_thread() {
    thread_local ScratchPool pool;
    return pool;
  }

 private:
  std::multimap<std::size_t, std::unique_ptr<float[]>> free_;
  std::size_t pooled_bytes_ = 0;
};

// `count` uninitialised floats from this thread's pool, given back when destroyed.
class PooledFloats {
 public:
  PooledFloats() = default;
  explicit PooledFloats(std::size_t count)
      : count_(count), data_(ScratchPool::of_this_thread().take(count)) {}
  PooledFloats(PooledFloats&&) = delete;
  PooledFloats& operator=(PooledFloats&&) = delete;
  ~PooledFloats() {
    if (data_) ScratchPool::of_this_thread().give_back(count_, std::move(data_));
  }
  float* get() const { return data_.get(); }

 private:
  std::size_t count_ = 0;
  std::unique_ptr<float[]> data_;
};

// The f32 image of one tensor argument of a 16-bit call: the tensor's own memory when it is
// f32, else a contiguous f32 copy (widened when `load`, for inputs and accumulators) that
// store() rounds back into the tensor (for outputs). A 2-dimensional view may have strided
// rows; ld() is the row stride of the image. An empty tensor gives a null image.
class F32Image {
 public:
  F32Image(const Tensor& t, bool load) : tensor_(t) {
    if (t.empty()) return;
    if (t.ndim() == 2) {
      rows_ = t.dim(0);
      cols_ = t.dim(1);
      stride_ = t.stride(0);
    } else {
      OASES_ASSERT(t.is_contiguous(), "a strided {} argument", t.shape().str());
      rows_ = 1;
      cols_ = t.numel();
      stride_ = cols_;
    }
    if (t.dtype() == DType::f32) {
      data_ = t.data<float>();
      ld_ = stride_;
      return;
    }
    // Uninitialised: widened just below, or written by the kernel before store().
    copy_.emplace(static_cast<std::size_t>(rows_ * cols_));
    data_ = copy_->get();
    ld_ = cols_;
    if (!load) return;
    if (stride_ == cols_) {
      widen_any(t.raw(), t.dtype(), data_, rows_ * cols_);
    } else {
      for (std::int64_t r = 0; r < rows_; ++r)
        widen_any(element(r), t.dtype(), data_ + r * cols_, cols_);
    }
  }

  F32Image(const F32Image&) = delete;
  F32Image& operator=(const F32Image&) = delete;

  float* data() const { return data_; }
  std::int64_t ld() const { return ld_; }

  // Rounds the image into the tensor (once), when the tensor is 16-bit.
  void store() const {
    if (tensor_.empty() || tensor_.dtype() == DType::f32) return;
    if (stride_ == cols_) {
      narrow_any(data_, tensor_.raw(), tensor_.dtype(), rows_ * cols_);
    } else {
      for (std::int64_t r = 0; r < rows_; ++r)
        narrow_any(data_ + r * cols_, element(r), tensor_.dtype(), cols_);
    }
  }

 private:
  void* element(std::int64_t row) const {
    return static_cast<char*>(tensor_.raw()) +
           static_cast<std::size_t>(row * stride_) * tensor_.element_size();
  }

  Tensor tensor_;
  std::optional<PooledFloats> copy_;
  float* data_ = nullptr;
  std::int64_t rows_ = 0, cols_ = 0, stride_ = 0, ld_ = 0;
};

// ---- Conversions fused into the element-wise kernels --------------------------------------
//
// A 16-bit element-wise call done through whole-tensor f32 images makes every element travel
// through memory several times in f32: the widened input is written, read by the f32 kernel,
// its output written, then read back to be rounded. The kernels below instead work in pieces
// that stay in the cache: each OpenMP thread widens one piece of the inputs into its own f32
// scratch, runs the f32 kernel on that piece on the same thread (cpu::Threads::calling_thread,
// no nested parallel region) and rounds the piece's outputs into the 16-bit tensors, so memory
// sees only the 16-bit reads and writes. The f32 kernels work element by element or row by
// row, so a piece's results are those of the whole call, and the pieces (fixed sizes) do not
// depend on the thread count. bench/half_kernels measures each kernel against its f32 form.

// The f32 kernels run on each piece on the thread that converted it (kernels/cpu/threads.h).
constexpr cpu::Threads kHere = cpu::Threads::calling_thread;

// f32 elements per operand of a piece: 64 KB, a few operands of which stay in L2.
constexpr std::int64_t kPieceElements = std::int64_t{1} << 14;

// Calls body(piece, scratch) for piece in [0, pieces), the pieces shared among the OpenMP
// threads, each thread with its own `scratch_floats` of f32 scratch.
template <class Body>
void in_pieces(std::int64_t pieces, std::int64_t scratch_floats, const Body& body) {
  if (pieces <= 0) return;
#pragma omp parallel if (pieces > 1)
  {
    // From the thread's scratch pool, as the f32 images above: no allocation per call.
    const PooledFloats scratch(static_cast<std::size_t>(scratch_floats));
#pragma omp for schedule(static)
    for (std::int64_t piece = 0; piece < pieces; ++piece) body(piece, scratch.get());
  }
}

// A tensor as a matrix of rows (a 2-dimensional view's rows, which may be strided; any other
// tensor, contiguous, as `rows_if_flat` rows of numel / rows_if_flat elements), for copying
// blocks of it to and from f32 scratch on the calling thread.
class RowView {
 public:
  explicit RowView(const Tensor& t, std::int64_t rows_if_flat = 1)
      : base_(static_cast<char*>(t.raw())), type_(t.dtype()), element_(t.element_size()) {
    if (t.ndim() == 2) {
      stride_ = t.stride(0);
    } else {
      OASES_ASSERT(t.is_contiguous(), "a strided {} argument", t.shape().str());
      stride_ = rows_if_flat == 0 ? 0 : t.numel() / rows_if_flat;
    }
  }
  // dst [r1 - r0, c1 - c0] (dense) = this[r0:r1, c0:c1] widened.
  void widen(std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, float* dst) const {
    for (std::int64_t r = r0; r < r1; ++r)
      widen_any(at(r, c0), type_, dst + (r - r0) * (c1 - c0), c1 - c0, kHere);
  }
  // this[r0:r1, c0:c1] = src [r1 - r0, c1 - c0] (dense), each element rounded once.
  void narrow(const float* src, std::int64_t r0, std::int64_t r1, std::int64_t c0,
              std::int64_t c1) const {
    for (std::int64_t r = r0; r < r1; ++r)
      narrow_any(src + (r - r0) * (c1 - c0), at(r, c0), type_, c1 - c0, kHere);
  }

 private:
  char* at(std::int64_t r, std::int64_t c) const {
    return base_ + static_cast<std::size_t>(r * stride_ + c) * element_;
  }

  char* base_;
  DType type_;
  std::size_t element_;
  std::int64_t stride_ = 0;
};

// Rows per piece of a row-wise kernel over rows of `cols` elements.
std::int64_t rows_per_piece(std::int64_t cols) {
  return std::max<std::int64_t>(1, kPieceElements / std::max<std::int64_t>(cols, 1));
}

// Calls body(first, count, scratch) over [0, n) in pieces of kPieceElements, for element-wise
// kernels on contiguous tensors; `operands` pieces of scratch per thread.
template <class Body>
void flat_pieces(std::int64_t n, int operands, const Body& body) {
  const std::int64_t pieces = (n + kPieceElements - 1) / kPieceElements;
  in_pieces(pieces, operands * kPieceElements, [&](std::int64_t piece, float* scratch) {
    const std::int64_t first = piece * kPieceElements;
    body(first, std::min(kPieceElements, n - first), scratch);
  });
}

// Calls body(r0, r1, scratch) over the rows [0, rows) in pieces of rows_per_piece(cols), for
// row-wise kernels; `operands` pieces of scratch per thread.
template <class Body>
void row_pieces(std::int64_t rows, std::int64_t cols, int operands, const Body& body) {
  const std::int64_t per = rows_per_piece(cols);
  const std::int64_t pieces = (rows + per - 1) / per;
  in_pieces(pieces, operands * per * cols, [&](std::int64_t piece, float* scratch) {
    const std::int64_t r0 = piece * per;
    body(r0, std::min(rows, r0 + per), scratch);
  });
}

// Calls body(b, f0, f1, scratch) for each sample b in [0, batch) and each range of features
// [f0, f1) of F, for the dropout kernels, whose masks are keyed by (sample, position, feature):
// a piece is one sequence's [seq, f1 - f0] block, so the kernel is called on one sample with
// the slice's offsets moved by (b, f0). `operands` blocks of scratch per thread.
template <class Body>
void sequence_pieces(std::int64_t batch, std::int64_t seq, std::int64_t F, int operands,
                     const Body& body) {
  if (batch * seq * F == 0) return;
  // Whole cache lines of f32 per row of a piece where F allows.
  const std::int64_t wanted = std::max<std::int64_t>(16, kPieceElements / seq / 16 * 16);
  const std::int64_t width = std::min(F, wanted);
  const std::int64_t per_sample = (F + width - 1) / width;
  in_pieces(batch * per_sample, operands * seq * width, [&](std::int64_t piece, float* scratch) {
    const std::int64_t b = piece / per_sample, f0 = (piece % per_sample) * width;
    body(b, f0, std::min(F, f0 + width), scratch);
  });
}

// A parameter vector (gamma, bias) as f32: the tensor's own memory when f32, else `copy`
// filled with its widened values; null when empty.
const float* f32_values(const Tensor& t, std::vector<float>& copy) {
  if (t.empty()) return nullptr;
  if (t.dtype() == DType::f32) return t.data<float>();
  copy.resize(static_cast<std::size_t>(t.numel()));
  widen_any(t.raw(), t.dtype(), copy.data(), t.numel());
  return copy.data();
}

F32Image input(const Tensor& t) {
  return F32Image(t, true);
}
F32Image output(const Tensor& t) {
  return F32Image(t, false);
}
F32Image accumulator(const Tensor& t) {
  return F32Image(t, true);
}

// The call's 16-bit type: that of the first operand; every operand must have it, all on CPU.
DType half_type(const char* what, std::initializer_list<const Tensor*> operands) {
  const Tensor* first = *operands.begin();
  const DType h = first->dtype();
  OASES_ASSERT(is_half(h), "{}: {} is not a 16-bit type", what, dtype_name(h));
  for (const Tensor* t : operands) {
    if (t->empty()) continue;
    OASES_ASSERT(t->device().is_cpu(), "{}: no kernel for tensors on {}", what, t->device().str());
    OASES_ASSERT(t->dtype() == h, "{}: a {} operand in a {} call", what, dtype_name(t->dtype()),
                 dtype_name(h));
  }
  return h;
}

// Statistics and losses of a 16-bit call: f32.
void check_f32(const char* what, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    OASES_ASSERT(t->empty() || (t->device().is_cpu() && t->dtype() == DType::f32),
                 "{}: statistics and losses of a 16-bit call are f32, got {}", what,
                 dtype_name(t->dtype()));
}

// Parameters and accumulators of a 16-bit call: the call's type h or f32.
void check_h_or_f32(const char* what, DType h, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    OASES_ASSERT(
        t->empty() || (t->device().is_cpu() && (t->dtype() == DType::f32 || t->dtype() == h)),
        "{}: expected {} or f32, got {}", what, dtype_name(h), dtype_name(t->dtype()));
}

using detail::check_contiguous;
using detail::check_matrix;

cpu::AttentionShape cpu_shape(const AttentionShape& s) {
  return {s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, s.causal};
}

// Calls body(Half{}) with Half the storage type of h.
template <class Body>
void by_half(DType h, Body&& body) {
  if (h == DType::bf16) {
    body(BFloat16{});
  } else {
    body(Float16{});
  }
}

// The f32 values of a small parameter vector (bias), or null when empty.
std::vector<float> widened_vector(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.empty() ? 0 : t.numel()));
  if (!t.empty()) widen_any(t.raw(), t.dtype(), v.data(), t.numel());
  return v;
}

// out[c] (+)= sum_r a[r, c] of a strided 16-bit matrix, each column summed in double in row
// order (as cpu::accumulate_column_sums); out f32 or 16-bit (one rounding per element).
template <class Half>
void accumulate_column_sums_into(const Half* a, std::int64_t rows, std::int64_t cols,
                                 std::int64_t ld, const Tensor& out) {
  if (out.dtype() == DType::f32) {
    cpu::accumulate_column_sums(a, rows, cols, ld, out.data<float>());
    return;
  }
  std::vector<float> sums(static_cast<std::size_t>(cols), 0.0f);
  cpu::accumulate_column_sums(a, rows, cols, ld, sums.data());
  Half* o = out.data<Half>();
  for (std::int64_t c = 0; c < cols; ++c)
    o[c] = Half(static_cast<float>(o[c]) + sums[static_cast<std::size_t>(c)]);
}

}  // namespace

bool is_half(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

void linear_forward(const Tensor& x, const Tensor& w, WeightLayout layout, const Tensor& bias,
                    const Tensor& y, bool accumulate, const Gemm16Paths& paths) {
  const DType h = half_type("linear_forward", {&x, &w});
  check_h_or_f32("linear_forward", h, {&bias, &y});
  const std::int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
  check_matrix("linear_forward y", y, n, out);
  check_matrix("linear_forward w", w, layout == WeightLayout::in_out ? in : out,
               layout == WeightLayout::in_out ? out : in);
  check_contiguous("linear_forward", {&w, &bias});
  OASES_ASSERT(bias.empty() || bias.numel() == out, "linear_forward: bias of {} for {} outputs",
               bias.numel(), out);
  const std::vector<float> bias32 = widened_vector(bias);
  const float* b = bias.empty() ? nullptr : bias32.data();
  by_half(h, [&](auto zero) {
    using Half = decltype(zero);
    // y[n, out] = x[n, in] @ W: W stored [in, out] (no transpose) or [out, in] (transposed).
    cpu::gemm16<Half>(paths.for_dtype(h), cpu::Trans::no,
                      layout == WeightLayout::in_out ? cpu::Trans::no : cpu::Trans::yes, n, out, in,
                      x.data<Half>(), x.stride(0), w.data<Half>(),
                      layout == WeightLayout::in_out ? out : in, b, accumulate, y.raw(), y.dtype(),
                      y.stride(0), paths.workspace.get());
  });
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, WeightLayout layout,
                     const Tensor& dx, bool accumulate_dx, const Tensor& dw, const Tensor& db,
                     const Gemm16Paths& paths) {
  const DType h = half_type("linear_backward", {&dy, &x, &w});
  check_h_or_f32("linear_backward", h, {&dx, &dw, &db});
  const std::int64_t n = x.dim(0), in = x.dim(1), out = dy.dim(1);
  check_matrix("linear_backward dy", dy, n, out);
  if (!dx.empty()) check_matrix("linear_backward dx", dx, n, in);
  check_contiguous("linear_backward", {&w, &dw, &db});
  OASES_ASSERT(dw.empty() || dw.numel() == in * out, "linear_backward: dw of {} for [{}, {}]",
               dw.numel(), in, out);
  OASES_ASSERT(db.empty() || db.numel() == out, "linear_backward: db of {} for {} outputs",
               db.numel(), out);
  const cpu::Gemm16Path path = paths.for_dtype(h);
  Gemm16Workspace* const workspace = paths.workspace.get();
  by_half(h, [&](auto zero) {
    using Half = decltype(zero);
    using cpu::Trans;
    const Half* g = dy.data<Half>();
    const Half* xs = x.data<Half>();
    const Half* ws = w.data<Half>();
    if (layout == WeightLayout::in_out) {
      // dx[n, in] (+)= dy[n, out] @ w[in, out]^T;  dw[in, out] += x[n, in]^T @ dy[n, out]
      if (!dx.empty())
        cpu::gemm16<Half>(path, Trans::no, Trans::yes, n, in, out, g, dy.stride(0), ws, out,
                          nullptr, accumulate_dx, dx.raw(), dx.dtype(), dx.stride(0), workspace);
      if (!dw.empty())
        cpu::gemm16<Half>(path, Trans::yes, Trans::no, in, out, n, xs, x.stride(0), g, dy.stride(0),
                          nullptr, true, dw.raw(), dw.dtype(), out, workspace);
    } else {
      // dx[n, in] (+)= dy[n, out] @ w[out, in];  dw[out, in] += dy[n, out]^T @ x[n, in]
      if (!dx.empty())
        cpu::gemm16<Half>(path, Trans::no, Trans::no, n, in, out, g, dy.stride(0), ws, in, nullptr,
                          accumulate_dx, dx.raw(), dx.dtype(), dx.stride(0), workspace);
      if (!dw.empty())
        cpu::gemm16<Half>(path, Trans::yes, Trans::no, out, in, n, g, dy.stride(0), xs, x.stride(0),
                          nullptr, true, dw.raw(), dw.dtype(), in, workspace);
    }
    if (!db.empty()) accumulate_column_sums_into(g, n, out, dy.stride(0), db);
  });
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, double eps) {
  const DType h = half_type("layernorm_forward", {&x, &y});
  check_h_or_f32("layernorm_forward", h, {&gamma, &beta});
  check_f32("layernorm_forward", {&mean, &rstd});
  check_contiguous("layernorm_forward", {&x, &gamma, &beta, &y, &mean, &rstd});
  const std::int64_t C = gamma.numel(), n = x.numel() / C;
  OASES_ASSERT(
      y.numel() == x.numel() && mean.numel() == n && rstd.numel() == n && beta.numel() == C,
      "layernorm_forward shapes");
  std::vector<float> gamma_copy, beta_copy;
  const float* g = f32_values(gamma, gamma_copy);
  const float* b = f32_values(beta, beta_copy);
  const RowView xs(x, n), ys(y, n);
  float* mu = mean.data<float>();
  float* rs = rstd.data<float>();
  row_pieces(n, C, 2, [&](std::int64_t r0, std::int64_t r1, float* scratch) {
    float* x32 = scratch;
    float* y32 = scratch + (r1 - r0) * C;
    xs.widen(r0, r1, 0, C, x32);
    cpu::layernorm_forward<float>(x32, g, b, y32, mu + r0, rs + r0, r1 - r0, C, eps, kHere);
    ys.narrow(y32, r0, r1, 0, C);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta) {
  const DType h = half_type("layernorm_backward", {&dy, &x, &dx});
  check_h_or_f32("layernorm_backward", h, {&gamma, &dgamma, &dbeta});
  check_f32("layernorm_backward", {&mean, &rstd});
  check_contiguous("layernorm_backward", {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta});
  const std::int64_t C = gamma.numel(), n = x.numel() / C;
  OASES_ASSERT(dy.numel() == x.numel() && dx.numel() == x.numel() && dgamma.numel() == C &&
                   dbeta.numel() == C && mean.numel() == n && rstd.numel() == n,
               "layernorm_backward shapes");
  const F32Image dy32 = input(dy), x32 = input(x), g32 = input(gamma), dx32 = output(dx),
                 dg32 = accumulator(dgamma), db32 = accumulator(dbeta);
  cpu::layernorm_backward<float>(dy32.data(), x32.data(), g32.data(), mean.data<float>(),
                                 rstd.data<float>(), dx32.data(), dg32.data(), db32.data(), n, C);
  dx32.store();
  dg32.store();
  db32.store();
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd,
                     double eps) {
  const DType h = half_type("rmsnorm_forward", {&x, &y});
  check_h_or_f32("rmsnorm_forward", h, {&weight});
  check_f32("rmsnorm_forward", {&rstd});
  check_contiguous("rmsnorm_forward", {&x, &weight, &y, &rstd});
  const std::int64_t C = weight.numel(), n = x.numel() / C;
  OASES_ASSERT(y.numel() == x.numel() && rstd.numel() == n, "rmsnorm_forward shapes");
  std::vector<float> weight_copy;
  const float* w = f32_values(weight, weight_copy);
  const RowView xs(x, n), ys(y, n);
  float* rs = rstd.data<float>();
  row_pieces(n, C, 2, [&](std::int64_t r0, std::int64_t r1, float* scratch) {
    float* x32 = scratch;
    float* y32 = scratch + (r1 - r0) * C;
    xs.widen(r0, r1, 0, C, x32);
    cpu::rmsnorm_forward<float>(x32, w, y32, rs + r0, r1 - r0, C, eps, kHere);
    ys.narrow(y32, r0, r1, 0, C);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight) {
  const DType h = half_type("rmsnorm_backward", {&dy, &x, &dx});
  check_h_or_f32("rmsnorm_backward", h, {&weight, &dweight});
  check_f32("rmsnorm_backward", {&rstd});
  check_contiguous("rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight});
  const std::int64_t C = weight.numel(), n = x.numel() / C;
  OASES_ASSERT(dy.numel() == x.numel() && dx.numel() == x.numel() && dweight.numel() == C &&
                   rstd.numel() == n,
               "rmsnorm_backward shapes");
  const F32Image dy32 = input(dy), x32 = input(x), w32 = input(weight), dx32 = output(dx),
                 dw32 = accumulator(dweight);
  cpu::rmsnorm_backward<float>(dy32.data(), x32.data(), w32.data(), rstd.data<float>(), dx32.data(),
                               dw32.data(), n, C);
  dx32.store();
  dw32.store();
}

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                       const AttentionShape& shape, const AttentionDropout& dropout) {
  half_type("attention_forward", {&qkv, &out});
  check_f32("attention_forward", {&lse});
  check_contiguous("attention_forward", {&qkv, &out, &lse});
  const F32Image qkv32 = input(qkv), out32 = output(out);
  cpu::attention_forward<float>(qkv32.data(), out32.data(), lse.data<float>(), cpu_shape(shape),
                                dropout);
  out32.store();
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, const AttentionShape& shape,
                        const AttentionDropout& dropout) {
  half_type("attention_backward", {&dout, &qkv, &out, &dqkv});
  check_f32("attention_backward", {&lse});
  check_contiguous("attention_backward", {&dout, &qkv, &out, &lse, &dqkv});
  const F32Image dout32 = input(dout), qkv32 = input(qkv), out32 = input(out),
                 dqkv32 = output(dqkv);
  cpu::attention_backward<float>(dout32.data(), qkv32.data(), out32.data(), lse.data<float>(),
                                 dqkv32.data(), cpu_shape(shape), dropout);
  dqkv32.store();
}

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part_out,
                     const Tensor& part_lse, const AttentionShape& shape) {
  half_type("attention_merge", {&out, &part_out});
  check_f32("attention_merge", {&lse, &part_lse});
  check_contiguous("attention_merge", {&out, &lse, &part_out, &part_lse});
  const F32Image out32 = accumulator(out), part32 = input(part_out);
  cpu::attention_merge<float>(out32.data(), lse.data<float>(), part32.data(),
                              part_lse.data<float>(), cpu_shape(shape));
  out32.store();
}

void rotary_tables(std::int64_t seq, std::span<const double> inv_freq, const Tensor& cos,
                   const Tensor& sin) {
  const auto head_dim = static_cast<std::int64_t>(2 * inv_freq.size());
  const DType h = half_type("rotary_tables", {&cos, &sin});
  check_contiguous("rotary_tables", {&cos, &sin});
  const std::int64_t n = seq * head_dim / 2;
  OASES_ASSERT(cos.numel() == n && sin.numel() == n, "rotary_tables: tables of {} for [{}, {}]",
               cos.numel(), seq, head_dim / 2);
  // In double, then rounded once to the 16-bit type.
  std::vector<double> c(static_cast<std::size_t>(n)), s(static_cast<std::size_t>(n));
  cpu::rotary_tables<double>(seq, inv_freq, c.data(), s.data());
  cpu::convert_elements(c.data(), DType::f64, cos.raw(), h, n);
  cpu::convert_elements(s.data(), DType::f64, sin.raw(), h, n);
}

void rotary_apply(const Tensor& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, const Tensor& cos, const Tensor& sin, bool inverse) {
  const DType h = half_type("rotary_apply", {&x});
  check_h_or_f32("rotary_apply", h, {&cos, &sin});
  check_contiguous("rotary_apply", {&cos, &sin});
  OASES_ASSERT(x.ndim() == 2 && x.dim(0) == batch * seq && x.dim(1) >= heads * head_dim,
               "rotary_apply: {} for {} rows of {} heads of {}", x.shape().str(), batch * seq,
               heads, head_dim);
  // Only the rotated columns take part: the first heads * head_dim of each row. A piece is a
  // run of positions of one sequence, rotated by the tables' rows of those positions.
  const std::int64_t width = heads * head_dim, half_dim = head_dim / 2;
  std::vector<float> cos_copy, sin_copy;
  const float* c = f32_values(cos, cos_copy);
  const float* s = f32_values(sin, sin_copy);
  const RowView xs(x.columns(0, width));
  const std::int64_t per = std::min(rows_per_piece(width), std::max<std::int64_t>(seq, 1));
  const std::int64_t per_sequence = seq == 0 ? 0 : (seq + per - 1) / per;
  in_pieces(batch * per_sequence, per * width, [&](std::int64_t piece, float* x32) {
    const std::int64_t b = piece / per_sequence, t0 = (piece % per_sequence) * per,
                       t1 = std::min(seq, t0 + per);
    const std::int64_t r0 = b * seq + t0, r1 = b * seq + t1;
    xs.widen(r0, r1, 0, width, x32);
    cpu::rotary_apply<float>(x32, width, 1, t1 - t0, heads, head_dim, c + t0 * half_dim,
                             s + t0 * half_dim, inverse, kHere);
    xs.narrow(x32, r0, r1, 0, width);
  });
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  half_type("swiglu_forward", {&gate, &up, &out});
  OASES_ASSERT(gate.ndim() == 2 && gate.shape() == up.shape() && gate.shape() == out.shape(),
               "swiglu_forward shapes {} {} {}", gate.shape().str(), up.shape().str(),
               out.shape().str());
  const std::int64_t n = gate.dim(0), F = gate.dim(1);
  const RowView gs(gate), us(up), os(out);
  row_pieces(n, F, 3, [&](std::int64_t r0, std::int64_t r1, float* scratch) {
    const std::int64_t m = (r1 - r0) * F;
    float* g32 = scratch;
    float* u32 = scratch + m;
    float* o32 = scratch + 2 * m;
    gs.widen(r0, r1, 0, F, g32);
    us.widen(r0, r1, 0, F, u32);
    // gate and up share the row stride: both pieces are dense [rows, F].
    cpu::swiglu_forward<float>(g32, u32, F, o32, F, r1 - r0, F, kHere);
    os.narrow(o32, r0, r1, 0, F);
  });
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                     const Tensor& dup) {
  half_type("swiglu_backward", {&gate, &up, &dout, &dgate, &dup});
  OASES_ASSERT(gate.ndim() == 2 && up.shape() == gate.shape() && dout.shape() == gate.shape() &&
                   dgate.shape() == gate.shape() && dup.shape() == gate.shape(),
               "swiglu_backward shapes");
  const std::int64_t n = gate.dim(0), F = gate.dim(1);
  const RowView gs(gate), us(up), dos(dout), dgs(dgate), dus(dup);
  row_pieces(n, F, 5, [&](std::int64_t r0, std::int64_t r1, float* scratch) {
    const std::int64_t m = (r1 - r0) * F;
    float* g32 = scratch;
    float* u32 = scratch + m;
    float* do32 = scratch + 2 * m;
    float* dg32 = scratch + 3 * m;
    float* du32 = scratch + 4 * m;
    gs.widen(r0, r1, 0, F, g32);
    us.widen(r0, r1, 0, F, u32);
    dos.widen(r0, r1, 0, F, do32);
    cpu::swiglu_backward<float>(g32, u32, F, do32, F, dg32, du32, F, r1 - r0, F, kHere);
    dgs.narrow(dg32, r0, r1, 0, F);
    dus.narrow(du32, r0, r1, 0, F);
  });
}

void gelu_forward(const Tensor& x, const Tensor& y, GeluForm form) {
  half_type("gelu_forward", {&x, &y});
  check_contiguous("gelu_forward", {&x, &y});
  OASES_ASSERT(x.numel() == y.numel(), "gelu_forward: sizes {} {}", x.numel(), y.numel());
  const RowView xs(x), ys(y);
  flat_pieces(x.numel(), 1, [&](std::int64_t first, std::int64_t count, float* v) {
    xs.widen(0, 1, first, first + count, v);
    if (form == GeluForm::tanh)  // in place: the f32 kernels allow y to alias x
      cpu::gelu_forward<float>(v, v, count, kHere);
    else
      cpu::gelu_erf_forward<float>(v, v, count, kHere);
    ys.narrow(v, 0, 1, first, first + count);
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, GeluForm form) {
  half_type("gelu_backward", {&x, &dy, &dx});
  check_contiguous("gelu_backward", {&x, &dy, &dx});
  OASES_ASSERT(x.numel() == dy.numel() && x.numel() == dx.numel(), "gelu_backward: sizes");
  const RowView xs(x), dys(dy), dxs(dx);
  flat_pieces(x.numel(), 2, [&](std::int64_t first, std::int64_t count, float* scratch) {
    float* x32 = scratch;
    float* g32 = scratch + kPieceElements;  // dy, then dx in its place (allowed to alias)
    xs.widen(0, 1, first, first + count, x32);
    dys.widen(0, 1, first, first + count, g32);
    if (form == GeluForm::tanh)
      cpu::gelu_backward<float>(x32, g32, g32, count, kHere);
    else
      cpu::gelu_erf_backward<float>(x32, g32, g32, count, kHere);
    dxs.narrow(g32, 0, 1, first, first + count);
  });
}

void dropout_apply(const Tensor& x, const Tensor& y, std::int64_t batch, std::int64_t seq, double p,
                   const DropoutSite& site, const DropoutSlice& slice) {
  half_type("dropout_apply", {&x, &y});
  check_contiguous("dropout_apply", {&x, &y});
  OASES_ASSERT(x.numel() == y.numel(), "dropout_apply: sizes {} {}", x.numel(), y.numel());
  const std::int64_t F = batch * seq == 0 ? 0 : x.numel() / (batch * seq);
  const RowView xs(x, batch * seq), ys(y, batch * seq);
  sequence_pieces(
      batch, seq, F, 1, [&](std::int64_t b, std::int64_t f0, std::int64_t f1, float* v) {
        const std::int64_t r0 = b * seq, r1 = r0 + seq;
        xs.widen(r0, r1, f0, f1, v);
        cpu::dropout_apply<float>(
            v, v, 1, seq, f1 - f0, p, site,
            {slice.sample_offset + b, slice.feature_offset + f0, slice.position_offset}, kHere);
        ys.narrow(v, r0, r1, f0, f1);
      });
}

void bias_dropout_add_forward(const Tensor& x, const Tensor& bias, const Tensor& residual,
                              const Tensor& out, std::int64_t batch, std::int64_t seq, double p,
                              const DropoutSite& site, const DropoutSlice& slice) {
  const DType h = half_type("bias_dropout_add_forward", {&x, &residual, &out});
  check_h_or_f32("bias_dropout_add_forward", h, {&bias});
  check_contiguous("bias_dropout_add_forward", {&x, &bias, &residual, &out});
  OASES_ASSERT(!residual.empty(), "bias_dropout_add_forward needs a residual");
  const std::int64_t F = batch * seq == 0 ? 0 : x.numel() / (batch * seq);
  std::vector<float> bias_copy;
  const float* bias32 = f32_values(bias, bias_copy);
  const RowView xs(x, batch * seq), rs(residual, batch * seq), os(out, batch * seq);
  sequence_pieces(
      batch, seq, F, 2, [&](std::int64_t b, std::int64_t f0, std::int64_t f1, float* scratch) {
        const std::int64_t r0 = b * seq, r1 = r0 + seq;
        float* x32 = scratch;
        float* r32 = scratch + seq * (f1 - f0);  // the residual, then the output in its place
        xs.widen(r0, r1, f0, f1, x32);
        rs.widen(r0, r1, f0, f1, r32);
        cpu::bias_dropout_add_forward<float>(
            x32, bias32 == nullptr ? nullptr : bias32 + f0, r32, r32, 1, seq, f1 - f0, p, site,
            {slice.sample_offset + b, slice.feature_offset + f0, slice.position_offset}, kHere);
        os.narrow(r32, r0, r1, f0, f1);
      });
}

void bias_dropout_add_backward(const Tensor& dout, const Tensor& dx, const Tensor& dbias,
                               std::int64_t batch, std::int64_t seq, double p,
                               const DropoutSite& site, const DropoutSlice& slice) {
  const DType h = half_type("bias_dropout_add_backward", {&dout, &dx});
  check_h_or_f32("bias_dropout_add_backward", h, {&dbias});
  check_contiguous("bias_dropout_add_backward", {&dout, &dx, &dbias});
  const std::int64_t F = dout.numel() / (batch * seq);
  const F32Image do32 = input(dout), dx32 = output(dx), db32 = accumulator(dbias);
  cpu::bias_dropout_add_backward<float>(do32.data(), dx32.data(), db32.data(), batch, seq, F, p,
                                        site, slice);
  dx32.store();
  db32.store();
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  half_type("add", {&a, &b, &out});
  check_contiguous("add", {&a, &b, &out});
  OASES_ASSERT(a.numel() == b.numel() && a.numel() == out.numel(), "add: sizes {} {} {}", a.numel(),
               b.numel(), out.numel());
  const RowView as(a), bs(b), os(out);
  flat_pieces(a.numel(), 2, [&](std::int64_t first, std::int64_t count, float* scratch) {
    float* a32 = scratch;
    float* b32 = scratch + kPieceElements;
    as.widen(0, 1, first, first + count, a32);
    bs.widen(0, 1, first, first + count, b32);
    cpu::add<float>(a32, b32, a32, count, kHere);
    os.narrow(a32, 0, 1, first, first + count);
  });
}

void embedding_forward(const std::int32_t* tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out, std::int64_t batch, std::int64_t seq,
                       const VocabRange& range) {
  const DType h = half_type("embedding_forward", {&wte, &wpe, &out});
  check_contiguous("embedding_forward", {&wte, &wpe, &out});
  const std::int64_t C = out.numel() / (batch * seq);
  // Reads only the table rows the tokens name (the table may hold 50k rows): each output
  // row is formed in f32 (token row + position row) and rounded once.
  by_half(h, [&](auto zero) {
    using Half = decltype(zero);
    const Half* table = wte.data<Half>();
    const Half* positions = wpe.empty() ? nullptr : wpe.data<Half>();
    Half* o = out.data<Half>();
    const std::int64_t rows = batch * seq;
#pragma omp parallel for schedule(static) if (rows * C >= (std::int64_t{1} << 14))
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t token = tokens[row];
      const bool held = token >= range.begin && token < range.end;
      const Half* token_row = held ? table + (token - range.begin) * C : nullptr;
      const Half* position_row = positions == nullptr ? nullptr : positions + (row % seq) * C;
      Half* dst = o + row * C;
      for (std::int64_t c = 0; c < C; ++c) {
        float v = token_row == nullptr ? 0.0f : static_cast<float>(token_row[c]);
        if (position_row != nullptr) v += static_cast<float>(position_row[c]);
        dst[c] = Half(v);
      }
    }
  });
}

void embedding_backward(const Tensor& dout, const std::int32_t* tokens, const Tensor& dwte,
                        const Tensor& dwpe, std::int64_t batch, std::int64_t seq,
                        const VocabRange& range) {
  const DType h = half_type("embedding_backward", {&dout});
  check_h_or_f32("embedding_backward", h, {&dwte, &dwpe});
  check_contiguous("embedding_backward", {&dout, &dwte, &dwpe});
  const std::int64_t C = dout.numel() / (batch * seq);
  const F32Image do32 = input(dout), dwte32 = accumulator(dwte), dwpe32 = accumulator(dwpe);
  cpu::embedding_backward<float>(do32.data(), tokens, dwte32.data(), dwpe32.data(), batch, seq, C,
                                 range);
  dwte32.store();
  dwpe32.store();
}

void embedding_accumulate(const std::int32_t* ids, const Tensor& table, const Tensor& out,
                          std::int64_t batch, std::int64_t seq) {
  const DType h = half_type("embedding_accumulate", {&out});
  check_h_or_f32("embedding_accumulate", h, {&table});
  check_contiguous("embedding_accumulate", {&table, &out});
  const std::int64_t C = out.numel() / (batch * seq);
  const F32Image t32 = input(table), o32 = accumulator(out);
  cpu::embedding_accumulate<float>(ids, t32.data(), o32.data(), batch, seq, C);
  o32.store();
}

void embedding_accumulate_backward(const Tensor& dout, const std::int32_t* ids,
                                   const Tensor& dtable, std::int64_t batch, std::int64_t seq) {
  const DType h = half_type("embedding_accumulate_backward", {&dout});
  check_h_or_f32("embedding_accumulate_backward", h, {&dtable});
  check_contiguous("embedding_accumulate_backward", {&dout, &dtable});
  const std::int64_t C = dout.numel() / (batch * seq);
  const F32Image do32 = input(dout), dt32 = accumulator(dtable);
  cpu::embedding_accumulate_backward<float>(do32.data(), ids, dt32.data(), batch, seq, C);
  dt32.store();
}

namespace {

// Rows of logits widened per block: a block of 32 rows of a 50k vocabulary is 6 MB of f32.
constexpr std::int64_t kLogitRowBlock = 32;

// Calls body(first_row, rows, logits32, ld32) for blocks of rows of the [n, V] logits, with
// the block's first V columns widened to f32 (ld32 = V); when `write_back`, the block is
// rounded back into the logits afterwards (columns [V, ld) are zeroed: padding takes no
// gradient).
template <class Body>
void by_logit_blocks(const Tensor& logits, std::int64_t V, bool write_back, Body&& body) {
  const std::int64_t n = logits.dim(0);
  for (std::int64_t r0 = 0; r0 < n; r0 += kLogitRowBlock) {
    const std::int64_t rows = std::min(kLogitRowBlock, n - r0);
    const F32Image image(logits.rows(r0, r0 + rows).columns(0, V), true);
    body(r0, rows, image.data(), image.ld());
    if (!write_back) continue;
    image.store();
    const std::int64_t ld = logits.stride(0);
    if (logits.dim(1) > V) {
      for (std::int64_t r = r0; r < r0 + rows; ++r) {
        char* row = static_cast<char*>(logits.raw()) +
                    static_cast<std::size_t>(r * ld) * logits.element_size();
        std::memset(row + static_cast<std::size_t>(V) * logits.element_size(), 0,
                    static_cast<std::size_t>(logits.dim(1) - V) * logits.element_size());
      }
    }
  }
}

void check_logits(const char* what, const Tensor& logits, std::int64_t vocab) {
  half_type(what, {&logits});
  OASES_ASSERT(logits.ndim() == 2 && vocab >= 0 && vocab <= logits.dim(1),
               "{}: logits {} with vocab {}", what, logits.shape().str(), vocab);
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, std::int64_t vocab, const std::int32_t* targets,
                           const Tensor& losses) {
  check_logits("cross_entropy_forward", logits, vocab);
  check_f32("cross_entropy_forward", {&losses});
  float* loss = losses.data<float>();
  by_logit_blocks(logits, vocab, false,
                  [&](std::int64_t r0, std::int64_t rows, float* l, std::int64_t ld) {
                    cpu::cross_entropy_forward<float>(l, targets + r0, loss + r0, rows, vocab, ld);
                  });
}

void cross_entropy_forward_backward(const Tensor& logits, std::int64_t vocab,
                                    const std::int32_t* targets, const Tensor& losses,
                                    double grad_scale) {
  check_logits("cross_entropy_forward_backward", logits, vocab);
  check_f32("cross_entropy_forward_backward", {&losses});
  float* loss = losses.data<float>();
  by_logit_blocks(
      logits, vocab, true, [&](std::int64_t r0, std::int64_t rows, float* l, std::int64_t ld) {
        cpu::cross_entropy_forward_backward<float>(l, targets + r0, loss + r0, rows, vocab, ld,
                                                   static_cast<float>(grad_scale));
      });
}

void cross_entropy_shard_max(const Tensor& logits, std::int64_t vocab, const Tensor& row_max) {
  check_logits("cross_entropy_shard_max", logits, vocab);
  check_f32("cross_entropy_shard_max", {&row_max});
  float* m = row_max.data<float>();
  if (vocab == 0) {
    std::fill(m, m + row_max.numel(), -std::numeric_limits<float>::infinity());
    return;
  }
  by_logit_blocks(logits, vocab, false,
                  [&](std::int64_t r0, std::int64_t rows, float* l, std::int64_t ld) {
                    cpu::cross_entropy_shard_max<float>(l, rows, vocab, ld, m + r0);
                  });
}

void cross_entropy_shard_sums(const Tensor& logits, std::int64_t vocab, const std::int32_t* targets,
                              std::int64_t vocab_begin, const Tensor& row_max,
                              const Tensor& sum_exp, const Tensor& target_logit) {
  check_logits("cross_entropy_shard_sums", logits, vocab);
  check_f32("cross_entropy_shard_sums", {&row_max, &sum_exp, &target_logit});
  float* s = sum_exp.data<float>();
  float* t = target_logit.data<float>();
  if (vocab == 0) {
    std::fill(s, s + sum_exp.numel(), 0.0f);
    std::fill(t, t + target_logit.numel(), 0.0f);
    return;
  }
  const float* m = row_max.data<float>();
  by_logit_blocks(logits, vocab, false,
                  [&](std::int64_t r0, std::int64_t rows, float* l, std::int64_t ld) {
                    cpu::cross_entropy_shard_sums<float>(l, targets + r0, vocab_begin, m + r0, rows,
                                                         vocab, ld, s + r0, t + r0);
                  });
}

void cross_entropy_shard_finish(const Tensor& logits, std::int64_t vocab,
                                const std::int32_t* targets, std::int64_t vocab_begin,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, double grad_scale, const Tensor& losses,
                                bool gradient) {
  check_logits("cross_entropy_shard_finish", logits, vocab);
  check_f32("cross_entropy_shard_finish", {&row_max, &sum_exp, &target_logit, &losses});
  const float* m = row_max.data<float>();
  const float* s = sum_exp.data<float>();
  const float* t = target_logit.data<float>();
  float* loss = losses.data<float>();
  if (vocab == 0) {  // the loss from the group's sums; no logit of this rank is real
    for (std::int64_t i = 0; i < losses.numel(); ++i)
      loss[i] = targets[i] < 0 ? 0.0f : std::log(s[i]) + m[i] - t[i];
    if (gradient) {
      for (std::int64_t r = 0; r < logits.dim(0); ++r)
        std::memset(static_cast<char*>(logits.raw()) +
                        static_cast<std::size_t>(r * logits.stride(0)) * logits.element_size(),
                    0, static_cast<std::size_t>(logits.dim(1)) * logits.element_size());
    }
    return;
  }
  by_logit_blocks(
      logits, vocab, gradient, [&](std::int64_t r0, std::int64_t rows, float* l, std::int64_t ld) {
        cpu::cross_entropy_shard_finish<float>(l, targets + r0, vocab_begin, m + r0, s + r0, t + r0,
                                               rows, vocab, ld, static_cast<float>(grad_scale),
                                               loss + r0, gradient);
      });
}

double sum(const Tensor& x) {
  half_type("sum", {&x});
  check_contiguous("sum", {&x});
  const F32Image x32 = input(x);
  double total = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) total += static_cast<double>(x32.data()[i]);
  return total;
}

double sum_of_squares(const Tensor& x) {
  half_type("sum_of_squares", {&x});
  check_contiguous("sum_of_squares", {&x});
  // Widening is exact, so this is the f32 kernel's sum of the same values.
  const F32Image x32 = input(x);
  return cpu::sum_of_squares<float>(x32.data(), x.numel());
}

void scale(const Tensor& x, double factor) {
  half_type("scale", {&x});
  check_contiguous("scale", {&x});
  const RowView xs(x);
  flat_pieces(x.numel(), 1, [&](std::int64_t first, std::int64_t count, float* v) {
    xs.widen(0, 1, first, first + count, v);
    cpu::scale_in_place<float>(v, count, static_cast<float>(factor), kHere);
    xs.narrow(v, 0, 1, first, first + count);
  });
}

}  // namespace oases::kernels::half
