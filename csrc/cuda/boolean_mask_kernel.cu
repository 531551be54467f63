// CUDA kernels for masked::boolean_mask and masked::boolean_mask_backward.
// The tensor is viewed as [outer, rows, inner] (boolean_mask.h). Forward: a
// count of the mask's true flags per chunk and a scan of those counts, one
// host synchronisation to learn the selected count n (the output's size
// depends on it), then a warp-level compaction of the mask (read back as the
// bit words the count wrote, an eighth of its bytes) that packs either
// the data itself (one unit per row, each block of the outer dimensions a
// row of the grid) or the selected row numbers, from which a coalesced copy
// gathers every block's slices. Backward: the output shape is known, so no
// synchronisation: the same chunk counts and the compaction in reverse when
// each row is one unit, else a scan of the mask's flags and one kernel that
// writes every input position, from the gradient or zero. Slices move in
// units of up to 16 bytes; offsets are 64-bit.
#include "boolean_mask.h"
#include "common.h"
#include "cuda/cub_call.cuh"
#include "cuda/host_read.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <limits>

namespace torch_masked {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// A mask byte as a count: any non-zero byte is true, as in every other
// reading of the mask (a bool tensor viewed from other bytes may hold 2 or
// 255), and 64 bits, so that the counts never overflow.
struct TrueFlagCount {
  __host__ __device__ int64_t operator()(uint8_t flag) const { return flag != 0; }
};

// counts[j] = number of true flags in mask[0..j].
at::Tensor inclusive_counts(const uint8_t* mask, int64_t rows, const at::TensorOptions& options,
                            cudaStream_t stream) {
  at::Tensor counts = uninitialized({rows}, options.dtype(at::kLong));
  int64_t* out = counts.data_ptr<int64_t>();
  const auto flags = thrust::make_transform_iterator(mask, TrueFlagCount{});
  run_cub(options, [&](void* temp, size_t& temp_bytes) {
    return cub::DeviceScan::InclusiveSum(temp, temp_bytes, flags, out, rows, stream);
  });
  return counts;
}

// Position e of the [outer, rows, units] view (units of one slice), with the
// divisions in 32 bits when the whole view allows.
template <typename Index>
struct SlicePosition {
  Index block;
  Index row;
  Index unit;

  __device__ SlicePosition(int64_t e, Index rows, Index units) {
    const Index slice = static_cast<Index>(e) / units;
    unit = static_cast<Index>(e) - slice * units;
    block = slice / rows;
    row = slice - block * rows;
  }
};

// The forward compacts the mask in chunks of kChunk flags, one warp per
// chunk: lane l takes the chunk's positions l, l + 32, ..., so every load
// and every store of the warp covers 32 consecutive rows.
constexpr int kWarp = 32;
constexpr int kLaneFlags = 16;
constexpr int64_t kChunk = kWarp * kLaneFlags;

__device__ int64_t first_warp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
}

__device__ int64_t warps_in_grid() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
}

// The mask is read as bytes, a byte other than zero being true, so that the
// 16-byte loads below and the byte loads agree on every bit pattern.
using MaskByte = uint8_t;

// Flags of the lane's positions in the chunk starting at `chunk_start`; false past the mask's end.
__device__ void load_lane_flags(const MaskByte* __restrict__ mask, int64_t rows, int64_t chunk_start,
                                bool (&flags)[kLaneFlags]) {
  const int64_t lane_start = chunk_start + threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < kLaneFlags; ++i) {
    const int64_t row = lane_start + static_cast<int64_t>(i) * kWarp;
    flags[i] = row < rows && mask[row] != 0;
  }
}

// A whole chunk of an aligned mask is read with one 16-byte load per lane
// (one byte per load read the mask far below copy bandwidth); lane l then
// holds the chunk's flags 16 l .. 16 l + 15.
__device__ bool loads_whole_vectors(bool aligned, int64_t rows, int64_t chunk_start) {
  return aligned && chunk_start + kChunk <= rows;
}

__device__ uint4 lane_vector(const MaskByte* __restrict__ mask, int64_t chunk_start) {
  return reinterpret_cast<const uint4*>(mask + chunk_start)[threadIdx.x % kWarp];
}

// Bit b set where byte b of the word is non-zero: a byte's top bit is set
// after the addition when its low seven bits are not all zero (no carry
// crosses bytes), or-ed with the byte's own top bit.
__device__ uint32_t nonzero_byte_bits(uint32_t word) {
  const uint32_t top = (((word & 0x7f7f7f7fu) + 0x7f7f7f7fu) | word) & 0x80808080u;
  return (top >> 7 & 1u) | (top >> 14 & 2u) | (top >> 21 & 4u) | (top >> 28 & 8u);
}

// counts[c] = number of true flags in chunk c, and the chunk's flags as
// kLaneFlags bit words at words[kLaneFlags c]: bit l of word i is the flag of
// the chunk's position 32 i + l (the ballot of lane l's i-th flag). The
// compaction reads these 64 bytes instead of the chunk's 512 mask bytes.
// `vector` is the lane's 16 mask bytes when `whole` (loads_whole_vectors).
__device__ void count_chunk(const MaskByte* __restrict__ mask, int64_t rows, int64_t chunk, bool whole,
                            const uint4& vector, int64_t* __restrict__ counts, uint32_t* __restrict__ words) {
  const int lane = threadIdx.x % kWarp;
  const int64_t chunk_start = chunk * kChunk;
  uint32_t* chunk_words = words + chunk * kLaneFlags;
  int count = 0;
  if (whole) {
    // Lane l holds positions 16 l .. 16 l + 15: word i is the bits of lanes 2 i and 2 i + 1.
    const uint32_t own = nonzero_byte_bits(vector.x) | nonzero_byte_bits(vector.y) << 4 |
                         nonzero_byte_bits(vector.z) << 8 | nonzero_byte_bits(vector.w) << 12;
    const uint32_t next = __shfl_down_sync(0xffffffffu, own, 1);
    if (lane % 2 == 0) {
      chunk_words[lane / 2] = own | next << 16;
    }
    count = __popc(own);
  } else {
    bool flags[kLaneFlags];
    load_lane_flags(mask, rows, chunk_start, flags);
    uint32_t own = 0;
#pragma unroll
    for (int i = 0; i < kLaneFlags; ++i) {
      const uint32_t ballot = __ballot_sync(0xffffffffu, flags[i]);
      own = lane == i ? ballot : own;
    }
    if (lane < kLaneFlags) {
      chunk_words[lane] = own;
      count = __popc(own);
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    count += __shfl_down_sync(0xffffffffu, count, offset);
  }
  if (lane == 0) {
    counts[chunk] = count;
  }
}

// count_chunk for every chunk, two per warp at a time with both chunks'
// loads issued first: with one 16-byte load in flight per lane, the pass
// over the mask ran below copy bandwidth.
constexpr int kCountChunksPerWarp = 2;

__global__ void count_chunks(const MaskByte* __restrict__ mask, int64_t rows, bool aligned, int64_t chunks,
                             int64_t* __restrict__ counts, uint32_t* __restrict__ words) {
  const int64_t warps = warps_in_grid();
  for (int64_t chunk = first_warp(); chunk < chunks; chunk += kCountChunksPerWarp * warps) {
    const int64_t second = chunk + warps;
    const bool whole = loads_whole_vectors(aligned, rows, chunk * kChunk);
    const bool second_whole = second < chunks && loads_whole_vectors(aligned, rows, second * kChunk);
    const uint4 vector = whole ? lane_vector(mask, chunk * kChunk) : uint4{};
    const uint4 second_vector = second_whole ? lane_vector(mask, second * kChunk) : uint4{};
    count_chunk(mask, rows, chunk, whole, vector, counts, words);
    if (second < chunks) {
      count_chunk(mask, rows, second, second_whole, second_vector, counts, words);
    }
  }
}

// What compaction packs for each true flag: its row number (the same in
// every block of the outer dimensions: packed once, for one block)...
struct PackRows {
  int64_t* dst;
  __device__ PackRows in_block(int64_t) const { return *this; }
  __device__ int64_t fetch(int64_t row) const { return row; }
  __device__ void store(int64_t place, int64_t row) const { dst[place] = row; }
};

// ...or the row's data, when each row is a single unit, in block o of the
// outer dimensions: src's blocks have `rows` units, dst's `selected`.
template <typename Unit>
struct PackUnits {
  const Unit* src;
  Unit* dst;
  int64_t rows;
  int64_t selected;
  __device__ PackUnits in_block(int64_t o) const { return {src + o * rows, dst + o * selected, rows, selected}; }
  __device__ Unit fetch(int64_t row) const { return src[row]; }
  __device__ void store(int64_t place, const Unit& value) const { dst[place] = value; }
};

// Calls visit(o, chunk_start, words, place) for each of this warp's chunks
// in block o = blockIdx.y of the outer dimensions, with the chunk's bit
// words (every lane all of them) and `place`, where the chunk's selection
// starts: chunk_ends[c - 1].
template <typename Visit>
__device__ void for_each_chunk(const uint32_t* __restrict__ words, int64_t chunks,
                               const int64_t* __restrict__ chunk_ends, const Visit& visit) {
  for (int64_t chunk = first_warp(); chunk < chunks; chunk += warps_in_grid()) {
    // 64 bytes, 64-byte aligned: four 16-byte loads, the same for every lane.
    const uint4* vectors = reinterpret_cast<const uint4*>(words + chunk * kLaneFlags);
    uint32_t chunk_bits[kLaneFlags];
#pragma unroll
    for (int q = 0; q < kLaneFlags / 4; ++q) {
      const uint4 v = vectors[q];
      chunk_bits[4 * q] = v.x;
      chunk_bits[4 * q + 1] = v.y;
      chunk_bits[4 * q + 2] = v.z;
      chunk_bits[4 * q + 3] = v.w;
    }
    visit(static_cast<int64_t>(blockIdx.y), chunk * kChunk, chunk_bits,
          chunk == 0 ? int64_t{0} : chunk_ends[chunk - 1]);
  }
}

__device__ bool lane_flag(uint32_t word) {
  return (word >> (threadIdx.x % kWarp) & 1u) != 0;
}

// Packs the true flags' rows (or data) in order: within a chunk a lane's
// place is the number of true flags before it in the chunk's bit words.
// Only selected rows are read. The grid's y is the blocks of the outer
// dimensions.
template <typename Pack>
__global__ void compact_chunks(const uint32_t* __restrict__ words, int64_t chunks,
                               const int64_t* __restrict__ chunk_ends, Pack all_blocks) {
  using Value = decltype(all_blocks.fetch(0));
  const int lane = threadIdx.x % kWarp;
  const unsigned lower_lanes = (1u << lane) - 1;
  for_each_chunk(words, chunks, chunk_ends,
                 [&](int64_t o, int64_t chunk_start, const uint32_t (&chunk_bits)[kLaneFlags], int64_t place) {
    const Pack pack = all_blocks.in_block(o);
    // All loads first, so that a lane has them all in flight at once.
    Value values[kLaneFlags];
#pragma unroll
    for (int i = 0; i < kLaneFlags; ++i) {
      if (lane_flag(chunk_bits[i])) {
        values[i] = pack.fetch(chunk_start + lane + static_cast<int64_t>(i) * kWarp);
      }
    }
#pragma unroll
    for (int i = 0; i < kLaneFlags; ++i) {
      if (lane_flag(chunk_bits[i])) {
        pack.store(place + __popc(chunk_bits[i] & lower_lanes), values[i]);
      }
      place += __popc(chunk_bits[i]);
    }
  });
}

// The backward of a mask whose rows are single units, the reverse of
// compact_chunks: every row of the chunk is written, from the packed
// gradient where the flag is true (the place counted as there) and zero
// elsewhere, in block blockIdx.y of the outer dimensions (grad's blocks
// have grad_rows units, dst's `rows`). A place past grad's rows (a grad that
// does not match the mask) reads nothing and writes zero.
template <typename Unit>
__global__ void expand_chunks(const uint32_t* __restrict__ words, int64_t rows, int64_t chunks,
                              const int64_t* __restrict__ chunk_ends, const Unit* __restrict__ all_grad,
                              int64_t grad_rows, Unit* __restrict__ all_dst) {
  const int lane = threadIdx.x % kWarp;
  const unsigned lower_lanes = (1u << lane) - 1;
  for_each_chunk(words, chunks, chunk_ends,
                 [&](int64_t o, int64_t chunk_start, const uint32_t (&chunk_bits)[kLaneFlags], int64_t place) {
    const Unit* grad = all_grad + o * grad_rows;
    Unit* dst = all_dst + o * rows;
    Unit values[kLaneFlags];
#pragma unroll
    for (int i = 0; i < kLaneFlags; ++i) {
      const int64_t packed = place + __popc(chunk_bits[i] & lower_lanes);
      values[i] = lane_flag(chunk_bits[i]) && packed < grad_rows ? grad[packed] : Unit{};
      place += __popc(chunk_bits[i]);
    }
#pragma unroll
    for (int i = 0; i < kLaneFlags; ++i) {
      const int64_t row = chunk_start + lane + static_cast<int64_t>(i) * kWarp;
      if (row < rows) {
        dst[row] = values[i];
      }
    }
  });
}

// dst[o, j, u] = src[o, selected_rows[j], u] over the [outer, selected,
// units] output. A thread takes kGatherItems units e of a block's output,
// blockDim apart (consecutive threads write consecutive units), reads their
// row numbers once and copies them in the blocks o = blockIdx.y,
// blockIdx.y + gridDim.y, ..., loading a block's units before storing them.
// With one unit per thread (and one block at a time for the [N, 64] rows of
// the benchmarks), too few loads were in flight: 68% of the H200's copy
// bandwidth there.
constexpr int kGatherItems = 4;

template <typename Unit, typename Index>
__global__ void gather_selected_rows(const Unit* __restrict__ src, const int64_t* __restrict__ selected_rows,
                                     Unit* __restrict__ dst, int64_t outer, int64_t rows, Index units,
                                     int64_t block_units) {
  const int64_t src_block_units = rows * static_cast<int64_t>(units);
  const int64_t tile = static_cast<int64_t>(blockDim.x) * kGatherItems;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * tile + threadIdx.x; first < block_units;
       first += static_cast<int64_t>(gridDim.x) * tile) {
    int64_t source[kGatherItems];
#pragma unroll
    for (int k = 0; k < kGatherItems; ++k) {
      const int64_t e = first + static_cast<int64_t>(k) * blockDim.x;
      if (e < block_units) {
        const Index j = static_cast<Index>(e) / units;
        const Index unit = static_cast<Index>(e) - j * units;
        source[k] = selected_rows[j] * static_cast<int64_t>(units) + unit;
      }
    }
#pragma unroll 2
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
      Unit values[kGatherItems];
#pragma unroll
      for (int k = 0; k < kGatherItems; ++k) {
        if (first + static_cast<int64_t>(k) * blockDim.x < block_units) {
          values[k] = src[o * src_block_units + source[k]];
        }
      }
#pragma unroll
      for (int k = 0; k < kGatherItems; ++k) {
        const int64_t e = first + static_cast<int64_t>(k) * blockDim.x;
        if (e < block_units) {
          dst[o * block_units + e] = values[k];
        }
      }
    }
  }
}

// The same copy with one thread per output unit, for outputs whose blocks
// have fewer units than a tile of gather_selected_rows: there most of its
// threads would idle (three selected columns of a [1e6, 37] tensor kept 3 of
// each block's 256 threads busy, each looping over a thousand blocks).
template <typename Unit, typename Index>
__global__ void gather_selected_units(const Unit* __restrict__ src, const int64_t* __restrict__ selected_rows,
                                      Unit* __restrict__ dst, Index selected, Index units, int64_t rows,
                                      int64_t total) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const SlicePosition<Index> position(e, selected, units);
    const int64_t row = static_cast<int64_t>(position.block) * rows + selected_rows[position.row];
    dst[e] = src[row * static_cast<int64_t>(units) + position.unit];
  }
}

// Blocks of kThreads for `items` work items: at least one, at most the grid
// limit (the kernels loop over the rest).
unsigned blocks_for(int64_t items) {
  constexpr int64_t kMaxBlocks = 1 << 20;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks)));
}

// One thread per output unit: the packed gradient's unit where the mask is
// true, zero where it is false. A count past grad's rows (a grad that does
// not match the mask) reads nothing and writes zero.
template <typename Unit, typename Index>
__global__ void expand_selected_slices(const Unit* __restrict__ grad, const uint8_t* __restrict__ mask,
                                       const int64_t* __restrict__ counts, Unit* __restrict__ dst, Index rows,
                                       Index units, int64_t grad_rows, int64_t total) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) {
    return;
  }
  const SlicePosition<Index> position(e, rows, units);
  Unit value{};
  if (mask[position.row] != 0) {
    const int64_t packed = counts[position.row] - 1;
    if (packed < grad_rows) {
      value = grad[(static_cast<int64_t>(position.block) * grad_rows + packed) * units + position.unit];
    }
  }
  dst[e] = value;
}

// Whether compaction moves the data itself (and its reverse the gradient),
// a block of the outer dimensions per grid row: each row is one unit, the
// outer blocks fit the grid's y, and the mask is long enough to keep a thread
// block's warps busy in each of them (a short mask in many blocks is spread
// better by the gathers).
bool compaction_moves_units(const MaskedView& view, int64_t units) {
  constexpr int64_t kMaxGridY = 65535;
  return units == 1 && (view.outer == 1 || (view.outer <= kMaxGridY && view.rows >= kChunk * (kThreads / kWarp)));
}

// The mask (contiguous) in chunks of kChunk flags, a warp per chunk: each
// chunk's bit words, and the inclusive sum of the chunks' true flags: where
// each chunk's selection ends, the last being the selected count n. A
// single chunk's count is its end: no scan (at small sizes every launch
// saved is host time saved).
struct ChunkedMask {
  int64_t rows;
  int64_t chunks;
  unsigned blocks;
  at::Tensor words;
  at::Tensor ends;

  ChunkedMask(const at::Tensor& mask, int64_t rows, const at::TensorOptions& options, cudaStream_t stream)
      : rows(rows),
        chunks((rows + kChunk - 1) / kChunk),
        blocks(blocks_for(chunks * kWarp)),
        words(uninitialized({chunks * kLaneFlags}, options.dtype(at::kInt))) {
    const at::Tensor flags = mask.contiguous();
    const auto* data = static_cast<const MaskByte*>(flags.const_data_ptr());
    const bool aligned = reinterpret_cast<uintptr_t>(data) % sizeof(uint4) == 0;
    const at::Tensor counts = uninitialized({chunks}, options.dtype(at::kLong));
    count_chunks<<<(blocks + kCountChunksPerWarp - 1) / kCountChunksPerWarp, kThreads, 0, stream>>>(
        data, rows, aligned, chunks, counts.data_ptr<int64_t>(), words_data());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (chunks == 1) {
      ends = counts;
      return;
    }
    ends = uninitialized({chunks}, options.dtype(at::kLong));
    const int64_t* counts_data = counts.const_data_ptr<int64_t>();
    int64_t* ends_out = ends.data_ptr<int64_t>();
    run_cub(options, [&](void* temp, size_t& temp_bytes) {
      return cub::DeviceScan::InclusiveSum(temp, temp_bytes, counts_data, ends_out, chunks, stream);
    });
  }

  // Chunks along x, blocks of the outer dimensions along y.
  dim3 grid(int64_t outer) const { return dim3(blocks, static_cast<unsigned>(outer)); }

  const int64_t* ends_data() const { return ends.const_data_ptr<int64_t>(); }
  uint32_t* words_data() const { return reinterpret_cast<uint32_t*>(words.data_ptr<int32_t>()); }
};

at::Tensor boolean_mask_cuda(const at::Tensor& tensor, const at::Tensor& mask, int64_t axis) {
  check_same_device("boolean_mask", {{"tensor", &tensor}, {"mask", &mask}});
  const MaskedView view = masked_view("boolean_mask", "tensor.shape", tensor.sizes(), mask, axis);
  const c10::cuda::CUDAGuard guard(tensor.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor input = tensor.contiguous();
  if (view.rows == 0) {
    return uninitialized(view.masked_shape(tensor.sizes(), 0), input.options());
  }
  const ChunkedMask chunked(mask, view.rows, input.options(), stream);
  // The forward's one host synchronisation.
  const int64_t selected = read_to_host(chunked.ends_data() + chunked.chunks - 1, stream, "boolean_mask",
                                        "the number of rows mask selects",
                                        "select or where keep the tensor's shape and need no read");

  at::Tensor result = uninitialized(view.masked_shape(tensor.sizes(), selected), input.options());
  if (result.numel() == 0) {
    return result;
  }
  const int64_t slice_bytes = view.inner * input.element_size();
  const void* src = input.const_data_ptr();
  const int64_t unit_bytes = widest_unit_bytes(slice_bytes, {src, result.data_ptr()});
  const int64_t units = slice_bytes / unit_bytes;
  dispatch_by_element_size("boolean_mask", unit_bytes, [&](auto tag) {
    using Unit = decltype(tag);
    const Unit* src_units = static_cast<const Unit*>(src);
    Unit* dst_units = static_cast<Unit*>(result.data_ptr());
    if (compaction_moves_units(view, units)) {
      // Each row is one unit: compaction packs the data itself.
      compact_chunks<<<chunked.grid(view.outer), kThreads, 0, stream>>>(
          chunked.words_data(), chunked.chunks, chunked.ends_data(),
          PackUnits<Unit>{src_units, dst_units, view.rows, selected});
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    // Otherwise compaction packs the selected row numbers, which every block
    // of the output then gathers from.
    at::Tensor selected_rows = uninitialized({selected}, input.options().dtype(at::kLong));
    compact_chunks<<<chunked.blocks, kThreads, 0, stream>>>(chunked.words_data(), chunked.chunks,
                                                            chunked.ends_data(),
                                                            PackRows{selected_rows.data_ptr<int64_t>()});
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t block_units = selected * units;
    if (block_units < kThreads * kGatherItems) {
      const int64_t total = view.outer * block_units;
      with_index_type(total, [&](auto index) {
        using Index = decltype(index);
        gather_selected_units<Unit, Index><<<blocks_for(total), kThreads, 0, stream>>>(
            src_units, selected_rows.const_data_ptr<int64_t>(), dst_units, static_cast<Index>(selected),
            static_cast<Index>(units), view.rows, total);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
      return;
    }
    const unsigned blocks_x = blocks_for((block_units + kGatherItems - 1) / kGatherItems);
    // Enough blocks to fill the GPU; more would re-read the row numbers.
    constexpr int64_t kTargetBlocks = 2048;
    const unsigned blocks_y = static_cast<unsigned>(
        std::min<int64_t>({view.outer, (kTargetBlocks + blocks_x - 1) / blocks_x, 65535}));
    const dim3 grid(blocks_x, blocks_y);
    with_index_type(block_units, [&](auto index) {
      using Index = decltype(index);
      gather_selected_rows<Unit, Index><<<grid, kThreads, 0, stream>>>(
          src_units, selected_rows.const_data_ptr<int64_t>(), dst_units, view.outer, view.rows,
          static_cast<Index>(units), block_units);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return result;
}

at::Tensor boolean_mask_backward_cuda(const at::Tensor& grad, const at::Tensor& mask, c10::SymIntArrayRef input_sizes,
                                      int64_t axis) {
  const at::IntArrayRef input_shape = C10_AS_INTARRAYREF_SLOW(input_sizes);
  check_same_device("boolean_mask_backward", {{"grad", &grad}, {"mask", &mask}});
  const MaskedView view = masked_view("boolean_mask_backward", "input_shape", input_shape, mask, axis);
  check_masked_grad(grad, input_shape, view);
  const c10::cuda::CUDAGuard guard(grad.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor packed_grad = grad.contiguous();
  at::Tensor result = uninitialized(input_shape, packed_grad.options());
  if (result.numel() == 0) {
    return result;
  }
  const int64_t slice_bytes = view.inner * packed_grad.element_size();
  const void* src = packed_grad.const_data_ptr();
  const int64_t unit_bytes = widest_unit_bytes(slice_bytes, {src, result.data_ptr()});
  const int64_t units = slice_bytes / unit_bytes;
  const int64_t total = result.numel() * result.element_size() / unit_bytes;
  const int64_t grad_rows = packed_grad.size(view.axis);
  dispatch_by_element_size("boolean_mask_backward", unit_bytes, [&](auto tag) {
    using Unit = decltype(tag);
    if (compaction_moves_units(view, units)) {
      // Each row is one unit: the forward's compaction in reverse, with a
      // count per chunk instead of one per row to write and read back.
      const ChunkedMask chunked(mask, view.rows, packed_grad.options(), stream);
      expand_chunks<<<chunked.grid(view.outer), kThreads, 0, stream>>>(
          chunked.words_data(), chunked.rows, chunked.chunks, chunked.ends_data(),
          static_cast<const Unit*>(src), grad_rows, static_cast<Unit*>(result.data_ptr()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    const at::Tensor flags = mask.contiguous();
    const auto* mask_data = static_cast<const uint8_t*>(flags.const_data_ptr());
    const at::Tensor counts = inclusive_counts(mask_data, view.rows, packed_grad.options(), stream);
    const int64_t blocks = (total + kThreads - 1) / kThreads;
    MASKED_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "boolean_mask_backward: ", total,
                 " units are too many for one launch");
    with_index_type(total, [&](auto index) {
      using Index = decltype(index);
      expand_selected_slices<Unit, Index><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          static_cast<const Unit*>(src), mask_data, counts.const_data_ptr<int64_t>(),
          static_cast<Unit*>(result.data_ptr()), static_cast<Index>(view.rows), static_cast<Index>(units),
          grad_rows, total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CUDA, m) {
  m.impl("boolean_mask", &boolean_mask_cuda);
  m.impl("boolean_mask_backward", &boolean_mask_backward_cuda);
}

}  // namespace cuda
}  // namespace torch_masked
