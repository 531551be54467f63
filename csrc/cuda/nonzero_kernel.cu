// CUDA kernels for masked::nonzero, masked::nonzero_tuple and
// masked::nonzero_static, in two passes over tiles of the input: the first
// counts each tile's non-zero elements and a scan turns the counts into each
// tile's first output row; the second lists each tile's non-zero positions
// in order with a block scan and writes their coordinates, a row per thread.
// nonzero reads the total back to size its output (its one host sync);
// nonzero_static knows its size and never synchronises.
#include "common.h"
#include "cuda/cub_call.cuh"
#include "cuda/host_read.cuh"

#include <ATen/ops/full.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

namespace torch_masked {
namespace cuda {
namespace {

// As ATen's CUDA nonzero: index math keeps the sizes in a fixed-size array.
constexpr int kMaxDims = 25;

// Where row k of the result goes: coordinate j of row k is
// columns[j][k * row_stride]; rows at or past max_rows are dropped.
struct IndexColumns {
  int64_t* columns[kMaxDims];
  int64_t sizes[kMaxDims];
  int dims;
  int64_t row_stride;
  int64_t max_rows;
};

// Each thread tests kItemsPerThread consecutive elements, loaded as 16-byte
// vectors where the input is aligned, and keeps the answers as bit flags.
constexpr int kThreads = 256;
constexpr int kItemsPerThread = 16;
constexpr int64_t kTile = int64_t{kThreads} * kItemsPerThread;

template <typename T>
union ThreadItems {
  uint4 vectors[kItemsPerThread * sizeof(T) / sizeof(uint4)];
  T items[kItemsPerThread];
};

// Bit u is set when element first + u is non-zero (elements past n are not).
template <typename T>
__device__ uint32_t nonzero_flags(const T* data, int64_t n, int64_t first, NonzeroBits<T> nonzero, bool aligned) {
  ThreadItems<T> loaded;
  if (aligned && first + kItemsPerThread <= n) {
    const uint4* source = reinterpret_cast<const uint4*>(data + first);
#pragma unroll
    for (int v = 0; v < kItemsPerThread * static_cast<int>(sizeof(T)) / 16; ++v) {
      loaded.vectors[v] = source[v];
    }
  } else {
#pragma unroll
    for (int u = 0; u < kItemsPerThread; ++u) {
      loaded.items[u] = first + u < n ? data[first + u] : T{};
    }
  }
  uint32_t flags = 0;
#pragma unroll
  for (int u = 0; u < kItemsPerThread; ++u) {
    flags |= static_cast<uint32_t>(nonzero(loaded.items[u])) << u;
  }
  return flags;
}

// counts[1 + tile] = the number of non-zero elements in the tile, and
// counts[0] = 0 (written here, not by a launch of its own).
template <typename T>
__global__ void count_tiles_kernel(const T* data, int64_t n, NonzeroBits<T> nonzero, bool aligned, int64_t* counts) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x * kItemsPerThread;
  const int tile_count = Reduce(temp).Sum(__popc(nonzero_flags(data, n, first, nonzero, aligned)));
  if (threadIdx.x == 0) {
    counts[1 + blockIdx.x] = tile_count;
    if (blockIdx.x == 0) {
      counts[0] = 0;
    }
  }
}

// Writes the coordinates of flat position `flat` into row `position` of the
// index columns. The first coordinate is what the other sizes leave of
// `flat`: no division for it, none at all for a 1-D input. Index is 32-bit
// when the input's size allows, 64-bit division being many times slower.
template <typename Index>
__device__ void write_coordinates(const IndexColumns& out, int64_t position, Index flat) {
  for (int j = out.dims - 1; j > 0; --j) {
    const Index size = static_cast<Index>(out.sizes[j]);
    const Index quotient = flat / size;
    out.columns[j][position] = static_cast<int64_t>(flat - quotient * size);
    flat = quotient;
  }
  out.columns[0][position] = static_cast<int64_t>(flat);
}

// Writes the coordinates of every non-zero element of the tile, in order,
// from row starts[tile] on (row 0 where starts is null: a single tile);
// rows at or past out.max_rows are dropped. The tile's non-zero positions
// are first listed in shared memory, so that consecutive threads then write
// consecutive rows (a thread writing its own elements' rows would scatter
// every store of a warp over many lines).
template <typename T, typename Index>
__global__ void write_tiles_kernel(const T* data, int64_t n, NonzeroBits<T> nonzero, bool aligned,
                                   const int64_t* starts, IndexColumns out) {
  using Scan = cub::BlockScan<int, kThreads>;
  static_assert(kTile <= 1 << 16, "tile positions are 16-bit");
  __shared__ typename Scan::TempStorage temp;
  __shared__ uint16_t positions[kTile];
  const int64_t tile_start = starts == nullptr ? 0 : starts[blockIdx.x];
  if (tile_start >= out.max_rows) {
    return;  // the whole block: nothing of this tile fits
  }
  const int64_t tile_first = static_cast<int64_t>(blockIdx.x) * kTile;
  const int thread_first = threadIdx.x * kItemsPerThread;
  uint32_t flags = nonzero_flags(data, n, tile_first + thread_first, nonzero, aligned);
  int place = 0;
  int tile_count = 0;
  Scan(temp).ExclusiveSum(__popc(flags), place, tile_count);
  for (; flags != 0; flags &= flags - 1) {
    positions[place++] = static_cast<uint16_t>(thread_first + __ffs(flags) - 1);
  }
  __syncthreads();
  const int rows = static_cast<int>(std::min<int64_t>(tile_count, out.max_rows - tile_start));
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    write_coordinates(out, (tile_start + r) * out.row_stride, static_cast<Index>(tile_first + positions[r]));
  }
}

int64_t num_tiles(const at::Tensor& input) {
  return (input.numel() + kTile - 1) / kTile;
}

bool is_vector_aligned(const at::Tensor& input) {
  return reinterpret_cast<uintptr_t>(input.const_data_ptr()) % sizeof(uint4) == 0;
}

// starts[tile] = the first output row of each tile; starts[tiles] = the total.
// A single tile's counts are its starts: no scan (at small sizes every
// launch saved is host time saved).
template <typename T>
at::Tensor tile_starts(const at::Tensor& input, NonzeroBits<T> nonzero, cudaStream_t stream) {
  const int64_t tiles = num_tiles(input);
  const at::Tensor counts = uninitialized({tiles + 1}, input.options().dtype(at::kLong));
  int64_t* counts_data = counts.data_ptr<int64_t>();
  count_tiles_kernel<<<tiles, kThreads, 0, stream>>>(static_cast<const T*>(input.const_data_ptr()), input.numel(),
                                                     nonzero, is_vector_aligned(input), counts_data);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (tiles == 1) {
    return counts;
  }
  const at::Tensor starts = uninitialized({tiles + 1}, input.options().dtype(at::kLong));
  int64_t* starts_data = starts.data_ptr<int64_t>();
  run_cub(input.options(), [&](void* temp, size_t& bytes) {
    return cub::DeviceScan::InclusiveSum(temp, bytes, counts_data, starts_data, tiles + 1, stream);
  });
  return starts;
}

// The total of tile_starts, read back to the host (nonzero's one sync).
int64_t read_total(const char* op, const at::Tensor& starts, cudaStream_t stream) {
  return read_to_host(starts.const_data_ptr<int64_t>() + starts.numel() - 1, stream, op,
                      "the number of nonzero elements",
                      "nonzero_static takes the size from its caller and needs no read");
}

// `starts` from tile_starts, or undefined for a single tile.
template <typename T>
void write_rows(const at::Tensor& input, NonzeroBits<T> nonzero, const at::Tensor& starts, const IndexColumns& out,
                cudaStream_t stream) {
  with_index_type(input.numel(), [&](auto index) {
    write_tiles_kernel<T, decltype(index)><<<num_tiles(input), kThreads, 0, stream>>>(
        static_cast<const T*>(input.const_data_ptr()), input.numel(), nonzero, is_vector_aligned(input),
        starts.defined() ? starts.const_data_ptr<int64_t>() : nullptr, out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// Index columns over `input`'s shape (a 0-d input counts as 1-D of one element).
IndexColumns columns_for(const at::Tensor& input, int64_t row_stride, int64_t max_rows) {
  IndexColumns out{};
  out.dims = std::max<int>(1, static_cast<int>(input.dim()));
  for (int j = 0; j < input.dim(); ++j) {
    out.sizes[j] = input.size(j);
  }
  if (input.dim() == 0) {
    out.sizes[0] = 1;
  }
  out.row_stride = row_stride;
  out.max_rows = max_rows;
  return out;
}

IndexColumns row_major_columns(const at::Tensor& input, const at::Tensor& result, int64_t max_rows) {
  IndexColumns out = columns_for(input, result.size(1), max_rows);
  for (int j = 0; j < out.dims; ++j) {
    out.columns[j] = result.data_ptr<int64_t>() + j;
  }
  return out;
}

// What every input must be, whether or not its elements are read.
// torch_masked/ops/nonzero.py:_check_input prints the same words.
void check_input(const char* op, const at::Tensor& self) {
  check_nonzero_dtype(op, self.scalar_type());
  MASKED_CHECK(self.dim() <= kMaxDims, op, ": expected a tensor of at most ", kMaxDims,
              " dimensions on CUDA, got ", self.dim());
  check_element_aligned(op, "input", self);
}

// Runs fn(input, nonzero_bits, stream) on the contiguous input, on its
// device, unless it is empty.
template <typename Fn>
void with_input(const char* op, const at::Tensor& self, const Fn& fn) {
  check_input(op, self);
  const c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor input = self.contiguous();
  if (input.numel() == 0) {
    return;  // no tiles: the callers' empty results stand
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_by_element_size(op, input.element_size(), [&](auto tag) {
    using T = decltype(tag);
    fn(input, nonzero_bits_for<T>(input.scalar_type()), stream);
  });
}

at::Tensor nonzero_cuda(const at::Tensor& self) {
  at::Tensor result = uninitialized({0, self.dim()}, self.options().dtype(at::kLong));
  with_input("nonzero", self, [&](const at::Tensor& input, auto nonzero, cudaStream_t stream) {
    const at::Tensor starts = tile_starts(input, nonzero, stream);
    const int64_t total = read_total("nonzero", starts, stream);
    result = uninitialized({total, self.dim()}, self.options().dtype(at::kLong));
    if (total > 0 && self.dim() > 0) {
      write_rows(input, nonzero, starts, row_major_columns(input, result, total), stream);
    }
  });
  return result;
}

std::vector<at::Tensor> nonzero_tuple_cuda(const at::Tensor& self) {
  std::vector<at::Tensor> result;
  for (int64_t j = 0; j < std::max<int64_t>(self.dim(), 1); ++j) {
    result.push_back(uninitialized({0}, self.options().dtype(at::kLong)));
  }
  with_input("nonzero_tuple", self, [&](const at::Tensor& input, auto nonzero, cudaStream_t stream) {
    const at::Tensor starts = tile_starts(input, nonzero, stream);
    const int64_t total = read_total("nonzero_tuple", starts, stream);
    IndexColumns out = columns_for(input, 1, total);
    for (int j = 0; j < out.dims; ++j) {
      result[j] = uninitialized({total}, self.options().dtype(at::kLong));
      out.columns[j] = result[j].data_ptr<int64_t>();
    }
    if (total > 0) {
      write_rows(input, nonzero, starts, out, stream);
    }
  });
  return result;
}

at::Tensor nonzero_static_cuda(const at::Tensor& self, int64_t size, int64_t fill_value) {
  MASKED_CHECK_VALUE(size >= 0, "nonzero_static: expected size >= 0, got size=", size);
  // Rows past the last non-zero element keep fill_value.
  const at::Tensor result = at::full({size, self.dim()}, fill_value, self.options().dtype(at::kLong));
  if (size == 0 || self.dim() == 0) {
    check_input("nonzero_static", self);  // refused alike where no element needs reading
    return result;
  }
  with_input("nonzero_static", self, [&](const at::Tensor& input, auto nonzero, cudaStream_t stream) {
    // A single tile starts at row 0 and its count is not needed.
    const at::Tensor starts = num_tiles(input) == 1 ? at::Tensor() : tile_starts(input, nonzero, stream);
    write_rows(input, nonzero, starts, row_major_columns(input, result, size), stream);
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CUDA, m) {
  m.impl("nonzero", &nonzero_cuda);
  m.impl("nonzero_tuple", &nonzero_tuple_cuda);
  m.impl("nonzero_static", &nonzero_static_cuda);
}

}  // namespace cuda
}  // namespace torch_masked
