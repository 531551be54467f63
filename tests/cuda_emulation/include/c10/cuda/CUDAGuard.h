#pragma once
#include "cuda_emulation.h"

#include <c10/core/Device.h>

namespace c10 {
namespace cuda {
struct CUDAGuard {
  explicit CUDAGuard(c10::Device) {}
};
}  // namespace cuda
}  // namespace c10
