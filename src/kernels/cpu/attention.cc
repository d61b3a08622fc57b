#include "kernels/cpu/attention.h"

#include "core/error.h"
#include "core/philox.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace oases::kernels::cpu {
namespace {

using std::int64_t;

// Tile products go through BLAS, one call on the task's own thread (gemm_on_calling_thread:
// never threaded by BLAS, so a tile's bits do not depend on the thread count). Measured at
// B=8, seq=256, heads=8, head_dim=64, float, one thread, forward + backward CPU time:
// vectorised loops (inner loop over head_dim) 210 ms, the same loops built for AVX-512
// (-march=native) 180 ms, cblas_sgemm on the tiles 100 ms with OpenBLAS's generic Prescott
// kernels and 35 ms with its SkylakeX ones (which the `oases` binary selects, see
// blas_runtime.h). Row-major; ld* are the row strides of the stored matrices.
template <class T>
void tile_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  gemm_on_calling_thread<T>(trans_a ? Trans::yes : Trans::no, trans_b ? Trans::yes : Trans::no, M,
                            N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Per-thread scratch is carved from one allocation made before the parallel region (so no
// allocation can throw inside it), each thread's share rounded up to a cache line so that
// threads never write the same line.
template <class T>
class ThreadScratch {
 public:
  ThreadScratch(int64_t per_thread, int threads)
      : stride_((per_thread + kLine - 1) / kLine * kLine),
        data_(static_cast<std::size_t>(stride_ * threads + kLine)) {}
  T* for_thread(int thread) {
    // Align each share to 64 bytes: the base of a std::vector is only 16-byte aligned.
    const auto base = reinterpret_cast<std::uintptr_t>(data_.data());
    const std::uintptr_t aligned = (base + 63) & ~std::uintptr_t{63};
    return reinterpret_cast<T*>(aligned) + stride_ * thread;
  }

 private:
  static constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  int64_t stride_;
  std::vector<T> data_;
};

// Online-softmax step for one [nq, nk] score tile s (row stride `block`): turns the scores
// into exp(scale * s - new running max), zero past the causal limit, and folds the tile into
// each row's running max and sum, rescaling the row's output accumulator (acc, [nq,
// head_dim]) to the new max. `first` is the first key block: nothing to rescale yet.
template <class T>
OASES_VECTOR_CLONES void online_softmax_tile(T* s, int64_t nq, int64_t nk, int64_t block,
                                             bool diagonal, bool first, T scale, T* row_max,
                                             T* row_sum, T* acc, int64_t head_dim) {
  for (int64_t r = 0; r < nq; ++r) {
    T* srow = s + r * block;
    // Blocks are aligned on the same grid for queries and keys, so only the diagonal tile is
    // cut by the causal mask: its row r sees keys 0..r.
    const int64_t limit = diagonal ? r + 1 : nk;
    T tile_max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : tile_max)
    for (int64_t j = 0; j < limit; ++j) tile_max = tile_max > srow[j] ? tile_max : srow[j];
    // scale > 0, so the max of the scaled scores is the scaled max.
    const T new_max = std::max(row_max[r], tile_max * scale);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < limit; ++j) {
      const T p = exp_approx(srow[j] * scale - new_max);
      srow[j] = p;
      sum += p;
    }
    for (int64_t j = limit; j < nk; ++j) srow[j] = T(0);
    if (first) {
      row_sum[r] = sum;
    } else {
      const T correction = exp_approx(row_max[r] - new_max);
      row_sum[r] = row_sum[r] * correction + sum;
      T* arow = acc + r * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) arow[d] *= correction;
    }
    row_max[r] = new_max;
  }
}

// Rebuilds a probability tile from the saved log-sum-exp: p = exp(scale * s - lse), zero past
// the causal limit. s holds the raw scores on entry and the probabilities on return.
template <class T>
OASES_VECTOR_CLONES void probabilities_tile(T* s, int64_t nq, int64_t nk, int64_t block,
                                            bool diagonal, T scale, const T* lse) {
  for (int64_t r = 0; r < nq; ++r) {
    T* prow = s + r * block;
    const int64_t limit = diagonal ? r + 1 : nk;
    const T row_lse = lse[r];
#pragma omp simd
    for (int64_t j = 0; j < limit; ++j) prow[j] = exp_approx(prow[j] * scale - row_lse);
    for (int64_t j = limit; j < nk; ++j) prow[j] = T(0);
  }
}

// dS = P * (dP - D) elementwise, in place over the dP tile.
template <class T>
OASES_VECTOR_CLONES void score_gradient_tile(const T* p, T* dp, int64_t nq, int64_t nk,
                                             int64_t block, const T* row_dot) {
  for (int64_t r = 0; r < nq; ++r) {
    const T* prow = p + r * block;
    T* dsrow = dp + r * block;
    const T dr = row_dot[r];
#pragma omp simd
    for (int64_t j = 0; j < nk; ++j) dsrow[j] = prow[j] * (dsrow[j] - dr);
  }
}

// The keep decisions of one (sample, head) pair's probabilities (attention_probability_keep's
// rule), with the key derived once.
class ProbabilityMask {
 public:
  ProbabilityMask(const AttentionDropout& dropout, int64_t global_sample, int64_t global_head)
      : key_(philox_key(dropout.site.seed,
                        (std::uint64_t{dropout.site.layer} << 32 |
                         (dropout.site.site | static_cast<std::uint32_t>(global_head) << 8)) +
                            1)),
        sample_(static_cast<std::uint32_t>(global_sample)),
        step_(dropout.site.step),
        p_(dropout.p),
        query_offset_(dropout.query_offset),
        key_offset_(dropout.key_offset) {}

  bool keep(int64_t query, int64_t key) const {
    const PhiloxCounter counter = {static_cast<std::uint32_t>(key >> 2),
                                   static_cast<std::uint32_t>(query), sample_, step_};
    return keep_word(philox4x32(counter, key_), key);
  }

  // m[r, j] = scale where probability (i0 + r, j0 + j) is kept, else 0, over an [nq, nk] tile
  // (row stride `block`); zero past the causal limit of a diagonal tile. One Philox block
  // serves four adjacent keys.
  template <class T>
  void fill_tile(T* m, int64_t i0, int64_t nq, int64_t j0, int64_t nk, int64_t block,
                 bool diagonal, T scale) const {
    for (int64_t r = 0; r < nq; ++r) {
      T* mrow = m + r * block;
      const int64_t limit = diagonal ? r + 1 : nk;
      const auto query = static_cast<std::uint32_t>(query_offset_ + i0 + r);
      PhiloxCounter bits{};
      int64_t bits_for = -1;  // the group of four keys `bits` holds
      for (int64_t j = 0; j < limit; ++j) {
        const int64_t key = key_offset_ + j0 + j;
        if (key >> 2 != bits_for) {
          bits_for = key >> 2;
          bits = philox4x32({static_cast<std::uint32_t>(bits_for), query, sample_, step_}, key_);
        }
        mrow[j] = keep_word(bits, key) ? scale : T(0);
      }
      for (int64_t j = limit; j < nk; ++j) mrow[j] = T(0);
    }
  }

 private:
  bool keep_word(const PhiloxCounter& bits, int64_t key) const {
    // uniform_open0 is k / 2^24 for an integer k, so the comparison in double is exact.
    return static_cast<double>(uniform_open0(bits[static_cast<std::size_t>(key & 3)])) > p_;
  }

  PhiloxKey key_;
  std::uint32_t sample_, step_;
  double p_;
  int64_t query_offset_, key_offset_;
};

// In place over an [nq, nk] tile (row stride `block`): a[r, j] *= m[r, j].
template <class T>
OASES_VECTOR_CLONES void multiply_tile(T* a, const T* m, int64_t nq, int64_t nk, int64_t block) {
  for (int64_t r = 0; r < nq; ++r) {
    T* arow = a + r * block;
    const T* mrow = m + r * block;
#pragma omp simd
    for (int64_t j = 0; j < nk; ++j) arow[j] *= mrow[j];
  }
}

void check_dropout(const AttentionDropout& dropout, const AttentionShape& shape) {
  OASES_ASSERT(dropout.p >= 0.0 && dropout.p < 1.0,
               "attention dropout probability must be in [0, 1), got {}", dropout.p);
  if (dropout.p == 0.0) return;
  OASES_ASSERT(dropout.site.site < 256, "attention dropout site {} must be below 256",
               dropout.site.site);
  OASES_ASSERT(dropout.sample_offset >= 0 && dropout.head_offset >= 0 &&
                   dropout.head_offset + shape.heads <= (int64_t{1} << 24),
               "attention dropout: sample offset {}, heads {}..{} (heads must be below 2^24)",
               dropout.sample_offset, dropout.head_offset, dropout.head_offset + shape.heads);
}

void check_shape(const AttentionShape& shape, int64_t block) {
  const int64_t B = shape.batch, seq = shape.seq, heads = shape.heads;
  const int64_t kv_heads = shape.kv_heads, head_dim = shape.head_dim;
  OASES_ASSERT(B >= 0 && seq >= 0 && heads >= 0 && kv_heads >= 0 && head_dim > 0,
               "attention shape: batch={} seq={} heads={} kv_heads={} head_dim={}", B, seq, heads,
               kv_heads, head_dim);
  OASES_ASSERT(
      (heads == 0 && kv_heads == 0) || (kv_heads > 0 && heads % kv_heads == 0 && heads >= kv_heads),
      "attention: {} query heads cannot share {} key/value heads evenly", heads, kv_heads);
  OASES_ASSERT(block > 0, "attention block size {} must be positive", block);
  // BLAS takes 32-bit sizes and strides; the widest is a row of qkv.
  OASES_ASSERT((heads + 2 * kv_heads) * head_dim <= std::numeric_limits<int>::max(),
               "attention row of {} elements is too wide for BLAS",
               (heads + 2 * kv_heads) * head_dim);
}

// Where each part of a head lives in the qkv and out rows.
struct HeadColumns {
  explicit HeadColumns(const AttentionShape& shape)
      : qkv_ld((shape.heads + 2 * shape.kv_heads) * shape.head_dim),
        out_ld(shape.heads * shape.head_dim),
        k_begin(shape.heads * shape.head_dim),
        v_begin((shape.heads + shape.kv_heads) * shape.head_dim),
        group(shape.kv_heads > 0 ? shape.heads / shape.kv_heads : 1) {}
  int64_t qkv_ld;   // row stride of qkv and dqkv
  int64_t out_ld;   // row stride of out and dout
  int64_t k_begin;  // first column of kv head 0's k
  int64_t v_begin;  // first column of kv head 0's v
  int64_t group;    // q heads per kv head
};

}  // namespace

namespace detail {

template <class T>
void attention_forward_blocked(const T* qkv, T* out, T* lse, const AttentionShape& shape,
                               int64_t block, const AttentionDropout& dropout) {
  check_shape(shape, block);
  check_dropout(dropout, shape);
  const bool drops = dropout.p > 0.0;
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const int64_t seq = shape.seq, heads = shape.heads, head_dim = shape.head_dim;
  const HeadColumns cols(shape);
  const int64_t ld = cols.qkv_ld, C = cols.out_ld;
  const int64_t blocks = (seq + block - 1) / block;
  const int64_t tasks = shape.batch * heads * blocks;
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));

  // Per thread: a score tile, an output accumulator, the running max and sum of a query
  // block, and with dropout a mask tile.
  const int64_t tile = block * block;
  const int64_t acc_size = block * head_dim;
  ThreadScratch<T> scratch(tile + acc_size + 2 * block + (drops ? tile : 0),
                           omp_get_max_threads());

  // A task is one query block of one (batch, q head); every output element is written by
  // exactly one task with a fixed order of operations, so the result does not depend on
  // which thread runs it, and the schedule may be dynamic. Tasks go from the last query
  // block (under the causal mask, the one with most key blocks) to the first, so the cheap
  // ones fill in at the end.
#pragma omp parallel
  {
    T* s = scratch.for_thread(omp_get_thread_num());
    T* acc = s + tile;
    T* row_max = acc + acc_size;
    T* row_sum = row_max + block;
    T* mask = row_sum + block;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bh = task / blocks;
      const int64_t qb = blocks - 1 - task % blocks;
      const int64_t b = bh / heads, h = bh % heads;
      const int64_t kv_head = h / cols.group;
      const int64_t i0 = qb * block;
      const int64_t nq = std::min(block, seq - i0);
      const T* q = qkv + (b * seq + i0) * ld + h * head_dim;
      const int64_t key_blocks = shape.causal ? qb + 1 : blocks;
      const ProbabilityMask dropped(dropout, dropout.sample_offset + b, dropout.head_offset + h);

      std::fill(row_max, row_max + nq, -std::numeric_limits<T>::infinity());
      std::fill(row_sum, row_sum + nq, T(0));
      for (int64_t kb = 0; kb < key_blocks; ++kb) {
        const int64_t j0 = kb * block;
        const int64_t nk = std::min(block, seq - j0);
        const T* key_row = qkv + (b * seq + j0) * ld;
        const T* k = key_row + cols.k_begin + kv_head * head_dim;
        const T* v = key_row + cols.v_begin + kv_head * head_dim;
        tile_gemm(false, true, nq, nk, head_dim, T(1), q, ld, k, ld, T(0), s, block);
        const bool diagonal = shape.causal && kb == qb;
        online_softmax_tile(s, nq, nk, block, diagonal, kb == 0, scale, row_max, row_sum, acc,
                            head_dim);
        // The row sums above are the undropped ones; only the products with v see the mask.
        if (drops) {
          dropped.fill_tile(mask, i0, nq, j0, nk, block, diagonal, keep_scale);
          multiply_tile(s, mask, nq, nk, block);
        }
        tile_gemm(false, false, nq, head_dim, nk, T(1), s, block, v, ld, kb == 0 ? T(0) : T(1), acc,
                  head_dim);
      }

      T* o = out + (b * seq + i0) * C + h * head_dim;
      T* l = lse + bh * seq + i0;
      for (int64_t r = 0; r < nq; ++r) {
        const T inv = T(1) / row_sum[r];
        for (int64_t d = 0; d < head_dim; ++d) o[r * C + d] = acc[r * head_dim + d] * inv;
        l[r] = row_max[r] + std::log(row_sum[r]);
      }
    }
  }
}

template <class T>
void attention_backward_blocked(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                                const AttentionShape& shape, int64_t block,
                                const AttentionDropout& dropout) {
  check_shape(shape, block);
  check_dropout(dropout, shape);
  const bool drops = dropout.p > 0.0;
  const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
  const int64_t seq = shape.seq, heads = shape.heads, head_dim = shape.head_dim;
  const HeadColumns cols(shape);
  const int64_t ld = cols.qkv_ld, C = cols.out_ld, group = cols.group;
  const int64_t blocks = (seq + block - 1) / block;
  const int64_t pairs = shape.batch * shape.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));

  // Per thread: the probability tile, the dP / dS tile, D for every row of every q head of the
  // group, and with dropout a mask tile.
  const int64_t tile = block * block;
  ThreadScratch<T> scratch(2 * tile + group * seq + (drops ? tile : 0), omp_get_max_threads());

  // One (batch, kv head) per task: its dK and dV rows collect contributions from every query
  // block of every q head of its group, so keeping the pair on one thread makes the
  // accumulation race-free and its order fixed (hence the result is independent of the
  // thread that runs it). The q heads' dQ rows are written by this task alone too.
#pragma omp parallel
  {
    T* p = scratch.for_thread(omp_get_thread_num());
    T* ds = p + tile;
    T* row_dot_all = ds + tile;  // D_i = dO_i . O_i, [group, seq]
    T* mask = row_dot_all + group * seq;
#pragma omp for schedule(dynamic)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int64_t b = pair / shape.kv_heads, kv_head = pair % shape.kv_heads;
      const T* qkv_b = qkv + b * seq * ld;
      T* dqkv_b = dqkv + b * seq * ld;

      for (int64_t r = 0; r < group; ++r) {
        const int64_t h = kv_head * group + r;
        const T* do_all = dout + b * seq * C + h * head_dim;
        const T* o_all = out + b * seq * C + h * head_dim;
        T* dq_all = dqkv_b + h * head_dim;
        T* row_dot = row_dot_all + r * seq;
        for (int64_t i = 0; i < seq; ++i) {
          const T* dor = do_all + i * C;
          const T* orow = o_all + i * C;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < head_dim; ++d) dot += dor[d] * orow[d];
          row_dot[i] = dot;
          std::fill(dq_all + i * ld, dq_all + i * ld + head_dim, T(0));
        }
      }
      for (int64_t i = 0; i < seq; ++i) {
        T* g = dqkv_b + i * ld;
        std::fill(g + cols.k_begin + kv_head * head_dim,
                  g + cols.k_begin + (kv_head + 1) * head_dim, T(0));
        std::fill(g + cols.v_begin + kv_head * head_dim,
                  g + cols.v_begin + (kv_head + 1) * head_dim, T(0));
      }

      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int64_t j0 = kb * block;
        const int64_t nk = std::min(block, seq - j0);
        const T* k = qkv_b + j0 * ld + cols.k_begin + kv_head * head_dim;
        const T* v = qkv_b + j0 * ld + cols.v_begin + kv_head * head_dim;
        T* dk = dqkv_b + j0 * ld + cols.k_begin + kv_head * head_dim;
        T* dv = dqkv_b + j0 * ld + cols.v_begin + kv_head * head_dim;
        for (int64_t r = 0; r < group; ++r) {
          const int64_t h = kv_head * group + r;
          const int64_t bh = b * heads + h;
          const T* q_all = qkv_b + h * head_dim;
          const T* do_all = dout + b * seq * C + h * head_dim;
          T* dq_all = dqkv_b + h * head_dim;
          const T* row_dot = row_dot_all + r * seq;
          const T* l_all = lse + bh * seq;
          const ProbabilityMask dropped(dropout, dropout.sample_offset + b,
                                        dropout.head_offset + h);
          for (int64_t qb = shape.causal ? kb : 0; qb < blocks; ++qb) {
            const int64_t i0 = qb * block;
            const int64_t nq = std::min(block, seq - i0);
            const T* q = q_all + i0 * ld;
            const T* dor = do_all + i0 * C;
            T* dq = dq_all + i0 * ld;
            const bool diagonal = shape.causal && kb == qb;

            tile_gemm(false, true, nq, nk, head_dim, T(1), q, ld, k, ld, T(0), p, block);
            probabilities_tile(p, nq, nk, block, diagonal, scale, l_all + i0);
            if (drops) {
              // dV_j += P~^T dO_i with the dropped P~ = mask * P (formed in the dS tile).
              dropped.fill_tile(mask, i0, nq, j0, nk, block, diagonal, keep_scale);
              std::copy_n(p, (nq - 1) * block + nk, ds);
              multiply_tile(ds, mask, nq, nk, block);
              tile_gemm(true, false, nk, head_dim, nq, T(1), ds, block, dor, C, T(1), dv, ld);
            } else {
              // dV_j += P^T dO_i
              tile_gemm(true, false, nk, head_dim, nq, T(1), p, block, dor, C, T(1), dv, ld);
            }
            // dP~ = dO_i V_j^T; dP = mask * dP~; then dS = P * (dP - D) in place.
            tile_gemm(false, true, nq, nk, head_dim, T(1), dor, C, v, ld, T(0), ds, block);
            if (drops) multiply_tile(ds, mask, nq, nk, block);
            score_gradient_tile(p, ds, nq, nk, block, row_dot + i0);
            // dQ_i += scale dS K_j;  dK_j += scale dS^T Q_i
            tile_gemm(false, false, nq, head_dim, nk, scale, ds, block, k, ld, T(1), dq, ld);
            tile_gemm(true, false, nk, head_dim, nq, scale, ds, block, q, ld, T(1), dk, ld);
          }
        }
      }
    }
  }
}

template <class T>
void attention_forward_blocked(const T* qkv, T* out, T* lse, int64_t B, int64_t seq, int64_t heads,
                               int64_t head_dim, int64_t block) {
  attention_forward_blocked(qkv, out, lse, AttentionShape{B, seq, heads, heads, head_dim, true},
                            block);
}

template <class T>
void attention_backward_blocked(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                                int64_t B, int64_t seq, int64_t heads, int64_t head_dim,
                                int64_t block) {
  attention_backward_blocked(dout, qkv, out, lse, dqkv,
                             AttentionShape{B, seq, heads, heads, head_dim, true}, block);
}

}  // namespace detail

bool attention_probability_keep(const DropoutSite& site, double p, int64_t global_sample,
                                int64_t global_head, int64_t query, int64_t key) {
  const AttentionDropout dropout{p, site, 0, 0};
  check_dropout(dropout, AttentionShape{1, 1, global_head + 1, global_head + 1, 1, true});
  if (p == 0.0) return true;
  return ProbabilityMask(dropout, global_sample, global_head).keep(query, key);
}

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& shape,
                       const AttentionDropout& dropout) {
  detail::attention_forward_blocked(qkv, out, lse, shape, kAttentionBlock, dropout);
}

template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                        const AttentionShape& shape, const AttentionDropout& dropout) {
  detail::attention_backward_blocked(dout, qkv, out, lse, dqkv, shape, kAttentionBlock, dropout);
}

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t seq, int64_t heads,
                       int64_t head_dim) {
  detail::attention_forward_blocked(qkv, out, lse, B, seq, heads, head_dim, kAttentionBlock);
}

template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv, int64_t B,
                        int64_t seq, int64_t heads, int64_t head_dim) {
  detail::attention_backward_blocked(dout, qkv, out, lse, dqkv, B, seq, heads, head_dim,
                                     kAttentionBlock);
}

template <class T>
void attention_merge(T* out, T* lse, const T* part_out, const T* part_lse,
                     const AttentionShape& shape) {
  const int64_t seq = shape.seq, heads = shape.heads, hd = shape.head_dim, C = heads * hd;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < shape.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        T& l = lse[(b * heads + h) * seq + i];
        const T pl = part_lse[(b * heads + h) * seq + i];
        // A row that saw no key on one side (lse -inf) takes the other side whole.
        const T top = std::max(l, pl);
        if (top == -std::numeric_limits<T>::infinity()) continue;
        const T a = std::exp(l - top), p = std::exp(pl - top), sum = a + p;
        const T wa = a / sum, wp = p / sum;
        T* o = out + (b * seq + i) * C + h * hd;
        const T* po = part_out + (b * seq + i) * C + h * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = wa * o[d] + wp * po[d];
        l = top + std::log(sum);
      }
}

#define OASES_INSTANTIATE(T)                                                                      \
  template void attention_merge<T>(T*, T*, const T*, const T*, const AttentionShape&);            \
  template void attention_forward<T>(const T*, T*, T*, const AttentionShape&,                     \
                                     const AttentionDropout&);                                    \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, T*,                 \
                                      const AttentionShape&, const AttentionDropout&);            \
  template void detail::attention_forward_blocked<T>(const T*, T*, T*, const AttentionShape&,     \
                                                     int64_t, const AttentionDropout&);           \
  template void detail::attention_backward_blocked<T>(const T*, const T*, const T*, const T*, T*, \
                                                      const AttentionShape&, int64_t,             \
                                                      const AttentionDropout&);                   \
  template void attention_forward<T>(const T*, T*, T*, int64_t, int64_t, int64_t, int64_t);       \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, T*, int64_t,        \
                                      int64_t, int64_t, int64_t);                                 \
  template void detail::attention_forward_blocked<T>(const T*, T*, T*, int64_t, int64_t, int64_t, \
                                                     int64_t, int64_t);                           \
  template void detail::attention_backward_blocked<T>(                                            \
      const T*, const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);
OASES_INSTANTIATE(float)
OASES_INSTANTIATE(double)
#undef OASES_INSTANTIATE

}  // namespace oases::kernels::cpu
