// CUDA kernels for masked::boolean_mask and masked::boolean_mask_backward.
// The tensor is viewed as [outer, rows, inner] (boolean_mask.h). Forward: a
// CUB pass over the mask, one host synchronisation to learn the selected
// count n (the output's size depends on it), then a coalesced copy of the
// selected slices. Backward: the output shape is known, so no
// synchronisation: a scan of the mask, then one kernel that writes every
// input position, from the gradient or zero. Slices move in units of up to
// 16 bytes; offsets are 64-bit.
#include "boolean_mask.h"
#include "common.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cub/cub.cuh>

#include <limits>

namespace torch_masked {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// Sums mask flags in 64 bits, so that the counts never overflow.
struct AddCounts {
  __host__ __device__ int64_t operator()(int64_t a, int64_t b) const { return a + b; }
};

// Runs a CUB device-wide call twice: to size its temporary storage, then for real.
template <typename CubCall>
void run_cub(const at::TensorOptions& options, const CubCall& call) {
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(call(nullptr, temp_bytes));
  const at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, options.dtype(at::kByte));
  C10_CUDA_CHECK(call(temp.data_ptr(), temp_bytes));
}

// counts[j] = number of true flags in mask[0..j].
at::Tensor inclusive_counts(const bool* mask, int64_t rows, const at::TensorOptions& options, cudaStream_t stream) {
  at::Tensor counts = at::empty({rows}, options.dtype(at::kLong));
  int64_t* out = counts.data_ptr<int64_t>();
  run_cub(options, [&](void* temp, size_t& temp_bytes) {
    return cub::DeviceScan::InclusiveScan(temp, temp_bytes, mask, out, AddCounts{}, rows, stream);
  });
  return counts;
}

// The one host synchronisation of the forward op.
int64_t read_to_host(const int64_t* value, cudaStream_t stream) {
  int64_t host = 0;
  C10_CUDA_CHECK(cudaMemcpyAsync(&host, value, sizeof(host), cudaMemcpyDeviceToHost, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

// Position e of the [outer, rows, units] view (units of one slice), with the
// divisions in 32 bits when the whole view allows.
template <typename Index>
struct SlicePosition {
  Index block;
  Index row;
  Index unit;

  __device__ SlicePosition(int64_t e, Index rows, Index units) {
    const Index slice = static_cast<Index>(e) / units;
    unit = static_cast<Index>(e) - slice * units;
    block = slice / rows;
    row = slice - block * rows;
  }
};

// One thread per input unit; those of selected slices copy themselves to
// their packed place. Consecutive threads write consecutive units.
template <typename Unit, typename Index>
__global__ void copy_selected_slices(const Unit* __restrict__ src, const bool* __restrict__ mask,
                                     const int64_t* __restrict__ counts, Unit* __restrict__ dst, Index rows,
                                     Index units, int64_t selected, int64_t total) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) {
    return;
  }
  const SlicePosition<Index> position(e, rows, units);
  if (mask[position.row]) {
    const int64_t packed = counts[position.row] - 1;
    dst[(static_cast<int64_t>(position.block) * selected + packed) * units + position.unit] = src[e];
  }
}

// One thread per output unit: the packed gradient's unit where the mask is
// true, zero where it is false. A count past grad's rows (a grad that does
// not match the mask) reads nothing and writes zero.
template <typename Unit, typename Index>
__global__ void expand_selected_slices(const Unit* __restrict__ grad, const bool* __restrict__ mask,
                                       const int64_t* __restrict__ counts, Unit* __restrict__ dst, Index rows,
                                       Index units, int64_t grad_rows, int64_t total) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) {
    return;
  }
  const SlicePosition<Index> position(e, rows, units);
  Unit value{};
  if (mask[position.row]) {
    const int64_t packed = counts[position.row] - 1;
    if (packed < grad_rows) {
      value = grad[(static_cast<int64_t>(position.block) * grad_rows + packed) * units + position.unit];
    }
  }
  dst[e] = value;
}

// Calls launch(blocks, index type) for a kernel over `total` units, with
// 32-bit index math when it fits.
template <typename Launch>
void launch_over(int64_t total, const Launch& launch) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "boolean_mask: ", total, " units are too many for one launch");
  if (total <= std::numeric_limits<uint32_t>::max()) {
    launch(static_cast<unsigned>(blocks), uint32_t{});
  } else {
    launch(static_cast<unsigned>(blocks), uint64_t{});
  }
}

at::Tensor boolean_mask_cuda(const at::Tensor& tensor, const at::Tensor& mask, int64_t axis) {
  check_same_device("boolean_mask", {{"tensor", &tensor}, {"mask", &mask}});
  const MaskedView view = masked_view("boolean_mask", "tensor.shape", tensor.sizes(), mask, axis);
  const c10::cuda::CUDAGuard guard(tensor.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor input = tensor.contiguous();
  if (view.rows == 0) {
    return at::empty(view.masked_shape(tensor.sizes(), 0), input.options());
  }
  const at::Tensor flags = mask.contiguous();
  const bool* mask_data = flags.const_data_ptr<bool>();
  const int64_t slice_bytes = view.inner * input.element_size();
  const void* src = input.const_data_ptr();
  // Fresh outputs are aligned to far more than 16 bytes; only the input may not be.
  const int64_t unit_bytes = widest_unit_bytes(slice_bytes, {src});

  // A single block whose slices are single units: CUB's flagged selection
  // compacts the data itself in one pass, after a count (the mask's sum)
  // that sizes the output. Otherwise a scan of the mask gives every selected
  // slice its packed place. (The count and the selection take 32-bit sizes
  // on older CUB; the scan takes 64-bit ones.)
  const bool int_rows = view.rows <= std::numeric_limits<int32_t>::max();
  const bool select_units = int_rows && view.outer == 1 && unit_bytes == slice_bytes;
  at::Tensor counts;
  if (select_units || (int_rows && input.numel() == 0)) {
    counts = at::empty({1}, input.options().dtype(at::kLong));
    int64_t* total = counts.data_ptr<int64_t>();
    run_cub(input.options(), [&](void* temp, size_t& temp_bytes) {
      return cub::DeviceReduce::Sum(temp, temp_bytes, mask_data, total, static_cast<int>(view.rows), stream);
    });
  } else {
    counts = inclusive_counts(mask_data, view.rows, input.options(), stream);
  }
  const int64_t selected = read_to_host(counts.const_data_ptr<int64_t>() + counts.numel() - 1, stream);

  at::Tensor result = at::empty(view.masked_shape(tensor.sizes(), selected), input.options());
  if (result.numel() == 0) {
    return result;
  }
  dispatch_by_element_size("boolean_mask", unit_bytes, [&](auto tag) {
    using Unit = decltype(tag);
    const Unit* src_units = static_cast<const Unit*>(src);
    Unit* dst_units = static_cast<Unit*>(result.data_ptr());
    if (select_units) {
      int64_t* selected_out = counts.data_ptr<int64_t>();
      run_cub(input.options(), [&](void* temp, size_t& temp_bytes) {
        return cub::DeviceSelect::Flagged(temp, temp_bytes, src_units, mask_data, dst_units, selected_out,
                                          static_cast<int>(view.rows), stream);
      });
      return;
    }
    const int64_t units = slice_bytes / unit_bytes;
    const int64_t total = input.numel() * input.element_size() / unit_bytes;
    launch_over(total, [&](unsigned blocks, auto index) {
      using Index = decltype(index);
      copy_selected_slices<Unit, Index><<<blocks, kThreads, 0, stream>>>(
          src_units, mask_data, counts.const_data_ptr<int64_t>(), dst_units, static_cast<Index>(view.rows),
          static_cast<Index>(units), selected, total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return result;
}

at::Tensor boolean_mask_backward_cuda(const at::Tensor& grad, const at::Tensor& mask, at::IntArrayRef input_shape,
                                      int64_t axis) {
  check_same_device("boolean_mask_backward", {{"grad", &grad}, {"mask", &mask}});
  const MaskedView view = masked_view("boolean_mask_backward", "input_shape", input_shape, mask, axis);
  check_masked_grad(grad, input_shape, view);
  const c10::cuda::CUDAGuard guard(grad.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor packed_grad = grad.contiguous();
  at::Tensor result = at::empty(input_shape, packed_grad.options());
  if (result.numel() == 0) {
    return result;
  }
  const at::Tensor flags = mask.contiguous();
  const bool* mask_data = flags.const_data_ptr<bool>();
  const at::Tensor counts = inclusive_counts(mask_data, view.rows, packed_grad.options(), stream);
  const int64_t slice_bytes = view.inner * packed_grad.element_size();
  const void* src = packed_grad.const_data_ptr();
  const int64_t unit_bytes = widest_unit_bytes(slice_bytes, {src});
  const int64_t units = slice_bytes / unit_bytes;
  const int64_t total = result.numel() * result.element_size() / unit_bytes;
  dispatch_by_element_size("boolean_mask_backward", unit_bytes, [&](auto tag) {
    using Unit = decltype(tag);
    launch_over(total, [&](unsigned blocks, auto index) {
      using Index = decltype(index);
      expand_selected_slices<Unit, Index><<<blocks, kThreads, 0, stream>>>(
          static_cast<const Unit*>(src), mask_data, counts.const_data_ptr<int64_t>(),
          static_cast<Unit*>(result.data_ptr()), static_cast<Index>(view.rows), static_cast<Index>(units),
          packed_grad.size(view.axis), total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CUDA, m) {
  m.impl("boolean_mask", &boolean_mask_cuda);
  m.impl("boolean_mask_backward", &boolean_mask_backward_cuda);
}

}  // namespace cuda
}  // namespace torch_masked
