// CUDA kernels for masked::where.self and masked::select (csrc/element_select.h
// prepares both). Three paths, by the merged geometry:
//   - contiguous same shape: 16-byte vector loads and stores of x, y and the
//     output, with the matching run of condition bytes; x or y may instead be
//     a single element, loaded once, or a number (where.ScalarSelf,
//     where.ScalarOther: where(c, x, 0.0)), passed by value;
//   - rows (the condition fixed along the innermost axis, x and y unit-stride
//     along it: select's rows, a [N, 1] condition, a scalar one): each row is
//     copied whole from x or y in the widest units its alignment allows, a
//     warp per piece of a row at a time, the grid what the device holds;
//   - anything else: four output elements per thread, all loads before any
//     store, offsets from the shared geometry, dividing in 32 bits where the
//     output's size allows.
// All offsets are 64-bit.
#include "element_select.h"
#include "cuda/grid.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace torch_masked {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Vectors per thread per loop step in the contiguous kernel: more loads in flight.
constexpr int kUnroll = 2;
// A row moves in pieces of kPieceUnits units, one warp per piece, each lane
// loading all its kLaneUnits units before storing any: many loads in flight
// per thread, where a block per short row would leave most threads idle and
// the rest waiting on one load each.
constexpr int kWarp = 32;
constexpr int kLaneUnits = 8;
constexpr int64_t kPieceUnits = kWarp * kLaneUnits;
// Rows shorter than this many bytes go through the element-wise kernel: a
// warp per row would leave most lanes idle.
constexpr int64_t kMinRowBytes = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 30;

int blocks_for(int64_t items, int64_t items_per_block) {
  return static_cast<int>(std::min(kMaxBlocks, std::max<int64_t>(1, (items + items_per_block - 1) / items_per_block)));
}

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vector {
  T v[kVec];
};

template <int kVec>
struct alignas(kVec) ConditionVector {
  uint8_t b[kVec];
};

// x or y: elements in device memory, or, for a number (where.ScalarSelf,
// where.ScalarOther), its value, passed with the launch.
template <typename T>
struct Operand {
  const T* data;  // nullptr for a number
  T value;
  __device__ T at(int64_t offset) const { return data != nullptr ? data[offset] : value; }
};

template <typename T>
Operand<T> operand(const at::Tensor& t, bool is_number) {
  if (is_number) {  // a 0-d tensor on the host (csrc/element_select.h: prepare_where_number)
    return {nullptr, *static_cast<const T*>(t.const_data_ptr())};
  }
  return {static_cast<const T*>(t.const_data_ptr()), T{}};
}

// The n elements of a 1-D selection. x_step and y_step are each 1 (the
// operand is contiguous) or 0 (its one element, or number, serves every
// position).
template <typename T>
__global__ void where_contiguous_kernel(const uint8_t* __restrict__ condition, Operand<T> x, int64_t x_step,
                                        Operand<T> y, int64_t y_step, T* __restrict__ out, int64_t n) {
  constexpr int kVec = 16 / sizeof(T);
  using V = Vector<T, kVec>;
  using C = ConditionVector<kVec>;
  V x_fill;
  V y_fill;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    x_fill.v[k] = x.at(0);
    y_fill.v[k] = y.at(0);
  }
  const int64_t vectors = n / kVec;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t base = tid; base < vectors; base += threads * kUnroll) {
    C c[kUnroll];
    V a[kUnroll];
    V b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + u * threads;
      if (v < vectors) {
        c[u] = reinterpret_cast<const C*>(condition)[v];
        a[u] = x_step != 0 ? reinterpret_cast<const V*>(x.data)[v] : x_fill;
        b[u] = y_step != 0 ? reinterpret_cast<const V*>(y.data)[v] : y_fill;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + u * threads;
      if (v < vectors) {
        V o;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          o.v[k] = c[u].b[k] ? a[u].v[k] : b[u].v[k];
        }
        reinterpret_cast<V*>(out)[v] = o;
      }
    }
  }
  // The last n % kVec elements.
  for (int64_t i = vectors * kVec + tid; i < n; i += threads) {
    out[i] = condition[i] ? x.at(i * x_step) : y.at(i * y_step);
  }
}

// Copies each innermost run (row) of the output from x or y as condition
// element of the row says. Work items are (row, piece) pairs, one per warp
// at a time, so that a few long rows still spread over the whole grid; the
// grid is what the device holds at once, each warp looping over items. An
// item's condition byte is loaded while the previous item's data loads are
// in flight, so a warp waits on one load per item, not on the condition and
// then the data. Offsets are in elements of `element_size` bytes; rows move
// in units U; `Index` is the type to divide in.
template <typename U, typename Index>
__global__ void __launch_bounds__(kThreads) select_rows_kernel(SelectGeometry g, int64_t element_size,
                                                               const uint8_t* __restrict__ condition,
                                                               const char* __restrict__ x, const char* __restrict__ y,
                                                               char* __restrict__ out, int64_t rows) {
  const int64_t row_len = g.sizes[0];
  const int64_t row_units = row_len * element_size / static_cast<int64_t>(sizeof(U));
  const Index pieces = static_cast<Index>((row_units + kPieceUnits - 1) / kPieceUnits);
  const int64_t items = rows * pieces;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (item >= items) {
    return;
  }
  int64_t row = static_cast<Index>(item) / pieces;
  int64_t offsets[kNumSelectOperands];
  g.offsets_at(static_cast<Index>(row * row_len), offsets);
  bool pick_x = condition[offsets[kCondition]] != 0;
  while (true) {
    const int64_t first = (item - row * pieces) * kPieceUnits;
    const int64_t count = row_units - first < kPieceUnits ? row_units - first : kPieceUnits;
    const U* src =
        reinterpret_cast<const U*>(pick_x ? x + offsets[kX] * element_size : y + offsets[kY] * element_size) + first;
    U* dst = reinterpret_cast<U*>(out + row * row_len * element_size) + first;
    U values[kLaneUnits];
#pragma unroll
    for (int k = 0; k < kLaneUnits; ++k) {
      if (lane + k * kWarp < count) {
        values[k] = src[lane + k * kWarp];
      }
    }
    item += warps;
    const bool more = item < items;
    if (more) {
      row = static_cast<Index>(item) / pieces;
      g.offsets_at(static_cast<Index>(row * row_len), offsets);
      pick_x = condition[offsets[kCondition]] != 0;
    }
#pragma unroll
    for (int k = 0; k < kLaneUnits; ++k) {
      if (lane + k * kWarp < count) {
        dst[lane + k * kWarp] = values[k];
      }
    }
    if (!more) {
      return;
    }
  }
}

// Any other geometry: each thread takes kStridedItems output elements,
// blockDim apart (consecutive threads write consecutive elements), and
// loads the condition, x and y of all of them before storing any; one load
// in flight per thread left the H200 waiting on each.
constexpr int kStridedItems = 4;

template <typename T, typename Index>
__global__ void where_strided_kernel(SelectGeometry g, const uint8_t* __restrict__ condition, Operand<T> x,
                                     Operand<T> y, T* __restrict__ out, int64_t n) {
  const int64_t tile = static_cast<int64_t>(blockDim.x) * kStridedItems;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * tile + threadIdx.x; first < n;
       first += static_cast<int64_t>(gridDim.x) * tile) {
    bool c[kStridedItems];
    T a[kStridedItems];
    T b[kStridedItems];
#pragma unroll
    for (int k = 0; k < kStridedItems; ++k) {
      const int64_t i = first + static_cast<int64_t>(k) * blockDim.x;
      if (i < n) {
        int64_t offsets[kNumSelectOperands];
        g.offsets_at(static_cast<Index>(i), offsets);
        c[k] = condition[offsets[kCondition]] != 0;
        a[k] = x.at(offsets[kX]);
        b[k] = y.at(offsets[kY]);
      }
    }
#pragma unroll
    for (int k = 0; k < kStridedItems; ++k) {
      const int64_t i = first + static_cast<int64_t>(k) * blockDim.x;
      if (i < n) {
        out[i] = c[k] ? a[k] : b[k];
      }
    }
  }
}

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The widest power of two, at most 16, dividing every value.
int64_t common_alignment(std::initializer_list<int64_t> values) {
  int64_t alignment = 16;
  for (const int64_t v : values) {
    while (v % alignment != 0) {
      alignment /= 2;
    }
  }
  return alignment;
}

// Rows are picked whole when the condition holds still along the innermost
// axis and x and y are unit-stride along it (so never with a number, whose
// strides are all 0). Returns the unit (bytes) to copy rows in, or 0 when
// the row kernel does not apply.
int64_t row_unit_bytes(const Selection& s) {
  const SelectGeometry& g = s.geometry;
  const int64_t element_size = s.out.element_size();
  const int64_t row_bytes = g.sizes[0] * element_size;
  if (g.strides[kCondition][0] != 0 || g.strides[kX][0] != 1 || g.strides[kY][0] != 1 ||
      (row_bytes < kMinRowBytes && g.dims > 1)) {
    return 0;
  }
  int64_t alignment = common_alignment({row_bytes, reinterpret_cast<int64_t>(s.x.const_data_ptr()),
                                        reinterpret_cast<int64_t>(s.y.const_data_ptr()),
                                        reinterpret_cast<int64_t>(s.out.const_data_ptr())});
  for (int d = 1; d < g.dims; ++d) {
    alignment = std::min(alignment,
                         common_alignment({g.strides[kX][d] * element_size, g.strides[kY][d] * element_size}));
  }
  return alignment;
}

template <typename T>
void launch_selection(const Selection& s, cudaStream_t stream) {
  const SelectGeometry& g = s.geometry;
  const int64_t n = s.out.numel();
  const uint8_t* c = static_cast<const uint8_t*>(s.condition.const_data_ptr());
  const Operand<T> x = operand<T>(s.x, s.x_is_number);
  const Operand<T> y = operand<T>(s.y, s.y_is_number);
  T* out = static_cast<T*>(s.out.mutable_data_ptr());

  constexpr int64_t kVec = 16 / sizeof(T);
  const int64_t x_step = g.strides[kX][0];
  const int64_t y_step = g.strides[kY][0];
  const bool flat = g.dims == 1 && g.strides[kCondition][0] == 1 && (x_step == 0 || x_step == 1) &&
                    (y_step == 0 || y_step == 1);
  if (flat && aligned(c, kVec) && (x_step == 0 || aligned(x.data, 16)) && (y_step == 0 || aligned(y.data, 16)) &&
      aligned(out, 16)) {
    const int blocks = blocks_for(std::max<int64_t>(n / kVec, 1), kThreads * kUnroll);
    where_contiguous_kernel<T><<<blocks, kThreads, 0, stream>>>(c, x, x_step, y, y_step, out, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int64_t unit = row_unit_bytes(s);
  if (unit > 0) {
    const int64_t rows = n / g.sizes[0];
    const int64_t row_units = g.sizes[0] * static_cast<int64_t>(sizeof(T)) / unit;
    const int64_t pieces = (row_units + kPieceUnits - 1) / kPieceUnits;
    dispatch_by_element_size("select", unit, [&](auto unit_tag) {
      with_index_type(n, [&](auto index) {
        constexpr auto kernel = select_rows_kernel<decltype(unit_tag), decltype(index)>;
        const int blocks = static_cast<int>(
            std::min<int64_t>(blocks_for(rows * pieces, kThreads / kWarp), resident_blocks<kernel>(kThreads)));
        kernel<<<blocks, kThreads, 0, stream>>>(g, sizeof(T), c, reinterpret_cast<const char*>(x.data),
                                                reinterpret_cast<const char*>(y.data), reinterpret_cast<char*>(out),
                                                rows);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
    return;
  }
  with_index_type(n, [&](auto index) {
    where_strided_kernel<T, decltype(index)><<<blocks_for(n, kThreads * kStridedItems), kThreads, 0, stream>>>(
        g, c, x, y, out, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

at::Tensor selected(const Selection& s) {
  if (s.out.numel() == 0) {
    return s.out;
  }
  const c10::cuda::CUDAGuard guard(s.out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // Selection only moves bits: one instantiation per element size.
  dispatch_by_element_size("where", s.out.element_size(),
                           [&](auto tag) { launch_selection<decltype(tag)>(s, stream); });
  return s.out;
}

at::Tensor where_self_cuda(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
  return selected(prepare_where(condition, x, y));
}

at::Tensor where_scalar_self_cuda(const at::Tensor& condition, const at::Scalar& x, const at::Tensor& y) {
  return selected(prepare_where_number(condition, y, x, /*number_is_x=*/true));
}

at::Tensor where_scalar_other_cuda(const at::Tensor& condition, const at::Tensor& x, const at::Scalar& y) {
  return selected(prepare_where_number(condition, x, y, /*number_is_x=*/false));
}

at::Tensor select_cuda(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
  return selected(prepare_select(condition, x, y));
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CUDA, m) {
  m.impl("where.self", &where_self_cuda);
  m.impl("where.ScalarSelf", &where_scalar_self_cuda);
  m.impl("where.ScalarOther", &where_scalar_other_cuda);
  m.impl("select", &select_cuda);
}

}  // namespace cuda
}  // namespace torch_masked
