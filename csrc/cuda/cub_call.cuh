// CUB for the CUDA kernels: the version they need and one way to run its
// device-wide calls.
#pragma once

#include "common.h"

#include <ATen/core/TensorBody.h>
#include <c10/cuda/CUDAException.h>

#include <cub/cub.cuh>

// Item counts reach CUB as int64_t; CUB before 2.7 took an int and would
// cut counts past 2^31 short.
static_assert(CUB_VERSION >= 200700, "CUB 2.7 or newer is needed (64-bit item counts)");

namespace torch_masked {
namespace cuda {

// Runs a CUB device-wide call twice: to size its temporary storage (on the
// device of `options`), then for real.
template <typename CubCall>
void run_cub(const at::TensorOptions& options, const CubCall& call) {
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(call(nullptr, temp_bytes));
  const at::Tensor temp = uninitialized({static_cast<int64_t>(temp_bytes)}, options.dtype(at::kByte));
  C10_CUDA_CHECK(call(temp.data_ptr(), temp_bytes));
}

}  // namespace cuda
}  // namespace torch_masked
