// Whether a call of one of our ops must go through Function::apply: grad
// mode is on and one of its differentiable inputs requires grad, or one
// carries a forward-mode tangent (see apply_if_recording). Function::apply
// builds the node, its context and its saved values on every call, even when
// nothing will use them, and that costs about as much as a small kernel;
// otherwise the op runs below autograd at once.
//
// Every Function of ours sets is_traceable: its backward reads only its saved
// tensors and saved_data and calls only our registered ops, so compiled
// autograd (torch._dynamo.config.compiled_autograd) traces it into the
// compiled backward graph rather than running it eagerly behind a graph break.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <functional>
#include <initializer_list>

namespace torch_masked {

using DifferentiableInputs = std::initializer_list<std::reference_wrapper<const at::Tensor>>;

inline bool records_graph(DifferentiableInputs differentiable) {
  const bool grad_mode = c10::GradMode::is_enabled();
  for (const at::Tensor& input : differentiable) {
    if ((grad_mode && input.requires_grad()) || input._fw_grad(/*level=*/0).defined()) {
      return true;
    }
  }
  return false;
}

inline bool has_tangent(DifferentiableInputs differentiable) {
  for (const at::Tensor& input : differentiable) {
    if (input._fw_grad(/*level=*/0).defined()) {
      return true;
    }
  }
  return false;
}

// An argument as Function::apply may take it: a tensor that carries a
// forward-mode tangent as its primal (a differentiable view, so backward
// still reaches the original), anything else as it is.
template <typename Arg>
const Arg& primal(const Arg& arg) {
  return arg;
}

inline at::Tensor primal(const at::Tensor& tensor) {
  return tensor._fw_grad(/*level=*/0).defined() ? tensor._fw_primal(/*level=*/0) : tensor;
}

// Function::apply(args...) when the call records a graph, else call(args...)
// below autograd. When an input carries a forward-mode tangent (level 0, as
// torch.autograd.forward_ad makes), Function::apply, which refuses tangents,
// runs on the primals, and the result's tangent is tangent(result, args...):
// our ops are linear in their differentiable inputs, so each tangent formula
// is the op itself applied to the input tangents. ATen's generated autograd
// kernels set the result's tangent the same way.
template <typename Function, typename Call, typename Tangent, typename... Args>
at::Tensor apply_if_recording(DifferentiableInputs differentiable, const Call& call, const Tangent& tangent,
                              const Args&... args) {
  if (!records_graph(differentiable)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call(args...);
  }
  if (!has_tangent(differentiable)) {
    return Function::apply(args...);
  }
  at::Tensor result = Function::apply(primal(args)...);
  result._set_fw_grad(tangent(result, args...), /*level=*/0, /*is_inplace_op=*/false);
  return result;
}

}  // namespace torch_masked
