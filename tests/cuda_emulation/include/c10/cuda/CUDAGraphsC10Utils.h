// c10's CUDA graph capture status, emulated: a capture is active while
// cuda_emulation::capturing is set (torch.ops.cuda_emulation.set_capturing).
#pragma once
#include "cuda_emulation.h"

namespace c10 {
namespace cuda {
enum class CaptureStatus : int { None = 0, Active = 1, Invalidated = 2 };
inline CaptureStatus currentStreamCaptureStatusMayInitCtx() {
  return cuda_emulation::capturing ? CaptureStatus::Active : CaptureStatus::None;
}
}  // namespace cuda
}  // namespace c10
