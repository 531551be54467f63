#pragma once
#include "cuda_emulation.h"

#include <c10/core/Device.h>

namespace c10 {
namespace cuda {
inline c10::DeviceIndex current_device() { return 0; }
inline void memcpy_and_sync(void* dst, const void* src, int64_t bytes, cudaMemcpyKind, cudaStream_t) {
  if (cuda_emulation::capturing) {  // as CUDA fails a capture that waits for the device
    throw std::runtime_error("cuda emulation: operation not permitted when stream is capturing");
  }
  std::memcpy(dst, src, static_cast<size_t>(bytes));
}
}  // namespace cuda
}  // namespace c10
