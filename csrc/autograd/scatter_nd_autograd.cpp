// Autograd for masked::scatter_nd, masked::gather_nd and
// masked::tensor_scatter_nd_add (its in-place form has none). Each backward
// is one of the other ops (scatter <-> gather), so double backward and
// compiled backward need nothing more. Backward calls pass
// check_bounds=false: the forward call already checked the same indices
// (autograd's version counter guards them against in-place changes), and
// the backward then costs no device sync.
// In C++ rather than with torch.library.register_autograd: the Python layer
// cost more than the kernels on sub-millisecond calls.
#include "autograd/records_graph.h"
#include "common.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace torch_masked {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_scatter_nd(const at::Tensor& indices, const at::Tensor& updates, c10::SymIntArrayRef shape,
                           bool check_bounds) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("masked::scatter_nd", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, bool)>();
  return op.call(indices, updates, shape, check_bounds);
}

at::Tensor call_gather_nd(const at::Tensor& params, const at::Tensor& indices, bool check_bounds) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("masked::gather_nd", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, bool)>();
  return op.call(params, indices, check_bounds);
}

at::Tensor call_tensor_scatter_nd_add(const at::Tensor& tensor, const at::Tensor& indices,
                                      const at::Tensor& updates, bool check_bounds) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("masked::tensor_scatter_nd_add", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>();
  return op.call(tensor, indices, updates, check_bounds);
}

void call_tensor_scatter_nd_add_in_place(const at::Tensor& tensor, const at::Tensor& indices,
                                         const at::Tensor& updates, bool check_bounds) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("masked::tensor_scatter_nd_add_", "")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>();
  op.call(tensor, indices, updates, check_bounds);
}

// The gradient of the updates: the upstream gradient's slices at the indices.
at::Tensor gather_updates_grad(AutogradContext* ctx, size_t updates_input, const at::Tensor& grad) {
  if (!ctx->needs_input_grad(updates_input)) {
    return at::Tensor();
  }
  return call_gather_nd(grad, ctx->get_saved_variables()[0], /*check_bounds=*/false);
}

class ScatterNd : public torch::autograd::Function<ScatterNd> {
 public:
  static constexpr bool is_traceable = true;  // see records_graph.h
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& indices, const at::Tensor& updates,
                            c10::SymIntArrayRef shape, bool check_bounds) {
    ctx->save_for_backward({indices});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_scatter_nd(indices, updates, shape, check_bounds);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {at::Tensor(), gather_updates_grad(ctx, 1, grads[0]), at::Tensor(), at::Tensor()};
  }
};

class TensorScatterNdAdd : public torch::autograd::Function<TensorScatterNdAdd> {
 public:
  static constexpr bool is_traceable = true;  // see records_graph.h
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& tensor, const at::Tensor& indices,
                            const at::Tensor& updates, bool check_bounds) {
    ctx->save_for_backward({indices});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_tensor_scatter_nd_add(tensor, indices, updates, check_bounds);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], at::Tensor(), gather_updates_grad(ctx, 2, grads[0]), at::Tensor()};
  }
};

class GatherNd : public torch::autograd::Function<GatherNd> {
 public:
  static constexpr bool is_traceable = true;  // see records_graph.h
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& params, const at::Tensor& indices,
                            bool check_bounds) {
    ctx->save_for_backward({indices});
    ctx->saved_data["params_shape"] = params.sym_sizes();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_gather_nd(params, indices, check_bounds);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_params;
    if (ctx->needs_input_grad(0)) {
      grad_params = call_scatter_nd(ctx->get_saved_variables()[0], grads[0],
                                    ctx->saved_data["params_shape"].toSymIntVector(), /*check_bounds=*/false);
    }
    return {grad_params, at::Tensor(), at::Tensor()};
  }
};

// Forward mode: each op applied to the tangents (the indices already checked).
at::Tensor scatter_nd_tangent(const at::Tensor&, const at::Tensor& indices, const at::Tensor& updates,
                              c10::SymIntArrayRef shape, bool) {
  return call_scatter_nd(indices, updates._fw_grad(/*level=*/0), shape, /*check_bounds=*/false);
}

at::Tensor tensor_scatter_nd_add_tangent(const at::Tensor&, const at::Tensor& tensor, const at::Tensor& indices,
                                         const at::Tensor& updates, bool) {
  const at::Tensor& tensor_tangent = tensor._fw_grad(/*level=*/0);
  const at::Tensor& updates_tangent = updates._fw_grad(/*level=*/0);
  if (!updates_tangent.defined()) {
    return tensor_tangent.clone();  // not the input's own tangent: the result's may be changed in place
  }
  if (!tensor_tangent.defined()) {
    return call_scatter_nd(indices, updates_tangent, tensor.sym_sizes(), /*check_bounds=*/false);
  }
  return call_tensor_scatter_nd_add(tensor_tangent, indices, updates_tangent, /*check_bounds=*/false);
}

at::Tensor gather_nd_tangent(const at::Tensor&, const at::Tensor& params, const at::Tensor& indices, bool) {
  return call_gather_nd(params._fw_grad(/*level=*/0), indices, /*check_bounds=*/false);
}

at::Tensor scatter_nd_autograd(const at::Tensor& indices, const at::Tensor& updates, c10::SymIntArrayRef shape,
                               bool check_bounds) {
  return apply_if_recording<ScatterNd>({updates}, call_scatter_nd, scatter_nd_tangent, indices, updates, shape,
                                       check_bounds);
}

at::Tensor tensor_scatter_nd_add_autograd(const at::Tensor& tensor, const at::Tensor& indices,
                                          const at::Tensor& updates, bool check_bounds) {
  return apply_if_recording<TensorScatterNdAdd>({tensor, updates}, call_tensor_scatter_nd_add,
                                                tensor_scatter_nd_add_tangent, tensor, indices, updates,
                                                check_bounds);
}

at::Tensor gather_nd_autograd(const at::Tensor& params, const at::Tensor& indices, bool check_bounds) {
  return apply_if_recording<GatherNd>({params}, call_gather_nd, gather_nd_tangent, params, indices, check_bounds);
}

// The in-place form, which compiled graphs call where tensor_scatter_nd_add
// was differentiated already, has no formula: it refuses tensors that
// require grad, and bumps the tensor's version, so that autograd still sees
// the change to a tensor it saved for some other op's backward.
void tensor_scatter_nd_add_in_place_autograd(const at::Tensor& tensor, const at::Tensor& indices,
                                             const at::Tensor& updates, bool check_bounds) {
  MASKED_CHECK(!(c10::GradMode::is_enabled() && (tensor.requires_grad() || updates.requires_grad())),
               "tensor_scatter_nd_add_: the in-place form has no gradient; call tensor_scatter_nd_add for "
               "tensors that require grad");
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    call_tensor_scatter_nd_add_in_place(tensor, indices, updates, check_bounds);
  }
  torch::autograd::impl::bump_version(tensor);
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, Autograd, m) {
  m.impl("scatter_nd", &scatter_nd_autograd);
  m.impl("tensor_scatter_nd_add", &tensor_scatter_nd_add_autograd);
  m.impl("tensor_scatter_nd_add_", &tensor_scatter_nd_add_in_place_autograd);
  m.impl("gather_nd", &gather_nd_autograd);
  // Nothing to differentiate (it returns nothing): passed through, where the
  // boxed fallback for ops without a formula would cost a few µs a call.
  m.impl("check_gather_nd_indices", torch::CppFunction::makeFallthrough());
}

}  // namespace torch_masked
