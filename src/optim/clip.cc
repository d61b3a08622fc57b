#include "optim/clip.h"

#include "core/error.h"
#include "kernels/cpu/optimizer.h"

namespace oases::optim {
namespace k = oases::kernels::cpu;

double sum_of_squares(Tensor flat, std::int64_t begin, std::int64_t end) {
  OASES_ASSERT(0 <= begin && begin <= end && end <= flat.numel(),
               "sum_of_squares: range [{}, {}) is not inside [0, {})", begin, end, flat.numel());
  switch (flat.dtype()) {
    case DType::f32:
      return k::sum_of_squares(flat.data<float>() + begin, end - begin);
    case DType::f64:
      return k::sum_of_squares(flat.data<double>() + begin, end - begin);
    default:
      OASES_ASSERT(false, "sum_of_squares: no kernel for {}", dtype_name(flat.dtype()));
      return 0;
  }
}

void scale(Tensor flat, double factor) {
  switch (flat.dtype()) {
    case DType::f32:
      return k::scale_in_place(flat.data<float>(), flat.numel(), static_cast<float>(factor));
    case DType::f64:
      return k::scale_in_place(flat.data<double>(), flat.numel(), factor);
    default:
      OASES_ASSERT(false, "scale: no kernel for {}", dtype_name(flat.dtype()));
  }
}

double clip_coefficient(double total_norm, double max_norm) {
  return k::clip_coefficient(total_norm, max_norm);
}

}  // namespace oases::optim
