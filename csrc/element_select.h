// The element-selection machinery shared by masked::where.self and
// masked::select on CPU and CUDA: argument checks, type promotion, and the
// broadcast geometry that both backends walk.
//
// A selection writes out[i] = condition[i] ? x[i] : y[i] into a fresh
// contiguous output. Inputs are read through element strides over the
// output's shape (stride 0 along broadcast axes), never copied to the full
// shape. Size-1 axes are dropped and axes that every operand walks evenly are
// merged, so a same-shape contiguous call becomes one flat run and a row
// selection becomes [rows, row length] with a condition stride of 0 inside
// the row.
#pragma once

#include "common.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace torch_masked {

// Most axes a selection takes (as TensorIterator); the geometry is a
// fixed-size kernel argument on CUDA.
constexpr int kMaxSelectDims = 25;

enum SelectOperand { kCondition = 0, kX = 1, kY = 2, kNumSelectOperands = 3 };

// The output's axes innermost first, after merging, and each operand's element
// stride along them. The output itself is contiguous: flat index i.
struct SelectGeometry {
  int dims = 0;
  int64_t sizes[kMaxSelectDims];
  int64_t strides[kNumSelectOperands][kMaxSelectDims];

  // Element offsets of every operand for flat output index `linear` (below
  // the output's size), and, when asked, its coordinates along the merged
  // axes. `Index` is the type to divide in: uint32_t where the output's size
  // allows, 64-bit division being many times slower on a GPU. What is left
  // for the outermost axis is its coordinate, with no division.
  template <typename Index = int64_t>
  C10_HOST_DEVICE void offsets_at(Index linear, int64_t offsets[kNumSelectOperands],
                                  int64_t* coords = nullptr) const {
    for (int op = 0; op < kNumSelectOperands; ++op) {
      offsets[op] = 0;
    }
    for (int d = 0; d < dims; ++d) {
      Index coord = linear;
      if (d + 1 < dims) {
        const Index size = static_cast<Index>(sizes[d]);
        coord = linear % size;
        linear /= size;
      }
      for (int op = 0; op < kNumSelectOperands; ++op) {
        offsets[op] += static_cast<int64_t>(coord) * strides[op][d];
      }
      if (coords != nullptr) {
        coords[d] = static_cast<int64_t>(coord);
      }
    }
  }
};

// The tensors of one selection: x and y already in the result dtype, the
// output allocated, and the geometry that relates them.
struct Selection {
  at::Tensor condition;
  at::Tensor x;
  at::Tensor y;
  at::Tensor out;
  SelectGeometry geometry;
  // x or y is a number held on the host (prepare_where_number), which the
  // CUDA kernels take as a value rather than from device memory.
  bool x_is_number = false;
  bool y_is_number = false;
};

// torch_masked/ops/where.py:_check_condition_dtype prints the same words.
inline void check_condition_dtype(const char* op, const at::Tensor& condition) {
  MASKED_CHECK_TYPE(condition.scalar_type() == at::kBool, op, ": expected condition of dtype torch.bool, got ",
                   dtype_name(condition.scalar_type()));
}

// NumPy broadcasting of condition, x and y; the error names all three shapes.
inline std::vector<int64_t> broadcast_select_shape(const at::Tensor& condition, const at::Tensor& x,
                                                    const at::Tensor& y) {
  const int64_t dims = std::max({condition.dim(), x.dim(), y.dim()});
  std::vector<int64_t> shape(dims, 1);
  for (const at::Tensor* t : {&condition, &x, &y}) {
    for (int64_t d = 0; d < t->dim(); ++d) {
      int64_t& size = shape[dims - t->dim() + d];
      const int64_t own = t->size(d);
      MASKED_CHECK(own == size || own == 1 || size == 1,
                  "where: expected condition, x and y to broadcast together, got condition ", condition.sizes(),
                  ", x ", x.sizes(), ", y ", y.sizes());
      size = own == 1 ? size : own;
    }
  }
  return shape;
}

// The geometry of reading condition, x and y (each broadcastable to `shape`)
// into a contiguous output of `shape`.
inline SelectGeometry select_geometry(at::IntArrayRef shape, const at::Tensor* operands[kNumSelectOperands]) {
  SelectGeometry g;
  const int64_t dims = static_cast<int64_t>(shape.size());
  for (int64_t d = dims - 1; d >= 0; --d) {
    if (shape[d] == 1) {
      continue;
    }
    int64_t strides[kNumSelectOperands];
    for (int op = 0; op < kNumSelectOperands; ++op) {
      const at::Tensor& t = *operands[op];
      const int64_t own = d - (dims - t.dim());
      strides[op] = own < 0 || t.size(own) == 1 ? 0 : t.stride(own);
    }
    // Merge into the axis inside this one when every operand steps over that
    // whole axis to reach the next element of this one.
    bool merges = g.dims > 0;
    for (int op = 0; op < kNumSelectOperands && merges; ++op) {
      merges = strides[op] == g.strides[op][g.dims - 1] * g.sizes[g.dims - 1];
    }
    if (merges) {
      g.sizes[g.dims - 1] *= shape[d];
      continue;
    }
    g.sizes[g.dims] = shape[d];
    for (int op = 0; op < kNumSelectOperands; ++op) {
      g.strides[op][g.dims] = strides[op];
    }
    ++g.dims;
  }
  if (g.dims == 0) {  // a single element
    g.sizes[0] = 1;
    for (int op = 0; op < kNumSelectOperands; ++op) {
      g.strides[op][0] = 0;
    }
    g.dims = 1;
  }
  return g;
}

// x and y in the result dtype (torch.result_type of the pair), the output of
// `shape` allocated, and the geometry. `condition` may be a view shaped for
// broadcasting (select's row form).
inline Selection make_selection(const char* op, const at::Tensor& condition, const at::Tensor& x,
                                const at::Tensor& y, at::IntArrayRef shape, at::ScalarType dtype) {
  MASKED_CHECK(shape.size() <= kMaxSelectDims, op, ": expected at most ", kMaxSelectDims, " dimensions, got ",
              shape.size());
  check_element_aligned(op, "x", x);
  check_element_aligned(op, "y", y);
  // Tensor::to costs a dispatch even when there is nothing to convert.
  const auto promoted = [dtype](const at::Tensor& t) { return t.scalar_type() == dtype ? t : t.to(dtype); };
  // On the condition's device: x or y may be a number held on the host.
  Selection s{condition, promoted(x), promoted(y), uninitialized(shape, condition.options().dtype(dtype)), {}};
  const at::Tensor* operands[kNumSelectOperands] = {&s.condition, &s.x, &s.y};
  s.geometry = select_geometry(shape, operands);
  return s;
}

// masked::where.self: NumPy broadcasting of all three.
inline Selection prepare_where(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
  check_same_device("where", {{"condition", &condition}, {"x", &x}, {"y", &y}});
  check_condition_dtype("where", condition);
  const std::vector<int64_t> shape = broadcast_select_shape(condition, x, y);
  return make_selection("where", condition, x, y, shape, at::result_type(x, y));
}

// masked::where.ScalarSelf (number_is_x) and where.ScalarOther: the number as
// a 0-d tensor on the host, of the dtype torch.where gives the pair (the
// number promotes as a wrapped number: where(c, half_tensor, 2.0) stays
// half). The CPU kernels read it as any 0-d operand; the CUDA kernels take
// its value as a kernel argument.
inline Selection prepare_where_number(const at::Tensor& condition, const at::Tensor& tensor,
                                      const at::Scalar& number, bool number_is_x) {
  check_same_device("where", {{"condition", &condition}, {number_is_x ? "y" : "x", &tensor}});
  check_condition_dtype("where", condition);
  const at::ScalarType dtype = at::result_type(tensor, number);
  at::Tensor value;
  try {
    value = at::scalar_tensor(number, at::TensorOptions(dtype));
  } catch (const std::runtime_error& error) {
    // c10's refusal of a number the dtype cannot hold, torch.where's error
    // ("value cannot be converted to type int8_t without overflow"), names
    // neither the argument nor the number: named as the front doors name
    // an argument they cannot make a tensor of (torch_masked/ops/_checks.py).
    MASKED_CHECK(false, "where: cannot make a tensor of ", number_is_x ? "x" : "y", " = ", number, ": ",
                 error.what());
  }
  const at::Tensor& x = number_is_x ? value : tensor;
  const at::Tensor& y = number_is_x ? tensor : value;
  Selection s = make_selection("where", condition, x, y, broadcast_select_shape(condition, x, y), dtype);
  (number_is_x ? s.x_is_number : s.y_is_number) = true;
  return s;
}

// select's condition as where's, for an x of rank `rank`: a row condition
// (1-D over the first axis of an x of rank >= 2) becomes the column
// [rows, 1, ..., 1], which broadcasting takes to whole rows; a scalar or
// element-wise one stays as it is. One view, for the kernels; the gradient,
// which may hold a DTensor, unsqueezes instead (autograd/where_autograd.cpp).
inline at::Tensor select_condition_as_where(const at::Tensor& condition, int64_t rank) {
  if (condition.dim() != 1 || rank <= 1) {
    return condition;
  }
  std::vector<int64_t> column(rank, 1);
  column[0] = condition.size(0);
  return condition.view(column);
}

// masked::select: x and y of one shape; condition a scalar, of x's shape, or
// (x of rank >= 1) 1-D over x's first axis, picking whole rows.
inline Selection prepare_select(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
  check_same_device("select", {{"condition", &condition}, {"x", &x}, {"y", &y}});
  check_condition_dtype("select", condition);
  MASKED_CHECK(x.sizes() == y.sizes(), "select: expected x and y of the same shape, got x ", x.sizes(), " and y ",
              y.sizes());
  const bool elementwise = condition.dim() == 0 || condition.sizes() == x.sizes();
  const bool rows = x.dim() >= 1 && condition.dim() == 1 && condition.size(0) == x.size(0);
  MASKED_CHECK(elementwise || rows, "select: expected condition to be a scalar, of x's shape ", x.sizes(),
              ", or 1-D of length x.shape[0], got condition of shape ", condition.sizes());
  return make_selection("select", select_condition_as_where(condition, x.dim()), x, y, x.sizes(),
                        at::result_type(x, y));
}

}  // namespace torch_masked
