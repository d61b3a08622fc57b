// AdamW and global-norm gradient clipping, with PyTorch's exact formulas
// (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_).
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // pass 0 for parameters that take no decay (biases, norms)
  std::int64_t step = 1;    // 1-based count of updates including this one (bias correction)
};

// p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, std::int64_t n, const AdamWStep& hp);

// sum_i x[i]^2, accumulated in double, deterministic for a fixed thread count.
template <class T>
double sum_of_squares(const T* x, std::int64_t n);

// x[i] *= factor
template <class T>
void scale_in_place(T* x, std::int64_t n, T factor);

// The factor clip_grad_norm_ multiplies gradients by: min(1, max_norm / (total_norm + 1e-6)).
double clip_coefficient(double total_norm, double max_norm);

}  // namespace oases::kernels::cpu
