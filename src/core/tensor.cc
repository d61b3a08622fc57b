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

Tensor::Tensor(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), device_(device), shape_(shape) {
  std::int64_t stride = 1;
  for (int i = shape_.ndim() - 1; i >= 0; --i) {
    strides_[static_cast<std::size_t>(i)] = stride;
    stride *= shape_[i];
  }
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (int i = shape_.ndim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[static_cast<std::size_t>(i)] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Tensor Tensor::reshaped(Shape shape) const {
  OASES_ASSERT(shape.numel() == numel(), "reshape {} -> {} changes the element count",
               shape_.str(), shape.str());
  OASES_ASSERT(is_contiguous(), "reshape of a strided view {}", shape_.str());
  return Tensor(data_, dtype_, shape, device_);
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  OASES_ASSERT(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
               "rows [{}, {}) of {}", begin, end, shape_.str());
  Tensor out = *this;
  std::vector<std::int64_t> dims = shape_.to_vector();
  dims[0] = end - begin;
  out.shape_ = Shape(dims);
  out.data_ = static_cast<char*>(data_) +
              static_cast<std::ptrdiff_t>(begin * strides_[0]) * static_cast<std::ptrdiff_t>(element_size());
  return out;
}

Tensor Tensor::columns(std::int64_t begin, std::int64_t end) const {
  OASES_ASSERT(ndim() == 2 && 0 <= begin && begin <= end && end <= shape_[1],
               "columns [{}, {}) of {}", begin, end, shape_.str());
  Tensor out = *this;
  out.shape_ = Shape({shape_[0], end - begin});
  out.data_ = static_cast<char*>(data_) +
              static_cast<std::ptrdiff_t>(begin) * static_cast<std::ptrdiff_t>(element_size());
  return out;
}

Tensor Tensor::view(std::int64_t offset, Shape shape) const {
  OASES_ASSERT(is_contiguous() && offset >= 0 && offset + shape.numel() <= numel(),
               "view of {} elements at {} inside {}", shape.numel(), offset, shape_.str());
  return Tensor(static_cast<char*>(data_) +
                    static_cast<std::ptrdiff_t>(offset) * static_cast<std::ptrdiff_t>(element_size()),
                dtype_, shape, device_);
}

Tensor Tensor::as_matrix(std::int64_t cols) const {
  OASES_ASSERT(cols > 0 && numel() % cols == 0, "{} elements are not rows of {}", numel(), cols);
  return reshaped({numel() / cols, cols});
}

}  // namespace oases
