// Index math shared by the CPU and CUDA kernels of masked::scatter_nd,
// masked::gather_nd and masked::tensor_scatter_nd_add (and its in-place form).
//
// The indices are N rows of K entries (N = prod(indices.shape[:-1]),
// K = indices.shape[-1]). Row n picks a "slot" of the target of shape `shape`:
// the slice target[idx[0], ..., idx[K-1]], S = prod(shape[K:]) contiguous
// elements starting at element slot * S, with slot = dot(idx, slot_strides)
// and M = prod(shape[:K]) slots in all.
#pragma once

#include "common.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <c10/util/irange.h>
#include <c10/util/safe_numerics.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace torch_masked {

// The deepest index the kernels take (the size of the geometry's arrays,
// which travel to the GPU as a kernel argument). ATen's own limit for
// indexing kernels.
constexpr int64_t kMaxIndexDepth = 25;

struct NdIndexGeometry {
  int64_t depth = 0;                          // K
  int64_t slot_sizes[kMaxIndexDepth] = {};    // shape[:K]
  int64_t slot_strides[kMaxIndexDepth] = {};  // prod(shape[j+1:K]), in slots
  int64_t num_slots = 1;                      // M
  int64_t slice_size = 1;                     // S
  int64_t num_rows = 0;                       // N
};

// The slot that index row `row` (K entries) picks, or -1 when an entry is
// negative or not below its dimension's size. kDepthOne: K == 1, known at
// compile time (the common case, and a tighter loop).
template <bool kDepthOne = false, typename index_t>
C10_HOST_DEVICE inline int64_t slot_of(const NdIndexGeometry& g, const index_t* row) {
  if constexpr (kDepthOne) {
    const int64_t v = static_cast<int64_t>(row[0]);
    return static_cast<uint64_t>(v) < static_cast<uint64_t>(g.slot_sizes[0]) ? v : -1;
  } else {
    // Unsigned: a negative entry is too large as well, and the sum of a bad
    // row (thrown away) wraps instead of overflowing.
    uint64_t slot = 0;
    bool in_range = true;
    for (int64_t j = 0; j < g.depth; ++j) {
      const uint64_t v = static_cast<uint64_t>(static_cast<int64_t>(row[j]));
      in_range &= v < static_cast<uint64_t>(g.slot_sizes[j]);
      slot += v * static_cast<uint64_t>(g.slot_strides[j]);
    }
    return in_range ? static_cast<int64_t>(slot) : -1;
  }
}

// Checks indices (dtype, rank, depth) against the target shape and returns
// the geometry. torch_masked/ops/scatter_nd.py:_geometry prints the same words.
inline NdIndexGeometry make_geometry(const char* op, const at::Tensor& indices, at::IntArrayRef shape,
                                     const char* shape_name) {
  MASKED_CHECK_TYPE(indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong, op,
                   ": expected indices of dtype torch.int32 or torch.int64, got ",
                   dtype_name(indices.scalar_type()));
  MASKED_CHECK(indices.dim() >= 1, op, ": expected indices with at least one dimension, got a 0-d tensor");
  const int64_t depth = indices.size(-1);
  const int64_t rank = static_cast<int64_t>(shape.size());
  MASKED_CHECK(depth <= rank, op, ": expected indices.shape[-1] <= len(", shape_name, ") = ", rank,
              ", got indices of shape ", indices.sizes(), " for ", shape_name, " ", shape);
  MASKED_CHECK(depth <= kMaxIndexDepth, op, ": expected indices.shape[-1] <= ", kMaxIndexDepth, ", got ",
              depth);
  // The product of the sizes but those of 0 bounds every product of them
  // the geometry and the kernels make (ATen refuses a tensor past it too;
  // scatter_nd's shape is the caller's own list).
  uint64_t product = 1;
  bool overflows = false;
  for (const int64_t size : shape) {
    MASKED_CHECK(size >= 0, op, ": expected non-negative sizes in ", shape_name, ", got ", shape);
    overflows |= size != 0 && c10::mul_overflows(product, static_cast<uint64_t>(size), &product);
  }
  MASKED_CHECK(!overflows && product <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), op,
              ": expected sizes in ", shape_name, " whose product, sizes of 0 left out, is less than 2**63, got ",
              shape);
  NdIndexGeometry g;
  g.depth = depth;
  g.num_rows = c10::multiply_integers(indices.sizes().slice(0, indices.dim() - 1));
  for (int64_t j = rank - 1; j >= 0; --j) {
    if (j >= depth) {
      g.slice_size *= shape[j];
    } else {
      g.slot_sizes[j] = shape[j];
      g.slot_strides[j] = g.num_slots;
      g.num_slots *= shape[j];
    }
  }
  return g;
}

// The dimensions a slice of a gather's `params` may keep apart after
// merging (a row of a transposed matrix keeps one); past that, params is
// copied first.
constexpr int64_t kMaxSliceDims = 6;

// How a gathered slice params[i0, ..., iK-1] lies in memory, for gathers
// that read params in its own strides: its dimensions past K with those of
// size 1 dropped and neighbours that step as one merged, innermost first.
// Dense (no dimension kept): its S elements lie at 0, 1, ..., S-1 from its
// first, to be copied whole.
struct SliceLayout {
  int64_t dims = 0;
  int64_t sizes[kMaxSliceDims] = {};
  int64_t strides[kMaxSliceDims] = {};
  bool fits = true;  // false: more than kMaxSliceDims dimensions are left

  bool dense() const { return fits && dims == 0; }
};

inline SliceLayout slice_layout(const at::Tensor& params, int64_t depth) {
  SliceLayout layout;
  for (int64_t d = params.dim() - 1; d >= depth; --d) {
    const int64_t size = params.size(d);
    const int64_t stride = params.stride(d);
    if (size == 1) {
      continue;
    }
    const int64_t inner = layout.dims - 1;
    if (inner >= 0 && stride == layout.strides[inner] * layout.sizes[inner]) {
      layout.sizes[inner] *= size;
    } else if (layout.dims == kMaxSliceDims) {
      layout.fits = false;
      return layout;
    } else {
      layout.sizes[layout.dims] = size;
      layout.strides[layout.dims] = stride;
      ++layout.dims;
    }
  }
  if (layout.dims == 1 && layout.strides[0] == 1) {
    layout.dims = 0;
  }
  return layout;
}

// `g` with params' own strides for its slots, so that slot_of() gives the
// offset, in elements of params, of the row's slice (and still -1 when the
// row is out of bounds).
inline NdIndexGeometry in_params_geometry(const NdIndexGeometry& g, const at::Tensor& params) {
  NdIndexGeometry in_params = g;
  for (int64_t j = 0; j < g.depth; ++j) {
    in_params.slot_strides[j] = params.stride(j);
  }
  return in_params;
}

// indices.shape[:-1] + shape[K:]: the shape of the updates of a scatter and
// of the result of a gather.
inline std::vector<int64_t> rows_shape(const at::Tensor& indices, at::IntArrayRef shape) {
  std::vector<int64_t> out(indices.sizes().begin(), indices.sizes().end() - 1);
  out.insert(out.end(), shape.begin() + indices.size(-1), shape.end());
  return out;
}

// The IndexError for index row `row`, found out of bounds. `indices` may live
// on any device; only the offending row is read back.
[[noreturn]] inline void raise_out_of_bounds(const char* op, const at::Tensor& indices, int64_t row,
                                             at::IntArrayRef shape) {
  const int64_t depth = indices.size(-1);
  const at::Tensor values = indices.reshape({-1, depth}).select(0, row).to(at::kCPU, at::kLong);
  const auto batch = indices.sizes().slice(0, indices.dim() - 1);
  std::vector<int64_t> position(batch.size());
  for (int64_t d = static_cast<int64_t>(batch.size()) - 1, rest = row; d >= 0; --d) {
    position[d] = rest % batch[d];
    rest /= batch[d];
  }
  const at::IntArrayRef index(values.data_ptr<int64_t>(), depth);
  int64_t bad_dim = -1;
  for (const auto j : c10::irange(depth)) {
    if ((index[j] < 0 || index[j] >= shape[j]) && bad_dim < 0) {
      bad_dim = j;
    }
  }
  // The row's position in indices.shape[:-1], e.g. "indices[1, 0]"; a
  // single (rank-1) index is the whole of indices.
  const std::string where = position.empty() ? "indices" : "indices" + message_piece(at::IntArrayRef(position));
  MASKED_CHECK_INDEX(false, op, ": expected every index within shape ", shape, ", got ", index, " at ",
                    where, " (", values.data_ptr<int64_t>()[bad_dim], " is out of range for dimension ",
                    bad_dim, " of size ", shape[bad_dim], ")");
}

// Updates (and tensor, for tensor_scatter_nd_add) dtypes the adding kernels
// take: bool, the integer types torch.index_put_ takes, half, bfloat16,
// float, double and complex.
inline bool is_addable(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
    case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

// The checks scatter_nd and tensor_scatter_nd_add (`tensor` non-null) make
// of their operands before any work, and the geometry of `indices` in a
// target of `shape`.
inline NdIndexGeometry check_scatter_add_operands(const char* op, const at::Tensor* tensor,
                                                  const at::Tensor& indices, const at::Tensor& updates,
                                                  at::IntArrayRef shape) {
  if (tensor != nullptr) {
    check_same_device(op, {{"tensor", tensor}, {"indices", &indices}, {"updates", &updates}});
  } else {
    check_same_device(op, {{"indices", &indices}, {"updates", &updates}});
  }
  const NdIndexGeometry g = make_geometry(op, indices, shape, tensor != nullptr ? "tensor.shape" : "shape");
  MASKED_CHECK_TYPE(is_addable(updates.scalar_type()), op,
                   ": expected updates of dtype bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, "
                   "float64, complex64 or complex128, got ",
                   dtype_name(updates.scalar_type()));
  if (tensor != nullptr) {
    MASKED_CHECK_TYPE(updates.scalar_type() == tensor->scalar_type(), op,
                     ": expected updates of the dtype of tensor, ", dtype_name(tensor->scalar_type()),
                     ", got ", dtype_name(updates.scalar_type()));
  }
  const std::vector<int64_t> expected = rows_shape(indices, shape);
  MASKED_CHECK(updates.sizes() == at::IntArrayRef(expected), op,
              ": expected updates of shape indices.shape[:-1] + ", tensor != nullptr ? "tensor.shape" : "shape",
              "[K:] = ", at::IntArrayRef(expected), ", got updates of shape ", updates.sizes(),
              " (indices of shape ", indices.sizes(), ")");
  if (tensor != nullptr) {
    check_element_aligned(op, "tensor", *tensor);
  }
  check_element_aligned(op, "indices", indices);
  check_element_aligned(op, "updates", updates);
  return g;
}

// scatter_into(op, tensor, shape, indices, updates, geometry, check_bounds,
// in_place) returns a contiguous tensor of `shape`: `tensor` (zeros when
// null) plus the updates; `indices` and `updates` are contiguous. Asked for
// in place (`*tensor` contiguous, overlapping neither operand), it writes
// into `*tensor` and returns it where the device's kernels can, else a new
// tensor. It raises via raise_out_of_bounds when check_bounds is set, else
// drops rows that are out of bounds.
template <typename ScatterInto>
at::Tensor scatter_add_op(const char* op, const at::Tensor* tensor, const at::Tensor& indices,
                          const at::Tensor& updates, at::IntArrayRef shape, bool check_bounds,
                          const ScatterInto& scatter_into) {
  const NdIndexGeometry g = check_scatter_add_operands(op, tensor, indices, updates, shape);
  return scatter_into(op, tensor, shape, indices.contiguous(), updates.contiguous(), g, check_bounds,
                      /*in_place=*/false);
}

// masked::tensor_scatter_nd_add_: tensor_scatter_nd_add's sums written into
// `tensor` itself, or copied in where scatter_into made a new tensor (for a
// non-contiguous `tensor`, or elements the device cannot add in place). Its
// errors name tensor_scatter_nd_add, the op a compiled graph was written
// with.
template <typename ScatterInto>
void tensor_scatter_nd_add_in_place_op(const at::Tensor& tensor, const at::Tensor& indices,
                                       const at::Tensor& updates, bool check_bounds,
                                       const ScatterInto& scatter_into) {
  constexpr const char* op = "tensor_scatter_nd_add";
  const NdIndexGeometry g = check_scatter_add_operands(op, &tensor, indices, updates, tensor.sizes());
  MASKED_CHECK_VALUE(at::has_internal_overlap(tensor) != at::MemOverlap::Yes,
                     "tensor_scatter_nd_add_: expected a tensor whose elements are each stored once, got strides ",
                     tensor.strides(), " for shape ", tensor.sizes());
  for (const auto& [name, operand] : {std::pair<const char*, const at::Tensor*>{"indices", &indices},
                                      std::pair<const char*, const at::Tensor*>{"updates", &updates}}) {
    // Views of one storage whose layouts get_overlap_status cannot compare
    // (not dense) are refused too.
    MASKED_CHECK_VALUE(!tensor.is_alias_of(*operand) ||
                           at::get_overlap_status(tensor, *operand) == at::MemOverlapStatus::No,
                       "tensor_scatter_nd_add_: expected ", name, " apart from tensor in memory, as the sums are ",
                       "written into tensor");
  }
  const at::Tensor sums = scatter_into(op, &tensor, tensor.sizes(), indices.contiguous(), updates.contiguous(), g,
                                       check_bounds, /*in_place=*/tensor.is_contiguous());
  if (!sums.is_same(tensor)) {
    tensor.copy_(sums);
  }
}

// gather_into(output, params, indices, geometry, check_bounds) fills
// `output` (contiguous, of shape indices.shape[:-1] + params.shape[K:]) from
// `params` (any strides) and contiguous `indices`, raising via raise_out_of_bounds when
// check_bounds is set, else writing zeros for rows out of bounds.
template <typename GatherInto>
at::Tensor gather_op(const at::Tensor& params, const at::Tensor& indices, bool check_bounds,
                     const GatherInto& gather_into) {
  check_same_device("gather_nd", {{"params", &params}, {"indices", &indices}});
  const NdIndexGeometry g = make_geometry("gather_nd", indices, params.sizes(), "params.shape");
  check_element_aligned("gather_nd", "params", params);
  check_element_aligned("gather_nd", "indices", indices);
  at::Tensor output = uninitialized(rows_shape(indices, params.sizes()), params.options());
  gather_into(output, params, indices.contiguous(), g, check_bounds);
  return output;
}

// masked::check_gather_nd_indices: gather_nd's checks of `indices` against
// params of shape `params_shape`, and, where `out_of_bounds` says a row is
// out of bounds, raise_first_bad_row(indices, geometry, params_shape)
// raising for the first (`indices` contiguous).
template <typename RaiseFirstBadRow>
void check_gather_nd_indices_op(const at::Tensor& indices, at::IntArrayRef params_shape,
                                const at::Tensor& out_of_bounds, const RaiseFirstBadRow& raise_first_bad_row) {
  check_same_device("check_gather_nd_indices", {{"indices", &indices}, {"out_of_bounds", &out_of_bounds}});
  const NdIndexGeometry g = make_geometry("gather_nd", indices, params_shape, "params.shape");
  check_element_aligned("gather_nd", "indices", indices);
  MASKED_CHECK_TYPE(out_of_bounds.scalar_type() == at::kBool,
                    "check_gather_nd_indices: expected out_of_bounds of dtype bool, got ",
                    dtype_name(out_of_bounds.scalar_type()));
  MASKED_CHECK_VALUE(out_of_bounds.dim() == 0, "check_gather_nd_indices: expected a 0-d out_of_bounds, got shape ",
                     out_of_bounds.sizes());
  if (!out_of_bounds.item<bool>()) {
    return;
  }
  if (g.num_rows > 0) {
    raise_first_bad_row(indices.contiguous(), g, params_shape);
  }
  MASKED_CHECK_VALUE(false, "check_gather_nd_indices: out_of_bounds is true, but every row of indices is within ",
                     params_shape);
}

}  // namespace torch_masked
