// Autograd for masked::boolean_mask and masked::boolean_mask_backward. The
// gradient of boolean_mask is boolean_mask_backward (the gradient slices
// written back into zeros), and the gradient of that is boolean_mask again,
// so derivatives of every order stay inside our ops. Written in C++ rather
// than with torch.library.register_autograd: the Python layer cost more than
// the kernels on sub-millisecond calls.
#include "autograd/records_graph.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace torch_masked {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_boolean_mask(const at::Tensor& tensor, const at::Tensor& mask, int64_t axis) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("masked::boolean_mask", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(tensor, mask, axis);
}

at::Tensor call_boolean_mask_backward(const at::Tensor& grad, const at::Tensor& mask,
                                      c10::SymIntArrayRef input_shape, int64_t axis) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("masked::boolean_mask_backward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, int64_t)>();
  return op.call(grad, mask, input_shape, axis);
}

class BooleanMask : public torch::autograd::Function<BooleanMask> {
 public:
  static constexpr bool is_traceable = true;  // see records_graph.h
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& tensor, const at::Tensor& mask, int64_t axis) {
    ctx->save_for_backward({mask});
    ctx->saved_data["input_shape"] = tensor.sym_sizes();
    // A negative axis counts from the end of the input's shape (an axis out
    // of range is refused by the kernel below).
    ctx->saved_data["axis"] = axis < 0 ? axis + tensor.dim() : axis;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_boolean_mask(tensor, mask, axis);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {call_boolean_mask_backward(grads[0], mask, ctx->saved_data["input_shape"].toSymIntVector(),
                                       ctx->saved_data["axis"].toInt()),
            at::Tensor(), at::Tensor()};
  }
};

class BooleanMaskBackward : public torch::autograd::Function<BooleanMaskBackward> {
 public:
  static constexpr bool is_traceable = true;  // see records_graph.h
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& mask,
                            c10::SymIntArrayRef input_shape, int64_t axis) {
    ctx->save_for_backward({mask});
    ctx->saved_data["axis"] = axis;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_boolean_mask_backward(grad, mask, input_shape, axis);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {call_boolean_mask(grads[0], mask, ctx->saved_data["axis"].toInt()), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// Forward mode: each op applied to the tangent.
at::Tensor boolean_mask_tangent(const at::Tensor&, const at::Tensor& tensor, const at::Tensor& mask, int64_t axis) {
  return call_boolean_mask(tensor._fw_grad(/*level=*/0), mask, axis);
}

at::Tensor boolean_mask_backward_tangent(const at::Tensor&, const at::Tensor& grad, const at::Tensor& mask,
                                         c10::SymIntArrayRef input_shape, int64_t axis) {
  return call_boolean_mask_backward(grad._fw_grad(/*level=*/0), mask, input_shape, axis);
}

at::Tensor boolean_mask_autograd(const at::Tensor& tensor, const at::Tensor& mask, int64_t axis) {
  return apply_if_recording<BooleanMask>({tensor}, call_boolean_mask, boolean_mask_tangent, tensor, mask, axis);
}

at::Tensor boolean_mask_backward_autograd(const at::Tensor& grad, const at::Tensor& mask,
                                          c10::SymIntArrayRef input_shape, int64_t axis) {
  return apply_if_recording<BooleanMaskBackward>({grad}, call_boolean_mask_backward, boolean_mask_backward_tangent,
                                                 grad, mask, input_shape, axis);
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, Autograd, m) {
  m.impl("boolean_mask", &boolean_mask_autograd);
  m.impl("boolean_mask_backward", &boolean_mask_backward_autograd);
}

}  // namespace torch_masked
