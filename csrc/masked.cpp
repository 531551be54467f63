// The one place where every torch.ops.masked schema is declared. Each kernel
// file (csrc/cpu/<op>_kernel.cpp, csrc/cuda/<op>_kernel.cu) registers its own
// implementations with TORCH_LIBRARY_IMPL, and so does each autograd formula
// (csrc/autograd/<op>_autograd.cpp); fake kernels are registered from Python
// (torch_masked/ops/<op>.py).
#include <Python.h>
#include <torch/library.h>

// Importing torch_masked._C runs the static registrations below and in the
// kernel files; the module itself exports nothing.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

// The ops whose CUDA kernels read a value back to the host, which a CUDA
// graph capture cannot do (csrc/cuda/host_read.cuh). Inductor's
// mode="reduce-overhead" runs their calls between its CUDA graphs; of a
// gather_nd it fuses, only the bounds check's call. The tag is the op's, not
// the call's, so calls with check_bounds=False are kept out too.
const std::vector<at::Tag> kReadsBackToHost = {at::Tag::cudagraph_unsafe};

TORCH_LIBRARY(masked, m) {
  // nonzero: [z, dim] int64 indices of the non-zero elements, row-major.
  m.def("nonzero(Tensor self) -> Tensor", kReadsBackToHost);
  // The as_tuple form: dim() separate 1-D int64 tensors (one for a 0-d input).
  m.def("nonzero_tuple(Tensor self) -> Tensor[]", kReadsBackToHost);
  // The first `size` rows of nonzero, padded with fill_value; no host sync.
  m.def("nonzero_static(Tensor self, *, SymInt size, int fill_value=-1) -> Tensor");

  // where: the broadcasting select, and the index mode (tf.where(condition)).
  // torch.ops.masked.where(...) tries the overloads in the order defined here,
  // and each that fails costs the call an exception (3 us for one of the
  // wrong length, 10 for a number offered for a Tensor): the three-operand
  // forms come first, as ATen's do, the plain tensors first of all.
  m.def("where.self(Tensor condition, Tensor x, Tensor y) -> Tensor");
  // where with a number for x or y, as ATen's overloads of the same names: the
  // number promotes as torch.where's numbers do and reaches the kernel as a
  // value, so no tensor is made for it on the device. ScalarOther before
  // ScalarSelf: a tensor offered for a Scalar fails with its repr() in the
  // message (0.5 ms for ten elements).
  m.def("where.ScalarOther(Tensor condition, Tensor x, Scalar y) -> Tensor");
  m.def("where.ScalarSelf(Tensor condition, Scalar x, Tensor y) -> Tensor");
  m.def("where(Tensor condition) -> Tensor");
  // select: TensorFlow's Select (Java Where3): scalar, same-shape or row condition.
  m.def("select(Tensor condition, Tensor x, Tensor y) -> Tensor");

  // boolean_mask: tf.boolean_mask(tensor, mask, axis) and its gradient.
  m.def("boolean_mask(Tensor tensor, Tensor mask, int axis=0) -> Tensor", kReadsBackToHost);
  m.def("boolean_mask_backward(Tensor grad, Tensor mask, SymInt[] input_shape, int axis) -> Tensor");

  // scatter_nd / gather_nd / tensor_scatter_nd_add. check_bounds=False skips
  // the host's look at the bounds check (no device sync, for CUDA graphs):
  // rows out of bounds are then dropped (scatter) or read as zeros (gather).
  m.def("scatter_nd(Tensor indices, Tensor updates, SymInt[] shape, *, bool check_bounds=True) -> Tensor",
        kReadsBackToHost);
  m.def("gather_nd(Tensor params, Tensor indices, *, bool check_bounds=True) -> Tensor", kReadsBackToHost);
  m.def("tensor_scatter_nd_add(Tensor tensor, Tensor indices, Tensor updates, *, bool check_bounds=True) -> Tensor",
        kReadsBackToHost);
  // Its in-place form, for compiled graphs (torch_masked/compile.py): the sums
  // written into `tensor`, where Inductor finds nothing else reads it. No
  // gradient (it refuses tensors that require one).
  m.def("tensor_scatter_nd_add_(Tensor(a!) tensor, Tensor indices, Tensor updates, *, bool check_bounds=True) -> ()",
        kReadsBackToHost);
  // The raising half of gather_nd's bounds check, for the gather_nd that
  // Inductor fuses (torch_masked/compile.py): its loop computes
  // out_of_bounds (a 0-d bool) as it reads the rows; when true, this raises
  // gather_nd's IndexError, naming the first row of indices out of bounds
  // of params_shape. It returns nothing, so Inductor keeps it as a side
  // effect.
  m.def("check_gather_nd_indices(Tensor indices, SymInt[] params_shape, Tensor out_of_bounds) -> ()",
        kReadsBackToHost);
}
