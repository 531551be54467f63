// Whether a call of one of our ops must go through Function::apply: grad
// mode is on and one of its differentiable inputs requires grad, or one
// carries a forward-mode tangent (which apply refuses, "jvp is not implemented",
// rather than dropping it). Function::apply builds the node, its context and
// its saved values on every call, even when nothing will use them, and that
// costs about as much as a small kernel; otherwise the op runs below
// autograd at once.
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

// Function::apply(args...) when the call records a graph, else call(args...)
// below autograd.
template <typename Function, typename Call, typename... Args>
at::Tensor apply_if_recording(DifferentiableInputs differentiable, const Call& call, const Args&... args) {
  if (records_graph(differentiable)) {
    return Function::apply(args...);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call(args...);
}

}  // namespace torch_masked
