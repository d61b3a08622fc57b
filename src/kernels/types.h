// Plain argument types of the kernels of kernels/kernels.h that every device's implementation
// shares (dropout_rule.h and gemm16_paths.h hold the dropout and 16-bit product ones).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace oases::kernels {

// The rows of the vocabulary this rank holds (vocab-parallel embedding): table row i is token
// begin + i. The default holds every token.
struct VocabRange {
  std::int64_t begin = 0;
  std::int64_t end = std::numeric_limits<std::int64_t>::max();
};

// Attention of `rows` new positions over a key/value cache.
// REQUIRES: rows >= 0, past >= 0, past + rows <= capacity; head_dim > 0; heads a positive
// multiple of kv_heads.
struct CachedAttentionShape {
  std::int64_t rows = 0;      // new positions
  std::int64_t past = 0;      // positions already in the cache (the first new one's position)
  std::int64_t capacity = 0;  // positions the cache holds at most
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
};

// One AdamW update (torch.optim.AdamW's hyperparameters at one step).
struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // pass 0 for parameters that take no decay (biases, norms)
  std::int64_t step = 1;    // 1-based count of updates including this one (bias correction)
};

// One SGD update (torch.optim.SGD with dampening 0).
struct SgdStep {
  double lr = 0;
  double momentum = 0;      // 0: no momentum buffer
  bool nesterov = false;    // REQUIRES: momentum > 0
  double weight_decay = 0;  // L2 added to the gradient; pass 0 for parameters without decay
};

// How an element-wise reduction combines two values.
enum class Reduction : std::uint8_t { sum, max, min };

// A measured peak rate of matrix products (measure_product_peak): the best sustained FLOP/s
// over a few transformer-like shapes at the thread count of the measurement.
struct ProductPeak {
  double flops_per_s = 0;
  double seconds = 0;     // wall time the measurement took
  // Of the best run: CPU time over (wall time x threads), at most 1. Below 0.75 no run had the
  // cores to itself (the machine was busy), and `flops_per_s` is that run's rate divided by
  // its share (`loaded`): what the cores deliver to a process that has them.
  double cpu_share = 1;
  bool loaded = false;
  int runs = 0;
  std::string shape;      // of the best run, "MxKxN"
};

}  // namespace oases::kernels
