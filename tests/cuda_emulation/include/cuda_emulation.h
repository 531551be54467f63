// The CUDA execution model on the CPU, for running csrc/cuda's kernels where
// no GPU is (tests/cuda_emulation/README.md). Every CUDA thread is a fiber
// with its own stack; a block's threads run until each finishes or waits at a
// barrier (__syncthreads, or a warp intrinsic, which waits for every lane of
// its mask), and blocks run one after another. Host-side CUDA calls act at
// once on host memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
using cudaStream_t = struct EmulatedStream*;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time on one host thread, so a function's statics are
// its block's shared memory.
#define __shared__ static

namespace cuda_emulation {

uint3 thread_index();
extern uint3 block_index;
extern dim3 grid_size;
extern dim3 block_size;

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  LaunchConfig(dim3 g, dim3 b, size_t shared = 0, cudaStream_t = nullptr) : grid(g), block(b), shared_bytes(shared) {}
};

// kernel<<<grid, block, shared, stream>>>(args) becomes
// launch(LaunchConfig(grid, block, shared, stream), [&] { kernel(args); }).
// Refuses a configuration the GPU would (a grid of no blocks, y past 65535).
void launch(const LaunchConfig& config, const std::function<void()>& thread_body);

void sync_threads();
// Every lane of `mask` gives `value`; each gets all the lanes' values.
void warp_exchange(unsigned mask, uint64_t value, uint64_t (&lanes)[32]);

// How many multiprocessors, and blocks of a kernel on each, the device
// reports: few, so that kernels sized to the device loop over their work.
constexpr int kProcessors = 2;
constexpr int kBlocksPerProcessor = 2;

// New device memory is filled with a different byte pattern each time (0xff,
// a NaN in every float type, among them), so that an element a kernel fails
// to write shows, as the GPU's reused memory would show it.
at::Tensor filled_with_garbage(at::Tensor t);

// Whether the stream is being captured into a CUDA graph: set and cleared by
// the tests through torch.ops.cuda_emulation.set_capturing. A copy back to
// the host then fails, as CUDA fails it.
extern bool capturing;

}  // namespace cuda_emulation

#define threadIdx (::cuda_emulation::thread_index())
#define blockIdx (::cuda_emulation::block_index)
#define gridDim (::cuda_emulation::grid_size)
#define blockDim (::cuda_emulation::block_size)

inline void __syncthreads() { cuda_emulation::sync_threads(); }

template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  static_assert(sizeof(T) <= 8, "values of up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  uint64_t lanes[32];
  cuda_emulation::warp_exchange(mask, bits, lanes);
  const unsigned lane = threadIdx.x % 32;
  const unsigned source = lane + delta < 32 ? lane + delta : lane;
  if (((mask >> source) & 1u) == 0) {
    throw std::runtime_error("cuda emulation: __shfl_down_sync reads a lane outside its mask");
  }
  T result;
  std::memcpy(&result, &lanes[source], sizeof(T));
  return result;
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  uint64_t lanes[32];
  cuda_emulation::warp_exchange(mask, predicate != 0, lanes);
  unsigned ballot = 0;
  for (unsigned lane = 0; lane < 32; ++lane) {
    ballot |= ((mask >> lane) & 1u) != 0 && lanes[lane] != 0 ? 1u << lane : 0u;
  }
  return ballot;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline unsigned __float_as_uint(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}
inline long long __double2ll_rn(double d) { return std::llrint(d); }  // the default rounding: to nearest even

// Fibers switch only at barriers, so a plain read-modify-write is atomic.
template <typename T, typename Op>
T atomic_update(T* address, Op op) {
  const T old = *address;
  *address = op(old);
  return old;
}
inline float atomicAdd(float* a, float v) { return atomic_update(a, [v](float o) { return o + v; }); }
inline double atomicAdd(double* a, double v) { return atomic_update(a, [v](double o) { return o + v; }); }
inline int atomicAdd(int* a, int v) {
  return atomic_update(a, [v](int o) { return static_cast<int>(static_cast<unsigned>(o) + static_cast<unsigned>(v)); });
}
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return atomic_update(a, [v](unsigned long long o) { return o + v; });
}
inline long long atomicMin(long long* a, long long v) {
  return atomic_update(a, [v](long long o) { return v < o ? v : o; });
}
inline unsigned atomicMax(unsigned* a, unsigned v) { return atomic_update(a, [v](unsigned o) { return v > o ? v : o; }); }
inline unsigned atomicOr(unsigned* a, unsigned v) { return atomic_update(a, [v](unsigned o) { return o | v; }); }
inline unsigned atomicCAS(unsigned* a, unsigned compare, unsigned v) {
  return atomic_update(a, [=](unsigned o) { return o == compare ? v : o; });
}

inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
  *value = cuda_emulation::kProcessors;
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, size_t) {
  *blocks = cuda_emulation::kBlocksPerProcessor;
  return cudaSuccess;
}
