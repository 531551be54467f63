// Autograd for masked::where.self, where.ScalarSelf, where.ScalarOther and
// masked::select. The gradient of a selection is the same selection of the
// upstream gradient against zero: each branch gets the gradient where it was
// chosen and an exact zero elsewhere (so a NaN or inf never leaks across),
// summed back to the branch's own shape and cast to its own dtype; a number
// gets none. Built from our own ops, so double backward and compiled
// backward work. In C++ rather than with torch.library.register_autograd:
// the Python layer cost more than the kernels on sub-millisecond calls.
#include "autograd/records_graph.h"
#include "element_select.h"

#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

namespace torch_masked {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using SelectionSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);

at::Tensor where_number_x(const at::Tensor& condition, const at::Scalar& x, const at::Tensor& y) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("masked::where", "ScalarSelf")
                             .typed<at::Tensor(const at::Tensor&, const at::Scalar&, const at::Tensor&)>();
  return op.call(condition, x, y);
}

at::Tensor where_number_y(const at::Tensor& condition, const at::Tensor& x, const at::Scalar& y) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("masked::where", "ScalarOther")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Scalar&)>();
  return op.call(condition, x, y);
}

// where.self broadcasts: the gradient against the number 0 (no zeros made on
// the device), each branch's part summed back to the branch's shape.
struct WhereSelf {
  static constexpr bool kBroadcasts = true;
  static at::Tensor call(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("masked::where", "self").typed<SelectionSignature>();
    return op.call(condition, x, y);
  }
  static at::Tensor x_part(const at::Tensor& condition, const at::Tensor& grad) {
    return where_number_y(condition, grad, 0);
  }
  static at::Tensor y_part(const at::Tensor& condition, const at::Tensor& grad) {
    return where_number_x(condition, 0, grad);
  }
};

// select's branches have the output's shape, and so has each part of the
// gradient: where against the number 0, with a row condition as where's
// column [rows, 1, ..., 1]; nothing to sum. Not summing to a saved shape also
// spares a trace from comparing branch sizes known only at run time
// (selections by boolean_mask), which it cannot.
struct Select {
  static constexpr bool kBroadcasts = false;
  static at::Tensor call(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("masked::select", "").typed<SelectionSignature>();
    return op.call(condition, x, y);
  }
  static at::Tensor x_part(const at::Tensor& condition, const at::Tensor& grad) {
    return where_number_y(as_where_condition(condition, grad.dim()), grad, 0);
  }
  static at::Tensor y_part(const at::Tensor& condition, const at::Tensor& grad) {
    return where_number_x(as_where_condition(condition, grad.dim()), 0, grad);
  }
  // select_condition_as_where's column, by unsqueezing rather than a view:
  // autograd may hold a DTensor, which refuses a view of an axis sharded at
  // size 0 (a trace's symbolic sizes need no reading either).
  static at::Tensor as_where_condition(const at::Tensor& condition, int64_t rank) {
    if (condition.dim() != 1) {
      return condition;
    }
    at::Tensor column = condition;
    for (int64_t axis = 1; axis < rank; ++axis) {
      column = column.unsqueeze(axis);
    }
    return column;
  }
};

// Whether `sizes` are `shape`, known without a guard: sizes known only when
// a graph runs are left to at::sum_to, which records what it needs.
bool known_same_sizes(c10::SymIntArrayRef sizes, c10::SymIntArrayRef shape) {
  if (sizes.size() != shape.size()) {
    return false;
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    const auto size = sizes[d].maybe_as_int();
    const auto wanted = shape[d].maybe_as_int();
    if (!size || !wanted || *size != *wanted) {
      return false;
    }
  }
  return true;
}

// What the backward needs to make a branch's gradient from the result's: the
// branch's shape (under `shape_key`), where the op broadcasts and it may
// differ from the result's, and its dtype (under `dtype_key`), where that
// differs. A branch of the result's shape and dtype, the common call, saves
// nothing, which spares each call the saved values' allocation and hashing,
// and its backward the sum_to and to() that would return the gradient
// as it is, at a dispatch each (summing a 0-d gradient to a 0-d branch would
// even add it to +0.0, turning -0.0 into +0.0, where torch.where's gradient
// keeps the sign).
void save_branch(AutogradContext* ctx, const char* shape_key, const char* dtype_key, const at::Tensor& branch,
                 const at::Tensor& result, bool broadcasts) {
  if (broadcasts && !known_same_sizes(branch.sym_sizes(), result.sym_sizes())) {
    ctx->saved_data[shape_key] = branch.sym_sizes();
  }
  if (branch.scalar_type() != result.scalar_type()) {
    ctx->saved_data[dtype_key] = static_cast<int64_t>(branch.scalar_type());
  }
}

// The branch's gradient: `grad` (of the result's shape), selected for it,
// in its dtype and summed back to its shape, as save_branch recorded them.
at::Tensor to_branch(at::Tensor grad, AutogradContext* ctx, const char* shape_key, const char* dtype_key) {
  const auto dtype = ctx->saved_data.find(dtype_key);
  const auto branch_dtype =
      dtype == ctx->saved_data.end() ? grad.scalar_type() : static_cast<at::ScalarType>(dtype->second.toInt());
  if (grad.is_complex() && !at::isComplexType(branch_dtype)) {
    grad = at::real(grad);
  }
  const auto shape = ctx->saved_data.find(shape_key);
  if (shape != ctx->saved_data.end()) {
    // ATen has no CPU sum of the 4-byte complex types (complex32 of float16
    // beside a 0-d complex tensor, bcomplex32 of bfloat16): summed in complex64.
    if (grad.is_complex() && grad.element_size() < 8) {
      grad = grad.to(at::kComplexFloat);
    }
    // at::sum_to, not sum_to_size, which first asks whether the shapes
    // broadcast (the forward made sure they do) by a guard on each size
    // being 1, which a size known only when the graph runs cannot answer.
    grad = at::sum_to(grad, shape->second.toSymIntVector());
  }
  return grad.scalar_type() == branch_dtype ? grad : grad.to(branch_dtype);
}

template <typename Op>
class Selection : public torch::autograd::Function<Selection<Op>> {
 public:
  static constexpr bool is_traceable = true;  // see records_graph.h
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& condition, const at::Tensor& x,
                            const at::Tensor& y) {
    ctx->save_for_backward({condition});
    at::Tensor result;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      result = Op::call(condition, x, y);
    }
    save_branch(ctx, "x_shape", "x_dtype", x, result, Op::kBroadcasts);
    save_branch(ctx, "y_shape", "y_dtype", y, result, Op::kBroadcasts);
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor condition = ctx->get_saved_variables()[0];
    const at::Tensor& grad = grads[0];
    at::Tensor grad_x, grad_y;
    if (ctx->needs_input_grad(1)) {
      grad_x = to_branch(Op::x_part(condition, grad), ctx, "x_shape", "x_dtype");
    }
    if (ctx->needs_input_grad(2)) {
      grad_y = to_branch(Op::y_part(condition, grad), ctx, "y_shape", "y_dtype");
    }
    return {at::Tensor(), grad_x, grad_y};
  }
};

// where.ScalarSelf (kNumberIsX) and where.ScalarOther: the tensor branch's
// gradient is where.self's for that branch; the number has none. Arguments
// (condition, tensor, number), whichever side the number is on.
template <bool kNumberIsX>
class WhereWithNumber : public torch::autograd::Function<WhereWithNumber<kNumberIsX>> {
 public:
  static constexpr bool is_traceable = true;  // see records_graph.h
  static at::Tensor call(const at::Tensor& condition, const at::Tensor& tensor, const at::Scalar& number) {
    return kNumberIsX ? where_number_x(condition, number, tensor) : where_number_y(condition, tensor, number);
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& condition, const at::Tensor& tensor,
                            const at::Scalar& number) {
    ctx->save_for_backward({condition});
    at::Tensor result;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      result = call(condition, tensor, number);
    }
    save_branch(ctx, "shape", "dtype", tensor, result, /*broadcasts=*/true);
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor condition = ctx->get_saved_variables()[0];
    const at::Tensor part = kNumberIsX ? WhereSelf::y_part(condition, grads[0]) : WhereSelf::x_part(condition, grads[0]);
    return {at::Tensor(), to_branch(part, ctx, "shape", "dtype"), at::Tensor()};
  }
};

// Forward mode: the selection of the tangents, a missing one taken as 0
// (the parts above), in the result's dtype and, where that has a broadcast
// shape, expanded to it.
at::Tensor as_result_tangent(const at::Tensor& part, const at::Tensor& result) {
  return part.to(result.scalar_type()).expand_symint(result.sym_sizes());
}

template <typename Op>
at::Tensor selection_tangent(const at::Tensor& result, const at::Tensor& condition, const at::Tensor& x,
                             const at::Tensor& y) {
  const at::Tensor& x_tangent = x._fw_grad(/*level=*/0);
  const at::Tensor& y_tangent = y._fw_grad(/*level=*/0);
  if (!y_tangent.defined()) {
    return as_result_tangent(Op::x_part(condition, x_tangent), result);
  }
  if (!x_tangent.defined()) {
    return as_result_tangent(Op::y_part(condition, y_tangent), result);
  }
  return as_result_tangent(Op::call(condition, x_tangent, y_tangent), result);
}

template <bool kNumberIsX>
at::Tensor where_with_number_tangent(const at::Tensor& result, const at::Tensor& condition, const at::Tensor& tensor,
                                     const at::Scalar&) {
  const at::Tensor& tangent = tensor._fw_grad(/*level=*/0);
  return as_result_tangent(kNumberIsX ? WhereSelf::y_part(condition, tangent) : WhereSelf::x_part(condition, tangent),
                           result);
}

template <typename Op>
at::Tensor selection_autograd(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
  return apply_if_recording<Selection<Op>>({x, y}, Op::call, selection_tangent<Op>, condition, x, y);
}

at::Tensor where_number_x_autograd(const at::Tensor& condition, const at::Scalar& x, const at::Tensor& y) {
  return apply_if_recording<WhereWithNumber<true>>({y}, WhereWithNumber<true>::call, where_with_number_tangent<true>,
                                                   condition, y, x);
}

at::Tensor where_number_y_autograd(const at::Tensor& condition, const at::Tensor& x, const at::Scalar& y) {
  return apply_if_recording<WhereWithNumber<false>>({x}, WhereWithNumber<false>::call,
                                                    where_with_number_tangent<false>, condition, x, y);
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, Autograd, m) {
  m.impl("where.self", &selection_autograd<WhereSelf>);
  m.impl("where.ScalarSelf", &where_number_x_autograd);
  m.impl("where.ScalarOther", &where_number_y_autograd);
  m.impl("select", &selection_autograd<Select>);
}

}  // namespace torch_masked
