// Shape checks and the [outer, rows, inner] view shared by the CPU and CUDA
// kernels of masked::boolean_mask and masked::boolean_mask_backward.
// torch_masked/ops/boolean_mask.py:_masked_view prints the same messages.
#pragma once

#include "common.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace torch_masked {

// The tensor seen as [outer, rows, inner]: rows is mask.numel() (the masked
// dims flattened), so each mask position owns one contiguous slice of `inner`
// elements in every one of the `outer` blocks.
struct MaskedView {
  int64_t axis;  // normalised: 0 <= axis, axis + mask.dim() <= rank
  int64_t mask_dims;
  int64_t outer;
  int64_t rows;
  int64_t inner;

  // shape[:axis] + [selected] + shape[axis + mask_dims:]
  std::vector<int64_t> masked_shape(at::IntArrayRef shape, int64_t selected) const {
    std::vector<int64_t> result(shape.begin(), shape.begin() + axis);
    result.push_back(selected);
    result.insert(result.end(), shape.begin() + axis + mask_dims, shape.end());
    return result;
  }
};

// Checks `mask` against the shape it masks (`shape_name` says which argument
// that is) and returns the view. A negative axis counts from the end of the
// shape whatever the mask's rank.
inline MaskedView masked_view(
    const char* op, const char* shape_name, at::IntArrayRef shape, const at::Tensor& mask, int64_t axis) {
  MASKED_CHECK_TYPE(mask.scalar_type() == at::kBool, op, ": expected mask of dtype torch.bool, got ",
                   dtype_name(mask.scalar_type()));
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t mask_dims = mask.dim();
  MASKED_CHECK_VALUE(mask_dims >= 1, op, ": expected mask of rank >= 1, got a 0-d mask");
  MASKED_CHECK_VALUE(mask_dims <= rank, op, ": expected mask.dim() <= ", rank, " (the rank of ", shape_name,
                    "), got mask.dim()=", mask_dims);
  MASKED_CHECK_INDEX(axis >= -rank && axis < rank, op, ": expected axis in [", -rank, ", ", rank, ") for ",
                    shape_name, " of rank ", rank, ", got axis=", axis);
  const int64_t start = axis < 0 ? axis + rank : axis;
  MASKED_CHECK_VALUE(start + mask_dims <= rank, op, ": expected axis + mask.dim() <= ", rank, " (the rank of ",
                    shape_name, "), got axis=", axis, axis < 0 ? message(" (dimension ", start, ")") : "",
                    " and mask.dim()=", mask_dims);
  MASKED_CHECK_VALUE(shape.slice(start, mask_dims) == mask.sizes(), op, ": expected mask.shape to equal ", shape_name,
                    "[", start, ":", start + mask_dims, "], got mask.shape=", mask.sizes(), " and ", shape_name, "=",
                    shape);
  MaskedView view{start, mask_dims, 1, 1, 1};
  for (int64_t d = 0; d < rank; ++d) {
    int64_t& part = d < start ? view.outer : d < start + mask_dims ? view.rows : view.inner;
    part *= shape[d];
  }
  return view;
}

// Slices move as units of the widest size (16, 8, 4, 2 or 1 bytes) that
// divides a slice and to which every buffer involved is aligned.
inline int64_t widest_unit_bytes(int64_t slice_bytes, std::initializer_list<const void*> buffers) {
  for (int64_t unit = 16; unit > 1; unit /= 2) {
    bool fits = slice_bytes % unit == 0;
    for (const void* buffer : buffers) {
      fits = fits && reinterpret_cast<uintptr_t>(buffer) % unit == 0;
    }
    if (fits) {
      return unit;
    }
  }
  return 1;
}

// The checks of masked::boolean_mask_backward beyond those on mask: sizes of
// input_shape are not negative (a tensor's shape, in the forward, never is),
// and grad has the forward result's shape, shape[:axis] + [n] +
// shape[axis+K:], n printed as "n" since only the kernels know it.
inline void check_masked_grad(const at::Tensor& grad, at::IntArrayRef input_shape, const MaskedView& view) {
  for (const int64_t size : input_shape) {
    MASKED_CHECK_VALUE(size >= 0, "boolean_mask_backward: expected non-negative sizes in input_shape, got input_shape=",
                      input_shape);
  }
  const auto expected = view.masked_shape(input_shape, -1);
  bool same = grad.dim() == static_cast<int64_t>(expected.size());
  for (int64_t d = 0; same && d < grad.dim(); ++d) {
    same = d == view.axis || grad.size(d) == expected[d];
  }
  if (!same) {
    std::string shape;
    for (int64_t d = 0; d < static_cast<int64_t>(expected.size()); ++d) {
      shape += message(d ? ", " : "", d == view.axis ? "n" : std::to_string(expected[d]));
    }
    MASKED_CHECK_VALUE(false, "boolean_mask_backward: expected grad of shape [", shape, "], got ", grad.sizes());
  }
}

}  // namespace torch_masked
