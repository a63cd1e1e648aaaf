// ddtree-deploy GPU check: our own stand-in for apache-tvm-ffi's tvm::ffi::TensorView, the
// non-owning tensor view SGLang's host checks read (shape, strides, dtype, device, data).
// Same meanings as tvm-ffi's: sizes and strides in elements; a dimension of size 1 is
// contiguous whatever its stride; a negative index counts from the last dimension.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/dtype.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tvm {
namespace ffi {

class ShapeView {
 public:
  ShapeView(const int64_t* data, int64_t size) : data_(data), size_(size) {}
  const int64_t* begin() const { return data_; }
  const int64_t* end() const { return data_ + size_; }
  int64_t size() const { return size_; }
  int64_t operator[](int64_t i) const { return data_[i]; }
  int64_t Product() const {
    int64_t p = 1;
    for (int64_t i = 0; i < size_; ++i) p *= data_[i];
    return p;
  }

 private:
  const int64_t* data_;
  int64_t size_;
};

class TensorView {
 public:
  TensorView(const DLTensor* tensor) : tensor_(*tensor) {}  // NOLINT(*): implicit, as tvm-ffi's

  void* data_ptr() const { return tensor_.data; }
  DLDevice device() const { return tensor_.device; }
  int32_t ndim() const { return tensor_.ndim; }
  int32_t dim() const { return tensor_.ndim; }
  DLDataType dtype() const { return tensor_.dtype; }
  ShapeView shape() const { return ShapeView(tensor_.shape, tensor_.ndim); }
  ShapeView sizes() const { return shape(); }
  ShapeView strides() const { return ShapeView(tensor_.strides, tensor_.ndim); }
  int64_t numel() const { return shape().Product(); }
  int64_t size(int64_t idx) const { return tensor_.shape[checked(idx)]; }
  int64_t stride(int64_t idx) const { return tensor_.strides[checked(idx)]; }
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int32_t k = tensor_.ndim - 1; k >= 0; --k) {
      if (tensor_.shape[k] == 1) continue;
      if (tensor_.strides[k] != expected) return false;
      expected *= tensor_.shape[k];
    }
    return true;
  }

 private:
  int64_t checked(int64_t idx) const {
    const int64_t k = idx >= 0 ? idx : tensor_.ndim + idx;
    if (k < 0 || k >= tensor_.ndim) {
      throw std::out_of_range("Index " + std::to_string(idx) + " out of bounds for tensor with " +
                              std::to_string(tensor_.ndim) + " dimensions");
    }
    return k;
  }

  DLTensor tensor_;
};

}  // namespace ffi
}  // namespace tvm
