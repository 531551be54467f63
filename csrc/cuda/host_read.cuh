// The CUDA kernels' reads back to the host. nonzero and boolean_mask read
// their result's size, and check_bounds reads whether an index row is out
// of bounds, each once a call. A CUDA graph capture cannot wait for the
// device: CUDA would fail the capture with "operation not permitted when
// stream is capturing", naming neither the op nor a way out. So a read
// during a capture is refused first, by name.
#pragma once

#include <ATen/EmptyTensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace torch_masked {

// Raises RuntimeError while the current stream is captured into a CUDA
// graph: `op`'s `what` must be read back, and `instead` says what needs no read.
inline void refuse_while_capturing(const char* op, const char* what, const char* instead) {
  TORCH_CHECK(c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None, op, ": ", what,
              " must be read back to the host, which cannot be done while a CUDA graph is being captured; ", instead);
}

// *value on the host, refused while capturing, through c10's copy, so that
// torch.cuda.set_sync_debug_mode warns of it (or refuses it) as it does of
// torch's own x[mask] and nonzero. Copied into pinned memory (torch's cached
// pinned blocks), as Tensor.item() and torch.nonzero's count are: a copy into
// pageable memory goes through the driver's staging buffer, and a CPU copy
// out of it, on every call.
inline int64_t read_to_host(const int64_t* value, cudaStream_t stream, const char* op, const char* what,
                            const char* instead) {
  refuse_while_capturing(op, what, instead);
  const at::Tensor host =
      at::detail::empty_cpu({1}, at::kLong, std::nullopt, std::nullopt, /*pin_memory=*/true, std::nullopt);
  c10::cuda::memcpy_and_sync(host.mutable_data_ptr(), value, sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
  return *host.const_data_ptr<int64_t>();
}

}  // namespace torch_masked
