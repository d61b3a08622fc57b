// Tensor: a non-owning view of typed memory on a device. Up to 4 dimensions, row-major, with
// strides in elements. A Tensor never allocates; memory comes from a Buffer or an Arena that
// outlives it. Shapes are written [d0, d1, ...]; the last dimension is always contiguous
// (stride 1), so a view is a stack of contiguous rows. A view made by the constructors is
// contiguous; columns() of a matrix is not (its rows keep the parent's row stride), which is
// how a kernel reads the q, k or v block of a fused [n, q|k|v] activation in place.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

namespace oases {

class Shape {
 public:
  static constexpr int kMaxDims = 4;
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims);

  int ndim() const { return ndim_; }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;
  std::vector<std::int64_t> to_vector() const;
  std::string str() const;  // "[2, 3]"
  bool operator==(const Shape& other) const;

 private:
  std::array<std::int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // A contiguous view.
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu());

  // A view of host memory; a const array may be viewed too (the view does not enforce it).
  template <class T>
  static Tensor of(T* data, Shape shape) {
    return Tensor(const_cast<std::remove_const_t<T>*>(data), dtype_of<T>::value, shape);
  }

  void* raw() const { return data_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  std::int64_t dim(int i) const { return shape_[i]; }
  std::int64_t stride(int i) const { return strides_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t element_size() const { return dtype_size(dtype_); }
  // Bytes of the elements (not of the span a strided view covers).
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr; }
  bool is_contiguous() const;

  // Typed access; the element type must match the tensor's dtype.
  template <class T>
  T* data() const {
    OASES_ASSERT(dtype_ == dtype_of<T>::value, "tensor holds {}, accessed as {}",
                 dtype_name(dtype_), dtype_name(dtype_of<T>::value));
    return static_cast<T*>(data_);
  }

  // The same memory seen with another shape of equal element count (contiguous views only).
  Tensor reshaped(Shape shape) const;
  // Rows [begin, end) of dimension 0.
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  // Columns [begin, end) of a 2-dimensional view; the rows keep this view's row stride.
  Tensor columns(std::int64_t begin, std::int64_t end) const;
  // A contiguous view of `shape` starting `offset` elements into this contiguous view.
  Tensor view(std::int64_t offset, Shape shape) const;
  // This contiguous view seen as a matrix [numel / cols, cols].
  Tensor as_matrix(std::int64_t cols) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_{};
  Shape shape_;
  std::array<std::int64_t, Shape::kMaxDims> strides_{};
};

}  // namespace oases
