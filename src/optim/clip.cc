#include "optim/clip.h"

#include "core/error.h"
#include "kernels/kernels.h"

namespace oases::optim {
namespace {

// clip.h takes f32 and f64 flats only (the optimizers' gradient dtypes), although the kernels
// would also take 16-bit ones: another dtype here is a caller's bug.
void check_float(const Tensor& flat, const char* what) {
  OASES_ASSERT(flat.dtype() == DType::f32 || flat.dtype() == DType::f64, "{}: no kernel for {}",
               what, dtype_name(flat.dtype()));
}

}  // namespace

double sum_of_squares(Tensor flat, std::int64_t begin, std::int64_t end) {
  OASES_ASSERT(0 <= begin && begin <= end && end <= flat.numel(),
               "sum_of_squares: range [{}, {}) is not inside [0, {})", begin, end, flat.numel());
  check_float(flat, "sum_of_squares");
  if (begin == end) return 0;
  return kernels::sum_of_squares(flat.reshaped({flat.numel()}).view(begin, {end - begin}));
}

void scale(Tensor flat, double factor) {
  check_float(flat, "scale");
  if (flat.empty() || flat.numel() == 0) return;
  kernels::scale(flat, factor);
}

double clip_coefficient(double total_norm, double max_norm) {
  return kernels::clip_coefficient(total_norm, max_norm);
}

}  // namespace oases::optim
