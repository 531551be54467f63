// torch.autocast for torch.ops.masked. Only masked::tensor_scatter_nd_add
// needs a kernel: it requires `updates` of the dtype of `tensor`, and in an
// autocast region one of them often comes out of a matmul in float16 or
// bfloat16 while the other is float32. Under autocast, two floating dtypes
// are cast to the wider one first (torch.promote_types), as CUDA autocast
// does for index_put and scatter_add ("promote to the widest input type");
// ours does it on the CPU too, so one training step behaves the same on
// either device. Every other op falls through: where and select promote by
// themselves, and the rest take one floating input and keep its dtype, as
// their ATen equivalents do under autocast.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace torch_masked {
namespace {

bool is_addable_floating(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kDouble;
}

template <c10::DispatchKey autocast_key>
at::Tensor tensor_scatter_nd_add_promoting(const at::Tensor& tensor, const at::Tensor& indices,
                                           const at::Tensor& updates, bool check_bounds) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("masked::tensor_scatter_nd_add", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key);
  const at::ScalarType from = tensor.scalar_type();
  const at::ScalarType with = updates.scalar_type();
  if (from == with || !is_addable_floating(from) || !is_addable_floating(with)) {
    // The op's own checks name any mismatch left (an integer with a float).
    return op.call(tensor, indices, updates, check_bounds);
  }
  const at::ScalarType wider = c10::promoteTypes(from, with);
  return op.call(tensor.to(wider), indices, updates.to(wider), check_bounds);
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, AutocastCPU, m) {
  m.impl("tensor_scatter_nd_add", &tensor_scatter_nd_add_promoting<c10::DispatchKey::AutocastCPU>);
}

TORCH_LIBRARY_IMPL(masked, AutocastCUDA, m) {
  m.impl("tensor_scatter_nd_add", &tensor_scatter_nd_add_promoting<c10::DispatchKey::AutocastCUDA>);
}

}  // namespace torch_masked
