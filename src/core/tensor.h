// Tensor: a non-owning, contiguous, row-major view of typed memory. Up to 4 dimensions.
// A Tensor never allocates; memory comes from a Buffer or an Arena that outlives it.
// Shapes are written [d0, d1, ...] with the last dimension contiguous.
#pragma once

#include "core/dtype.h"
#include "core/error.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
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
  Tensor(void* data, DType dtype, Shape shape) : data_(data), dtype_(dtype), shape_(shape) {}

  template <class T>
  static Tensor of(T* data, Shape shape) { return Tensor(data, dtype_of<T>::value, shape); }

  void* raw() const { return data_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr; }

  // Typed access; the element type must match the tensor's dtype.
  template <class T>
  T* data() const {
    OASES_ASSERT(dtype_ == dtype_of<T>::value, "tensor holds {}, accessed as {}",
                 dtype_name(dtype_), dtype_name(dtype_of<T>::value));
    return static_cast<T*>(data_);
  }

  // The same memory seen with another shape of equal element count.
  Tensor reshaped(Shape shape) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_;
};

}  // namespace oases
