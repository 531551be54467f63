// masked::where(condition), TensorFlow's index mode: the [z, rank] indices of
// the non-zero elements, exactly masked::nonzero. Registered once for every
// backend as a composite of nonzero, so it shares nonzero's kernels, fake
// kernel and device support rather than having its own.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace torch_masked {
namespace {

at::Tensor where_indices(const at::Tensor& condition) {
  static const auto nonzero = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("masked::nonzero", "")
                                  .typed<at::Tensor(const at::Tensor&)>();
  return nonzero.call(condition);
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CompositeImplicitAutograd, m) {
  m.impl("where", &where_indices);
}

}  // namespace torch_masked
