#pragma once
#include "cuda_emulation.h"

namespace c10 {
namespace cuda {
struct CUDAStream {
  operator cudaStream_t() const { return nullptr; }
};
inline CUDAStream getCurrentCUDAStream() { return {}; }
}  // namespace cuda
}  // namespace c10
