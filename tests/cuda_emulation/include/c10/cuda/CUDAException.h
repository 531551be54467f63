// c10's CUDA checks, emulated: every call succeeds or has thrown already.
#pragma once
#include "cuda_emulation.h"

#include <c10/util/Exception.h>

#define C10_CUDA_CHECK(expr) TORCH_CHECK((expr) == cudaSuccess, "cuda emulation: failed: " #expr)
#define C10_CUDA_KERNEL_LAUNCH_CHECK() ((void)0)
