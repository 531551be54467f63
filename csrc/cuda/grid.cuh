// Grid sizes for kernels that loop over their work (grid-stride loops).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace torch_masked {
namespace cuda {

// How many blocks of `threads` threads of `kernel` the current device runs
// at once: a looping kernel launched with that many fills every SM, with no
// partial last wave, and each warp has several items to overlap. Asked of
// the runtime once per kernel, on the first device it runs on; another model
// of GPU in the same process gets a grid sized for the first (only the speed
// differs).
template <auto kernel>
int64_t resident_blocks(int threads) {
  static const int64_t blocks = [threads] {
    int device = 0;
    int processors = 0;
    int per_processor = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_processor, kernel, threads, 0));
    return int64_t{processors} * std::max(per_processor, 1);
  }();
  return blocks;
}

}  // namespace cuda
}  // namespace torch_masked
