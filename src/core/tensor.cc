#include "core/tensor.h"

#include <fmt/format.h>

namespace oases {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(const std::vector<std::int64_t>& dims) {
  OASES_ASSERT(dims.size() <= kMaxDims, "at most {} dimensions, got {}", kMaxDims, dims.size());
  ndim_ = static_cast<int>(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    OASES_ASSERT(dims[i] >= 0, "negative dimension {}", dims[i]);
    dims_[i] = dims[i];
  }
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<std::size_t>(i)];
  return n;
}

std::vector<std::int64_t> Shape::to_vector() const {
  return {dims_.begin(), dims_.begin() + ndim_};
}

std::string Shape::str() const { return fmt::format("[{}]", fmt::join(to_vector(), ", ")); }

bool Shape::operator==(const Shape& other) const {
  return ndim_ == other.ndim_ && to_vector() == other.to_vector();
}

Tensor Tensor::reshaped(Shape shape) const {
  OASES_ASSERT(shape.numel() == numel(), "reshape {} -> {} changes the element count",
               shape_.str(), shape.str());
  return Tensor(data_, dtype_, shape);
}

}  // namespace oases
